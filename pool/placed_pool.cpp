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
    const auto is_cut = [&](uint64_t g) { return std::binary_search(cuts.begin(), cuts.end(), g); };
    // The block a pool granule lies in.
    const auto block_of = [&](uint64_t g) {
      return std::upper_bound(blocks_.begin(), blocks_.end(), g,
                              [](uint64_t x, const Block& b) { return x < b.first + b.count; });
    };
    // A slot's segments as it is laid out: each joint a block boundary, its kept part's end one
    // too (else it moves whole); not placed (no granules) when they are inconsistent.
    const auto laid_out = [&](const Slot& in, uint64_t* kept) {
      std::vector<Segment> segs = in.segments;
      if (segs.empty() && in.granules) segs.push_back({in.offset, in.granules});
      uint64_t total = 0;
      for (size_t k = 0; k < segs.size(); ++k) {
        if (segs[k].granules == 0 || segs[k].offset + segs[k].granules > pool) return std::vector<Segment>{};
        if (k > 0 && (!is_cut(segs[k].offset) || !is_cut(segs[k - 1].offset + segs[k - 1].granules)))
          return std::vector<Segment>{};
        total += segs[k].granules;
      }
      if (total != in.granules) return std::vector<Segment>{};
      *kept = 0;
      if (in.kept == 0 || in.kept >= in.granules) return segs;
      uint64_t at = 0;
      for (size_t k = 0; k < segs.size(); at += segs[k].granules, ++k) {
        if (at == in.kept) {
          *kept = in.kept;  // a joint already
          break;
        }
        if (in.kept < at + segs[k].granules) {
          const uint64_t split = segs[k].offset + (in.kept - at);
          if (!is_cut(split)) break;
          segs.insert(segs.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                      {split, segs[k].offset + segs[k].granules - split});
          segs[k].granules = split - segs[k].offset;
          *kept = in.kept;
          break;
        }
      }
      return segs;
    };
    // Its range: the whole blocks its segments lie in, one segment after another (the driver maps
    // whole allocations only); the buffer's address is its first granule's place in that range.
    const auto window = [&](const std::vector<Segment>& segs) {
      uint64_t n = 0;
      for (const Segment& g : segs) {
        const auto first = block_of(g.offset), last = block_of(g.offset + g.granules - 1);
        n += last->first + last->count - first->first;
      }
      return n;
    };
    std::vector<std::vector<Segment>> layout(slots.size());
    std::vector<uint64_t> kept(slots.size(), 0);
    uint64_t total = 0;
    bool any = false;
    for (size_t k = 0; k < slots.size(); ++k) {
      if (!slots[k].granules) continue;
      layout[k] = laid_out(slots[k], &kept[k]);
      if (slots[k].external) {
        // Its range is the buffer's own: exactly its granules, so each segment whole blocks.
        bool whole = slots[k].kept == 0;
        for (const Segment& g : layout[k]) whole = whole && is_cut(g.offset) && is_cut(g.offset + g.granules);
        if (!whole) layout[k].clear();
        any = any || whole;
        continue;
      }
      total += window(layout[k]);
    }
    if (total == 0 && !any) return;
    uint64_t base = 0;
    if (total) {
      if (!backend_.reserve(total * g_, &base)) return;
      base_ = base;
      reserved_ = total * g_;
    }
    uint64_t va = base_;
    slots_.resize(slots.size());
    for (size_t k = 0; k < slots.size(); ++k) {
      SlotState& s = slots_[k];
      if (layout[k].empty()) continue;
      s.segs = std::move(layout[k]);
      s.granules = slots[k].granules;
      s.kept = kept[k];
      if (slots[k].external) {
        s.external = true;
        continue;
      }
      s.base = va;
      s.va = va + (s.segs.front().offset - block_of(s.segs.front().offset)->first) * g_;
      slot_of_va_.emplace(s.va, static_cast<uint32_t>(k));
      va += window(s.segs) * g_;
    }
    owner_.assign(pool, nullptr);
    tags_.assign(pool, {});
    away_.assign(pool, 0);
    ok_ = true;
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

