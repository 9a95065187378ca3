// VmmArena (vmm_arena.h). Guarded by mu_.
//
// Policy:
//  - Sizes round up to 512 B; a rounded size of a granule or more rounds up to whole granules and
//    is placed granule-aligned, so a large buffer never shares a granule (evicting it unmaps only
//    its own memory). Small buffers are 512-aligned and may straddle two granules.
//  - Long-lived buffers take the lowest fit, placed at its low end; short-lived ones the highest,
//    placed at its high end.
//  - A granule is mapped while some live, non-evicted buffer overlaps it and unmapped when its
//    last user goes. So inside a free VA range only the partial granules at its two ends can be
//    mapped. A small buffer also looks for a fit there (scanning from its end of the range); it
//    takes that spot instead of the plain first fit when the spot is no farther from its end (so
//    long- and short-lived buffers stay apart) or when the first fit would need a granule beyond
//    the budget (under pressure, sharing a granule beats failing).
//  - Chunks come from the free list first; create_chunk() only when it is empty. They go back to
//    the free list when unmapped and are released only by trim() and the destructor.
//  - Every backend failure leaves the bookkeeping matching what the backend holds.
#include "pool/vmm_arena.h"

#include "pool/align.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <string>

namespace vcudnn::pool {
namespace {

constexpr uint64_t kAlign = 512;

}  // namespace

VmmArena::VmmArena(PhysicalBackend& backend, uint64_t reserve_bytes, uint64_t physical_budget) : backend_(backend) {
  try {
    const uint64_t g = backend_.granularity();
    if (g == 0 || g % kAlign != 0) return;
    granularity_ = g;
    const std::optional<uint64_t> bytes = round_up(reserve_bytes, g);
    if (!bytes || *bytes == 0) return;
    uint64_t base = 0;
    if (!backend_.reserve(*bytes, &base)) return;
    base_ = base;
    reserved_ = *bytes;
    max_granules_ = physical_budget / g;
    free_ranges_.emplace(0, reserved_);
    stats_.reserved_bytes = reserved_;
  } catch (...) {
    // A throwing backend: reserved_ stays 0 unless the reservation was recorded.
  }
}

VmmArena::~VmmArena() {
  for (auto& [index, granule] : granules_) {
    if (granule.chunk == 0) continue;
    try {
      backend_.unmap(base_ + index * granularity_);
      backend_.release_chunk(granule.chunk);
    } catch (...) {
    }
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

std::optional<Allocation> VmmArena::allocate(uint64_t bytes, Lifetime lifetime) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    if (bytes == 0) return Allocation{};
    const auto fail = [&]() -> std::optional<Allocation> {
      ++stats_.failures;
      return std::nullopt;
    };
    if (!ok()) return fail();
    std::optional<uint64_t> size = round_up(bytes, kAlign);
    if (!size) return fail();
    const bool large = *size >= granularity_;
    if (large) size = round_up(*size, granularity_);
    if (!size || *size > reserved_) return fail();
    std::optional<uint64_t> offset = place(*size, large, lifetime, false);
    if (!large) {
      // A spot in an already mapped granule: taken when it is no farther from the buffer's end
      // of the range, or when the first fit would exceed the budget.
      const std::optional<uint64_t> in_mapped = place(*size, false, lifetime, true);
      const bool low = lifetime == Lifetime::kLong;
      if (in_mapped && (!offset || (low ? *in_mapped <= *offset : *in_mapped >= *offset) ||
                        mapped_granules_ + unmapped_in(*offset, *size) > max_granules_)) {
        offset = in_mapped;
      }
    }
    if (!offset) return fail();
    if (mapped_granules_ + unmapped_in(*offset, *size) > max_granules_) return fail();
    if (!map_span(*offset, *size)) return fail();
    carve(*offset, *size);
    buffers_.emplace(*offset, Buffer{*size, bytes, large});
    const uint64_t first = *offset / granularity_;
    const uint64_t last = (*offset + *size - 1) / granularity_;
    for (uint64_t g = first; g <= last; ++g) ++granules_[g].users;
    ++stats_.allocations;
    stats_.live_bytes += bytes;
    return Allocation{base_ + *offset, *size};
  } catch (...) {
    if (lock.owns_lock()) ++stats_.failures;
    return std::nullopt;
  }
}

bool VmmArena::free(uint64_t address) {
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
    give_back_range(offset, buffer.bytes);
    const uint64_t first = offset / granularity_;
    const uint64_t last = (offset + buffer.bytes - 1) / granularity_;
    for (uint64_t g = first; g <= last; ++g) {
      const auto git = granules_.find(g);
      if (git == granules_.end()) continue;  // cannot happen
      if (git->second.users > 0) --git->second.users;
      if (git->second.users > 0) continue;
      // An unmap failure keeps the granule mapped (and counted) with no users; the destructor
      // or a later allocation over it deals with it.
      if (git->second.chunk == 0 || unmap_granule(g)) granules_.erase(g);
    }
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<std::pair<uint64_t, uint64_t>> VmmArena::large_buffer_granules(uint64_t address) const {
  if (address < base_) return std::nullopt;
  const auto it = buffers_.find(address - base_);
  if (it == buffers_.end() || !it->second.large) return std::nullopt;
  return std::make_pair(it->first / granularity_, it->second.bytes / granularity_);
}

bool VmmArena::evict(uint64_t address) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    const auto span = large_buffer_granules(address);
    if (!span) return false;
    const auto [first, count] = *span;
    bool any_mapped = false;
    for (uint64_t g = first; g < first + count; ++g) any_mapped = any_mapped || granules_[g].chunk != 0;
    if (!any_mapped) return false;
    bool all = true;
    for (uint64_t g = first; g < first + count; ++g) {
      if (granules_[g].chunk != 0 && !unmap_granule(g)) all = false;
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
    uint64_t missing = 0;
    for (uint64_t g = first; g < first + count; ++g) missing += granules_[g].chunk == 0 ? 1 : 0;
    if (missing == 0) return false;
    if (mapped_granules_ + missing > max_granules_) return false;
    for (uint64_t g = first; g < first + count; ++g) {
      if (granules_[g].chunk == 0 && !map_granule(g)) return false;
    }
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
    return it != buffers_.end() && buffer_evicted(it->first, it->second);
  } catch (...) {
    return false;
  }
}

void VmmArena::trim() {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    while (!free_chunks_.empty()) {
      const Handle chunk = free_chunks_.back();
      free_chunks_.pop_back();
      backend_.release_chunk(chunk);
    }
  } catch (...) {
  }
}

