// Residency: the mechanism that moves a large buffer's bytes to pinned host memory and back, at the
// same address, ordered by events alone (no host synchronisation). What moves is the buffer's
// moving part (Buffer::moving_address/bytes: all of it, unless the plan keeps its first granules:
// Note [Moving part of a buffer]):
//  - evict: the out stream waits for fences on every stream that used the buffer, copies it
//    out, and the buffer is kEvicting: still mapped and valid. Once that copy has finished (polled
//    by finish_eviction), its granules are unmapped: kEvicted. An access meanwhile cancels the
//    eviction; the bytes never left.
//  - restore: map fresh granules, copy back on the in stream (so a copy back never waits behind
//    copies out, and both directions of the link are used at once); the consumer stream waits for
//    the copy's end (`ready`); other streams are ordered after it when they touch the buffer.
// Which buffers go, and when, is decided elsewhere (eviction_policy.h, memory_manager.cpp). Every
// call comes with the manager's lock held.
//
// Note [Copies back in pieces]
// A placed buffer comes back onto pool bytes that buffers laid out in its absence held, and its
// copy back may write a byte only once the last of them has finished with it (their frees' tags).
// Waiting for all of them, the whole copy started when the last one's last use ended: on VGG-16
// under micro-batching at 90 % (H100) conv1_1's output, 784 MiB and 15 ms on the link, started
// 13 ms before its use and the backward pass stood 1.8 ms for it. The holders of its first bytes
// are often long gone by then. So the copy goes in pieces of set_copy_piece() bytes: each waits for
// the tags of its own bytes alone, and the pieces are queued in the order their holders finished
// (the latest of a piece's tags; pieces no one held first), so that on the in stream no piece
// waits behind one whose holders are still at work. This helps where the host runs ahead of the
// device (it queues the copy back as the plan's point comes, and the device reaches the holders'
// frees later: 28 ms later there); the plan's model still starts the copy at its point. Both ways
// back go in pieces: from the evicted state (restore) and before the host has seen the copy out end
// (resume_back: Note [Back before the copy out ended], the usual way on the H100: 10 of 11 copies
// back of VGG-16, 40 of 44 of ResNet-50), there each piece also after the copy out's pieces up to it.
//
// Note [Exact fences for vcudnn's copies]
// StreamOrder fences a mark lazily, when someone first waits on it, and a fence recorded then
// covers everything queued on the stream by that time. For the copy streams that is wrong: a plan
// queues its copies out early in the forward pass (five of 98-196 MiB within 2 ms of host time on
// ResNet-50 b64 at 90 %), and a buffer placed over the first one's bytes waited on a fence that
// also covered the four behind it: the GPU stood 12 ms where 4 were due (scripts/bench/
// profile_step.py --gaps; the same for copies back in the backward pass). So each copy out and copy
// back gets its own fence as it is queued (one event record), and a wait takes the earliest fence
// that covers its mark.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "pool/host_pool.h"
#include "pool/vmm_arena.h"
#include "runtime/memory/buffer.h"
#include "runtime/memory/device.h"
#include "runtime/memory/stream_order.h"

namespace vcudnn::memory {

class Residency {
 public:
  Residency(pool::VmmArena& arena, pool::HostPool& host, Device& device, StreamOrder& order);

