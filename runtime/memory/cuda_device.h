// CudaDevice: the memory runtime's Device (device.h) on the CUDA runtime: one non-blocking
// transfer stream per GPU, events without timing, every call on the arena's GPU whatever the
// calling thread's current device, and vcudnn's own failures (and cudaEventQuery's "not ready")
// cleared from CUDA's last error so that the framework never sees them.
#pragma once

#include "runtime/memory/device.h"

namespace vcudnn::memory {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device);
  bool ok() const { return ok_; }

  Event create_event() override;
  void destroy_event(Event event) override;
  bool record(Event event, Stream stream) override;
  bool wait(Stream waiter, Event event) override;
  bool capturing(Stream stream) override;
  EventState query(Event event) override;
  bool host_wait(Event event) override;
  Stream transfer_stream() override { return transfer_; }
  bool copy_to_host(void* host, uint64_t device, uint64_t bytes) override;
  bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) override;

 private:
  int device_;
  bool ok_ = false;
  Stream transfer_ = nullptr;
};

}  // namespace vcudnn::memory
