// Static placement of an iteration's buffers (placement.h, Note [A static placement]).
#include "planner/placement.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace vcudnn {
namespace {

using Intervals = std::vector<std::pair<size_t, size_t>>;  // closed, ascending, disjoint

bool overlap(const Intervals& a, const Intervals& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].first <= b[j].second && b[j].first <= a[i].second) return true;
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return false;
}

uint64_t length(const Intervals& a) {
  uint64_t n = 0;
  for (const auto& [first, last] : a) n += last - first + 1;
  return n;
}

// [first, last] less the absent intervals (any order, may touch the ends).
Intervals less(size_t first, size_t last, Intervals absent) {
  std::sort(absent.begin(), absent.end());
  Intervals out;
  size_t at = first;
  for (const auto& [a, b] : absent) {
    if (b < at || a > last) continue;
    if (a > at) out.push_back({at, a - 1});
    at = std::max(at, b + 1);
  }
  if (at <= last) out.push_back({at, last});
  return out;
}

// Where each life is off the device under `moves`, and how many of its bytes stay (Note [Moving part
// of a buffer]: a life's moves all keep the same part).
std::pair<std::vector<Intervals>, std::vector<uint64_t>> absences(const SpanModel& model,
                                                                  const std::vector<OffloadMove>& moves) {
  std::vector<Intervals> absent(model.lives.size());
  std::vector<uint64_t> kept(model.lives.size(), 0);
  for (const OffloadMove& mv : moves) {
    if (mv.life < absent.size() && mv.first_absent() <= mv.last_absent()) {
      absent[mv.life].push_back({mv.first_absent(), mv.last_absent()});
      kept[mv.life] = mv.offset;
    }
  }
  return {std::move(absent), std::move(kept)};
}

// Where each placed buffer is on the device, before offsets are chosen.
std::vector<PlacedBuffer> placeable(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                                    const std::vector<OffloadMove>& moves, uint64_t granule) {
  const size_t n = model.seqs.size();
  const auto [absent, kept] = absences(model, moves);
  const auto large = [&](size_t i) {
    return model.lives[i].bytes >= granule && !trace.buffers[lifetimes.buffers[i].buffer].library;
  };
  // The buffers alive at the start that the iteration frees, by requested size, in order: the
  // previous instances of those it leaves to the next iteration.
  std::map<uint64_t, std::deque<size_t>> started;
  for (size_t i = 0; i < lifetimes.buffers.size(); ++i) {
    const BufferLife& b = lifetimes.buffers[i];
    if (large(i) && !b.alloc_seq && b.free_seq) started[trace.buffers[b.buffer].bytes].push_back(i);
  }
  std::vector<PlacedBuffer> out;
  for (size_t i = 0; i < lifetimes.buffers.size(); ++i) {
    const BufferLife& b = lifetimes.buffers[i];
    if (model.across_end && model.lives[i].through && large(i) && !absent[i].empty()) {
      PlacedBuffer p;  // Note [Across the iteration's end], offload_plan.h
      p.life = i;
      p.through = true;
      p.bytes = model.lives[i].bytes;
      p.moved = true;
      p.resident = less(0, n - 1, absent[i]);
      out.push_back(std::move(p));
      continue;
    }
    if (!large(i) || !b.alloc_seq || n == 0) continue;
    const SpanModel::Life& life = model.lives[i];
    PlacedBuffer p;
    p.life = i;
    p.bytes = life.bytes;
    p.moved = !absent[i].empty();
    if (b.free_seq) {
      p.resident = less(life.first, life.last, absent[i]);
      p.kept = kept[i];
      if (p.kept) p.kept_resident = {{life.first, life.last}};
    } else {
      auto& q = started[trace.buffers[b.buffer].bytes];
      if (q.empty()) continue;  // nothing it replaces: left to the arena
      p.partner = q.front();
      q.pop_front();
      p.resident = less(0, model.lives[p.partner].last, absent[p.partner]);
      for (const auto& r : less(life.first, n - 1, absent[i])) p.resident.push_back(r);
      // The two parts touch when the partner is freed right before this one is allocated.
      Intervals merged;
      for (const auto& r : p.resident) {
        if (!merged.empty() && r.first <= merged.back().second + 1)
          merged.back().second = std::max(merged.back().second, r.second);
        else
          merged.push_back(r);
      }
      p.resident = std::move(merged);
    }
    if (!p.resident.empty()) out.push_back(std::move(p));
  }
  return out;
}

// A placed buffer's segments (its `segments`, or all of it at `offset`, split where its kept part ends).
std::vector<PlacedSegment> segments_of(const PlacedBuffer& p) {
  if (!p.segments.empty()) return p.segments;
  if (!p.kept) return {{0, p.offset, p.bytes}};
  return {{0, p.offset, p.kept}, {p.kept, p.offset + p.kept, p.bytes - p.kept}};
}