  // A placed buffer's copy out goes in pieces of `bytes` (0: whole), each with a fence of its own
  // (Buffer::copied_pieces; Note [Copies out in pieces], planner/offload_plan.h).
  void set_copy_piece(uint64_t bytes) { piece_ = bytes; }
  // Starts the eviction of each victim that can get host memory; returns those (now kEvicting).
  std::vector<Buffer*> start_eviction(const std::vector<Buffer*>& victims);
  // A kEvicting buffer whose copy has finished is unmapped (kEvicted): true. false while the copy
  // is in flight, or when the unmap failed (then the buffer is kResident again, nothing lost).
  bool finish_eviction(Buffer* b);
  // An access needs a kEvicting buffer: it is kResident again at once.
  void cancel_eviction(Buffer* b);
  // A kEvicting placed buffer whose pool bytes went to others (a hand-over) is wanted back before
  // its copy out ended: the eviction counts as done without unmapping its range, and the copy back
  // is queued after the copy out and after `waits` (the frees of those who held its bytes), all on
  // the device (Note [Back before the copy out ended]); with `by_piece`, in pieces as copy_back()
  // (each also after the copy out). false on failure (nothing queued).
  bool resume_back(Buffer* b, std::optional<Stream> consumer, pool::TagSet waits,
                   std::vector<pool::TagSet>* by_piece = nullptr);
  // Maps a kEvicted buffer again (the caller made room) and queues the copy back; `consumer` (when
  // known) waits for it on the device. false (still kEvicted, bytes kept) on failure.
  bool restore(Buffer* b, std::optional<Stream> consumer);
  // The copy back alone, for a buffer its caller mapped again (a placed one: the pool maps it),
  // ordered after `waits` (those who held the memory before). With `by_piece` (the same tags split
  // by piece of set_copy_piece() bytes: PlacedPool::restore) it goes in pieces, each after the
  // holders of its own bytes alone (Note [Copies back in pieces]). false (unmapped again, still
  // kEvicted) on failure.
  bool copy_back(Buffer* b, std::optional<Stream> consumer, const pool::TagSet& waits,
                 const std::vector<pool::TagSet>* by_piece = nullptr);
  uint64_t copy_piece() const { return piece_; }
  // Releases the host blocks of a buffer that is being freed.
  void drop_host_copy(Buffer* b);

  // Note [Timing the waits for vcudnn's copies]: with timing on (VCUDNN_LOG_ITERATIONS), each copy
  // back also records timed events on the in stream where the stream got to it, where the waits
  // for the memory's previous holders had passed, and at its end: whether a late copy waited for
  // them, or ran slow, or neither (then it was queued late, or behind other copies back).
  void time_copies_back(bool on) { time_back_ = on; }
  struct CopyTime {
    uint64_t bytes = 0;
    double held_ms = 0;  // the in stream waiting for the memory's previous holders
    double copy_ms = 0;  // the copy itself
  };
  std::vector<CopyTime> take_copy_times();  // those whose end has run; never blocks
  ~Residency();
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  struct Stats {
    uint64_t evictions = 0;  // copies out finished and unmapped
    uint64_t restores = 0;
    uint64_t bytes_evicted = 0;
    uint64_t bytes_restored = 0;
    uint64_t started = 0;    // evictions started
    uint64_t cancelled = 0;  // evictions an access cancelled
    uint64_t no_host_memory = 0;
    uint64_t failures = 0;
    uint64_t restores_in_pieces = 0;  // copies back queued piece by piece (Note [Copies back in pieces])
  };
  const Stats& stats() const { return stats_; }

 private:
  bool take_host_blocks(Buffer* b);
  // Queues the copy of bytes [lo, hi) of its moving part from its host blocks, on the in stream.
  bool copy_range_back(const Buffer* b, uint64_t lo, uint64_t hi);
  // Unmaps an evicted buffer's memory: the arena's, or its slot of a static placement.
  bool unmap(Buffer* b);

  pool::VmmArena& arena_;
  pool::HostPool& host_;
  Device& device_;
  StreamOrder& order_;
  uint32_t out_id_ = 0;                   // the device's out stream
  uint32_t in_id_ = 0;                    // the device's in stream
  std::optional<pool::FreeTag> last_in_;  // the latest copy back queued
  Stats stats_;
  struct Timing {
    Event pre = nullptr, start = nullptr, end = nullptr;
    uint64_t bytes = 0;
  };
  Event timed_event();
  bool time_back_ = false;
  uint64_t piece_ = 0;  // set_copy_piece
  std::deque<Timing> timings_;
  std::vector<Event> spare_events_, all_events_;
};

}  // namespace vcudnn::memory
