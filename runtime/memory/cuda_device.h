// CudaDevice: the memory runtime's Device (device.h) on the CUDA runtime: two non-blocking
// transfer streams per GPU (out and in), events without timing, every call on the arena's GPU whatever the
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
  Event create_timed_event() override;
  void destroy_event(Event event) override;
  std::optional<float> elapsed_ms(Event from, Event to) override;
  bool record(Event event, Stream stream) override;
  bool wait(Stream waiter, Event event) override;
  bool capturing(Stream stream) override;
  EventState query(Event event) override;
  bool host_wait(Event event) override;
  Stream out_stream() override { return out_; }
  Stream in_stream() override { return in_; }
  bool copy_to_host(void* host, uint64_t device, uint64_t bytes) override;
  bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) override;

 private:
  int device_;
  bool ok_ = false;
  Stream out_ = nullptr;  // copies out
  Stream in_ = nullptr;   // copies back
};

}  // namespace vcudnn::memory