// A piece of the pool a placed buffer holds, and when (its kept part's residency, or its moving
// part's: Note [Moving part of a buffer]).
struct Part {
  uint64_t lo = 0, hi = 0;  // pool bytes
  const Intervals* when = nullptr;
  bool moving = false;
  // A moving part's copy out still reading its bytes (Note [Laying out around copies out]), piece by
  // piece from `moving_at`, where this part begins in its buffer's moving part.
  const CopyWindow* copying = nullptr;
  uint64_t moving_at = 0;
};
std::vector<Part> parts_of(const PlacedBuffer& p) {
  std::vector<Part> out;
  for (const PlacedSegment& s : segments_of(p)) {
    const bool kept = s.at < p.kept;
    out.push_back({s.offset, s.offset + s.bytes, kept ? &p.kept_resident : &p.resident, p.moved && !kept});
  }
  return out;
}

// Placed bytes on the device at each position.
std::vector<uint64_t> placed_curve(size_t n, const std::vector<PlacedBuffer>& placed) {
  std::vector<int64_t> diff(n + 1, 0);
  for (const PlacedBuffer& p : placed) {
    for (const Part& part : parts_of(p)) {
      for (const auto& [first, last] : *part.when) {
        diff[first] += static_cast<int64_t>(part.hi - part.lo);
        diff[std::min(last, n - 1) + 1] -= static_cast<int64_t>(part.hi - part.lo);
      }
    }
  }
  std::vector<uint64_t> out(n);
  int64_t run = 0;
  for (size_t k = 0; k < n; ++k) {
    run += diff[k];
    out[k] = static_cast<uint64_t>(std::max<int64_t>(run, 0));
  }
  return out;
}

// The peaks, blocks and driver calls of a layout whose offsets are set.
void summarise(const SpanModel& model, const std::vector<OffloadMove>& moves, Placement& out) {
  const size_t n = model.seqs.size();
  out.pool_bytes = 0;
  for (const PlacedBuffer& p : out.buffers)
    for (const Part& part : parts_of(p)) out.pool_bytes = std::max(out.pool_bytes, part.hi);
  const std::vector<uint64_t> placed = placed_curve(n, out.buffers);
  const std::vector<uint64_t> all = simulate(model, moves);
  out.resident_peak = placed.empty() ? 0 : *std::max_element(placed.begin(), placed.end());
  out.other_peak = 0;
  for (size_t k = 0; k < n; ++k) out.other_peak = std::max(out.other_peak, all[k] > placed[k] ? all[k] - placed[k] : 0);
  // Blocks: the pool cut at both ends of every moved placed buffer.
  std::set<uint64_t> cuts{0, out.pool_bytes};
  // Blocks: the pool cut at both ends of each piece of a buffer in pieces or moved (Note [Buffers in
  // pieces]), so that its range shows its pieces one after another and a move maps whole blocks.
  for (const PlacedBuffer& p : out.buffers) {
    const std::vector<Part> parts = parts_of(p);
    if (!p.moved && parts.size() < 2) continue;
    for (const Part& part : parts) {
      cuts.insert(part.lo);
      cuts.insert(part.hi);
    }
  }
  out.blocks = out.pool_bytes ? cuts.size() - 1 : 0;
  out.cuts.assign(cuts.begin(), cuts.end());
  // The blocks [from, end) of the pool lie in.
  const auto blocks_in = [&](uint64_t from, uint64_t end) {
    const auto lo = cuts.upper_bound(from);
    const auto hi = cuts.lower_bound(end);
    return static_cast<uint64_t>(std::distance(lo, hi)) + 1;
  };
  const auto pieces = [&](const PlacedBuffer& p, bool moving_only) {
    uint64_t n = 0;
    for (const Part& part : parts_of(p))
      if (!moving_only || part.moving) n += blocks_in(part.lo, part.hi);
    return n;
  };
  std::vector<const PlacedBuffer*> by_life(model.lives.size(), nullptr);
  out.first_mappings = 0;
  for (const PlacedBuffer& p : out.buffers) {
    by_life[p.life] = &p;
    out.first_mappings += pieces(p, false);
  }
  out.remap_calls = 0;
  for (const OffloadMove& mv : moves) {
    const PlacedBuffer* p = mv.life < by_life.size() ? by_life[mv.life] : nullptr;
    // Placed: unmap its pieces when it leaves, map them and set their access when it comes back.
    // Not placed: the arena's extent, created, mapped and made accessible, then unmapped and released.
    out.remap_calls += p ? 3 * pieces(*p, true) : 5;
  }
}

}  // namespace

