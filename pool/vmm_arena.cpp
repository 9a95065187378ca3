// VmmArena (vmm_arena.h). Guarded by mu_.
//
// Two levels:
//  - Granules. The whole VA range is granules; those not held by a buffer or a slab form free
//    runs, each all mapped (idle) or all unmapped, never two of one kind side by side. A request
//    of n granules takes (1) the best-fitting idle run, else (2) an idle run grown into the
//    unmapped runs beside it (fewest fresh granules among the largest idle runs), else (3) the
//    best-fitting unmapped run. Fresh granules are placed at the lifetime's end of their run.
//  - Slabs. A buffer below one granule (after rounding to 512 B) is carved best fit out of the
//    free ranges of all slabs; a slab is one granule taken as in (1)-(3); an empty slab becomes an
//    idle run again.
// Chunks come from the free list first; create_chunk() only when it is empty. They go back to the
// free list when unmapped and are released only by release_free_chunks() and the destructor.
// Extents (fresh stretches of extent_min_ granules or more) are created for their stretch, unmapped
// only whole (unmap_span() over ranges no extent crosses: extent_up/extent_down) and released then.
// Every backend failure leaves the bookkeeping matching what the backend holds.
#include "pool/vmm_arena.h"

#include <algorithm>
#include <iterator>

#include "pool/align.h"

