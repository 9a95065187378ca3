// EventPool: timing events reused per device (creating one costs microseconds), and
// RelaxedCapture, which lets vcudnn's own bookkeeping calls run while another thread captures a
// CUDA graph in global mode without invalidating that capture.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace vcudnn {

class EventPool {
 public:
  // nullptr when no event can be made (no GPU, CUDA unavailable): the caller skips timing.
  cudaEvent_t acquire(int device);
  void release(int device, cudaEvent_t event);

 private:
  std::mutex mu_;
  std::unordered_map<int, std::vector<cudaEvent_t>> free_;
};

class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

}  // namespace vcudnn