namespace {

// Pool offsets for `todo` placed one by one in `order` (each buffer's kept part, then its moving
// part, or the whole of it), each part at the best-fitting gap among the pieces of the placed parts
// it shares a moment with (the smallest gap that fits), else on top of them; with `pieces`, a part
// that fits no gap fills the largest gaps first, in up to kMaxSegments pieces, the rest on top (Note
// [Buffers in pieces]); with `copying` (by life), a gap away from copies out first, below a pool of
// `floor` bytes (Note [Laying out around copies out]). Returns the pool's size.
uint64_t lay_out(std::vector<PlacedBuffer>& todo, const std::vector<size_t>& order, uint64_t granule, bool pieces,
                 const CopyWindows* copying, uint64_t floor) {
  std::vector<Part> placed;
  std::vector<std::pair<uint64_t, uint64_t>> busy, gaps;
  uint64_t pool = 0;
  uint64_t top = 0;
  // The gaps among the placed parts on the device over `when`; with `copies` (the part's own copy
  // out, or none), also among the pieces whose copy out is still reading their bytes then (Note
  // [Copies out in pieces]) and the parts on the device while its own copy reads it; `top` the end
  // of those.
  const auto find_gaps = [&](const Intervals& when, bool around_copies, const Intervals* copies) {
    busy.clear();
    for (const Part& q : placed) {
      if (overlap(when, *q.when) || (around_copies && copies && overlap(*copies, *q.when))) {
        busy.push_back({q.lo, q.hi});
      } else if (around_copies && q.copying && overlap(when, q.copying->whole)) {
        for (uint64_t x = q.lo; x < q.hi;) {
          const uint64_t at = q.moving_at + (x - q.lo);
          const uint64_t end = std::min(q.hi, x + (kCopyPiece - at % kCopyPiece));
          const size_t k = at / kCopyPiece;
          if (k >= q.copying->pieces.size() || overlap(when, q.copying->pieces[k])) busy.push_back({x, end});
          x = end;
        }
      }
    }
    std::sort(busy.begin(), busy.end());
    gaps.clear();
    top = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo > top) gaps.push_back({top, lo});
      top = std::max(top, hi);
    }
  };
  // Note [Copies out in pieces]: how long a part over [lo, hi) on the device over `when` makes the
  // device wait for copies out: for the pieces of placed parts' copies still reading those bytes
  // when it arrives, and, when it moves itself (`own`, its moving part's bytes from `own_at` on),
  // for the pieces of its own copy still reading what placed parts take while on the device. 0 for
  // none, else one past the last call of the latest such piece's window.
  const auto wait_until = [&](uint64_t lo, uint64_t hi, const Intervals& when, const CopyWindow* own, uint64_t own_at) {
    size_t until = 0;
    const auto piece_waits = [&](const CopyWindow& c, uint64_t at, const Intervals& arrives) {
      const size_t k = at / kCopyPiece;
      if (k >= c.pieces.size()) {
        until = SIZE_MAX;
        return;
      }
      for (const auto& w : c.pieces[k])
        if (overlap(arrives, Intervals{w})) until = std::max(until, w.second + 1);
    };
    for (const Part& q : placed) {
      if (hi <= q.lo || q.hi <= lo) continue;
      const bool theirs = q.copying && overlap(when, q.copying->whole);
      const bool mine = own && overlap(own->whole, *q.when);
      if (!theirs && !mine) continue;
      const uint64_t start = std::max(lo, q.lo), stop = std::min(hi, q.hi);
      for (uint64_t x = start; x < stop;) {
        uint64_t next = stop;
        if (theirs) {
          const uint64_t at = q.moving_at + (x - q.lo);
          piece_waits(*q.copying, at, when);
          next = std::min(next, x + (kCopyPiece - at % kCopyPiece));
        }
        if (mine) {
          const uint64_t at = own_at + (x - lo);
          piece_waits(*own, at, *q.when);
          next = std::min(next, x + (kCopyPiece - at % kCopyPiece));
        }
        x = next;
      }
    }
    return until;
  };
  const auto best_fit = [&](uint64_t want) {
    size_t best = gaps.size();
    for (size_t i = 0; i < gaps.size(); ++i) {
      const uint64_t size = gaps[i].second - gaps[i].first;
      if (size >= want && (best == gaps.size() || size < gaps[best].second - gaps[best].first)) best = i;
    }
    return best;
  };
  // Places `bytes` of a part on the device over `when`; appends its segments from `at` on. `copy`:
  // while its copy out reads them, if it moves.
  const auto place = [&](PlacedBuffer& p, uint64_t at, uint64_t bytes, const Intervals& when, bool moving,
                         const CopyWindow* copy) {
    const Intervals* copies = copy ? &copy->whole : nullptr;
    std::vector<std::pair<uint64_t, uint64_t>> chosen;  // pool ranges, in the part's order
    uint64_t left = bytes;
    if (copying) {  // Note [Laying out around copies out]: a gap no copy reads, below the pool's floor
      find_gaps(when, true, copies);
      if (top < std::max(pool, floor)) gaps.push_back({top, std::max(pool, floor)});
      if (const size_t i = best_fit(left); i < gaps.size() && gaps[i].first + left <= std::max(pool, floor)) {
        chosen.push_back({gaps[i].first, gaps[i].first + left});
        left = 0;
      }
    }
    if (left) find_gaps(when, false, nullptr);
    if (left && copying) {
      // No gap away from the copies: the one whose bytes the copies have read soonest, at either
      // end, the smaller gap on a tie.
      std::optional<std::tuple<size_t, uint64_t, uint64_t>> best;  // (wait, gap size, offset)
      for (const auto& [lo, hi] : gaps) {
        if (hi - lo < left) continue;
        for (const uint64_t off : {lo, hi - left}) {
          const std::tuple<size_t, uint64_t, uint64_t> c{
              wait_until(off, off + left, when, copy, copy ? at - p.kept : 0), hi - lo, off};
          if (!best || c < *best) best = c;
        }
      }
      // Note [Laying out in the copies' order]: a part that moves no bytes of its own may also take
      // the bytes read soonest from several gaps, in up to kMaxSegments pieces.
      if (pieces && !copy && (!best || std::get<0>(*best) > 0)) {
        struct Chunk {
          size_t wait = 0;
          uint64_t lo = 0, hi = 0;
        };
        std::vector<Chunk> chunks;
        for (const auto& [lo, hi] : gaps)
          for (uint64_t x = lo; x < hi;) {
            const uint64_t next = std::min(hi, (x / kCopyPiece + 1) * kCopyPiece);
            chunks.push_back({wait_until(x, next, when, nullptr, 0), x, next});
            x = next;
          }
        std::stable_sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.wait < b.wait; });
        std::vector<std::pair<uint64_t, uint64_t>> taken;
        uint64_t need = left;
        size_t wait = 0;
        for (const Chunk& c : chunks) {
          if (need == 0) break;
          const uint64_t n = std::min(need, c.hi - c.lo);
          taken.push_back({c.lo, c.lo + n});
          need -= n;
          wait = c.wait;
        }
        std::sort(taken.begin(), taken.end());
        std::vector<std::pair<uint64_t, uint64_t>> merged;
        for (const auto& r : taken) {
          if (!merged.empty() && merged.back().second == r.first)
            merged.back().second = r.second;
          else
            merged.push_back(r);
        }
        if (need == 0 && merged.size() <= kMaxSegments && (!best || wait < std::get<0>(*best))) {
          chosen = std::move(merged);
          left = 0;
          best.reset();
        }
      }
      if (best) {
        chosen.push_back({std::get<2>(*best), std::get<2>(*best) + left});
        left = 0;
      }
    }
    if (left == 0) {
      // placed
    } else if (const size_t i = best_fit(left); i < gaps.size()) {
      chosen.push_back({gaps[i].first, gaps[i].first + left});
      left = 0;
    } else if (pieces && left > granule) {
      std::vector<size_t> by_size(gaps.size());
      std::iota(by_size.begin(), by_size.end(), size_t{0});
      std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
        return gaps[a].second - gaps[a].first > gaps[b].second - gaps[b].first;
      });
      for (size_t i : by_size) {
        if (left == 0 || chosen.size() + 1 >= kMaxSegments) break;
        const uint64_t take = std::min(left, gaps[i].second - gaps[i].first);
        chosen.push_back({gaps[i].first, gaps[i].first + take});
        left -= take;
      }
    }
    if (left) chosen.push_back({top, top + left});
    for (const auto& [lo, hi] : chosen) {
      p.segments.push_back({at, lo, hi - lo});
      placed.push_back({lo, hi, &when, moving, copy, copy ? at - p.kept : 0});
      at += hi - lo;
      pool = std::max(pool, hi);
    }
  };
  for (size_t k : order) {
    PlacedBuffer& p = todo[k];
    p.segments.clear();
    if (p.kept) place(p, 0, p.kept, p.kept_resident, false, nullptr);
    const CopyWindow* copy = copying && p.moved && !(*copying)[p.life].whole.empty() ? &(*copying)[p.life] : nullptr;
    place(p, p.kept, p.bytes - p.kept, p.resident, p.moved, copy);  // segments appended in their order
    p.offset = p.segments.front().offset;
  }
  return pool;
}

}  // namespace

