// PlacedPool (placed_pool.h).
#include "pool/placed_pool.h"

#include <algorithm>

namespace vcudnn::pool {

PlacedPool::PlacedPool(PhysicalBackend& backend, uint64_t granularity, std::vector<uint64_t> cuts,
                       std::vector<Slot> slots)
    : backend_(backend), g_(granularity) {
  try {
    if (g_ == 0 || cuts.size() < 2 || cuts.front() != 0 || !std::is_sorted(cuts.begin(), cuts.end())) return;
    const uint64_t pool = cuts.back();
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      if (cuts[i + 1] > cuts[i]) blocks_.push_back({cuts[i], cuts[i + 1] - cuts[i], 0});
    // A slot's range shows the whole blocks its granules lie in (the driver maps whole allocations
    // only); the buffer's address is its first granule's place in that window.
    const auto window = [&](const Slot& s) {
      auto first = std::upper_bound(blocks_.begin(), blocks_.end(), s.offset,
                                    [](uint64_t g, const Block& b) { return g < b.first + b.count; });
      auto last = std::upper_bound(blocks_.begin(), blocks_.end(), s.offset + s.granules - 1,
                                   [](uint64_t g, const Block& b) { return g < b.first + b.count; });
      return std::make_pair(first->first, last->first + last->count);
    };
    uint64_t total = 0;
    for (const Slot& s : slots) {
      if (s.granules && s.offset + s.granules > pool) return;
      if (s.granules) total += window(s).second - window(s).first;
    }
    if (total == 0) return;
    uint64_t base = 0;
    if (!backend_.reserve(total * g_, &base)) return;
    base_ = base;
    reserved_ = total * g_;
    uint64_t va = base_;
    slots_.resize(slots.size());
    for (size_t k = 0; k < slots.size(); ++k) {
      SlotState& s = slots_[k];
      s.offset = slots[k].offset;
      s.granules = slots[k].granules;
      if (!s.granules) continue;
      // A kept part needs a block boundary where the moving part begins; without one it moves whole.
      s.kept = slots[k].kept < s.granules && std::binary_search(cuts.begin(), cuts.end(), s.offset + slots[k].kept)
                   ? slots[k].kept
                   : 0;
      const auto [first, end] = window(slots[k]);
      s.base = va;
      s.window_first = first;
      s.va = va + (s.offset - first) * g_;
      slot_of_va_.emplace(s.va, static_cast<uint32_t>(k));
      va += (end - first) * g_;
    }
    owner_.assign(pool, nullptr);
    tags_.assign(pool, {});
  } catch (...) {
    slots_.clear();
  }
}

PlacedPool::~PlacedPool() {
  for (SlotState& s : slots_) {
    try {
      unmap_slot(s);
      if (s.detached) {
        backend_.unmap_extent(s.va + s.kept * g_, s.granules - s.kept);
        backend_.release_chunk(s.detached);
      }
    } catch (...) {
    }
  }
  for (Block& b : blocks_) {
    try {
      if (b.handle) backend_.release_chunk(b.handle);
    } catch (...) {
    }
  }
  if (reserved_) {
    try {
      backend_.unreserve(base_, reserved_);
    } catch (...) {
    }
  }
}

int64_t PlacedPool::slot_at(uint64_t address) const {
  const auto it = slot_of_va_.find(address);
  return it == slot_of_va_.end() ? -1 : static_cast<int64_t>(it->second);
}

// f(block index, the block's place in the slot's range): each whole block the slot's granules from
// `from` to `end` lie in.
template <typename F>
bool PlacedPool::each_piece(const SlotState& s, uint64_t from, uint64_t end, F&& f) const {
  if (from >= end) return true;
  // Blocks are in order: the first that ends after `from`.
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), from,
                             [](uint64_t g, const Block& b) { return g < b.first + b.count; });
  for (; it != blocks_.end() && it->first < end; ++it) {
    if (!f(static_cast<size_t>(it - blocks_.begin()), s.base + (it->first - s.window_first) * g_)) return false;
  }
  return true;
}

uint64_t PlacedPool::missing_bytes(uint32_t slot) const {
  if (!placed(slot)) return 0;
  uint64_t missing = 0;
  const SlotState& s = slots_[slot];
  each_piece(s, s.offset, s.end(), [&](size_t b, uint64_t) {
    if (!blocks_[b].handle) missing += blocks_[b].count;
    return true;
  });
  return missing * g_;
}

bool PlacedPool::create_blocks(const SlotState& s) {
  return each_piece(s, s.offset, s.end(), [&](size_t b, uint64_t) {
    Block& block = blocks_[b];
    if (block.handle) return true;
    block.handle = backend_.create_extent(block.count);
    if (!block.handle) return false;
    held_granules_ += block.count;
    ++stats_.blocks_created;
    return true;
  });
}