uint64_t VmmArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_granules_ * granularity_;
}

VmmArena::Stats VmmArena::stats() const {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  try {
    lock.lock();
    Stats s = stats_;
    s.mapped_bytes = mapped_granules_ * granularity_;
    s.chunks_free = free_chunks_.size();
    uint64_t evicted_granules = 0;
    for (const auto& [index, granule] : granules_) evicted_granules += granule.users > 0 && granule.chunk == 0;
    s.evicted_bytes = evicted_granules * granularity_;
    uint64_t resident = 0;
    for (const auto& [offset, buffer] : buffers_) {
      if (!buffer_evicted(offset, buffer)) resident += buffer.requested;
    }
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
// Placement and the free VA ranges.

std::optional<uint64_t> VmmArena::place(uint64_t size, bool large, Lifetime lifetime, bool mapped_only) const {
  const bool low = lifetime == Lifetime::kLong;
  const uint64_t g = granularity_;
  const auto mapped = [&](uint64_t index) {
    const auto it = granules_.find(index);
    return it != granules_.end() && it->second.chunk != 0;
  };
  // A fit inside [start, end), or nullopt.
  const auto fit_in = [&](uint64_t start, uint64_t end) -> std::optional<uint64_t> {
    if (large) {
      const uint64_t lo = (start + g - 1) / g * g;
      if (lo > end || end - lo < size) return std::nullopt;
      return low ? lo : (end - size) / g * g;
    }
    if (end - start < size) return std::nullopt;
    return low ? start : end - size;
  };
  // Small buffers: the partial mapped granules at the ends of a free range first.
  const auto fit_mapped = [&](uint64_t start, uint64_t end) -> std::optional<uint64_t> {
    const uint64_t head = start / g;
    const uint64_t tail = (end - 1) / g;
    std::optional<uint64_t> head_fit, tail_fit;
    if (mapped(head)) head_fit = fit_in(start, std::min(end, (head + 1) * g));
    if (tail != head && mapped(tail)) tail_fit = fit_in(tail * g, end);
    return low ? (head_fit ? head_fit : tail_fit) : (tail_fit ? tail_fit : head_fit);
  };
  const auto scan = [&](const auto& fit) -> std::optional<uint64_t> {
    if (low) {
      for (const auto& [start, bytes] : free_ranges_) {
        if (const auto at = fit(start, start + bytes)) return at;
      }
    } else {
      for (auto it = free_ranges_.rbegin(); it != free_ranges_.rend(); ++it) {
        if (const auto at = fit(it->first, it->first + it->second)) return at;
      }
    }
    return std::nullopt;
  };
  if (mapped_only) return scan(fit_mapped);
  return scan(fit_in);
}

void VmmArena::carve(uint64_t offset, uint64_t size) {
  auto it = free_ranges_.upper_bound(offset);
  --it;  // the range holding [offset, offset + size): place() found it there
  const uint64_t start = it->first;
  const uint64_t end = start + it->second;
  free_ranges_.erase(it);
  if (offset > start) free_ranges_.emplace(start, offset - start);
  if (offset + size < end) free_ranges_.emplace(offset + size, end - offset - size);
}

void VmmArena::give_back_range(uint64_t offset, uint64_t size) {
  uint64_t start = offset;
  uint64_t end = offset + size;
  auto next = free_ranges_.lower_bound(offset);
  if (next != free_ranges_.end() && next->first == end) {
    end += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      free_ranges_.erase(prev);
    }
  }
  free_ranges_.emplace(start, end - start);
}

bool VmmArena::buffer_evicted(uint64_t offset, const Buffer& buffer) const {
  if (!buffer.large) return false;
  const uint64_t first = offset / granularity_;
  for (uint64_t g = first; g < first + buffer.bytes / granularity_; ++g) {
    const auto it = granules_.find(g);
    if (it == granules_.end() || it->second.chunk == 0) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Granules.

uint64_t VmmArena::unmapped_in(uint64_t offset, uint64_t size) const {
  uint64_t n = 0;
  for (uint64_t g = offset / granularity_; g <= (offset + size - 1) / granularity_; ++g) {
    const auto it = granules_.find(g);
    n += it == granules_.end() || it->second.chunk == 0 ? 1 : 0;
  }
  return n;
}

bool VmmArena::map_span(uint64_t offset, uint64_t size) {
  const uint64_t first = offset / granularity_;
  const uint64_t last = (offset + size - 1) / granularity_;
  std::vector<uint64_t> mapped_now;
  mapped_now.reserve(last - first + 1);
  for (uint64_t g = first; g <= last; ++g) {
    if (granules_[g].chunk != 0) continue;
    if (map_granule(g)) {
      mapped_now.push_back(g);
      continue;
    }
    // Roll back: unmap what this call mapped; drop entries nobody uses.
    for (uint64_t m : mapped_now) unmap_granule(m);
    for (uint64_t h = first; h <= last; ++h) {
      const auto it = granules_.find(h);
      if (it != granules_.end() && it->second.users == 0 && it->second.chunk == 0) granules_.erase(it);
    }
    return false;
  }
  return true;
}

bool VmmArena::map_granule(uint64_t index) {
  Handle chunk = 0;
  if (!free_chunks_.empty()) {
    chunk = free_chunks_.back();
    free_chunks_.pop_back();
  } else {
    chunk = backend_.create_chunk();
    if (chunk == 0) return false;
    ++stats_.chunks_created;
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
  granules_[index].chunk = chunk;
  ++mapped_granules_;
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, mapped_granules_ * granularity_);
  return true;
}

bool VmmArena::unmap_granule(uint64_t index) {
  Granule& granule = granules_[index];
  if (granule.chunk == 0) return true;
  if (!backend_.unmap(base_ + index * granularity_)) return false;
  free_chunks_.push_back(granule.chunk);
  granule.chunk = 0;
  --mapped_granules_;
  return true;
}

// ---------------------------------------------------------------------------------------------
// parse_budget

std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total) {
  size_t i = 0;
  uint64_t whole = 0;
  size_t digits = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) return std::nullopt;
    whole = whole * 10 + d;
  }
  if (digits == 0) return std::nullopt;
  // Decimals: percentages only; at most 9 digits.
  uint64_t fraction = 0;
  uint64_t scale = 1;
  bool has_point = false;
  if (i < text.size() && text[i] == '.') {
    has_point = true;
    ++i;
    size_t n = 0;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++n) {
      if (n >= 9) return std::nullopt;
      fraction = fraction * 10 + static_cast<uint64_t>(text[i] - '0');
      scale *= 10;
    }
    if (n == 0) return std::nullopt;
  }
  const std::string_view rest = text.substr(i);
  if (rest == "%") {
    if (whole > 100) return std::nullopt;
    const unsigned __int128 mantissa = static_cast<unsigned __int128>(whole) * scale + fraction;  // p * scale
    if (mantissa == 0 || mantissa > static_cast<unsigned __int128>(100) * scale) return std::nullopt;
    const unsigned __int128 bytes = static_cast<unsigned __int128>(device_total) * mantissa / (100 * scale);
    if (bytes == 0) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  if (has_point) return std::nullopt;
  std::string s;
  for (char c : rest) s.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  int shift = -1;
  if (s.empty() || s == "B") shift = 0;
  const char* const units = "KMGT";
  for (int u = 0; u < 4; ++u) {
    const std::string unit(1, units[u]);
    if (s == unit || s == unit + "B" || s == unit + "IB") shift = 10 * (u + 1);
  }
  if (shift < 0 || whole == 0) return std::nullopt;
  if (shift > 0 && whole > (UINT64_MAX >> shift)) return std::nullopt;
  return whole << shift;
}

}  // namespace vcudnn::pool