// Note [Searching for a layout that fits]
// The four orders of place_buffers() leave ResNet-50's pool within 1-4 % of the most placed bytes on
// the device at once, but VGG-16 b64's (103 buffers, the largest 784 and 1568 MiB) 18 % above it:
// at 90 % of its peak no plan's layout fitted the budget, and the arena served every buffer (2.43x
// PyTorch alone, ten host waits a step). Laying out in orders of bytes x time scaled by a random
// factor each (0-2, a fixed seed: the same iteration gets the same layout) finds much tighter
// ones there: for the plan for 92 % of that budget a pool of 4358 MiB in 2000 tries against 4754,
// for 88 % 4008 against 4656 (a layout's cost grows with the square of the buffers: 0.07 ms each
// for VGG-16, 0.85 for ResNet-50's 383). So plan_placed() searches only when no plan's layout
// fitted in the orders above, and at most ~30 ms of tries a layout.
namespace {

constexpr uint64_t kLayoutSeed = 0x5eed;

size_t search_tries(size_t buffers) {
  const double per_try = static_cast<double>(buffers) * static_cast<double>(buffers);  // ~6 ns each
  return std::clamp<size_t>(static_cast<size_t>(5e6 / std::max(1.0, per_try)), 8, 2000);
}

}  // namespace