namespace vcudnn::pool {
namespace {

constexpr uint64_t kAlign = 512;
// Idle runs looked at when none fits whole: the largest ones, which need the fewest fresh granules.
constexpr int kGrowCandidates = 8;
// Under exact extents: idle runs of at least the size looked at for a window of whole extents, and
// positions tried inside each. Idle extents that fit exactly are often inside large runs of other
// extents; with 8 runs and 64 positions, a budget of 150-300 % of the peak (ResNet-50's recorded
// iteration, tests/cpu/trace_sim_test.cpp) mapped 35-88 extents anew every iteration and never
// settled; with these bounds it maps none after the second. A search visits each extent boundary
// of a run once: the bounds are reached only with thousands of idle extents.
constexpr int kExactCandidates = 64;
constexpr int kWindowSteps = 4096;

}  // namespace

VmmArena::VmmArena(PhysicalBackend& backend, uint64_t reserve_bytes, uint64_t physical_budget, uint64_t extent_min,
                   bool exact_extents)
    : backend_(backend), extent_min_(extent_min), exact_extents_(exact_extents && extent_min > 1) {
  uint64_t base = 0;
  uint64_t bytes = 0;
  try {
    const uint64_t g = backend_.granularity();
    if (g == 0 || g % kAlign != 0) return;
    const std::optional<uint64_t> rounded = round_up(reserve_bytes, g);
    if (!rounded || *rounded == 0) return;
    if (!backend_.reserve(*rounded, &base)) return;
    bytes = *rounded;
    granularity_ = g;
    chunk_.assign(bytes / g, 0);
    idle_since_.assign(bytes / g, 0);
    base_ = base;
    max_granules_ = physical_budget / g;
    insert_run(0, bytes / g, false, {});
    reserved_ = bytes;
    stats_.reserved_bytes = reserved_;
  } catch (...) {
    // The arena stays unusable; give back a reservation made before the failure.
    if (bytes != 0 && reserved_ == 0) {
      try {
        backend_.unreserve(base, bytes);
      } catch (...) {
      }
    }
  }
}

VmmArena::~VmmArena() {
  for (uint64_t i = 0; i < chunk_.size();) {
    const auto extent = extents_.find(i);
    const uint64_t n = extent != extents_.end() ? extent->second : 1;
    if (chunk_[i] != 0) {
      try {
        if (n > 1)
          backend_.unmap_extent(base_ + i * granularity_, n);
        else
          backend_.unmap(base_ + i * granularity_);
        backend_.release_chunk(chunk_[i]);
      } catch (...) {
      }
    }
    i += n;
  }
  for (Handle chunk : free_chunks_) {
    try {
      backend_.release_chunk(chunk);
    } catch (...) {
    }
  }
  if (reserved_ != 0) {
    try {
      backend_.unreserve(base_, reserved_);
    } catch (...) {
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Public entry points: lock, catch everything.

uint64_t VmmArena::span_of(uint64_t bytes) const {
  const uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  return size < granularity_ || granularity_ == 0 ? size : (size + granularity_ - 1) / granularity_ * granularity_;
}

std::optional<Allocation> VmmArena::allocate(uint64_t bytes, Lifetime lifetime, TagSet* waits) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (bytes == 0) return Allocation{};
    const auto fail = [&]() -> std::optional<Allocation> {
      ++stats_.failures;
      return std::nullopt;
    };
    const std::optional<uint64_t> size = round_up(bytes, kAlign);
    if (!ok() || !size) return fail();
    uint64_t fresh = 0;
    ++allocations_in_interval_;
    if (*size < granularity_) {
      const std::optional<uint64_t> offset = allocate_small(*size, lifetime, waits, &fresh);
      if (!offset) return fail();
      buffers_[*offset] = Buffer{*size, bytes, *offset / granularity_, false};
      ++stats_.allocations;
      stats_.live_bytes += bytes;
      return Allocation{base_ + *offset, *size, fresh};
    }
    const std::optional<uint64_t> whole = round_up(*size, granularity_);
    if (!whole || *whole / granularity_ > std::min<uint64_t>(chunk_.size(), max_granules_)) return fail();
    const std::optional<uint64_t> first = allocate_granules(*whole / granularity_, lifetime, waits, &fresh);
    if (!first) return fail();
    buffers_[*first * granularity_] = Buffer{*whole, bytes, kNoSlab, false};
    ++stats_.allocations;
    stats_.live_bytes += bytes;
    return Allocation{base_ + *first * granularity_, *whole, fresh};
  } catch (...) {
    if (lock.owns_lock()) ++stats_.failures;
    return std::nullopt;
  }
}

bool VmmArena::free(uint64_t address, const TagSet& tags) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (address < base_) return false;
    const auto it = buffers_.find(address - base_);
    if (it == buffers_.end()) return false;
    const uint64_t offset = it->first;
    const Buffer buffer = it->second;
    buffers_.erase(it);
    stats_.live_bytes -= buffer.requested;
    if (buffer.slab != kNoSlab)
      free_small(offset, buffer, tags);
    else
      free_granules(offset / granularity_, buffer.bytes / granularity_, tags);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<std::pair<uint64_t, uint64_t>> VmmArena::large_buffer_granules(uint64_t address) const {
  if (address < base_) return std::nullopt;
  const auto it = buffers_.find(address - base_);
  if (it == buffers_.end() || it->second.slab != kNoSlab) return std::nullopt;
  return std::make_pair(it->first / granularity_, it->second.bytes / granularity_);
}

bool VmmArena::evict(uint64_t address) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    const auto span = large_buffer_granules(address);
    if (!span) return false;
    const auto [first, count] = *span;
    if (unmapped_in(first, count) == count) return false;
    // An extent that holds memory beyond the buffer cannot be unmapped for it.
    if (extent_up(first) != first || extent_down(first + count) != first + count) return false;
    buffers_[address - base_].evicted = true;
    bool all = true;
    for (uint64_t g = first; g < first + count;) {
      const auto extent = extents_.find(g);
      const uint64_t n = extent != extents_.end() ? extent->second : 1;
      if (chunk_[g] != 0) {
        if (n > 1 ? unmap_extent(g) : unmap_granule(g))
          evicted_granules_ += n;
        else
          all = false;
      }
      g += n;
    }
    return all;
  } catch (...) {
    return false;
  }
}

bool VmmArena::restore(uint64_t address) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    const auto span = large_buffer_granules(address);
    if (!span) return false;
    const auto [first, count] = *span;
    const uint64_t missing = unmapped_in(first, count);
    if (missing == 0 || mapped_granules_ + missing > max_granules_) return false;
    if (exact_extents_ && missing == count && count >= extent_min_) {  // Note [Extents under a budget]
      if (!map_extent(first, count)) return false;
      evicted_granules_ -= count;
      buffers_[address - base_].evicted = false;
      return true;
    }
    for (uint64_t g = first; g < first + count; ++g) {
      if (chunk_[g] != 0) continue;
      if (!map_granule(g)) return false;
      --evicted_granules_;
    }
    buffers_[address - base_].evicted = false;
    return true;
  } catch (...) {
    return false;
  }
}

