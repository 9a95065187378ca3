// HostPool (host_pool.h). Guarded by mu_.
//
// Policy:
//  - Slabs come only from reserve(), never more than budget / slab_bytes of them, and go back to
//    the backend only in the destructor (blocks still out are not a reason to keep them: the
//    pool's owner outlives the copies).
//  - A request rounds up to 2 MiB and takes the smallest free range that fits, across all slabs
//    (ties: the slab reserved first, then the lowest offset), at that range's low end. Since
//    slab sizes, block sizes and offsets are all multiples of 2 MiB, so is every free range.
//  - A release gives the block's range back to its slab, merged with its free neighbours.
#include "pool/host_pool.h"

#include "pool/align.h"

#include <utility>

namespace vcudnn::pool {

HostPool::HostPool(HostBackend& backend, uint64_t budget, uint64_t slab_bytes) : backend_(backend), budget_(budget) {
  const std::optional<uint64_t> slab = round_up(slab_bytes, kAlign);
  if (slab) slab_bytes_ = *slab;
  stats_.budget = budget_;
  stats_.slab_bytes = slab_bytes_;
}

HostPool::~HostPool() {
  for (const Slab& slab : slabs_) {
    try {
      backend_.free_pinned(reinterpret_cast<void*>(slab.base));
    } catch (...) {
    }
  }
}

bool HostPool::reserve(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (!ok()) return false;
    const uint64_t max_slabs = budget_ / slab_bytes_;
    const std::optional<uint64_t> rounded = round_up(bytes, slab_bytes_);
    const uint64_t wanted = rounded ? *rounded / slab_bytes_ : max_slabs;
    const uint64_t target = wanted < max_slabs ? wanted : max_slabs;
    if (slabs_.size() >= target) return true;
    slabs_.reserve(target);  // so that recording a slab below cannot throw
    while (slabs_.size() < target) {
      Slab slab;
      slab.free.emplace(0, slab_bytes_);
      void* ptr = backend_.allocate_pinned(slab_bytes_);
      if (ptr == nullptr) return false;
      slab.base = reinterpret_cast<uintptr_t>(ptr);
      slabs_.push_back(std::move(slab));
      ++stats_.slabs;
      stats_.held_bytes += slab_bytes_;
    }
    return true;
  } catch (...) {
    // A throwing backend: nothing was recorded for the slab it did not return.
    return false;
  }
}

std::optional<HostBlock> HostPool::acquire(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (bytes == 0) return HostBlock{};
    const auto fail = [&]() -> std::optional<HostBlock> {
      ++stats_.failures;
      return std::nullopt;
    };
    if (!ok() || bytes > slab_bytes_) return fail();
    const uint64_t size = *round_up(bytes, kAlign);  // <= slab_bytes_, itself a multiple of kAlign
    Slab* best_slab = nullptr;
    size_t best_index = 0;
    std::map<uint64_t, uint64_t>::iterator best;
    for (size_t i = 0; i < slabs_.size(); ++i) {
      for (auto it = slabs_[i].free.begin(); it != slabs_[i].free.end(); ++it) {
        if (it->second < size) continue;
        if (best_slab == nullptr || it->second < best->second) {
          best_slab = &slabs_[i];
          best_index = i;
          best = it;
        }
      }
    }
    if (best_slab == nullptr) return fail();
    const uint64_t offset = best->first;
    const uint64_t range = best->second;
    const uintptr_t address = best_slab->base + offset;
    blocks_.emplace(address, Block{best_index, offset, size});  // the only step that can throw
    if (range > size) {
      // The rest of the range keeps its node, re-keyed: no allocation.
      auto node = best_slab->free.extract(best);
      node.key() = offset + size;
      node.mapped() = range - size;
      best_slab->free.insert(std::move(node));
    } else {
      best_slab->free.erase(best);
    }
    ++stats_.acquires;
    stats_.in_use_bytes += size;
    if (stats_.in_use_bytes > stats_.peak_in_use_bytes) stats_.peak_in_use_bytes = stats_.in_use_bytes;
    return HostBlock{reinterpret_cast<void*>(address), size};
  } catch (...) {
    if (lock.owns_lock()) ++stats_.failures;
    return std::nullopt;
  }
}

bool HostPool::release(void* ptr) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    const auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == blocks_.end()) return false;
    const Block block = it->second;
    std::map<uint64_t, uint64_t>& free = slabs_[block.slab].free;
    const uint64_t end = block.offset + block.bytes;
    // Merged with the free range just after and the one just before; a new node (the only
    // allocation, before anything changes) only when neither is adjacent.
    const auto next = free.find(end);
    const uint64_t next_bytes = next == free.end() ? 0 : next->second;
    auto prev = free.lower_bound(block.offset);
    bool merge_prev = false;
    if (prev != free.begin()) {
      --prev;
      merge_prev = prev->first + prev->second == block.offset;
    }
    if (merge_prev) {
      prev->second += block.bytes + next_bytes;
      if (next != free.end()) free.erase(next);
    } else if (next != free.end()) {
      auto node = free.extract(next);
      node.key() = block.offset;
      node.mapped() = block.bytes + next_bytes;
      free.insert(std::move(node));
    } else {
      free.emplace(block.offset, block.bytes);
    }
    blocks_.erase(it);
    stats_.in_use_bytes -= block.bytes;
    return true;
  } catch (...) {
    return false;
  }
}

HostPool::Stats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats = stats_;
  stats.largest_free_block = 0;
  for (const Slab& slab : slabs_) {
    for (const auto& [offset, size] : slab.free) {
      if (size > stats.largest_free_block) stats.largest_free_block = size;
    }
  }
  return stats;
}

}  // namespace vcudnn::pool