bool PlacedPool::adopt(uint32_t slot, const void* owner, uint64_t va) {
  try {
    if (!placed(slot) || !owner || va == 0) return false;
    SlotState& s = slots_[slot];
    if (!s.external || s.va || s.owner || s.mapped || s.detached) return false;
    s.base = s.va = va;
    s.owner = owner;
    slot_of_va_.emplace(va, slot);
    return true;
  } catch (...) {
    return false;
  }
}

int64_t PlacedPool::slot_at(uint64_t address) const {
  const auto it = slot_of_va_.find(address);
  return it == slot_of_va_.end() ? -1 : static_cast<int64_t>(it->second);
}

// f(block index, the block's place in the slot's range): each whole block the granules of the
// slot's part lie in, segment after segment.
template <typename F>
bool PlacedPool::each_piece(const SlotState& s, Part part, F&& f) const {
  uint64_t va = s.base, at = 0;
  for (const Segment& g : s.segs) {
    const bool in = part == Part::kAll || (part == Part::kKept) == (at < s.kept);
    at += g.granules;
    // Blocks are in order: the first that ends after the segment's first granule.
    auto it = std::upper_bound(blocks_.begin(), blocks_.end(), g.offset,
                               [](uint64_t x, const Block& b) { return x < b.first + b.count; });
    for (; it != blocks_.end() && it->first < g.offset + g.granules; ++it) {
      if (in && !f(static_cast<size_t>(it - blocks_.begin()), va)) return false;
      va += it->count * g_;
    }
  }
  return true;
}

template <typename F>
void PlacedPool::each_granule(const SlotState& s, Part part, F&& f) const {
  uint64_t at = 0;
  for (const Segment& g : s.segs) {
    const bool in = part == Part::kAll || (part == Part::kKept) == (at < s.kept);
    at += g.granules;
    if (!in) continue;
    for (uint64_t x = g.offset; x < g.offset + g.granules; ++x) f(x);
  }
}

uint64_t PlacedPool::missing_bytes(uint32_t slot) const {
  if (!placed(slot)) return 0;
  uint64_t missing = 0;
  const SlotState& s = slots_[slot];
  each_piece(s, Part::kAll, [&](size_t b, uint64_t) {
    if (!blocks_[b].handle) missing += blocks_[b].count;
    return true;
  });
  return missing * g_;
}

bool PlacedPool::create_blocks(const SlotState& s) {
  return each_piece(s, Part::kAll, [&](size_t b, uint64_t) {
    Block& block = blocks_[b];
    if (block.handle) return true;
    block.handle = backend_.create_extent(block.count);
    if (!block.handle) return false;
    held_granules_ += block.count;
    ++stats_.blocks_created;
    return true;
  });
}

bool PlacedPool::map_part(SlotState& s, Part part) {
  size_t done = 0;  // pieces mapped so far
  const bool ok = each_piece(s, part, [&](size_t b, uint64_t va) {
    const Block& block = blocks_[b];
    if (!backend_.map_alias(va, block.handle, block.count)) return false;
    ++stats_.mappings;
    ++done;
    return true;
  });
  if (ok) return true;
  // Undo the pieces mapped: the part is all or nothing.
  size_t undone = 0;
  each_piece(s, part, [&](size_t b, uint64_t va) {
    if (undone >= done) return false;
    backend_.unmap_extent(va, blocks_[b].count);
    ++undone;
    return true;
  });
  return false;
}

bool PlacedPool::unmap_part(SlotState& s, Part part) {
  return each_piece(s, part, [&](size_t b, uint64_t va) {
    if (!backend_.unmap_extent(va, blocks_[b].count)) return false;
    ++stats_.unmappings;
    return true;
  });
}