bool PlacedPool::map_part(SlotState& s, uint64_t from, uint64_t end) {
  size_t done = 0;  // pieces mapped so far
  const bool ok = each_piece(s, from, end, [&](size_t b, uint64_t va) {
    const Block& block = blocks_[b];
    if (!backend_.map_alias(va, block.handle, block.count)) return false;
    ++stats_.mappings;
    ++done;
    return true;
  });
  if (ok) return true;
  // Undo the pieces mapped: the part is all or nothing.
  size_t undone = 0;
  each_piece(s, from, end, [&](size_t b, uint64_t va) {
    if (undone >= done) return false;
    backend_.unmap_extent(va, blocks_[b].count);
    ++undone;
    return true;
  });
  return false;
}

bool PlacedPool::unmap_part(SlotState& s, uint64_t from, uint64_t end) {
  return each_piece(s, from, end, [&](size_t b, uint64_t va) {
    if (!backend_.unmap_extent(va, blocks_[b].count)) return false;
    ++stats_.unmappings;
    return true;
  });
}

bool PlacedPool::map_slot(SlotState& s) {
  const bool kept_now = s.kept && !s.kept_mapped;
  if (kept_now) {
    if (!map_part(s, s.offset, s.moving())) return false;
    s.kept_mapped = true;
  }
  if (!s.mapped && !s.detached) {
    if (!map_part(s, s.moving(), s.end())) {
      if (kept_now && unmap_part(s, s.offset, s.moving())) s.kept_mapped = false;
      return false;
    }
    s.mapped = true;
  }
  return true;
}

bool PlacedPool::unmap_slot(SlotState& s) {
  if (s.mapped) {
    if (!unmap_part(s, s.moving(), s.end())) return false;
    s.mapped = false;
  }
  if (s.kept_mapped) {
    if (!unmap_part(s, s.offset, s.moving())) return false;
    s.kept_mapped = false;
  }
  return true;
}