Placement place_buffers(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                        const std::vector<OffloadMove>& moves, uint64_t granule, uint64_t fit,
                        const CopyWindows* copying, uint64_t copy_room) {
  Placement out;
  out.granule = granule;
  std::vector<PlacedBuffer> todo = placeable(trace, lifetimes, model, moves, granule);
  // The pool the layout may take to go around copies out: at least the most placed bytes on the
  // device at once (no layout's pool is smaller).
  uint64_t floor = copy_room;
  for (const uint64_t b : placed_curve(model.seqs.size(), todo)) floor = std::max(floor, b);
  // Orders tried, the smallest pool kept: bytes x time on the device, bytes, time on the device,
  // and the first arrival (an online allocator's order), each largest first; ties by life.
  std::vector<std::vector<uint64_t>> keys(4, std::vector<uint64_t>(todo.size()));
  for (size_t k = 0; k < todo.size(); ++k) {
    const uint64_t time = length(todo[k].resident);
    keys[0][k] = todo[k].bytes * time;
    keys[1][k] = todo[k].bytes;
    keys[2][k] = time;
    keys[3][k] = UINT64_MAX - todo[k].resident.front().first;
  }
  std::vector<PlacedBuffer> best;
  uint64_t best_pool = UINT64_MAX;
  std::vector<size_t> order(todo.size());
  // Lays the buffers out largest key first (ties in their own order), whole and in pieces (Note
  // [Buffers in pieces]); keeps the smallest pool, whole buffers when the pools are equal.
  auto try_order = [&](const auto& key) {
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] > key[b]; });
    for (const bool pieces : {false, true}) {
      const uint64_t pool = lay_out(todo, order, granule, pieces, copying, floor);
      if (pool < best_pool) {
        best_pool = pool;
        best = todo;
      }
    }
  };
  for (const std::vector<uint64_t>& key : keys) try_order(key);
  // Note [Searching for a layout that fits]
  if (fit && !todo.empty()) {
    out.buffers = best;
    summarise(model, moves, out);  // other_peak does not depend on the offsets
    std::mt19937_64 rng(kLayoutSeed);
    std::uniform_real_distribution<double> scale(0.0, 2.0);
    std::vector<double> key(todo.size());
    for (size_t tries = search_tries(todo.size()); tries > 0 && best_pool + out.other_peak > fit; --tries) {
      for (size_t k = 0; k < todo.size(); ++k) key[k] = static_cast<double>(keys[0][k]) * scale(rng);
      try_order(key);
    }
  }
  out.buffers = std::move(best);
  std::sort(out.buffers.begin(), out.buffers.end(), [](const PlacedBuffer& a, const PlacedBuffer& b) {
    return std::pair(a.offset, a.life) < std::pair(b.offset, b.life);
  });
  summarise(model, moves, out);
  return out;
}

std::string check_placement(const SpanModel& model, const std::vector<OffloadMove>& moves, const Placement& placement) {
  const size_t n = model.seqs.size();
  const auto [absent, kept] = absences(model, moves);
  std::vector<bool> seen(model.lives.size(), false);
  struct Held {
    Part part;
    size_t life = 0;
  };
  std::vector<Held> held;
  for (const PlacedBuffer& p : placement.buffers) {
    if (p.life >= model.lives.size()) return fmt::format("placed life {} is not in the span", p.life);
    if (seen[p.life]) return fmt::format("life {} placed twice", p.life);
    seen[p.life] = true;
    const SpanModel::Life& life = model.lives[p.life];
    if (placement.granule == 0 || p.offset % placement.granule || p.bytes % placement.granule)
      return fmt::format("life {} at {} ({} bytes) is not granule-aligned", p.life, p.offset, p.bytes);
    if (p.bytes != life.bytes) return fmt::format("life {} placed with {} bytes, has {}", p.life, p.bytes, life.bytes);
    // Its segments cover it in order, aligned, within the pool, none straddling its kept part's end.
    const std::vector<PlacedSegment> segs = segments_of(p);
    if (segs.front().offset != p.offset) return fmt::format("life {}: its offset is not its first segment's", p.life);
    uint64_t at = 0;
    for (const PlacedSegment& g : segs) {
      if (g.at != at || g.bytes == 0 || g.offset % placement.granule || g.bytes % placement.granule)
        return fmt::format("life {}: its segments do not cover it in order, aligned", p.life);
      if (g.offset + g.bytes > placement.pool_bytes) return fmt::format("life {} reaches beyond the pool", p.life);
      if (g.at < p.kept && g.at + g.bytes > p.kept)
        return fmt::format("life {}: a segment straddles its kept part's end", p.life);
      at += g.bytes;
    }
    if (at != p.bytes) return fmt::format("life {}: its segments cover {} of its {} bytes", p.life, at, p.bytes);
    if (segs.size() > 2 * kMaxSegments) return fmt::format("life {} in {} pieces", p.life, segs.size());
    Intervals want;
    if (p.partner == PlacedBuffer::kNoPartner) {
      want = less(life.first, life.last, absent[p.life]);
    } else {
      if (p.partner >= model.lives.size())
        return fmt::format("life {}: partner {} is not in the span", p.life, p.partner);
      if (model.lives[p.partner].bytes != p.bytes)
        return fmt::format("life {}: partner {} has another size", p.life, p.partner);
      want = less(0, model.lives[p.partner].last, absent[p.partner]);
      for (const auto& r : less(life.first, n - 1, absent[p.life])) {
        if (!want.empty() && r.first <= want.back().second + 1)
          want.back().second = std::max(want.back().second, r.second);
        else
          want.push_back(r);
      }
    }
    if (want != p.resident) return fmt::format("life {}: residency is not its life less its absences", p.life);
    if (p.moved != !absent[p.life].empty()) return fmt::format("life {}: moved flag wrong", p.life);
    if (p.through && !(model.across_end && life.through && p.moved && p.partner == PlacedBuffer::kNoPartner))
      return fmt::format("life {}: placed as alive through the span, which it is not (or it never moves)", p.life);
    if (p.kept % placement.granule || p.kept >= p.bytes || (p.kept && p.partner != PlacedBuffer::kNoPartner))
      return fmt::format("life {}: keeps {} of its {} bytes", p.life, p.kept, p.bytes);
    if (p.kept && p.kept_resident != Intervals{{life.first, life.last}})
      return fmt::format("life {}: its kept part is not on the device over its whole life", p.life);
    if (kept[p.life] != p.kept)
      return fmt::format("life {}: keeps {} bytes, its moves {}", p.life, p.kept, kept[p.life]);
    for (const Part& part : parts_of(p)) held.push_back({part, p.life});
  }
  // No two pieces share a pool byte while both are on the device (a buffer's own pieces included).
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) { return a.part.lo < b.part.lo; });
  for (size_t a = 0; a < held.size(); ++a) {
    for (size_t b = a + 1; b < held.size() && held[b].part.lo < held[a].part.hi; ++b) {
      if (overlap(*held[a].part.when, *held[b].part.when))
        return fmt::format("lives {} and {} share pool bytes while both are on the device", held[a].life, held[b].life);
    }
  }
  Placement again = placement;
  summarise(model, moves, again);
  if (again.pool_bytes != placement.pool_bytes || again.resident_peak != placement.resident_peak ||
      again.other_peak != placement.other_peak)
    return "the stated peaks are not the layout's";
  if (placement.resident_peak > placement.pool_bytes) return "more placed bytes on the device at once than the pool";
  return "";
}

