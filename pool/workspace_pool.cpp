// WorkspacePool (workspace_pool.h): best fit among free blocks, on the same stream first, then on
// another stream behind a device-side wait, else a new block after evicting free ones. Guarded by mu_.
//
// Policy:
//  - Requests round up to the granularity, clamped to min(capacity, per-stream capacity).
//  - A stream "holds" the bytes of every block whose `stream` it is, in use or free. Reusing
//    another stream's block moves it (and its bytes) to the acquiring stream; so does releasing
//    a block on another stream than it was acquired on.
//  - Eviction frees free blocks only, the acquiring stream's first, smallest first; a request
//    that blocks in use leave no room for fails before anything is freed.
//  - A backend allocate() failure frees every free block and tries once more.
//  - Nothing throws out: bad_alloc, a mutex error or a throwing backend make acquire() fail and
//    release()/trim() do nothing more. The state changes before each backend call, so an
//    exception leaves the pool consistent (at worst leaking that one block or event).
//
// Note [Blocks without an event]: a block whose release could not create or record its event
// has no device-side marker for the end of its last use, so no other stream may safely reuse it.
// It stays cached but bound to the stream it was released on: reuse there is ordered by the
// stream itself, and freeing it is stream-ordered on that stream too. The next successful
// release (event recorded) unbinds it. Freeing such blocks instead would throw away the common
// case (same-stream reuse) for nothing.
#include "pool/workspace_pool.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace vcudnn::pool {
namespace {

// used + need <= cap, without overflow.
bool fits(uint64_t used, uint64_t need, uint64_t cap) { return used <= cap && need <= cap - used; }

// `bytes` (<= limit) rounded up to a multiple of `granularity`, but never above `limit`.
uint64_t round_up(uint64_t bytes, uint64_t granularity, uint64_t limit) {
  const uint64_t rem = bytes % granularity;
  if (rem == 0) return bytes;
  const uint64_t pad = granularity - rem;
  return pad >= limit - bytes ? limit : bytes + pad;
}

}  // namespace

WorkspacePool::WorkspacePool(PoolBackend& backend, uint64_t capacity, uint64_t per_stream_capacity,
                             uint64_t granularity, Holding holding)
    : backend_(backend),
      capacity_(capacity),
      per_stream_capacity_(per_stream_capacity),
      granularity_(granularity == 0 ? 1 : granularity),
      holding_(holding) {}

WorkspacePool::~WorkspacePool() {
  // No lock: using a pool while it is destroyed is the caller's bug. Blocks still in use are
  // freed too (last resort), stream-ordered on the stream they were acquired on.
  while (!blocks_.empty()) {
    try {
      free_block(blocks_.begin());
    } catch (...) {
      // free_block() erased the entry before calling the backend: go on with the next one.
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Public entry points: lock, catch everything, count failures.

std::optional<Lease> WorkspacePool::acquire(StreamHandle stream, uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    ++stats_.acquires;
    if (bytes == 0) return Lease{};
    std::optional<Lease> lease = acquire_locked(stream, bytes);
    if (!lease) ++stats_.failures;
    return lease;
  } catch (...) {
    if (lock.owns_lock()) ++stats_.failures;
    return std::nullopt;
  }
}

void WorkspacePool::release(const Lease& lease, StreamHandle stream) {
  if (lease.ptr == nullptr) return;
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    auto it = blocks_.find(lease.id);
    if (it == blocks_.end() || !it->second.in_use || it->second.ptr != lease.ptr) return;  // stale or unknown
    Block& block = it->second;
    const StreamHandle previous = block.stream;
    block.in_use = false;
    stats_.in_use -= block.bytes;
    block.stream = stream;
    if (holding_ == Holding::kReturn) {  // Note [Workspace that lives for one call]: freed after the work on `stream`
      free_block(it);
      return;
    }
    block.stream_bound = true;  // until the event is recorded: Note [Blocks without an event]
    if (block.event == nullptr) block.event = backend_.create_event();
    if (block.event != nullptr && backend_.record(block.event, stream)) block.stream_bound = false;
    if (previous == stream) return;
    // The block moved to `stream`. If that puts the stream over its cap, give back this block: the
    // stream was within its cap before, and its other blocks are its established cache.
    if (!fits(held_by(stream), 0, per_stream_capacity_)) {
      free_block(it);
      return;
    }
    note_stream_peak(stream);
  } catch (...) {
    // Nothing to report through this API; the pool is consistent (see the top of the file).
  }
}

void WorkspacePool::trim() {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    free_all_free_blocks();
  } catch (...) {
  }
}

PoolStats WorkspacePool::stats() const {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
  } catch (...) {
    return PoolStats{};
  }
  return stats_;
}

// ---------------------------------------------------------------------------------------------
// Acquisition, in order of preference.

std::optional<Lease> WorkspacePool::acquire_locked(StreamHandle stream, uint64_t bytes) {
  const uint64_t limit = std::min(capacity_, per_stream_capacity_);
  if (bytes > limit) return std::nullopt;
  const uint64_t request = round_up(bytes, granularity_, limit);

  // 1. The smallest free block of this stream that is large enough: ordered by the stream itself.
  auto best = blocks_.end();
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    const Block& b = it->second;
    if (b.in_use || b.stream != stream || b.bytes < request) continue;
    if (best == blocks_.end() || b.bytes < best->second.bytes) best = it;
  }
  if (best != blocks_.end()) {
    ++stats_.reused;
    return hand_out(best);
  }
  // 2. Another stream's block, behind a device-side wait on its event. 3. A new block.
  if (std::optional<Lease> lease = reuse_from_other_stream(stream, request)) return lease;
  return allocate_block(stream, request);
}

