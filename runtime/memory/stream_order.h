// StreamOrder: where each stream's work stands, known without blocking the host. A tag (pool/
// free_tags.h) names a point in one stream's order: mark() makes one for "everything queued on the
// stream so far" without touching the device. Only when someone needs to know whether a tag is
// settled, or must make another stream wait for it, is an event (a fence) recorded; fences are
// shared by every tag they cover and polled, never waited for, except by wait_host(), which
// callers count (host_waits.h).
//
// Streams are numbered in order of first sight (id 1, 2, ...). nullptr and cudaStreamLegacy are
// one stream. cudaStreamPerThread means a different stream on every thread, so it is never "the
// same stream" as anything; it is fenced through the legacy stream, which orders after all prior
// work of blocking streams, per-thread default streams included.
//
// Thread-safe: one mutex; id_of() is lock-free on a thread that saw the stream before.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/free_tags.h"
#include "runtime/memory/device.h"

namespace vcudnn::memory {

class StreamOrder {
 public:
  explicit StreamOrder(Device& device);
  ~StreamOrder();  // destroys every event it made
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  uint32_t id_of(Stream stream);
  // One bit per stream id for access masks; ids from 63 on share bit 63.
  static uint64_t bit_of(uint32_t id) { return id < 63 ? 1ull << id : 1ull << 63; }
  std::vector<uint32_t> ids_in(uint64_t mask) const;

  // A point in stream `id`'s order after everything queued on it so far. Records nothing.
  pool::FreeTag mark(uint32_t id);
  // Whether the device has finished everything up to `tag` (polls; never blocks). A tag that is
  // not settled gets a fence if none covers it yet, so that it settles without further help.
  bool settled(const pool::FreeTag& tag);
  // Keeps a fence in flight on stream `id` covering its latest mark, when none is in flight: then
  // what was marked settles soon after the device gets there, without anyone waiting for it.
  void fence_ahead(uint32_t id);
  // A fence covering stream `id`'s latest mark now, unless one does already: for a mark that others
  // will wait on alone (vcudnn's copies: Note [Exact fences for vcudnn's copies]).
  void fence(uint32_t id);
  // A fence on every stream covering its latest mark (a stream capture is about to begin: once a
  // stream is capturing, nothing can be recorded on it, yet what was queued before must settle).
  void fence_all();
  // `waiter` waits on the device for everything stream `id` will run of what was queued on it so
  // far (Note [Evicting while a stream is captured]). false when that cannot be ordered.
  bool order_after_queued(Stream waiter, uint32_t id);
  // `waiter` waits on the device for `tag`; nothing when it is settled or `waiter` is the tag's own
  // stream. false when no fence could be recorded (the stream is being captured, or CUDA failed).
  // A wait on a timed stream's tag with a non-zero `cookie` is timed (take_waits()).
  bool order(Stream waiter, const pool::FreeTag& tag, uint64_t cookie = 0);

  // Note [Timing the waits for vcudnn's copies]
  // Whether a copy came too late is a question about the device's clock, not the host's: the host
  // usually runs ahead, so a copy not done when the host queues its consumer may still be done long
  // before the consumer runs. Fences on a stream named here are timed events, and a timed wait
  // (order() with a cookie) records a timed probe on the waiter just before its wait: once both
  // have run, the fence's time less the probe's is how long the waiter stood still for the copy
  // (nothing when negative). At most kMostProbes are in flight (the rest are not timed) and as
  // many samples are kept for take_waits(), the newest.
  void time_waits_on(uint32_t id);
  struct WaitSample {
    uint32_t stream = 0;  // the tag's
    uint64_t cookie = 0;
    double waited_ms = 0;  // 0 when the copy was done before the waiter got there
  };
  // The timed waits whose probe and fence have both run since the last call. Never blocks.
  std::vector<WaitSample> take_waits();
  static constexpr size_t kMostProbes = 4096;
  // The host waits for `tag`. false on failure.
  bool wait_host(const pool::FreeTag& tag);
  // `stream` is about to be destroyed: a last fence covers its marks, and a new stream that gets
  // the same handle gets a new id.
  void retire(Stream stream);

  // The marks of `stream` (nullopt: of every stream) now. After the program waited for those
  // streams (cudaStreamSynchronize, cudaDeviceSynchronize), settle(snapshot) records that
  // everything they marked before is done, without a fence.
  using Snapshot = std::vector<std::pair<uint32_t, uint64_t>>;
  Snapshot snapshot(std::optional<Stream> stream) const;
  void settle(const Snapshot& snapshot);

  struct Stats {
    uint64_t streams = 0;       // ids given
    uint64_t fences = 0;        // events recorded
    uint64_t stream_waits = 0;  // order() calls that made a stream wait
    uint64_t host_waits = 0;    // wait_host() calls that blocked
    uint64_t failures = 0;      // events that could not be made, recorded or queried
    uint64_t timed_waits = 0;   // order() calls that recorded a probe
    uint64_t untimed_waits = 0;  // order() calls with a cookie not timed (kMostProbes in flight)
  };
  Stats stats() const;

 private:
  struct Fence {
    Event event = nullptr;
    uint64_t seq = 0;    // covers every mark up to this
    bool timed = false;  // a timed event (its stream's waits are timed)
  };
  struct State {
    Stream handle = nullptr;  // normalised
    bool per_thread = false;
    bool retired = false;
    uint64_t marks = 0;
    uint64_t done = 0;    // every mark up to this is settled
    uint64_t fenced = 0;  // the latest mark a fence was recorded for
    bool timed = false;   // fences are timed events (time_waits_on)
    std::deque<Fence> fences;
  };
  struct Probe {
    Event probe = nullptr;  // on the waiter, before its wait
    Event fence = nullptr;
    uint32_t stream = 0;
    uint64_t cookie = 0;
  };

  // All below with mu_ held.
  uint32_t register_locked(Stream stream);
  State& state(uint32_t id) { return states_[id - 1]; }
  void poll(State& st);
  const Fence* ensure_fence(State& st, uint64_t seq);
  Event take_event(bool timed);
  void drop_fence(State& st);
  void read_probes(bool all);  // the oldest fence has run: its event is free (unless a probe reads it)
  bool same_stream(Stream waiter, const State& st) const;

  Device& device_;
  mutable std::mutex mu_;
  std::deque<State> states_;                  // by id - 1
  std::unordered_map<Stream, uint32_t> ids_;  // live handles
  std::vector<Event> free_events_;
  std::vector<Event> free_timed_;  // timed events: fences of timed streams, and probes
  std::vector<Event> all_events_;
  std::deque<Probe> probes_;
  std::vector<WaitSample> samples_;                 // read, not yet taken
  std::unordered_map<Event, uint32_t> probe_refs_;  // a timed fence's probes not yet read
  std::vector<Event> orphans_;                      // fences that ran while probes still read them
  Stats stats_;
};

}  // namespace vcudnn::memory