bool PlacedPool::map_slot(SlotState& s) {
  const bool kept_now = s.kept && !s.kept_mapped;
  if (kept_now) {
    if (!map_part(s, Part::kKept)) return false;
    s.kept_mapped = true;
  }
  if (!s.mapped && !s.detached) {
    if (!map_part(s, Part::kMoving)) {
      if (kept_now && unmap_part(s, Part::kKept)) s.kept_mapped = false;
      return false;
    }
    s.mapped = true;
  }
  return true;
}

bool PlacedPool::unmap_slot(SlotState& s) {
  if (s.mapped) {
    if (!unmap_part(s, Part::kMoving)) return false;
    s.mapped = false;
  }
  if (s.kept_mapped) {
    if (!unmap_part(s, Part::kKept)) return false;
    s.kept_mapped = false;
  }
  return true;
}

PlacedPool::Result PlacedPool::take(uint32_t slot, const void* owner, TagSet* waits,
                                    const std::function<bool(const void*)>& may_hand_over,
                                    std::vector<HandOver>* handed_over) {
  try {
    if (!placed(slot) || !owner || slots_[slot].external) return Result::kFailed;  // external: adopt()
    SlotState& s = slots_[slot];
    const auto busy = [&] {
      ++stats_.busy;
      return Result::kBusy;
    };
    if (s.owner || s.detached || s.release_pending) return busy();
    bool refused = false;
    each_granule(s, Part::kAll, [&](uint64_t g) { refused = refused || (owner_[g] && !may_hand_over(owner_[g])); });
    if (refused) return busy();
    if (!create_blocks(s)) return Result::kFailed;
    if (!map_slot(s)) return Result::kFailed;
    // The slot of each buffer handing granules over, looked up once per buffer (not per granule).
    std::vector<std::pair<const void*, const SlotState*>> from_slots;
    each_granule(s, Part::kAll, [&](uint64_t g) {
      if (owner_[g] && handed_over) {
        const void* from = owner_[g];
        auto it =
            std::find_if(handed_over->begin(), handed_over->end(), [&](const HandOver& h) { return h.owner == from; });
        if (it == handed_over->end()) {
          it = handed_over->insert(handed_over->end(), HandOver{from, 0});
          ++stats_.handovers;
        }
        auto fs = std::find_if(from_slots.begin(), from_slots.end(), [&](const auto& f) { return f.first == from; });
        if (fs == from_slots.end()) fs = from_slots.insert(from_slots.end(), {from, slot_owned_by(from)});
        // A granule not in its moving part (cannot happen: kept parts never change hands): all of it.
        const std::optional<uint64_t> rank = fs->second ? moving_rank(*fs->second, g) : std::nullopt;
        it->reach = std::max(it->reach, rank ? (*rank + 1) * g_ : UINT64_MAX);
      }
      if (owner_[g]) away_[g] = 1;  // handed over by a buffer that is leaving: it comes back here
      if (waits) waits->merge(tags_[g]);
      tags_[g].clear();
      owner_[g] = owner;
    });
    s.owner = owner;
    s.freed.clear();
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

bool PlacedPool::release(uint32_t slot, const void* owner, const TagSet& tags) {
  bool awaited = false;
  try {
    if (!placed(slot)) return false;
    SlotState& s = slots_[slot];
    each_granule(s, Part::kAll, [&](uint64_t g) {
      if (owner_[g] != owner) return;
      owner_[g] = nullptr;
      tags_[g].merge(tags);
      awaited = awaited || away_[g];
    });
    if (s.owner == owner) s.owner = nullptr;
    s.freed = tags;
    if (s.detached && !s.release_pending) {
      s.release_pending = true;
      pending_.push_back(slot);
    }
  } catch (...) {
  }
  return awaited;
}

bool PlacedPool::evict(uint32_t slot, const void* owner, const TagSet& tags) {
  try {
    if (!placed(slot)) return false;
    SlotState& s = slots_[slot];
    if (s.mapped) {
      if (!unmap_part(s, Part::kMoving)) return false;
      s.mapped = false;
    }
    if (s.detached) {
      if (!backend_.unmap_extent(s.va + s.kept * g_, s.granules - s.kept)) return false;
      backend_.release_chunk(s.detached);
      s.detached = 0;
      held_granules_ -= s.granules - s.kept;
      ++stats_.unmappings;
    }
    each_granule(s, Part::kMoving, [&](uint64_t g) {
      if (owner_[g] != owner) return;
      owner_[g] = nullptr;
      tags_[g].merge(tags);
      away_[g] = 1;
    });
    return true;
  } catch (...) {
    return false;
  }
}

bool PlacedPool::held_by_another(const SlotState& s, const void* owner) {
  bool held = false;
  each_granule(s, Part::kMoving, [&](uint64_t g) { held = held || (owner_[g] && owner_[g] != owner); });
  if (held) ++stats_.busy;
  return held;
}

void PlacedPool::own_granules(const SlotState& s, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece,
                              uint64_t piece_bytes) {
  uint64_t rank = 0;  // the granule's place in the moving part (each_granule goes in its byte order)
  each_granule(s, Part::kMoving, [&](uint64_t g) {
    if (by_piece && piece_bytes) {
      const uint64_t first = rank * g_ / piece_bytes, last = ((rank + 1) * g_ - 1) / piece_bytes;
      if (by_piece->size() <= last) by_piece->resize(last + 1);
      for (uint64_t k = first; k <= last; ++k) (*by_piece)[k].merge(tags_[g]);
    }
    ++rank;
    if (waits) waits->merge(tags_[g]);
    tags_[g].clear();
    owner_[g] = owner;
    away_[g] = 0;
  });
}

const PlacedPool::SlotState* PlacedPool::slot_owned_by(const void* owner) const {
  for (const SlotState& s : slots_)
    if (s.owner == owner) return &s;
  return nullptr;
}

std::optional<uint64_t> PlacedPool::moving_rank(const SlotState& s, uint64_t g) {
  uint64_t at = 0;
  for (const Segment& seg : s.segs) {
    if (at >= s.kept && seg.offset <= g && g < seg.offset + seg.granules) return at - s.kept + (g - seg.offset);
    at += seg.granules;
  }
  return std::nullopt;
}

PlacedPool::Result PlacedPool::restore(uint32_t slot, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece,
                                       uint64_t piece_bytes) {
  try {
    if (!placed(slot)) return Result::kFailed;
    SlotState& s = slots_[slot];
    if (s.mapped || s.detached) return Result::kFailed;  // not evicted
    if (held_by_another(s, owner)) return Result::kBusy;
    if (!create_blocks(s) || !map_slot(s)) return Result::kFailed;  // its moving part (its kept part stayed)
    own_granules(s, owner, waits, by_piece, piece_bytes);
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

PlacedPool::Result PlacedPool::reclaim(uint32_t slot, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece,
                                       uint64_t piece_bytes) {
  try {
    if (!placed(slot)) return Result::kFailed;
    SlotState& s = slots_[slot];
    if (!s.mapped || s.detached) return Result::kFailed;
    if (held_by_another(s, owner)) return Result::kBusy;
    own_granules(s, owner, waits, by_piece, piece_bytes);
    return Result::kOk;
  } catch (...) {
    return Result::kFailed;
  }
}

std::vector<const void*> PlacedPool::holders(uint32_t slot, const void* owner) const {
  std::vector<const void*> out;
  if (!placed(slot)) return out;
  const SlotState& s = slots_[slot];
  each_granule(s, Part::kMoving, [&](uint64_t g) {
    const void* o = owner_[g];
    if (o && o != owner && std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
  });
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
        if (!s.mapped && !s.kept_mapped) continue;
        bool shows = false;
        each_piece(s, Part::kAll, [&](size_t k, uint64_t) {
          shows = shows || &blocks_[k] == &b;
          return true;
        });
        if (!shows) continue;
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
