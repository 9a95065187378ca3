// The device seen by the memory runtime: events, stream-ordered waits and the transfer stream's
// copies. Everything here is asynchronous except host_wait(), the one call that blocks the host
// (on a single event, never the whole device); the runtime counts every use of it by cause
// (host_waits.h). CUDA-free so that the CPU tests can run the memory runtime on a simulated
// device (tests/cpu/sim_device.h); the CUDA implementation is cuda_device.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

namespace vcudnn::memory {

using Stream = cudaStream_t;  // nullptr: the legacy default stream
using Event = void*;          // cudaEvent_t

enum class EventState { kDone, kPending, kFailed };

class Device {
 public:
  virtual ~Device() = default;
  virtual Event create_event() = 0;  // nullptr on failure
  // An event that also keeps the time its record ran, for elapsed_ms(). Recording one costs a little
  // more; the runtime uses them only to measure how long a stream stood waiting for a copy.
  virtual Event create_timed_event() = 0;
  virtual void destroy_event(Event event) = 0;
  // Milliseconds from `from`'s record running to `to`'s (negative when `to` ran first); both timed
  // events. nullopt while either has not run, or on failure. Never blocks.
  virtual std::optional<float> elapsed_ms(Event from, Event to) = 0;
  // Records `event` after everything queued on `stream` so far. false on failure, or when the
  // stream is being captured into a CUDA graph (an event there would become part of the graph).
  virtual bool record(Event event, Stream stream) = 0;
  // `waiter` waits on the device for `event` (cudaStreamWaitEvent); never blocks the host. false on
  // failure, or when `waiter` is being captured (the wait on an event recorded outside the capture
  // would join the graph): the caller then waits on the host.
  virtual bool wait(Stream waiter, Event event) = 0;
  // Whether `stream` is being captured into a CUDA graph now.
  virtual bool capturing(Stream stream) = 0;
  virtual EventState query(Event event) = 0;  // never blocks
  virtual bool host_wait(Event event) = 0;    // blocks the host until `event` completed
  // Copies out (device to host) are queued in order on out_stream(), copies back on in_stream(): the
  // two directions of the link run at once, and a copy back never queues behind copies out.
  virtual Stream out_stream() = 0;
  virtual Stream in_stream() = 0;
  virtual bool copy_to_host(void* host, uint64_t device, uint64_t bytes) = 0;
  virtual bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) = 0;
};

}  // namespace vcudnn::memory
