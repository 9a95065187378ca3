// Event reuse. Events are created with timing enabled on the current device; a released event
// may still be pending on the GPU, which is fine: recording it again replaces that work.
#include "runtime/event_pool.h"

#include "runtime/real_api.h"

namespace vcudnn {

cudaEvent_t EventPool::acquire(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[device];
    if (!list.empty()) {
      cudaEvent_t e = list.back();
      list.pop_back();
      return e;
    }
  }
  const RealCudart& rt = real_cudart();
  if (!rt.cudaEventCreateWithFlags) return nullptr;
  RelaxedCapture relaxed;
  cudaEvent_t e = nullptr;
  if (rt.cudaEventCreateWithFlags(&e, cudaEventDefault) != cudaSuccess) return nullptr;
  return e;
}

void EventPool::release(int device, cudaEvent_t event) {
  if (!event) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_[device].push_back(event);
}

RelaxedCapture::RelaxedCapture() {
  const RealCudart& rt = real_cudart();
  if (rt.cudaThreadExchangeStreamCaptureMode)
    exchanged_ = rt.cudaThreadExchangeStreamCaptureMode(&previous_) == cudaSuccess;
}

RelaxedCapture::~RelaxedCapture() {
  if (exchanged_) real_cudart().cudaThreadExchangeStreamCaptureMode(&previous_);
}

}  // namespace vcudnn