// Note [Bytes held until the copy out ends]
// A moved buffer's pool bytes can take another buffer only once its copy out has read them: a
// buffer placed there earlier waits on the device for that copy (the runtime's hand-over). The plan
// counts a move off the device from the call after the one its copy overlaps, but copies out queue
// on one link: on the H100, ResNet-50 b64 at 90 % moves five buffers of 98-196 MiB in its first
// ~3 ms of compute, and the copies take 17 ms, so the fifth leaves only after the forward pass.
// Placed from the plan's off_from, buffers of the early forward pass took the bytes of the copies
// still queued and the GPU waited 16 ms for them (measured with scripts/bench/profile_step.py
// --gaps). So for the layout each move holds its bytes until its copy out ends in the plan's
// timeline, except from the first call over the target with them held on: there the bytes must
// change hands early, and the calls wait for the copies as they would without a placement.
namespace {

// The first call of a move's absence that starts once its copy out `c` has ended in `t` (its
// prefetch_at when none does).
size_t copied_by(const OffloadMove& mv, const TimedCopy& c, const PlanTimeline& t, size_t n) {
  size_t p = mv.off_from;
  while (p < n && p < mv.prefetch_at && t.call_start_ms[p] < c.end_ms) ++p;
  return p;
}

void hold_until_copied(const Trace& trace, const SpanModel& model, OffloadPlan& plan, const LinkModel& link,
                       double default_call_ms) {
  const PlanTimeline t = time_plan(trace, model, plan, link, default_call_ms);
  const size_t n = model.seqs.size();
  std::vector<size_t> held(plan.moves.size());
  for (size_t i = 0; i < plan.moves.size(); ++i) held[i] = plan.moves[i].off_from;
  for (const TimedCopy& c : t.copies_out)
    held[c.move] = std::min(copied_by(plan.moves[c.move], c, t, n), plan.moves[c.move].prefetch_at - 1);
  std::vector<OffloadMove> moves = plan.moves;
  for (size_t i = 0; i < moves.size(); ++i) moves[i].off_from = std::max(moves[i].off_from, held[i]);
  const std::vector<uint64_t> curve = simulate(model, moves);
  size_t over = n;
  for (size_t p = 0; p < n && over == n; ++p)
    if (curve[p] > plan.budget) over = p;
  for (size_t i = 0; i < moves.size(); ++i) {
    plan.moves[i].off_from = std::max(plan.moves[i].off_from, std::min(moves[i].off_from, over));
  }
  finish_plan(model, plan);
}

}  // namespace

CopyWindows copy_windows(const SpanModel& model, const OffloadPlan& plan, const PlanTimeline& t) {
  CopyWindows out(model.lives.size());
  const size_t n = model.seqs.size();
  for (const TimedCopy& c : t.copies_out) {
    const OffloadMove& mv = plan.moves[c.move];
    if (mv.life >= out.size()) continue;
    CopyWindow& w = out[mv.life];
    const size_t p = copied_by(mv, c, t, n);
    if (p > mv.off_from) w.whole.push_back({mv.off_from, p - 1});
    // Note [Copies out in pieces]: piece k has been read once the copy has read its end.
    const size_t pieces = static_cast<size_t>((mv.bytes + kCopyPiece - 1) / kCopyPiece);
    if (w.pieces.size() < pieces) w.pieces.resize(pieces);
    size_t q = mv.off_from;
    for (size_t k = 0; k < pieces; ++k) {
      const double read = static_cast<double>(std::min(mv.bytes, (k + 1) * kCopyPiece)) / static_cast<double>(mv.bytes);
      const double end = c.start_ms + read * (c.end_ms - c.start_ms);
      while (q < n && q < mv.prefetch_at && t.call_start_ms[q] < end) ++q;
      if (q > mv.off_from) w.pieces[k].push_back({mv.off_from, q - 1});
    }
  }
  for (CopyWindow& w : out) {
    std::sort(w.whole.begin(), w.whole.end());
    for (auto& piece : w.pieces) std::sort(piece.begin(), piece.end());
  }
  return out;
}