PlacedPool::Result PlacedPool::take(uint32_t slot, const void* owner, TagSet* waits,
                                    const std::function<bool(const void*)>& may_hand_over,
                                    std::vector<const void*>* handed_over) {
  try {
    if (!placed(slot) || !owner) return Result::kFailed;
    SlotState& s = slots_[slot];
    const auto busy = [&] {
      ++stats_.busy;
      return Result::kBusy;
    };
    if (s.owner || s.detached || s.release_pending) return busy();
    for (uint64_t g = s.offset; g < s.offset + s.granules; ++g)
      if (owner_[g] && !may_hand_over(owner_[g])) return busy();
    if (!create_blocks(s)) return Result::kFailed;
    if (!map_slot(s)) return Result::kFailed;
    for (uint64_t g = s.offset; g < s.offset + s.granules; ++g) {
      if (owner_[g]) {
        if (handed_over && std::find(handed_over->begin(), handed_over->end(), owner_[g]) == handed_over->end()) {
          handed_over->push_back(owner_[g]);
          ++stats_.handovers;
        }
      }
      if (waits) waits->merge(tags_[g]);
      tags_[g].clear();
      owner_[g] = owner;
    }
    s.owner = owner;
    s.freed.clear();
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

void PlacedPool::release(uint32_t slot, const void* owner, const TagSet& tags) {
  try {
    if (!placed(slot)) return;
    SlotState& s = slots_[slot];
    for (uint64_t g = s.offset; g < s.offset + s.granules; ++g) {
      if (owner_[g] != owner) continue;
      owner_[g] = nullptr;
      tags_[g].merge(tags);
    }
    if (s.owner == owner) s.owner = nullptr;
    s.freed = tags;
    if (s.detached && !s.release_pending) {
      s.release_pending = true;
      pending_.push_back(slot);
    }
  } catch (...) {
  }
}

bool PlacedPool::evict(uint32_t slot, const void* owner, const TagSet& tags) {
  try {
    if (!placed(slot)) return false;
    SlotState& s = slots_[slot];
    if (s.mapped) {
      if (!unmap_part(s, s.moving(), s.end())) return false;
      s.mapped = false;
    }
    if (s.detached) {
      if (!backend_.unmap_extent(s.va + s.kept * g_, s.granules - s.kept)) return false;
      backend_.release_chunk(s.detached);
      s.detached = 0;
      held_granules_ -= s.granules - s.kept;
      ++stats_.unmappings;
    }
    for (uint64_t g = s.moving(); g < s.end(); ++g) {
      if (owner_[g] != owner) continue;
      owner_[g] = nullptr;
      tags_[g].merge(tags);
    }
    return true;
  } catch (...) {
    return false;
  }
}

bool PlacedPool::held_by_another(const SlotState& s, const void* owner) {
  for (uint64_t g = s.moving(); g < s.end(); ++g) {
    if (owner_[g] && owner_[g] != owner) {
      ++stats_.busy;
      return true;
    }
  }
  return false;
}

void PlacedPool::own_granules(const SlotState& s, const void* owner, TagSet* waits) {
  for (uint64_t g = s.moving(); g < s.end(); ++g) {
    if (waits) waits->merge(tags_[g]);
    tags_[g].clear();
    owner_[g] = owner;
  }
}

PlacedPool::Result PlacedPool::restore(uint32_t slot, const void* owner, TagSet* waits) {
  try {
    if (!placed(slot)) return Result::kFailed;
    SlotState& s = slots_[slot];
    if (s.mapped || s.detached) return Result::kFailed;  // not evicted
    if (held_by_another(s, owner)) return Result::kBusy;
    if (!create_blocks(s) || !map_slot(s)) return Result::kFailed;  // its moving part (its kept part stayed)
    own_granules(s, owner, waits);
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

PlacedPool::Result PlacedPool::reclaim(uint32_t slot, const void* owner, TagSet* waits) {
  try {
    if (!placed(slot)) return Result::kFailed;
    SlotState& s = slots_[slot];
    if (!s.mapped || s.detached) return Result::kFailed;
    if (held_by_another(s, owner)) return Result::kBusy;
    own_granules(s, owner, waits);
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

std::vector<const void*> PlacedPool::holders(uint32_t slot, const void* owner) const {
  std::vector<const void*> out;
  if (!placed(slot)) return out;
  const SlotState& s = slots_[slot];
  for (uint64_t g = s.moving(); g < s.end(); ++g) {
    const void* o = owner_[g];
    if (o && o != owner && std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
  }
  return out;
}

bool PlacedPool::restore_detached(uint32_t slot) {
  try {
    if (!placed(slot)) return false;
    SlotState& s = slots_[slot];
    if (s.mapped || s.detached) return false;
    const uint64_t n = s.granules - s.kept;
    const Handle h = backend_.create_extent(n);
    if (!h) return false;
    if (!backend_.map_extent(s.va + s.kept * g_, h, n)) {
      backend_.release_chunk(h);
      return false;
    }
    s.detached = h;
    held_granules_ += n;
    ++stats_.detached;
    ++stats_.mappings;
    return true;
  } catch (...) {
    return false;
  }
}

uint64_t PlacedPool::reap(const std::function<bool(const FreeTag&)>& settled) {
  uint64_t freed = 0;
  try {
    for (size_t i = 0; i < pending_.size();) {
      SlotState& s = slots_[pending_[i]];
      s.freed.prune(settled);
      const uint64_t n = s.granules - s.kept;
      if (!s.freed.empty() || !backend_.unmap_extent(s.va + s.kept * g_, n)) {
        ++i;
        continue;
      }
      backend_.release_chunk(s.detached);
      s.detached = 0;
      s.release_pending = false;
      held_granules_ -= n;
      freed += n * g_;
      ++stats_.unmappings;
      pending_[i] = pending_.back();
      pending_.pop_back();
    }
  } catch (...) {
  }
  return freed;
}

uint64_t PlacedPool::shrink(uint64_t want, const std::function<bool(const FreeTag&)>& settled) {
  uint64_t freed = 0;
  try {
    for (Block& b : blocks_) {
      if (freed >= want) break;
      if (!b.handle) continue;
      const uint64_t end = b.first + b.count;
      bool free = true;
      for (uint64_t g = b.first; free && g < end; ++g) {
        tags_[g].prune(settled);
        free = !owner_[g] && tags_[g].empty();
      }
      if (!free) continue;
      // The ranges that show it: each must be unmappable (no buffer, work settled).
      std::vector<SlotState*> showing;
      for (SlotState& s : slots_) {
        if ((!s.mapped && !s.kept_mapped) || s.offset >= end || s.offset + s.granules <= b.first) continue;
        s.freed.prune(settled);
        if (s.owner || !s.freed.empty()) {
          free = false;
          break;
        }
        showing.push_back(&s);
      }
      if (!free) continue;
      bool unmapped = true;
      for (SlotState* s : showing) unmapped = unmap_slot(*s) && unmapped;
      if (!unmapped) continue;
      backend_.release_chunk(b.handle);
      b.handle = 0;
      held_granules_ -= b.count;
      freed += b.count * g_;
    }
  } catch (...) {
  }
  return freed;
}

bool PlacedPool::drained(const std::function<bool(const FreeTag&)>& settled) {
  try {
    if (!pending_.empty()) return false;
    for (SlotState& s : slots_) {
      if (s.owner || s.detached) return false;
      s.freed.prune(settled);
      if (!s.freed.empty()) return false;
    }
    for (TagSet& t : tags_) {
      t.prune(settled);
      if (!t.empty()) return false;
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace vcudnn::pool