bool VmmArena::is_evicted(uint64_t address) const {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (address < base_) return false;
    const auto it = buffers_.find(address - base_);
    return it != buffers_.end() && it->second.evicted;
  } catch (...) {
    return false;
  }
}

uint64_t VmmArena::trim(uint64_t max_granules, const std::function<bool(const FreeTag&)>& settled) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  uint64_t done = 0;
  try {
    lock.lock();
    // Largest runs first: the fewest unmaps for the room.
    const std::vector<RunKey> keys(idle_by_size_.rbegin(), idle_by_size_.rend());
    for (const auto& [count, first] : keys) {
      if (done >= max_granules) break;
      const auto it = runs_.find(first);
      if (it == runs_.end() || !it->second.mapped || it->second.count != count) continue;
      it->second.tags.prune(settled);
      if (!it->second.tags.empty()) continue;
      // The part of the run no extent crosses (one that does also holds a live buffer).
      const uint64_t lo = extent_up(first);
      const uint64_t hi = extent_down(first + count);
      if (lo >= hi) continue;
      const uint64_t cut = extent_down(hi - std::min(hi - lo, max_granules - done));
      erase_run(it);
      const uint64_t unmapped = unmap_span(cut, hi);
      if (cut > first) insert_run(first, cut - first, true, {});
      if (unmapped > 0) insert_run(cut, unmapped, false, {});
      if (cut + unmapped < first + count) insert_run(cut + unmapped, first + count - cut - unmapped, true, {});
      done += unmapped;
    }
  } catch (...) {
  }
  return done;
}

uint64_t VmmArena::end_interval(const std::function<bool(const FreeTag&)>& settled, uint64_t keep) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  uint64_t done = 0;
  try {
    lock.lock();
    if (allocations_in_interval_ == 0) return 0;
    allocations_in_interval_ = 0;
    const std::vector<RunKey> keys(idle_by_size_.begin(), idle_by_size_.end());
    for (const auto& [count, first] : keys) {
      const auto it = runs_.find(first);
      if (it == runs_.end() || !it->second.mapped || it->second.count != count) continue;
      it->second.tags.prune(settled);
      if (!it->second.tags.empty()) continue;
      // Stale: idle through this interval and the one before, both with allocations. One is not
      // enough: cudnn.benchmark's search waits for the device between candidates whose workspaces
      // alternate between two sizes, and would unmap and map tens of GiB for every candidate.
      const auto is_stale = [&](uint64_t g) { return idle_since_[g] + 1 < interval_; };
      if (std::none_of(idle_since_.begin() + static_cast<long>(first),
                       idle_since_.begin() + static_cast<long>(first + count),
                       [&](uint32_t since) { return since + 1 < interval_; }))
        continue;
      erase_run(it);  // rebuilt below from what is mapped
      const uint64_t end = first + count;
      // An extent inside the run (all idle: it holds no data) that is stale only in part is
      // unmapped whole and its recent part mapped again: CUDA cannot unmap part of it.
      for (auto e = extents_.lower_bound(first); e != extents_.end() && e->first + e->second <= end;) {
        const auto [e_first, e_count] = *e;
        ++e;
        uint64_t stale = 0;
        for (uint64_t g = e_first; g < e_first + e_count; ++g) stale += is_stale(g) ? 1 : 0;
        if (stale == 0 || stale == e_count || !unmap_extent(e_first)) continue;
        done += stale;
        for (uint64_t g = e_first; g < e_first + e_count;) {
          uint64_t recent = g;
          while (recent < e_first + e_count && !is_stale(recent)) ++recent;
          if (recent > g) map_window(g, recent - g);  // on failure these stay unmapped: released
          g = recent;
          while (g < e_first + e_count && is_stale(g)) ++g;
        }
        e = extents_.lower_bound(e_first + e_count);
      }
      // The stale stretches, less the parts an extent reaching beyond the run holds.
      for (uint64_t g = first; g < end;) {
        if (!is_stale(g) || chunk_[g] == 0) {
          ++g;
          continue;
        }
        uint64_t stretch_end = g;
        while (stretch_end < end && is_stale(stretch_end) && chunk_[stretch_end] != 0) ++stretch_end;
        const uint64_t b = extent_up(g), e = extent_down(stretch_end);
        if (b < e) done += unmap_span(b, e);
        g = stretch_end;
      }
      for (uint64_t g = first; g < end;) {
        const bool mapped = chunk_[g] != 0;
        uint64_t run_end = g;
        while (run_end < end && (chunk_[run_end] != 0) == mapped) ++run_end;
        insert_run(g, run_end - g, mapped, {});
        g = run_end;
      }
    }
    // The bottom of the free list (a stack) below its low water was not used all interval.
    size_t unused = std::min(free_low_water_, free_chunks_.size());
    for (size_t i = keep; i < unused; ++i) backend_.release_chunk(free_chunks_[i]);
    if (unused > keep)
      free_chunks_.erase(free_chunks_.begin() + static_cast<long>(keep),
                         free_chunks_.begin() + static_cast<long>(unused));
    free_low_water_ = free_chunks_.size();
  } catch (...) {
  }
  ++interval_;
  return done;
}