std::optional<Lease> WorkspacePool::reuse_from_other_stream(StreamHandle stream, uint64_t request) {
  std::vector<std::pair<uint64_t, uint64_t>> candidates;  // (bytes, id), smallest first
  for (const auto& [id, b] : blocks_) {
    if (b.in_use || b.stream == stream || b.stream_bound || b.event == nullptr || b.bytes < request) continue;
    candidates.emplace_back(b.bytes, id);
  }
  std::sort(candidates.begin(), candidates.end());
  // Taking a block adds its bytes to `stream`; only the stream's free blocks can make room.
  const uint64_t pinned = in_use_by(stream);
  for (const auto& [bytes, id] : candidates) {
    if (!fits(pinned, bytes, per_stream_capacity_)) break;  // the next candidates are larger still
    auto it = blocks_.find(id);
    // A failed wait leaves the stream unordered after the block's last use: try the next one.
    if (!backend_.wait(stream, it->second.event)) continue;
    ++stats_.cross_stream_waits;
    ++stats_.reused;
    it->second.stream = stream;
    const Lease lease = hand_out(it);  // in use now, so evict() leaves it alone
    evict(stream, 0, 0);               // cannot fail: `pinned` + bytes fits
    note_stream_peak(stream);
    return lease;
  }
  return std::nullopt;
}

std::optional<Lease> WorkspacePool::allocate_block(StreamHandle stream, uint64_t request) {
  // Blocks in use cannot be freed: fail before evicting anything if they leave too little room.
  if (!fits(in_use_by(stream), request, per_stream_capacity_) || !fits(stats_.in_use, request, capacity_)) {
    return std::nullopt;
  }
  if (!evict(stream, request, request)) return std::nullopt;
  void* ptr = allocate_with_retry(stream, request);
  if (ptr == nullptr) return std::nullopt;
  ++stats_.allocations;
  Blocks::iterator it;
  try {
    it = blocks_.try_emplace(next_id_++).first;
  } catch (...) {
    ++stats_.frees;
    backend_.release(ptr, stream);
    throw;
  }
  it->second = Block{ptr, request, stream, nullptr, false, false};
  stats_.reserved += request;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  note_stream_peak(stream);
  return hand_out(it);
}

void* WorkspacePool::allocate_with_retry(StreamHandle stream, uint64_t request) {
  if (void* ptr = backend_.allocate(request, stream)) return ptr;
  // The backend may be short because of what we cache (or its own pool may then have room).
  free_all_free_blocks();
  return backend_.allocate(request, stream);
}

Lease WorkspacePool::hand_out(Blocks::iterator it) {
  // A fresh id per lease (re-keying a node allocates nothing): see Blocks.
  auto node = blocks_.extract(it);
  node.key() = next_id_++;
  Block& block = node.mapped();
  block.in_use = true;
  stats_.in_use += block.bytes;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  const Lease lease{block.ptr, block.bytes, node.key()};
  blocks_.insert(std::move(node));
  return lease;
}

// ---------------------------------------------------------------------------------------------
// Eviction and freeing.

// Frees free blocks until `stream` has room for `stream_need` more bytes and the pool for
// `total_need` more: the stream's own blocks first (they help with both caps), then other streams'
// (they help with the total only), smallest first within each. False if that is not enough.
bool WorkspacePool::evict(StreamHandle stream, uint64_t stream_need, uint64_t total_need) {
  uint64_t held = held_by(stream);
  auto stream_over = [&] { return !fits(held, stream_need, per_stream_capacity_); };
  auto total_over = [&] { return !fits(stats_.reserved, total_need, capacity_); };
  if (!stream_over() && !total_over()) return true;

  std::vector<std::tuple<bool, uint64_t, uint64_t>> victims;  // (another stream's, bytes, id)
  for (const auto& [id, b] : blocks_) {
    if (!b.in_use) victims.emplace_back(b.stream != stream, b.bytes, id);
  }
  std::sort(victims.begin(), victims.end());
  for (const auto& [other, bytes, id] : victims) {
    if (!stream_over() && !total_over()) break;
    if (other && !total_over()) break;
    if (!other) held -= bytes;
    free_block(blocks_.find(id));
  }
  return !stream_over() && !total_over();
}

void WorkspacePool::free_block(Blocks::iterator it) {
  const Block block = it->second;
  blocks_.erase(it);  // first, so that a throwing backend cannot leave a dangling entry
  stats_.reserved -= block.bytes;
  if (block.in_use) stats_.in_use -= block.bytes;  // only the destructor frees blocks in use
  ++stats_.frees;
  if (block.event != nullptr) backend_.destroy_event(block.event);
  backend_.release(block.ptr, block.stream);
}

void WorkspacePool::free_all_free_blocks() {
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    auto next = std::next(it);
    if (!it->second.in_use) free_block(it);
    it = next;
  }
}

uint64_t WorkspacePool::held_by(StreamHandle stream) const {
  uint64_t sum = 0;
  for (const auto& [id, b] : blocks_) {
    if (b.stream == stream) sum += b.bytes;
  }
  return sum;
}

uint64_t WorkspacePool::in_use_by(StreamHandle stream) const {
  uint64_t sum = 0;
  for (const auto& [id, b] : blocks_) {
    if (b.in_use && b.stream == stream) sum += b.bytes;
  }
  return sum;
}

void WorkspacePool::note_stream_peak(StreamHandle stream) {
  stats_.peak_stream_reserved = std::max(stats_.peak_stream_reserved, held_by(stream));
}

}  // namespace vcudnn::pool
