// CudaDevice (cuda_device.h).
#include "runtime/memory/cuda_device.h"

#include <string>

#include "runtime/cuda_check.h"
#include "runtime/event_pool.h"
#include "runtime/log.h"
#include "runtime/real_api.h"

namespace vcudnn::memory {
namespace {

bool check(cudaError_t e, const char* what) { return cuda_ok(e, "offload", what); }

// Runs CUDA calls on the arena's device whatever the calling thread's current device is.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    const RealCudart& rt = real_cudart();
    if (rt.cudaGetDevice && rt.cudaSetDevice && rt.cudaGetDevice(&previous_) == cudaSuccess && previous_ != device)
      switched_ = rt.cudaSetDevice(device) == cudaSuccess;
  }
  ~OnDevice() {
    if (switched_) real_cudart().cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

CudaDevice::CudaDevice(int device) : device_(device) {
  const RealCudart& rt = real_cudart();
  OnDevice on(device_);
  ok_ = rt.cudaStreamCreateWithFlags && rt.cudaEventCreateWithFlags && rt.cudaEventDestroy && rt.cudaEventRecord &&
        rt.cudaEventQuery && rt.cudaEventSynchronize && rt.cudaStreamWaitEvent && rt.cudaMemcpyAsync &&
        rt.cudaStreamIsCapturing &&
        check(rt.cudaStreamCreateWithFlags(&out_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") &&
        check(rt.cudaStreamCreateWithFlags(&in_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Event CudaDevice::create_event() {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  cudaEvent_t e = nullptr;
  return check(real_cudart().cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags")
             ? e
             : nullptr;
}

Event CudaDevice::create_timed_event() {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  cudaEvent_t e = nullptr;
  return check(real_cudart().cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreateWithFlags") ? e : nullptr;
}

std::optional<float> CudaDevice::elapsed_ms(Event from, Event to) {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  const RealCudart& rt = real_cudart();
  if (!rt.cudaEventElapsedTime) return std::nullopt;
  float ms = 0;
  const cudaError_t e = rt.cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to));
  if (e == cudaSuccess) return ms;
  rt.cudaGetLastError();  // not ready yet (or failed): the framework must not see it as its error
  return std::nullopt;
}

void CudaDevice::destroy_event(Event event) {
  if (event) real_cudart().cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

bool CudaDevice::record(Event event, Stream stream) {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  const RealCudart& rt = real_cudart();
  // An event recorded on a stream under capture would become a node of the user's graph.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    rt.cudaGetLastError();
    return false;
  }
  if (status != cudaStreamCaptureStatusNone) return false;
  return check(rt.cudaEventRecord(static_cast<cudaEvent_t>(event), stream), "cudaEventRecord");
}

bool CudaDevice::capturing(Stream stream) {
  OnDevice on(device_);
  const RealCudart& rt = real_cudart();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    rt.cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

bool CudaDevice::wait(Stream waiter, Event event) {
  if (capturing(waiter)) return false;
  OnDevice on(device_);
  return check(real_cudart().cudaStreamWaitEvent(waiter, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
}

EventState CudaDevice::query(Event event) {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  const RealCudart& rt = real_cudart();
  const cudaError_t e = rt.cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) return EventState::kDone;
  if (e == cudaErrorNotReady) {
    rt.cudaGetLastError();  // "not ready" is recorded as the last error: the framework must not see it
    return EventState::kPending;
  }
  check(e, "cudaEventQuery");
  return EventState::kFailed;
}

bool CudaDevice::host_wait(Event event) {
  OnDevice on(device_);
  RelaxedCapture relaxed;
  return check(real_cudart().cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}

bool CudaDevice::copy_to_host(void* host, uint64_t device, uint64_t bytes) {
  OnDevice on(device_);
  return check(
      real_cudart().cudaMemcpyAsync(host, reinterpret_cast<const void*>(device), bytes, cudaMemcpyDeviceToHost, out_),
      "cudaMemcpyAsync (evict)");
}

bool CudaDevice::copy_to_device(uint64_t device, const void* host, uint64_t bytes) {
  OnDevice on(device_);
  return check(real_cudart().cudaMemcpyAsync(reinterpret_cast<void*>(device), host, bytes, cudaMemcpyHostToDevice, in_),
               "cudaMemcpyAsync (restore)");
}

}  // namespace vcudnn::memory