TagSet VmmArena::idle_tags() const {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  TagSet all;
  try {
    lock.lock();
    for (const auto& [count, first] : idle_by_size_) all.merge(runs_.at(first).tags);
  } catch (...) {
  }
  return all;
}

void VmmArena::release_free_chunks(uint64_t keep) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    while (free_chunks_.size() > keep) {
      const Handle chunk = free_chunks_.back();
      free_chunks_.pop_back();
      backend_.release_chunk(chunk);
    }
    free_low_water_ = std::min(free_low_water_, free_chunks_.size());
  } catch (...) {
  }
}

void VmmArena::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_mapped_bytes = mapped_granules_ * granularity_;
  stats_.peak_held_bytes = (mapped_granules_ + free_chunks_.size()) * granularity_;
}

uint64_t VmmArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_granules_ * granularity_;
}

uint64_t VmmArena::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_granules_ * granularity_;
}

uint64_t VmmArena::budget_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_granules_ * granularity_;
}

void VmmArena::set_budget(uint64_t physical_budget) {
  std::lock_guard<std::mutex> lock(mu_);
  if (granularity_) max_granules_ = physical_budget / granularity_;
}

uint64_t VmmArena::free_chunk_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_chunks_.size() * granularity_;
}

VmmArena::Stats VmmArena::stats() const {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    Stats s = stats_;
    s.mapped_bytes = mapped_granules_ * granularity_;
    s.idle_bytes = idle_granules_ * granularity_;
    s.chunks_free = free_chunks_.size();
    s.evicted_bytes = evicted_granules_ * granularity_;
    s.slabs = slabs_.size();
    s.extents = extents_.size();
    uint64_t resident = 0;
    for (const auto& [offset, buffer] : buffers_) resident += buffer.evicted ? 0 : buffer.requested;
    if (s.mapped_bytes > 0) {
      s.fragmentation = 1.0 - static_cast<double>(resident) / static_cast<double>(s.mapped_bytes);
      s.fragmentation = std::clamp(s.fragmentation, 0.0, 1.0);
    }
    return s;
  } catch (...) {
    return Stats{};
  }
}

// ---------------------------------------------------------------------------------------------
// Granule runs

std::optional<uint64_t> VmmArena::allocate_granules(uint64_t count, Lifetime lifetime, TagSet* waits,
                                                    uint64_t* fresh_out) {
  const auto window = choose_window(count, lifetime);
  if (!window) return std::nullopt;
  const auto [first, fresh] = *window;
  if (mapped_granules_ + fresh > max_granules_) return std::nullopt;
  if (!map_window(first, count)) return std::nullopt;
  carve_runs(first, count, waits);
  stats_.fresh_granules += fresh;
  *fresh_out = fresh;
  return first;
}

