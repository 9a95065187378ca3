// ReuseCache: buffers freed on a stream, kept whole for the next allocation of the same span on the
// same stream, once accesses are no longer tracked (Note [Reuse without a budget] in
// memory_manager.cpp). A training loop allocates and frees the same sizes every step: taking the
// last buffer of that size freed on that stream costs a table probe and a list pop, where the
// arena's best fit walks ordered maps and merges ranges (2.5 us a call on the H100's host).
//
// Stream order makes the reuse safe without an event: the new owner's work is queued behind the
// free on the same stream. The cache only keeps the buffers; the manager decides when they go back
// to the arena (flush) and with which tags. Not thread-safe: the manager's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/memory/buffer.h"

namespace vcudnn::memory {

class ReuseCache {
 public:
  // Keeps `b` (freed on stream `stream_id`, StreamOrder's id, below 512) during `interval`.
  void put(Buffer* b, uint32_t stream_id, uint64_t interval);
  // The buffer of `span` bytes freed last on `stream_id`, or nullptr.
  Buffer* take(uint64_t span, uint32_t stream_id);
  // Every buffer out of the cache, each given to `each(Buffer*, stream_id)`.
  template <typename F>
  void drain(F&& each) {
    drain_if([](const Buffer*) { return true; }, each);
  }
  // The buffers put before `interval` (kept a whole interval without reuse) out of the cache.
  template <typename F>
  void drain_before(uint64_t interval, F&& each) {
    drain_if([interval](const Buffer* b) { return b->cached_interval < interval; }, each);
  }
  // The buffers of one stream out (it is being destroyed: its id may be given to another stream).
  template <typename F>
  void drain_stream(uint32_t stream_id, F&& each) {
    drain_if([stream_id](const Buffer* b) { return b->cached_stream == stream_id; }, each);
  }
  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Slot {
    uint64_t key = 0;  // span | stream id; 0: empty (a span is at least 512)
    Buffer* head = nullptr;
  };
  static uint64_t key_of(uint64_t span, uint32_t stream_id) { return span | stream_id; }
  Slot& slot_for(uint64_t key);  // its slot, or the empty one where it would go
  void grow();
  // Unlinks every cached buffer `stale` accepts. The lists run newest first, and what each predicate
  // above accepts in a list of one stream and span is a suffix for drain_before, anything otherwise:
  // a plain walk serves both.
  template <typename Stale, typename F>
  void drain_if(Stale&& stale, F&& each) {
    for (Slot& s : slots_) {
      Buffer** link = &s.head;
      while (Buffer* b = *link) {
        if (!stale(b)) {
          link = &b->next_cached;
          continue;
        }
        *link = b->next_cached;
        b->next_cached = nullptr;
        b->cached = false;
        --count_;
        bytes_ -= b->span;
        each(b, b->cached_stream);
      }
    }
  }

  std::vector<Slot> slots_;  // open addressing, linear probing, a power of two long; keys never removed
  size_t keys_ = 0;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace vcudnn::memory
