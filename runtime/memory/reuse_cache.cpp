// ReuseCache (see header): an open-addressing table of LIFO lists threaded through the buffers.
#include "runtime/memory/reuse_cache.h"

#include "planner/mix64.h"

namespace vcudnn::memory {

ReuseCache::Slot& ReuseCache::slot_for(uint64_t key) {
  const size_t mask = slots_.size() - 1;
  // Spans are multiples of 512, their low bits all alike: mixed before masking.
  for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key || slots_[i].key == 0) return slots_[i];
  }
}

void ReuseCache::grow() {
  std::vector<Slot> old(slots_.empty() ? 64 : slots_.size() * 2);
  old.swap(slots_);
  for (const Slot& s : old) {
    if (s.key != 0) slot_for(s.key) = s;
  }
}

void ReuseCache::put(Buffer* b, uint32_t stream_id, uint64_t interval) {
  const uint64_t key = key_of(b->span, stream_id);
  if (2 * (keys_ + 1) > slots_.size()) grow();
  Slot& s = slot_for(key);
  if (s.key == 0) {
    s.key = key;
    ++keys_;
  }
  b->next_cached = s.head;
  b->cached = true;
  b->cached_stream = stream_id;
  b->cached_interval = interval;
  s.head = b;
  ++count_;
  bytes_ += b->span;
}

Buffer* ReuseCache::take(uint64_t span, uint32_t stream_id) {
  if (count_ == 0) return nullptr;
  Slot& s = slot_for(key_of(span, stream_id));
  Buffer* b = s.head;
  if (!b) return nullptr;
  s.head = b->next_cached;
  b->next_cached = nullptr;
  b->cached = false;
  --count_;
  bytes_ -= b->span;
  return b;
}

}  // namespace vcudnn::memory