// (first granule, fresh granules to map) of the window a request of `count` granules takes.
std::optional<std::pair<uint64_t, uint64_t>> VmmArena::choose_window(uint64_t count, Lifetime lifetime) const {
  const bool low = lifetime == Lifetime::kLong;
  int tried = 0;
  for (auto it = idle_by_size_.lower_bound({count, 0}); it != idle_by_size_.end() && tried < kExactCandidates;
       ++it, ++tried) {
    const auto [size, first] = *it;
    if (!exact_extents_) return std::make_pair(low ? first : first + size - count, uint64_t{0});
    // Whole extents only (Note [Extents under a budget]): the window nearest the run's low or high
    // end that cuts none.
    if (const std::optional<uint64_t> at = extent_window(first, size, count, low))
      return std::make_pair(*at, uint64_t{0});
  }
  std::optional<std::pair<uint64_t, uint64_t>> best;
  int looked = 0;
  for (auto it = idle_by_size_.rbegin(); it != idle_by_size_.rend() && looked < kGrowCandidates; ++it, ++looked) {
    const auto [size, first] = *it;
    if (size >= count) continue;  // passed over above: the window would cut an extent
    // Runs of one kind never touch, so the free neighbours of an idle run are unmapped.
    const auto run = runs_.find(first);
    uint64_t left = 0, right = 0;
    if (run != runs_.begin()) {
      const auto prev = std::prev(run);
      if (prev->first + prev->second.count == first) left = prev->second.count;
    }
    if (const auto next = std::next(run); next != runs_.end() && next->first == first + size)
      right = next->second.count;
    if (left + size + right < count) continue;
    const uint64_t fresh = count - size;
    if (best && best->second <= fresh) continue;
    const uint64_t before = low ? std::min(left, fresh) : fresh - std::min(right, fresh);
    best = std::make_pair(first - before, fresh);
  }
  if (best) return best;
  const auto it = unmapped_by_size_.lower_bound({count, 0});
  if (it == unmapped_by_size_.end()) return std::nullopt;
  const auto [size, first] = *it;
  return std::make_pair(low ? first : first + size - count, count);
}

void VmmArena::carve_runs(uint64_t first, uint64_t count, TagSet* waits) {
  const uint64_t end = first + count;
  for (uint64_t at = first; at < end;) {
    auto it = std::prev(runs_.upper_bound(at));  // the run holding `at`
    const uint64_t run_first = it->first;
    const uint64_t run_end = run_first + it->second.count;
    const bool mapped = it->second.mapped;
    TagSet tags = std::move(it->second.tags);
    erase_run(it);
    const uint64_t taken_end = std::min(end, run_end);
    if (run_first < at) insert_run(run_first, at - run_first, mapped, tags);
    if (taken_end < run_end) insert_run(taken_end, run_end - taken_end, mapped, tags);
    if (mapped && waits) waits->merge(tags);
    at = taken_end;
  }
}

void VmmArena::free_granules(uint64_t first, uint64_t count, const TagSet& tags) {
  // An evicted buffer leaves unmapped granules (all, or some after a failed evict/restore).
  uint64_t start = first;
  for (uint64_t g = first; g <= first + count; ++g) {
    const bool boundary = g == first + count || (chunk_[g] != 0) != (chunk_[start] != 0);
    if (!boundary) continue;
    const bool mapped = chunk_[start] != 0;
    if (!mapped) evicted_granules_ -= std::min(evicted_granules_, g - start);
    if (mapped) mark_idle(start, g - start);
    insert_run(start, g - start, mapped, mapped ? tags : TagSet{});
    start = g;
  }
}

void VmmArena::mark_idle(uint64_t first, uint64_t count) {
  std::fill(idle_since_.begin() + static_cast<long>(first), idle_since_.begin() + static_cast<long>(first + count),
            interval_);
}

void VmmArena::insert_run(uint64_t first, uint64_t count, bool mapped, TagSet tags) {
  if (count == 0) return;
  if (!mapped) tags.clear();  // unmapped memory holds nothing anyone could still be using
  auto next = runs_.lower_bound(first);
  if (next != runs_.end() && next->first == first + count && next->second.mapped == mapped) {
    count += next->second.count;
    tags.merge(next->second.tags);
    next = std::next(next);
    erase_run(std::prev(next));
  }
  if (next != runs_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second.count == first && prev->second.mapped == mapped) {
      first = prev->first;
      count += prev->second.count;
      tags.merge(prev->second.tags);
      erase_run(prev);
    }
  }
  runs_.emplace(first, Run{count, mapped, std::move(tags)});
  (mapped ? idle_by_size_ : unmapped_by_size_).insert({count, first});
  if (mapped) idle_granules_ += count;
}

