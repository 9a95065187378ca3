#include "pool/buffer_index.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

namespace vcudnn::pool {

namespace {

// Counts a writer as waiting from before it asks for the lock until it has released it.
class WriterGuard {
 public:
  explicit WriterGuard(std::atomic<uint32_t>& waiting) : waiting_(waiting) {
    waiting_.fetch_add(1, std::memory_order_acq_rel);
  }
  ~WriterGuard() { waiting_.fetch_sub(1, std::memory_order_acq_rel); }
  WriterGuard(const WriterGuard&) = delete;
  WriterGuard& operator=(const WriterGuard&) = delete;

 private:
  std::atomic<uint32_t>& waiting_;
};

}  // namespace

std::shared_lock<std::shared_mutex> BufferIndex::read_lock() const {
  while (writers_waiting_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  return std::shared_lock(mutex_);
}

bool BufferIndex::add(uint64_t address, uint64_t bytes, uint64_t id) {
  if (bytes == 0 || address > UINT64_MAX - bytes) return false;
  try {
    WriterGuard guard(writers_waiting_);
    std::unique_lock lock(mutex_);
    const uint64_t end = address + bytes;
    auto next = buffers_.lower_bound(address);  // first buffer at or after address
    if (next != buffers_.end() && next->first < end) return false;
    if (next != buffers_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.bytes > address) return false;
    }
    // Widen the prefilter before the buffer becomes findable, so it never hides it.
    if (address < min_.load(std::memory_order_relaxed)) min_.store(address, std::memory_order_release);
    if (end > max_.load(std::memory_order_relaxed)) max_.store(end, std::memory_order_release);
    buffers_.emplace_hint(next, address, Entry{bytes, id});
    return true;
  } catch (...) {  // bad_alloc, or a lock failure
    return false;
  }
}

bool BufferIndex::remove(uint64_t address) {
  try {
    WriterGuard guard(writers_waiting_);
    std::unique_lock lock(mutex_);
    auto it = buffers_.find(address);
    if (it == buffers_.end()) return false;
    buffers_.erase(it);
    update_range_locked();  // shrink only after the buffer is gone
    return true;
  } catch (...) {
    return false;
  }
}

void BufferIndex::update_range_locked() {
  if (buffers_.empty()) {
    min_.store(UINT64_MAX, std::memory_order_release);
    max_.store(0, std::memory_order_release);
    return;
  }
  // Buffers never overlap, so the one with the highest address also has the highest end.
  const auto& last = *buffers_.rbegin();
  min_.store(buffers_.begin()->first, std::memory_order_release);
  max_.store(last.first + last.second.bytes, std::memory_order_release);
}

std::optional<Hit> BufferIndex::find_locked(uint64_t pointer) const {
  auto it = buffers_.upper_bound(pointer);  // first buffer starting after pointer
  if (it == buffers_.begin()) return std::nullopt;
  --it;
  const uint64_t offset = pointer - it->first;
  if (offset >= it->second.bytes) return std::nullopt;
  return Hit{it->second.id, it->first, offset};
}

std::optional<Hit> BufferIndex::find(uint64_t pointer) const {
  if (pointer < prefilter_min() || pointer >= prefilter_max()) return std::nullopt;
  try {
    auto lock = read_lock();
    return find_locked(pointer);
  } catch (...) {
    return std::nullopt;
  }
}

size_t BufferIndex::size() const {
  try {
    auto lock = read_lock();
    return buffers_.size();
  } catch (...) {
    return 0;
  }
}

namespace {

// Looks up each 8-byte word of [data + first, data + bytes) at steps of 8 and appends hits on
// buffers not yet in `hits`. The index's lock is held shared by the caller.
template <typename Lookup>
void scan_block(const unsigned char* data, size_t first, size_t bytes, uint64_t lo, uint64_t hi, const Lookup& lookup,
                HitList& hits) {
  for (size_t k = first; k + 8 <= bytes; k += 8) {
    uint64_t word;
    std::memcpy(&word, data + k, sizeof word);
    if (word < lo || word >= hi) continue;
    std::optional<Hit> hit = lookup(word);
    if (!hit) continue;
    if (!hits.contains(hit->id)) hits.push_back(*hit);
  }
}

}  // namespace

HitList scan_params(const BufferIndex& index, const std::vector<ParamSlot>& layout, void** args) {
  HitList hits;
  if (args == nullptr) return hits;
  try {
    auto lock = index.read_lock();
    const uint64_t lo = index.prefilter_min(), hi = index.prefilter_max();
    if (lo >= hi) return hits;  // nothing tracked
    auto lookup = [&](uint64_t p) { return index.find_locked(p); };
    for (size_t i = 0; i < layout.size(); ++i) {
      const ParamSlot& slot = layout[i];
      if (slot.size < 8 || slot.size > kMaxParamBytes || args[i] == nullptr) continue;
      const size_t first = (8 - slot.offset % 8) % 8;  // first offset inside that is 8-aligned in the layout
      scan_block(static_cast<const unsigned char*>(args[i]), first, slot.size, lo, hi, lookup, hits);
    }
  } catch (...) {  // bad_alloc: report what was found
  }
  return hits;
}

HitList scan_words(const BufferIndex& index, const void* data, size_t bytes) {
  HitList hits;
  if (data == nullptr || bytes < 8) return hits;
  try {
    auto lock = index.read_lock();
    const uint64_t lo = index.prefilter_min(), hi = index.prefilter_max();
    if (lo >= hi) return hits;
    auto lookup = [&](uint64_t p) { return index.find_locked(p); };
    scan_block(static_cast<const unsigned char*>(data), 0, bytes, lo, hi, lookup, hits);
  } catch (...) {
  }
  return hits;
}

}  // namespace vcudnn::pool
