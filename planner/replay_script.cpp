// ReplayScript (replay_script.h).
#include "planner/replay_script.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>

namespace vcudnn {
namespace {

bool same_step(const ReplayStep& a, const ReplayStep& b) { return a.alloc == b.alloc && a.bytes == b.bytes; }

// The fewest first steps that occur at no other (cyclic) offset of the sequence; 0 if even 64 do.
size_t unique_prefix(const std::vector<ReplayStep>& steps) {
  constexpr size_t kMaxAnchor = 64;
  const size_t n = steps.size();
  std::vector<size_t> candidates;  // offsets still matching the prefix so far
  for (size_t o = 1; o < n; ++o) candidates.push_back(o);
  for (size_t len = 1; len <= std::min(n, kMaxAnchor); ++len) {
    const ReplayStep& want = steps[len - 1];
    std::erase_if(candidates, [&](size_t o) { return !same_step(steps[(o + len - 1) % n], want); });
    if (candidates.empty()) return len;
  }
  return 0;
}

}  // namespace

bool is_memory_event(const TraceCall& call) {
  return call.kind == CallKind::kAlloc || call.kind == CallKind::kFree || !call.accesses.empty();
}

Result<ReplayScript> replay_script(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                                   const OffloadPlan& plan) {
  std::unordered_map<uint64_t, const TraceCall*> by_seq;
  for (const TraceCall& c : trace.calls) by_seq.emplace(c.seq, &c);
  const size_t n = model.seqs.size();
  ReplayScript s;
  // event_before[p]: memory events before position p (so the event at p, or the next one).
  std::vector<uint32_t> event_before(n + 1, 0);
  std::unordered_map<uint64_t, uint32_t> alloc_index;  // alloc seq -> index among the allocations
  uint32_t allocs = 0;
  for (size_t p = 0; p < n; ++p) {
    event_before[p] = s.events;
    const auto it = by_seq.find(model.seqs[p]);
    if (it == by_seq.end()) return Error{fmt::format("replay: call {} is not in the trace", model.seqs[p])};
    const TraceCall& c = *it->second;
    if (!is_memory_event(c)) continue;
    if (c.kind == CallKind::kAlloc || c.kind == CallKind::kFree) {
      if (c.buffer < 0 || static_cast<size_t>(c.buffer) >= trace.buffers.size())
        return Error{fmt::format("replay: call {} allocates or frees no known buffer", c.seq)};
      const bool alloc = c.kind == CallKind::kAlloc;
      s.steps.push_back({alloc, trace.buffers[static_cast<size_t>(c.buffer)].bytes, s.events});
      if (alloc) alloc_index.emplace(c.seq, allocs++);
    }
    ++s.events;
  }
  event_before[n] = s.events;
  s.anchor = unique_prefix(s.steps);
  s.alloc_uses.resize(allocs);
  for (const BufferLife& bl : lifetimes.buffers) {
    std::vector<uint32_t> events;
    for (uint64_t seq : bl.uses) {
      const auto p =
          static_cast<size_t>(std::lower_bound(model.seqs.begin(), model.seqs.end(), seq) - model.seqs.begin());
      if (p < n) events.push_back(event_before[p]);
    }
    if (bl.alloc_seq && bl.free_seq) {
      s.alloc_uses[alloc_index.at(*bl.alloc_seq)] = std::move(events);
    } else if (!bl.alloc_seq && !bl.free_seq) {
      s.persistent_uses.push_back({trace.buffers.at(bl.buffer).id, std::move(events)});
    }
  }

  // How early each copy back may go with the budget still held, the earlier ones served first.
  std::vector<uint64_t> sim = simulate(model, plan.moves);
  std::vector<size_t> by_prefetch(plan.moves.size());
  for (size_t k = 0; k < by_prefetch.size(); ++k) by_prefetch[k] = k;
  std::stable_sort(by_prefetch.begin(), by_prefetch.end(),
                   [&](size_t a, size_t b) { return plan.moves[a].prefetch_at < plan.moves[b].prefetch_at; });
  std::vector<size_t> earliest_at(plan.moves.size());
  for (size_t k : by_prefetch) {
    const OffloadMove& mv = plan.moves[k];
    size_t q = mv.prefetch_at;
    while (q > mv.off_from + 1 && q - 1 < sim.size() && sim[q - 1] + mv.bytes <= plan.budget) --q;
    for (size_t x = q; x < mv.prefetch_at && x < sim.size(); ++x) sim[x] += mv.bytes;
    earliest_at[k] = q;
  }

  for (size_t k = 0; k < plan.moves.size(); ++k) {
    const OffloadMove& mv = plan.moves[k];
    const BufferLife& bl = lifetimes.buffers.at(mv.life);
    ReplayTarget t;
    t.bytes = trace.buffers.at(bl.buffer).bytes;
    if (bl.alloc_seq && bl.free_seq) {
      t.alloc_index = alloc_index.at(*bl.alloc_seq);
    } else if (!bl.alloc_seq && !bl.free_seq) {
      t.persistent = true;
      t.serial = trace.buffers.at(bl.buffer).id;
    } else {
      return Error{
          fmt::format("replay: buffer {} lives across one end of the iteration only and cannot be named "
                      "in a later one",
                      trace.buffers.at(bl.buffer).id)};
    }
    const uint32_t out = event_before[mv.out_after] + 1;
    const uint32_t back = event_before[mv.prefetch_at];
    if (back <= out) continue;  // no memory event between: nothing to gain
    const auto target = static_cast<uint32_t>(s.targets.size());
    s.targets.push_back(t);
    s.actions.push_back({out, ReplayAction::kOffload, target, out});
    s.actions.push_back(
        {back, ReplayAction::kPrefetch, target, std::clamp(event_before[earliest_at[k]], out + 1, back)});
    s.bytes_moved += mv.bytes;
  }
  std::stable_sort(s.actions.begin(), s.actions.end(), [](const ReplayAction& a, const ReplayAction& b) {
    return a.event != b.event ? a.event < b.event : a.kind < b.kind;
  });
  return s;
}

Status place_script(ReplayScript& script, const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                    const Placement& placement) {
  const uint64_t g = placement.granule;
  if (g == 0 || placement.cuts.size() < 2) return Error{"placement: no pool"};
  // Allocation indexes as replay_script() counts them: the span's allocations of a known buffer.
  std::unordered_map<uint64_t, const TraceCall*> by_seq;
  for (const TraceCall& c : trace.calls) by_seq.emplace(c.seq, &c);
  std::unordered_map<uint64_t, uint32_t> alloc_index;
  uint32_t allocs = 0;
  for (uint64_t seq : model.seqs) {
    const auto it = by_seq.find(seq);
    if (it == by_seq.end()) continue;
    const TraceCall& c = *it->second;
    if (c.kind == CallKind::kAlloc && c.buffer >= 0 && static_cast<size_t>(c.buffer) < trace.buffers.size())
      alloc_index.emplace(c.seq, allocs++);
  }
  ReplayPlacement out;
  out.granule = g;
  for (uint64_t cut : placement.cuts) {
    if (cut % g) return Error{"placement: a block boundary is not granule-aligned"};
    out.cuts.push_back(cut / g);
  }
  out.slots.assign(allocs, {});
  std::set<uint64_t> through;  // their serials
  for (const PlacedBuffer& p : placement.buffers) {
    const BufferLife& life = lifetimes.buffers.at(p.life);
    if (p.through) {  // Note [Across the iteration's end]: whole, in whole blocks
      if (life.alloc_seq || life.free_seq || p.kept || p.offset % g || p.bytes % g)
        return Error{fmt::format("placement: buffer {} is not alive through the iteration, or moves in part",
                                 trace.buffers.at(life.buffer).id)};
      ReplayThroughSlot t{trace.buffers.at(life.buffer).id, {p.offset / g, p.bytes / g, 0, {}}};
      if (p.segments.size() > 1)
        for (const PlacedSegment& s : p.segments) t.slot.segments.push_back({s.offset / g, s.bytes / g});
      through.insert(t.serial);
      out.through.push_back(std::move(t));
      continue;
    }
    const auto index = life.alloc_seq ? alloc_index.find(*life.alloc_seq) : alloc_index.end();
    if (index == alloc_index.end())
      return Error{
          fmt::format("placement: buffer {} is not allocated by the iteration", trace.buffers.at(life.buffer).id)};
    if (p.offset % g || p.bytes % g || p.kept % g) return Error{"placement: a buffer is not granule-aligned"};
    ReplaySlot& slot = out.slots[index->second];
    slot = {p.offset / g, p.bytes / g, p.kept / g, {}};
    if (p.segments.size() > 1) {
      for (const PlacedSegment& s : p.segments) {
        if (s.offset % g || s.bytes % g) return Error{"placement: a buffer's piece is not granule-aligned"};
        slot.segments.push_back({s.offset / g, s.bytes / g});
      }
    }
  }
  // A placed buffer's copy back may not move earlier than planned (late prefetches do, Replayer::late):
  // the buffers placed in its absence may still hold its pool bytes before then.
  for (ReplayAction& a : script.actions) {
    const ReplayTarget& t = script.targets.at(a.target);
    if (a.kind == ReplayAction::kPrefetch &&
        ((!t.persistent && t.alloc_index < out.slots.size() && out.slots[t.alloc_index].granules) ||
         (t.persistent && through.count(t.serial))))
      a.earliest = a.event;
  }
  script.placement = std::move(out);
  return ok_status();
}

}  // namespace vcudnn