void VmmArena::erase_run(std::map<uint64_t, Run>::iterator it) {
  (it->second.mapped ? idle_by_size_ : unmapped_by_size_).erase({it->second.count, it->first});
  if (it->second.mapped) idle_granules_ -= it->second.count;
  runs_.erase(it);
}

// ---------------------------------------------------------------------------------------------
// Slabs

std::optional<uint64_t> VmmArena::allocate_small(uint64_t size, Lifetime lifetime, TagSet* waits, uint64_t* fresh) {
  auto it = small_free_.lower_bound({size, 0, 0});
  if (it == small_free_.end()) {
    TagSet tags;
    const std::optional<uint64_t> granule = allocate_granules(1, lifetime, &tags, fresh);
    if (!granule) return std::nullopt;
    slabs_[*granule].tags = std::move(tags);
    add_small_range(*granule, 0, granularity_);
    it = small_free_.lower_bound({size, 0, 0});
  }
  const auto [free_size, slab, offset] = *it;
  remove_small_range(slab, offset, free_size);
  if (free_size > size) add_small_range(slab, offset + size, free_size - size);
  Slab& s = slabs_.at(slab);
  s.used += size;
  if (waits) waits->merge(s.tags);
  return slab * granularity_ + offset;
}

void VmmArena::free_small(uint64_t offset, const Buffer& buffer, const TagSet& tags) {
  const uint64_t slab = buffer.slab;
  Slab& s = slabs_.at(slab);
  s.used -= buffer.bytes;
  s.tags.merge(tags);
  uint64_t start = offset - slab * granularity_;
  uint64_t size = buffer.bytes;
  if (const auto next = s.free.find(start + size); next != s.free.end()) {
    const uint64_t n = next->second;
    remove_small_range(slab, start + size, n);
    size += n;
  }
  if (const auto after = s.free.lower_bound(start); after != s.free.begin()) {
    const auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      const auto [prev_start, prev_size] = *prev;
      remove_small_range(slab, prev_start, prev_size);
      start = prev_start;
      size += prev_size;
    }
  }
  if (s.used != 0) {
    add_small_range(slab, start, size);
    return;
  }
  TagSet slab_tags = std::move(s.tags);
  slabs_.erase(slab);
  mark_idle(slab, 1);
  insert_run(slab, 1, true, std::move(slab_tags));
}

void VmmArena::add_small_range(uint64_t slab, uint64_t offset, uint64_t size) {
  slabs_.at(slab).free.emplace(offset, size);
  small_free_.insert({size, slab, offset});
}

void VmmArena::remove_small_range(uint64_t slab, uint64_t offset, uint64_t size) {
  slabs_.at(slab).free.erase(offset);
  small_free_.erase({size, slab, offset});
}

// ---------------------------------------------------------------------------------------------
// Mapping

uint64_t VmmArena::unmapped_in(uint64_t first, uint64_t count) const {
  uint64_t n = 0;
  for (uint64_t g = first; g < first + count; ++g) n += chunk_[g] == 0 ? 1 : 0;
  return n;
}

bool VmmArena::map_window(uint64_t first, uint64_t count) {
  std::vector<uint64_t> mapped_now;  // granules, or the first of an extent
  const auto undo = [&] {
    for (uint64_t m : mapped_now) extents_.count(m) ? unmap_extent(m) : unmap_granule(m);
    return false;
  };
  for (uint64_t g = first; g < first + count;) {
    if (chunk_[g] != 0) {
      ++g;
      continue;
    }
    uint64_t end = g;
    while (end < first + count && chunk_[end] == 0) ++end;
    if (extent_min_ > 1 && end - g >= extent_min_) {
      if (!map_extent(g, end - g)) return undo();
      mapped_now.push_back(g);
      g = end;
      continue;
    }
    for (; g < end; ++g) {
      if (!map_granule(g)) return undo();
      mapped_now.push_back(g);
    }
  }
  return true;
}