std::vector<Handover> handovers(const std::vector<OffloadMove>& moves, const Placement& placement) {
  std::vector<const PlacedBuffer*> by_life;
  for (const PlacedBuffer& p : placement.buffers) {
    if (p.life >= by_life.size()) by_life.resize(p.life + 1, nullptr);
    by_life[p.life] = &p;
  }
  std::vector<Handover> out;
  for (size_t i = 0; i < moves.size(); ++i) {
    const OffloadMove& mv = moves[i];
    const PlacedBuffer* x = mv.life < by_life.size() ? by_life[mv.life] : nullptr;
    if (!x || mv.first_absent() > mv.last_absent()) continue;
    std::vector<PlacedSegment> leaves;  // the pool bytes of its moving part
    for (const PlacedSegment& g : segments_of(*x))
      if (g.at >= x->kept) leaves.push_back(g);
    for (const PlacedBuffer& y : placement.buffers) {
      if (&y == x) continue;
      for (const Part& q : parts_of(y)) {
        // How far into the moving part (its copy's order) the bytes it shares reach.
        uint64_t reach = 0;
        for (const PlacedSegment& l : leaves)
          if (q.lo < l.offset + l.bytes && l.offset < q.hi)
            reach = std::max(reach, l.at - x->kept + std::min(q.hi, l.offset + l.bytes) - l.offset);
        if (reach == 0) continue;
        const uint64_t upto = std::min(mv.bytes, (reach + kCopyPiece - 1) / kCopyPiece * kCopyPiece);
        for (const auto& [first, last] : *q.when)
          if (mv.first_absent() <= first && first <= mv.last_absent()) out.push_back({first, i, upto});
      }
    }
  }
  return out;
}

PlanTimeline time_placed(const Trace& trace, const SpanModel& model, const OffloadPlan& plan,
                         const Placement& placement, const LinkModel& link, double default_call_ms) {
  std::vector<bool> pooled(plan.moves.size(), false);
  for (const PlacedBuffer& p : placement.buffers)
    for (size_t i = 0; i < plan.moves.size(); ++i) pooled[i] = pooled[i] || plan.moves[i].life == p.life;
  return time_plan(trace, model, plan, link, default_call_ms, handovers(plan.moves, placement), pooled);
}

// Note [Laying out around copies out]
// A layout that hands a moved buffer's bytes over as it leaves (not held until copied) makes each
// buffer placed there wait for the copy out if it arrives while the copy still runs. The layout
// picks gaps by size alone, so it often puts the forward pass's next feature maps exactly there:
// on the shipped VGG-16 iteration at the runtime's 90 % target the plan moves 742 MiB of one
// feature map right after its last forward use, the copy takes 13 ms, and the buffers of the rest
// of the forward pass waited 13 ms for it in the plan's timeline (79.7 ms a step; 62.9 for the
// budget's plan without a layout). Given when each copy out still reads its bytes (copy_windows(),
// from the plan's own timeline), a part is first offered only the gaps among the parts that share
// a moment with it and those whose copy reads them while it arrives (or that are on the device
// while its own copy reads it), below a pool of `copy_room` bytes; if none fits, it is laid out as
// before. plan_placed() lays each fitting plan out so twice more (room up to the most placed bytes
// at once, and up to what the budget leaves the pool) and keeps whichever timeline is shortest:
// there 72.4 ms, 5.6 of it waiting for copies out (13.0 before), in 25 blocks (78 before).
// Since copies out go in pieces (Note [Copies out in pieces]) the windows are per piece, a part is
// offered the bytes of the pieces read by the time it arrives, and where no gap avoids the copies
// it takes the one whose pieces are read soonest (at either end). The windows come from the
// timeline without waits for room (the one the layout aims for): from the plan's own timeline,
// whose calls wait for whole copies out, every piece looked read by the calls that arrive while it
// was still being read. On the VGG-16 iteration under micro-batching at 90 % (H100, 2026-11-25)
// the placed timeline went from 60.9 ms (3.3 waiting for copies out) to 57.6 (none).

// Note [Laying out in the copies' order]
// Where no gap away from the copies out fits a part, it took the one gap whose bytes the copies
// have read soonest. A gap holds bytes of several moves, copied one after another, so the part
// waited for the latest of them: on ResNet-50 b128 at the runtime's 90 % target (H100 trace,
// 2026-11-25) a buffer at call 783 took 224 MiB of the fourth move's bytes while that copy ran and
// waited 2.7 ms, when 980 MiB of the first three moves were already read, in gaps too small for it
// alone. A part that moves nothing of its own may now be laid out over the bytes read soonest, piece
// by piece (kCopyPiece), from every gap, in up to kMaxSegments segments, when that waits less.