bool VmmArena::map_extent(uint64_t first, uint64_t count) {
  const Handle extent = backend_.create_extent(count);
  if (extent == 0) return false;
  bool mapped = false;
  try {
    mapped = backend_.map_extent(base_ + first * granularity_, extent, count);
  } catch (...) {
  }
  if (!mapped) {
    backend_.release_chunk(extent);
    return false;
  }
  std::fill(chunk_.begin() + static_cast<long>(first), chunk_.begin() + static_cast<long>(first + count), extent);
  extents_.emplace(first, count);
  mapped_granules_ += count;
  ++stats_.extents_created;
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, mapped_granules_ * granularity_);
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, (mapped_granules_ + free_chunks_.size()) * granularity_);
  return true;
}

bool VmmArena::unmap_extent(uint64_t first) {
  const auto it = extents_.find(first);
  const uint64_t count = it->second;
  const Handle extent = chunk_[first];
  if (!backend_.unmap_extent(base_ + first * granularity_, count)) return false;
  backend_.release_chunk(extent);
  std::fill(chunk_.begin() + static_cast<long>(first), chunk_.begin() + static_cast<long>(first + count), Handle{0});
  extents_.erase(it);
  mapped_granules_ -= count;
  return true;
}

uint64_t VmmArena::unmap_span(uint64_t begin, uint64_t end) {
  uint64_t g = begin;
  while (g < end) {
    if (const auto extent = extents_.find(g); extent != extents_.end()) {
      const uint64_t n = extent->second;
      if (!unmap_extent(g)) break;
      g += n;
    } else if (unmap_granule(g)) {
      ++g;
    } else {
      break;
    }
  }
  return g - begin;
}

std::optional<uint64_t> VmmArena::extent_window(uint64_t first, uint64_t size, uint64_t count, bool low) const {
  const uint64_t end = first + size;
  int steps = 0;
  if (low) {
    for (uint64_t at = first; at + count <= end && steps < kWindowSteps; ++steps) {
      if (!cuts_extent(at, count)) return at;
      const auto e = extents_.find(at);
      at = e != extents_.end() ? at + e->second : extent_up(at + 1);
    }
    return std::nullopt;
  }
  for (uint64_t stop = end; stop >= first + count && steps < kWindowSteps; ++steps) {
    if (!cuts_extent(stop - count, count)) return stop - count;
    stop = extent_down(stop - 1);  // the next boundary below
  }
  return std::nullopt;
}

bool VmmArena::cuts_extent(uint64_t first, uint64_t count) const {
  return extent_up(first) != first || extent_down(first + count) != first + count;
}

uint64_t VmmArena::extent_up(uint64_t g) const {
  auto it = extents_.upper_bound(g);
  if (it == extents_.begin()) return g;
  --it;
  return it->first < g && g < it->first + it->second ? it->first + it->second : g;
}

uint64_t VmmArena::extent_down(uint64_t g) const {
  auto it = extents_.upper_bound(g);
  if (it == extents_.begin()) return g;
  --it;
  return it->first < g && g < it->first + it->second ? it->first : g;
}

bool VmmArena::map_granule(uint64_t index) {
  Handle chunk = 0;
  if (!free_chunks_.empty()) {
    chunk = free_chunks_.back();
    free_chunks_.pop_back();
    free_low_water_ = std::min(free_low_water_, free_chunks_.size());
  } else {
    chunk = backend_.create_chunk();
    if (chunk == 0) return false;
    ++stats_.chunks_created;
    const uint64_t held = (mapped_granules_ + 1 + free_chunks_.size()) * granularity_;
    stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held);
  }
  bool mapped = false;
  try {
    mapped = backend_.map(base_ + index * granularity_, chunk);
  } catch (...) {
    free_chunks_.push_back(chunk);
    throw;
  }
  if (!mapped) {
    free_chunks_.push_back(chunk);
    return false;
  }
  chunk_[index] = chunk;
  ++mapped_granules_;
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, mapped_granules_ * granularity_);
  return true;
}

bool VmmArena::unmap_granule(uint64_t index) {
  if (chunk_[index] == 0) return true;
  if (!extents_.empty() && (extents_.count(index) || extent_up(index) != index)) return false;  // a caller's bug
  if (!backend_.unmap(base_ + index * granularity_)) return false;
  free_chunks_.push_back(chunk_[index]);
  chunk_[index] = 0;
  --mapped_granules_;
  return true;
}

}  // namespace vcudnn::pool