// Note [Choosing how a placement holds bytes]
// Holding a moved buffer's bytes until its copy out ends (Note [Bytes held until the copy out
// ends]) removes the waits for hand-overs but leaves the layout less room, so that a tight budget
// needs a plan for a lower target that moves more: on the shipped ResNet-50 iteration 2744 MiB
// each way against 1960 at 70 % of its peak. Both layouts are made, each with the highest target
// that fits, and the one whose timeline (hand-overs included) is shorter is kept.
namespace {

Result<PlacedPlan> plan_placed_with(const Trace& trace, const Lifetimes& lifetimes, uint64_t budget,
                                    const OffloadOptions& options, const LinkModel& link, double default_call_ms) {
  const SpanModel model = span_model(trace, lifetimes, options);
  const uint64_t step = std::max<uint64_t>(options.granule, budget / 100);
  std::optional<PlacedPlan> closest, best;
  std::string refused;
  // Note [Searching for a layout that fits]: a second pass searches for layouts when none fitted.
  for (const bool search : {false, true}) {
    if (search && best) break;
    for (const bool hold : {true, false}) {
      for (uint64_t target = budget; target >= step; target -= step) {
        Result<OffloadPlan> plan =
            plan_offload(trace, lifetimes, target, OffloadPolicy::kVcudnn, options, link, default_call_ms);
        if (!plan) {
          if (!closest) refused = plan.error().message;
          break;  // below the least budget: more moves cannot help
        }
        schedule_prefetches_early(model, plan.value());  // Note [Prefetches as early as the budget allows]
        if (hold) hold_until_copied(trace, model, plan.value(), link, default_call_ms);
        PlacedPlan placed{std::move(plan.value()), {}, target, hold};
        placed.placement =
            place_buffers(trace, lifetimes, model, placed.plan.moves, options.granule, search ? budget : 0);
        if (placed.placement.total() <= budget) {
          PlanTimeline t = time_placed(trace, model, placed.plan, placed.placement, link, default_call_ms);
          // Note [Laying out around copies out]
          if (!hold && t.room_ms > 0) {
            // The copies' windows in the timeline the layout aims for: no call waiting for room.
            const CopyWindows windows = copy_windows(model, placed.plan,
                                                     time_plan(trace, model, placed.plan, link, default_call_ms, {},
                                                               std::vector<bool>(placed.plan.moves.size(), true)));
            const uint64_t rooms[] = {0, budget - std::min(budget, placed.placement.other_peak)};
            for (const uint64_t room : rooms) {
              Placement around = place_buffers(trace, lifetimes, model, placed.plan.moves, options.granule,
                                               search ? budget : 0, &windows, room);
              if (around.total() > budget) continue;
              PlanTimeline u = time_placed(trace, model, placed.plan, around, link, default_call_ms);
              if (u.step_ms < t.step_ms) {
                placed.placement = std::move(around);
                t = std::move(u);
              }
            }
          }
          placed.step_ms = t.step_ms;
          placed.handover_ms = t.room_ms;
          if (!best || placed.step_ms < best->step_ms) best = std::move(placed);
          break;
        }
        if (!closest || placed.placement.total() < closest->placement.total()) closest = std::move(placed);
      }
    }
  }
  if (best) return std::move(*best);
  if (!closest) return Error{refused};
  return Error{fmt::format("no static placement fits {:.1f} MiB: the closest needs {:.1f} MiB (a plan for {:.1f} MiB)",
                           static_cast<double>(budget) / (1 << 20),
                           static_cast<double>(closest->placement.total()) / (1 << 20),
                           static_cast<double>(closest->plan_budget) / (1 << 20))};
}

}  // namespace

// Note [Moving part of a buffer]: a plan that keeps part of its buffers on the device leaves each
// call at its target exactly, so its layout may need a lower target than a plan of whole buffers
// (VGG-16 b64 at 90 %: none fitted at all). Both are laid out; the shorter predicted step is kept.
Result<PlacedPlan> plan_placed(const Trace& trace, const Lifetimes& lifetimes, uint64_t budget,
                               const OffloadOptions& options, const LinkModel& measured, double default_call_ms) {
  // Note [Copies out with room to spare]
  LinkModel link = measured;
  link.device_to_host_gbps *= kCopyOutRate;
  link.both_gbps *= kCopyOutRate;
  Result<PlacedPlan> out = Error{""};
  // Note [Across the iteration's end]: with moves across the end allowed, also a plan that takes them
  // first; the faster is kept (or, across_only_where_needed, that plan only where none fits without).
  for (const bool across : {false, true}) {
    if (across && (!options.across_end || (options.across_only_where_needed && out))) break;
    for (const bool partial : {false, true}) {
      if (partial && !options.partial_moves) break;
      OffloadOptions o = options;
      o.partial_moves = partial;
      o.across_end = o.across_first = across;
      Result<PlacedPlan> p = plan_placed_with(trace, lifetimes, budget, o, link, default_call_ms);
      // Moves across the end only where they shorten the step (by 0.1 % at least): not more bytes for
      // a tie (ResNet-50 b64 at 90 %: 146 MiB more, the same step).
      const double margin = across && out ? 0.001 * out->step_ms : 0.0;
      if (p ? !out || p->step_ms < out->step_ms - margin : !out && out.error().message.empty()) out = std::move(p);
    }
  }
  // The step it predicts is at the measured rates, as every other timeline's.
  if (out) {
    const PlanTimeline t = time_placed(trace, span_model(trace, lifetimes, options), out->plan, out->placement,
                                       measured, default_call_ms);
    out->step_ms = t.step_ms;
    out->handover_ms = t.room_ms;
  }
  return out;
}

}  // namespace vcudnn
