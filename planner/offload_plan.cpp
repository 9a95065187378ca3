// Offload planning (offload_plan.h).
#include "planner/offload_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace vcudnn {
namespace {

uint64_t round_up(uint64_t v, uint64_t g) { return g ? (v + g - 1) / g * g : v; }

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// A gap between two consecutive uses of a movable buffer long enough to leave the device.
struct Gap {
  size_t life = 0;
  size_t use = 0, next = 0;  // positions of the two uses
  uint64_t bytes = 0;
  size_t first() const { return use + 2; }
  size_t last() const { return next - 2; }
};

// Positions u < v are far enough apart for the buffer to be off the device for at least one call.
constexpr size_t kMinGap = 4;

std::vector<Gap> gaps_of(const SpanModel& m) {
  std::vector<Gap> out;
  const size_t n = m.seqs.size();
  for (size_t i = 0; i < m.lives.size(); ++i) {
    const SpanModel::Life& l = m.lives[i];
    if (!l.movable) continue;
    for (size_t k = 0; k + 1 < l.uses.size(); ++k)
      if (l.uses[k + 1] - l.uses[k] >= kMinGap) out.push_back({i, l.uses[k], l.uses[k + 1], l.bytes});
    if (m.across_end && l.through && !l.uses.empty() &&
        n - l.uses.back() >= kMinGap)  // Note [Across the iteration's end]
      out.push_back({i, l.uses.back(), n, l.bytes});
  }
  return out;
}

Result<OffloadPlan> plan_modnn(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& m, uint64_t budget,
                               const LinkModel& link, double default_call_ms);

// Each call's GPU time by position: the trace's; `default_call_ms` for a call that queues work
// and has none; 0 for one that queues none (allocations, frees and stream settings: ResNet-50's
// iteration has ~1700, which at the runtime's 5 us each had its plans' steps 8.5 ms above the GPU's
// 72.4 at batch 128), and 0 for a collective (is_collective()): NCCL's stream runs it beside the
// compute, and its time counts the other ranks' too. The copies out of its buffers wait for it on
// the device all the same. How many queue work and had none.
std::vector<double> durations(const Trace& trace, const SpanModel& m, double default_call_ms, size_t* untimed) {
  const size_t n = m.seqs.size();
  std::vector<double> duration(n, 0.0);
  size_t p = 0, missing = 0;
  for (const TraceCall& c : trace.calls) {
    if (p >= n) break;
    if (c.seq != m.seqs[p]) continue;
    if (is_collective(trace, c)) {
      ++p;
      continue;
    }
    if (c.gpu_ms) {
      duration[p] = *c.gpu_ms;
    } else if (call_queues_device_work(c.kind)) {
      duration[p] = default_call_ms;
      ++missing;
    }
    ++p;
  }
  if (untimed) *untimed = missing;
  return duration;
}

// Off the device from the call after the one its copy out overlaps (Gap::first()), not from the
// start of the iteration: a move left with off_from = 0 took its bytes off every call before its
// use too, in simulate(), offload_bound() and where prefetches may move (replay_script.cpp).
OffloadMove move_of(const Gap& g, size_t prefetch_at) {
  return {g.life, g.bytes, g.use, prefetch_at, g.next, g.first()};
}

void finish(const SpanModel& m, OffloadPlan& plan) {
  std::sort(plan.moves.begin(), plan.moves.end(), [](const OffloadMove& a, const OffloadMove& b) {
    return std::pair(a.out_after, a.life) < std::pair(b.out_after, b.life);
  });
  plan.bytes_moved = 0;
  for (const OffloadMove& mv : plan.moves) plan.bytes_moved += mv.bytes;
  const std::vector<uint64_t> with = simulate(m, plan.moves);
  const std::vector<uint64_t> without = simulate(m, {});
  plan.peak_bytes = 0;
  plan.peak_at = 0;
  for (size_t p = 0; p < with.size(); ++p) {
    if (with[p] > plan.peak_bytes) {
      plan.peak_bytes = with[p];
      plan.peak_at = p;
    }
  }
  plan.peak_without = without.empty() ? 0 : *std::max_element(without.begin(), without.end());
  plan.fits = plan.peak_bytes <= plan.budget;
}

// Bytes per millisecond at `gbps`; a link without a rate moves anything at once.
double bytes_per_ms(double gbps) { return gbps > 0 ? gbps * 1e6 : 1e300; }

// The calls back to back, without stalls, from their GPU times: when each starts.
// One more entry than calls: the last is the span's end (the next iteration's use of a move across
// it, Note [Across the iteration's end]).
std::vector<double> start_times(const std::vector<double>& duration) {
  std::vector<double> start(duration.size() + 1);
  double now = 0;
  for (size_t p = 0; p < duration.size(); ++p) {
    start[p] = now;
    now += duration[p];
  }
  start[duration.size()] = now;
  return start;
}

// Greedy cover of the calls over the budget, worst first: at the worst call, the smallest move that
// removes its whole excess, else the one that removes the most excess over its range; then every
// move the later ones made unneeded goes again (last chosen, first tried).
// Note [Moving part of a buffer]: each moved buffer that may move in part, the last to leave first,
// keeps the granules its absences have room for under the budget.
void keep_what_fits(const SpanModel& m, uint64_t budget, uint64_t granule, std::vector<OffloadMove>& moves) {
  if (granule == 0) return;
  std::vector<uint64_t> present = simulate(m, moves);
  std::vector<std::vector<size_t>> by_life(m.lives.size());
  std::vector<size_t> lives;  // by their first move's out_after, last first
  for (size_t k = 0; k < moves.size(); ++k) {
    if (by_life[moves[k].life].empty()) lives.push_back(moves[k].life);
    by_life[moves[k].life].push_back(k);
  }
  const auto leaves = [&](size_t life) { return moves[by_life[life].front()].out_after; };
  std::stable_sort(lives.begin(), lives.end(), [&](size_t a, size_t b) { return leaves(a) > leaves(b); });
  for (size_t life : lives) {
    const SpanModel::Life& l = m.lives[life];
    if (!l.partial || l.bytes <= granule) continue;
    uint64_t room = l.bytes - granule;  // at least one granule moves
    for (size_t k : by_life[life]) {
      const OffloadMove& mv = moves[k];
      for (size_t p = mv.first_absent(); p <= mv.last_absent() && p < present.size(); ++p)
        room = std::min(room, present[p] < budget ? budget - present[p] : 0);
    }
    const uint64_t keep = room / granule * granule;
    if (keep == 0) continue;
    for (size_t k : by_life[life]) {
      OffloadMove& mv = moves[k];
      mv.offset = keep;
      mv.bytes = l.bytes - keep;
      for (size_t p = mv.first_absent(); p <= mv.last_absent() && p < present.size(); ++p) present[p] += keep;
    }
  }
}

Result<OffloadPlan> plan_vcudnn(const SpanModel& m, uint64_t budget, uint64_t granule, bool across_first) {
  OffloadPlan plan;
  plan.policy = OffloadPolicy::kVcudnn;
  plan.budget = budget;
  std::vector<uint64_t> present = simulate(m, {});
  const std::vector<Gap> gaps = gaps_of(m);
  std::vector<bool> taken(gaps.size(), false);
  std::vector<size_t> chosen;
  const auto excess = [&](size_t p) { return present[p] > budget ? present[p] - budget : 0; };
  if (across_first)  // Note [Across the iteration's end]
    for (size_t i = 0; i < gaps.size(); ++i)
      if (gaps[i].next == m.seqs.size() && gaps[i].next - gaps[i].use > m.seqs.size() / 2) {
        taken[i] = true;
        chosen.push_back(i);
        for (size_t p = gaps[i].first(); p <= gaps[i].last(); ++p) present[p] -= gaps[i].bytes;
      }
  while (true) {
    size_t worst = 0;
    for (size_t p = 1; p < present.size(); ++p)
      if (present[p] > present[worst]) worst = p;
    if (present.empty() || present[worst] <= budget) break;
    const uint64_t need = excess(worst);
    std::optional<size_t> best;
    uint64_t best_benefit = 0;
    bool best_covers = false;
    for (size_t i = 0; i < gaps.size(); ++i) {
      const Gap& g = gaps[i];
      if (taken[i] || g.first() > worst || g.last() < worst) continue;
      uint64_t benefit = 0;
      for (size_t p = g.first(); p <= g.last(); ++p) benefit += std::min(g.bytes, excess(p));
      const bool covers = g.bytes >= need;
      bool better = false;
      if (!best) {
        better = true;
      } else if (covers != best_covers) {
        better = covers;
      } else if (covers) {  // both remove the whole excess here: the fewer bytes, then the more help elsewhere
        better = g.bytes < gaps[*best].bytes || (g.bytes == gaps[*best].bytes && benefit > best_benefit);
      } else {
        better = benefit > best_benefit || (benefit == best_benefit && g.bytes < gaps[*best].bytes);
      }
      if (better) {
        best = i;
        best_benefit = benefit;
        best_covers = covers;
      }
    }
    if (!best)
      return Error{fmt::format("no buffer can leave the device at call {} ({} over the budget of {})", m.seqs[worst],
                               mib(need), mib(budget))};
    taken[*best] = true;
    chosen.push_back(*best);
    const Gap& g = gaps[*best];
    for (size_t p = g.first(); p <= g.last(); ++p) present[p] -= g.bytes;
  }
  for (size_t k = chosen.size(); k-- > 0;) {
    const Gap& g = gaps[chosen[k]];
    // Across the end: kept though no call needs them; what they buy is time (the link idle early in
    // the step), which bytes do not show.
    if (across_first && g.next == m.seqs.size()) continue;
    bool needed = false;
    for (size_t p = g.first(); p <= g.last() && !needed; ++p) needed = present[p] + g.bytes > budget;
    if (needed) continue;
    for (size_t p = g.first(); p <= g.last(); ++p) present[p] += g.bytes;
    taken[chosen[k]] = false;
  }
  for (size_t i = 0; i < gaps.size(); ++i)
    if (taken[i]) plan.moves.push_back(move_of(gaps[i], gaps[i].next - 1));
  keep_what_fits(m, budget, granule, plan.moves);
  finish(m, plan);
  return plan;
}

Result<OffloadPlan> plan_vdnn(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& m, uint64_t budget,
                              OffloadPolicy policy) {
  if (!lifetimes.turn_seq)
    return Error{fmt::format("{} needs a forward pass of convolutions followed by a backward one; this trace has none",
                             offload_policy_name(policy))};
  const auto pos_of = [&](uint64_t seq) {
    return static_cast<size_t>(std::lower_bound(m.seqs.begin(), m.seqs.end(), seq) - m.seqs.begin());
  };
  const size_t turn = pos_of(*lifetimes.turn_seq);
  // Backward convolutions (a layer's backward pass starts with one), and the buffers forward
  // convolutions read (vdnn-conv: the convolution layers' input feature maps).
  std::vector<size_t> backward_convs;
  std::set<uint32_t> conv_inputs;
  for (const TraceCall& c : trace.calls) {
    if (c.seq < lifetimes.first_seq || c.seq >= lifetimes.end_seq || c.kind != CallKind::kConvolution) continue;
    const size_t p = pos_of(c.seq);
    if (c.conv != ConvKind::kForward && p >= turn) backward_convs.push_back(p);
    if (c.conv == ConvKind::kForward && p < turn)
      for (const BufferAccess& a : c.accesses)
        if (a.mode != AccessMode::kWrite) conv_inputs.insert(a.buffer);
  }
  OffloadPlan plan;
  plan.policy = policy;
  plan.budget = budget;
  for (size_t i = 0; i < m.lives.size(); ++i) {
    const SpanModel::Life& l = m.lives[i];
    const BufferLife& bl = lifetimes.buffers[i];
    // Feature maps: what the iteration allocates (parameters and optimizer state stay).
    if (!l.movable || !bl.alloc_seq) continue;
    if (policy == OffloadPolicy::kVdnnConv && !conv_inputs.count(bl.buffer)) continue;
    const auto next = std::lower_bound(l.uses.begin(), l.uses.end(), turn);
    if (next == l.uses.begin() || next == l.uses.end()) continue;  // not used on both sides of the turn
    const size_t use = *(next - 1), v = *next;
    // The prefetch starts with the backward layer computed before the one that needs it.
    const auto before = std::lower_bound(backward_convs.begin(), backward_convs.end(), v);
    if (before == backward_convs.begin()) continue;
    const size_t prefetch_at = *(before - 1);
    if (prefetch_at < use + 3) continue;                               // back before it could have left
    plan.moves.push_back({i, l.bytes, use, prefetch_at, v, use + 2});  // off once its copy out has overlapped a call
  }
  finish(m, plan);
  return plan;
}

}  // namespace

void finish_plan(const SpanModel& m, OffloadPlan& plan) { finish(m, plan); }

std::string_view offload_policy_name(OffloadPolicy policy) {
  switch (policy) {
    case OffloadPolicy::kVcudnn:
      return "vcudnn";
    case OffloadPolicy::kVdnnAll:
      return "vdnn-all";
    case OffloadPolicy::kVdnnConv:
      return "vdnn-conv";
    case OffloadPolicy::kModnn:
      return "modnn";
  }
  return "?";
}

std::optional<OffloadPolicy> offload_policy_from_name(std::string_view name) {
  for (OffloadPolicy p : kOffloadPolicies)
    if (offload_policy_name(p) == name) return p;
  return std::nullopt;
}

SpanModel span_model(const Trace& trace, const Lifetimes& lifetimes, const OffloadOptions& options) {
  SpanModel m;
  for (const TraceCall& c : trace.calls)
    if (c.seq >= lifetimes.first_seq && c.seq < lifetimes.end_seq) m.seqs.push_back(c.seq);
  const auto pos_of = [&](uint64_t seq) {
    return static_cast<size_t>(std::lower_bound(m.seqs.begin(), m.seqs.end(), seq) - m.seqs.begin());
  };
  const size_t n = m.seqs.size();
  for (const BufferLife& bl : lifetimes.buffers) {
    SpanModel::Life l;
    l.first = bl.alloc_seq ? pos_of(*bl.alloc_seq) : 0;
    l.last = bl.free_seq ? pos_of(*bl.free_seq) : (n ? n - 1 : 0);
    for (uint64_t s : bl.uses) l.uses.push_back(pos_of(s));
    const bool library = trace.buffers[bl.buffer].library;
    const bool own_granules = !library && bl.bytes >= options.granule;
    const bool replayable = bl.alloc_seq.has_value() == bl.free_seq.has_value();
    l.movable = own_granules && (replayable || !options.replayable_only);
    l.bytes = own_granules ? round_up(bl.bytes, options.granule) : bl.bytes;
    l.partial = l.movable && options.partial_moves && bl.alloc_seq && bl.free_seq;
    l.through = !bl.alloc_seq && !bl.free_seq;
    m.lives.push_back(std::move(l));
  }
  m.fixed_bytes = lifetimes.untouched_bytes;
  m.across_end = options.across_end;
  return m;
}

std::vector<uint64_t> simulate(const SpanModel& m, const std::vector<OffloadMove>& moves) {
  const size_t n = m.seqs.size();
  std::vector<int64_t> diff(n + 1, 0);
  const auto add = [&](size_t first, size_t last, int64_t bytes) {
    if (first > last || first >= n) return;
    diff[first] += bytes;
    diff[std::min(last, n - 1) + 1] -= bytes;
  };
  for (const SpanModel::Life& l : m.lives) add(l.first, l.last, static_cast<int64_t>(l.bytes));
  for (const OffloadMove& mv : moves) add(mv.first_absent(), mv.last_absent(), -static_cast<int64_t>(mv.bytes));
  std::vector<uint64_t> out(n);
  int64_t run = static_cast<int64_t>(m.fixed_bytes);
  for (size_t p = 0; p < n; ++p) {
    run += diff[p];
    out[p] = static_cast<uint64_t>(std::max<int64_t>(run, 0));
  }
  return out;
}

ConvWorkspace largest_conv_workspace(const Trace& trace) {
  ConvWorkspace out;
  for (const TraceCall& c : trace.calls) {
    if (c.kind != CallKind::kConvolution || c.seq < trace.first_seq || c.seq >= trace.end_seq) continue;
    const uint64_t ws = c.ptrs[kPtrWorkspace];
    if (ws == 0) continue;
    for (const BufferAccess& a : c.accesses) {
      const TraceBuffer& b = trace.buffers[a.buffer];
      if (b.address == ws && b.bytes > out.bytes) out = {b.bytes, c.seq};
    }
  }
  return out;
}

// Note [Workspaces that decide the budget]
std::string workspace_advice(const ConvWorkspace& workspace, uint64_t budget) {
  if (workspace.bytes == 0 || workspace.bytes < budget / 10) return "";
  return fmt::format(
      "convolution workspaces reach {} (call {}, {:.0f}% of the budget), which no plan can move: "
      "VCUDNN_POLICY=microbatch+offload with VCUDNN_WORKSPACE_LIMIT (512M, say) bounds them by running such "
      "convolutions as micro-batches (results then differ by floating-point reassociation, no longer bitwise)",
      mib(workspace.bytes), workspace.seq, 100.0 * static_cast<double>(workspace.bytes) / static_cast<double>(budget));
}

OffloadBound offload_bound(const SpanModel& m) {
  std::vector<OffloadMove> every;  // every gap taken: what stays is what no move can take
  for (const Gap& g : gaps_of(m)) every.push_back(move_of(g, g.next - 1));
  const std::vector<uint64_t> fixed = simulate(m, every);
  OffloadBound b;
  for (size_t p = 0; p < fixed.size(); ++p) {
    if (fixed[p] > b.least_bytes) {
      b.least_bytes = fixed[p];
      b.at = p;
    }
  }
  b.seq = m.seqs.empty() ? 0 : m.seqs[b.at];
  return b;
}

Result<OffloadPlan> plan_offload(const Trace& trace, const Lifetimes& lifetimes, uint64_t budget, OffloadPolicy policy,
                                 const OffloadOptions& options, const LinkModel& link, double default_call_ms) {
  const SpanModel m = span_model(trace, lifetimes, options);
  const OffloadBound bound = offload_bound(m);
  if (budget < bound.least_bytes)
    return Error{fmt::format(
        "a device budget of {} is below the least any offload plan of this iteration needs: {} ({} bytes), at call "
        "{} (what that call and its neighbours use, buffers below one granule of {} and library buffers stay{})",
        mib(budget), mib(bound.least_bytes), bound.least_bytes, bound.seq, mib(options.granule),
        m.fixed_bytes ? ", and " + mib(m.fixed_bytes) + " alive that no call of the iteration uses" : "")};
  if (policy == OffloadPolicy::kVcudnn) return plan_vcudnn(m, budget, options.granule, options.across_first);
  if (policy == OffloadPolicy::kModnn) return plan_modnn(trace, lifetimes, m, budget, link, default_call_ms);
  return plan_vdnn(trace, lifetimes, m, budget, policy);
}

namespace {

// moDNN's Algorithm 1 over the call sequence (offload_plan.h says what is left out).
Result<OffloadPlan> plan_modnn(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& m, uint64_t budget,
                               const LinkModel& link, double default_call_ms) {
  const size_t n = m.seqs.size();
  const std::vector<double> dur = durations(trace, m, default_call_ms, nullptr);
  const double d2h = bytes_per_ms(link.device_to_host_gbps), h2d = bytes_per_ms(link.host_to_device_gbps);
  std::vector<std::vector<size_t>> uses_at(n), arrive_at(n), leave_at(n);
  struct State {
    bool resident = false, fresh = true;  // fresh: not used since it arrived (protected)
    bool away = false;                    // offloaded, not yet brought back
    bool brought = false;                 // on the device again after an offload
    double ready_ms = 0;                  // its copy back ends
    size_t out_after = 0, off_from = 0;   // while offloaded
    bool offloaded_now = false;           // offloaded before the current call
  };
  std::vector<State> st(m.lives.size());
  uint64_t resident = m.fixed_bytes;
  for (size_t i = 0; i < m.lives.size(); ++i) {
    const SpanModel::Life& l = m.lives[i];
    for (size_t u : l.uses) uses_at[u].push_back(i);
    if (lifetimes.buffers[i].alloc_seq) {
      arrive_at[l.first].push_back(i);
    } else {
      st[i].resident = true;
      resident += l.bytes;
    }
    if (lifetimes.buffers[i].free_seq) leave_at[l.last].push_back(i);
  }
  const auto next_use_from = [&](size_t i, size_t p) -> std::optional<size_t> {
    const auto& u = m.lives[i].uses;
    const auto it = std::lower_bound(u.begin(), u.end(), p);
    return it == u.end() ? std::nullopt : std::optional<size_t>(*it);
  };
  OffloadPlan plan;
  plan.policy = OffloadPolicy::kModnn;
  plan.budget = budget;
  std::vector<double> end_ms(n, 0);
  double now = 0, lane = 0;  // one transfer stream for both directions
  std::vector<size_t> offloaded_here;
  // Frees `need` bytes before call p by offloading, the least delay first. false (nothing done) when
  // the unprotected buffers do not hold that much.
  // `drop_prefetched`: moDNN's defragmentation step (offload everything the next calls do not need)
  // in this model without addresses: buffers brought back but not used yet may go again; their host
  // copy is still good, so they leave without a copy.
  const auto offload = [&](uint64_t need, size_t p, bool drop_prefetched) {
    struct Candidate {
      double delay;
      size_t life, last_use;
      bool copy;
    };
    std::vector<Candidate> c;
    for (size_t i = 0; i < m.lives.size(); ++i) {
      const SpanModel::Life& l = m.lives[i];
      const bool prefetched = st[i].fresh && st[i].brought;
      if (!st[i].resident || (st[i].fresh && !(drop_prefetched && prefetched)) || !l.movable ||
          !lifetimes.buffers[i].alloc_seq || p < l.first || p > l.last)
        continue;
      const auto next = next_use_from(i, p);
      if (!next || *next < p + 2) continue;                    // used now or next, or not used again
      if (st[i].ready_ms > now && !drop_prefetched) continue;  // still on its way back
      const auto lu = std::lower_bound(l.uses.begin(), l.uses.end(), p);
      if (lu == l.uses.begin()) continue;
      const size_t last = *(lu - 1);
      if (prefetched) {  // once its copy back has landed
        c.push_back({std::max(0.0, st[i].ready_ms - now), i, last, false});
        continue;
      }
      const double end = std::max(lane, end_ms[last]) + static_cast<double>(l.bytes) / d2h;
      c.push_back({std::max(0.0, end - now), i, last, true});
    }
    std::sort(c.begin(), c.end(), [&](const Candidate& a, const Candidate& b) {
      return a.delay != b.delay ? a.delay < b.delay : m.lives[a.life].bytes > m.lives[b.life].bytes;
    });
    uint64_t freed = 0;
    size_t k = 0;
    while (k < c.size() && freed < need) freed += m.lives[c[k++].life].bytes;
    if (freed < need) return false;
    for (size_t j = 0; j < k; ++j) {
      const Candidate& x = c[j];
      if (x.copy) lane = std::max(lane, end_ms[x.last_use]) + static_cast<double>(m.lives[x.life].bytes) / d2h;
      now = std::max(now, st[x.life].ready_ms);
      State& s = st[x.life];
      s.resident = false;
      s.away = true;
      s.out_after = x.last_use;
      s.off_from = p;
      s.offloaded_now = true;
      offloaded_here.push_back(x.life);
      resident -= m.lives[x.life].bytes;
    }
    now = std::max(now, lane);  // the call waits for the space
    return true;
  };
  const auto bring = [&](size_t i, size_t p, size_t use) {
    const uint64_t bytes = m.lives[i].bytes;
    lane = std::max(now, lane) + static_cast<double>(bytes) / h2d;
    State& s = st[i];
    s.resident = true;
    s.away = false;
    s.brought = true;
    s.fresh = true;
    s.ready_ms = lane;
    resident += bytes;
    plan.moves.push_back({i, bytes, s.out_after, p, use, s.off_from});
  };
  const auto missing_at = [&](size_t p) {
    std::vector<size_t> out;
    for (size_t i : uses_at[p])
      if (st[i].away) out.push_back(i);
    return out;
  };
  for (size_t p = 0; p < n; ++p) {
    for (size_t i : offloaded_here) st[i].offloaded_now = false;
    offloaded_here.clear();
    // Lines 3-8: room for what this call allocates and for inputs not on the device; load those.
    const std::vector<size_t> missing = missing_at(p);
    uint64_t need = 0;
    for (size_t i : arrive_at[p]) need += m.lives[i].bytes;
    for (size_t i : missing) need += m.lives[i].bytes;
    if (resident + need > budget && !offload(resident + need - budget, p, false) &&
        !offload(resident + need - budget, p, true))
      return Error{
          fmt::format("modnn: nothing can leave the device to make room for call {} ({} needed, {} of {} held)",
                      m.seqs[p], mib(need), mib(resident), mib(budget))};
    for (size_t i : arrive_at[p]) {
      st[i].resident = true;
      st[i].brought = false;
      st[i].fresh = true;
      st[i].ready_ms = 0;
      resident += m.lives[i].bytes;
    }
    for (size_t i : missing) bring(i, p, p);
    // Lines 15-27: prefetches for the calls ahead whose inputs would otherwise be late (Eq. 9).
    double est = now + dur[p];
    for (size_t s = p + 1; s < n; est += dur[s], ++s) {
      const std::vector<size_t> ahead = missing_at(s);
      if (ahead.empty()) continue;
      double transfer = 0;
      uint64_t bytes = 0;
      bool just_left = false;
      for (size_t i : ahead) {
        transfer += static_cast<double>(m.lives[i].bytes) / h2d;
        bytes += m.lives[i].bytes;
        just_left = just_left || st[i].offloaded_now;
      }
      if (just_left || now + dur[p] + transfer <= est) break;  // it can wait
      if (resident + bytes > budget && !offload(resident + bytes - budget, p, false)) break;
      for (size_t i : ahead) bring(i, p, s);
    }
    // Line 28: the call, once its inputs are back.
    double start = now;
    for (size_t i : uses_at[p]) start = std::max(start, st[i].ready_ms);
    now = start + dur[p];
    end_ms[p] = now;
    for (size_t i : uses_at[p]) st[i].fresh = false;
    // Lines 29-31: what the iteration frees.
    for (size_t i : leave_at[p]) {
      if (st[i].resident) resident -= m.lives[i].bytes;
      st[i].resident = false;
    }
  }
  finish(m, plan);
  return plan;
}

}  // namespace

size_t schedule_prefetches_early(const SpanModel& m, OffloadPlan& plan) {
  if (plan.policy != OffloadPolicy::kVcudnn || plan.moves.empty()) return 0;
  std::vector<size_t> order(plan.moves.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(plan.moves[a].next_use, a) < std::pair(plan.moves[b].next_use, b);
  });
  std::vector<uint64_t> present = simulate(m, plan.moves);
  size_t lane = 0;  // the previous copy back's call: the lane takes them in the order of their uses
  size_t moved = 0;
  for (size_t k : order) {
    OffloadMove& mv = plan.moves[k];
    const size_t lowest = std::max(mv.off_from + 1, lane);
    size_t at = mv.prefetch_at;
    while (at > lowest && present[at - 1] + mv.bytes <= plan.budget) --at;
    for (size_t p = at; p < mv.prefetch_at; ++p) present[p] += mv.bytes;
    if (at != mv.prefetch_at) ++moved;
    mv.prefetch_at = at;
    lane = std::max(lane, at);
  }
  finish(m, plan);
  return moved;
}

size_t schedule_prefetches(const Trace& trace, const SpanModel& m, OffloadPlan& plan, const LinkModel& link,
                           double default_call_ms) {
  if (plan.policy != OffloadPolicy::kVcudnn || link.host_to_device_gbps <= 0 || plan.moves.empty()) return 0;
  const std::vector<double> start_ms = start_times(durations(trace, m, default_call_ms, nullptr));
  const double h2d = bytes_per_ms(link.host_to_device_gbps * kPrefetchRate);
  // The copies back share one lane: the latest use first, each copy must end before its use and
  // before the copy after it in the lane starts.
  std::vector<size_t> order(plan.moves.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(plan.moves[a].next_use, a) > std::pair(plan.moves[b].next_use, b);
  });
  double lane_from = 1e300;  // when the copy after this one in the lane starts
  size_t moved = 0;
  for (size_t k : order) {
    OffloadMove& mv = plan.moves[k];
    const double copy_ms = static_cast<double>(mv.bytes) / h2d;
    const double begin = std::min(start_ms[mv.next_use], lane_from) - copy_ms;
    // The latest call starting by `begin`, after the move is off the device for one call at least.
    const size_t earliest = mv.off_from + 1;
    const size_t latest = mv.prefetch_at;
    const auto after = std::upper_bound(start_ms.begin(), start_ms.end(), begin);
    size_t want = after == start_ms.begin() ? 0 : static_cast<size_t>(after - start_ms.begin()) - 1;
    want = std::min(std::max(want, earliest), latest);
    // Earlier holds its bytes on the device from there: as early as `want` while the budget holds.
    if (want < latest) {
      const std::vector<uint64_t> present = simulate(m, plan.moves);
      size_t at = latest;
      uint64_t most = 0;
      while (at > want) {
        most = std::max(most, present[at - 1]);
        if (most + mv.bytes > plan.budget) break;
        --at;
      }
      if (at != latest) {
        mv.prefetch_at = at;
        ++moved;
      }
    }
    lane_from = std::min(lane_from, start_ms[mv.prefetch_at]);
  }
  finish(m, plan);
  return moved;
}

namespace {

// Note [Both directions at once]
// The host link moves each direction at its own bandwidth alone, but both together at `both_gbps`
// in all, less than the sum (H100: 54 and 51 GB/s alone, 76 together in the probe of a ResNet-50
// b128 run; at 70 % of its peak, where copies out and back overlap in the backward pass, its copies
// back ran at 35.6 GB/s, and the device stood 60 ms a step for them, 2026-11-25). A lane is FIFO:
// one copy at a time. A copy is scheduled when it is queued: at its own bandwidth where the other
// lane is idle, and at what the other lane's copies leave of `both` where it is busy, but never
// below a tenth of its own (no copy stands still; the two lanes then move a little more than
// `both`). Copies already scheduled keep their rates, so that where a copy sits in time is known
// once it is queued, as the call-by-call timeline needs: of two overlapping copies the later takes
// the whole slowdown, where the link would share it, which moves their ends but not when the pair
// is done. Without a measure of `both` (0) the lanes do not slow each other.
class Lanes {
 public:
  Lanes(double d2h, double h2d, double both) : full_{d2h, h2d}, both_(both > 0 ? both : 1e300) {}
  static constexpr int kOut = 0, kBack = 1;
  // Queues `bytes` on `lane`, to start at `from` at the earliest: its start and end.
  std::pair<double, double> copy(int lane, double from, double bytes) {
    Lane& self = lanes_[lane];
    const Lane& other = lanes_[1 - lane];
    const double start = std::max(from, self.free);
    double at = start, left = bytes;
    size_t k = std::lower_bound(other.segments.begin(), other.segments.end(), at,
                                [](const Segment& g, double t) { return g.end <= t; }) -
               other.segments.begin();
    while (left > 0) {
      const bool shared = k < other.segments.size() && other.segments[k].start <= at;
      double until = 1e300;  // when this stretch ends: the other lane's copy ends, or its next starts
      if (k < other.segments.size()) until = shared ? other.segments[k].end : other.segments[k].start;
      double rate = full_[lane];
      if (shared) rate = std::clamp(both_ - other.segments[k].rate, full_[lane] / 10, full_[lane]);
      const double end = std::min(until, at + left / rate);
      if (end > at) self.segments.push_back({at, end, rate});
      left -= (end - at) * rate;
      if (end >= until) {
        at = until;
        if (shared) ++k;
      } else {
        at = end;
        left = 0;
      }
    }
    self.free = at;
    return {start, at};
  }
  // When the copy on `lane` that began at `start` had moved `bytes` (its own segments are the ones
  // from `start` on, until it ends).
  double moved_by(int lane, double start, double bytes) const {
    const auto& g = lanes_[lane].segments;
    auto k = std::lower_bound(g.begin(), g.end(), start, [](const Segment& s, double t) { return s.start < t; });
    double done = 0;
    for (; k != g.end(); ++k) {
      const double here = (k->end - k->start) * k->rate;
      if (done + here >= bytes) return k->start + (bytes - done) / k->rate;
      done += here;
    }
    return g.empty() ? start : g.back().end;
  }

 private:
  struct Segment {
    double start = 0, end = 0, rate = 0;  // bytes per ms
  };
  struct Lane {
    std::vector<Segment> segments;  // in time, not overlapping
    double free = 0;
  };
  double full_[2];
  double both_;
  Lane lanes_[2];
};

}  // namespace

PlanTimeline time_plan(const Trace& trace, const SpanModel& m, const OffloadPlan& plan, const LinkModel& link,
                       double default_call_ms, const std::vector<Handover>& handovers,
                       const std::vector<bool>& pooled) {
  PlanTimeline t;
  const size_t n = m.seqs.size();
  const std::vector<double> duration = durations(trace, m, default_call_ms, &t.untimed_calls);
  // Bytes per millisecond.
  const double d2h = bytes_per_ms(link.device_to_host_gbps), h2d = bytes_per_ms(link.host_to_device_gbps);
  Lanes lanes(d2h, h2d, link.both_gbps > 0 ? bytes_per_ms(link.both_gbps) : 0);
  std::vector<std::vector<size_t>> out_after(n), back_at(n), needed_by(n + 1);  // n: the next iteration
  std::vector<std::vector<std::pair<size_t, uint64_t>>> handed_at(n);  // (move, bytes it must have read)
  for (size_t i = 0; i < plan.moves.size(); ++i) {
    out_after[plan.moves[i].out_after].push_back(i);
    back_at[plan.moves[i].prefetch_at].push_back(i);
    needed_by[plan.moves[i].next_use].push_back(i);
  }
  for (const Handover& h : handovers)
    if (h.call < n && h.move < plan.moves.size() && plan.moves[h.move].out_after < h.call)
      handed_at[h.call].push_back(
          {h.move, h.upto ? std::min(h.upto, plan.moves[h.move].bytes) : plan.moves[h.move].bytes});
  std::vector<double> out_start(plan.moves.size(), 0), out_end(plan.moves.size(), 0), back_end(plan.moves.size(), 0);
  const std::vector<uint64_t> present = simulate(m, plan.moves);
  std::vector<std::pair<double, uint64_t>> pending;  // copies out not ended: (end, bytes)
  t.call_start_ms.assign(n, 0);
  t.call_end_ms.assign(n, 0);
  double now = 0;
  for (size_t p = 0; p < n; ++p) {
    // Prefetches issued as this call is reached (its predecessor has been queued).
    for (size_t i : back_at[p]) {
      const auto [start, end] =
          lanes.copy(Lanes::kBack, std::max(now, out_end[i]), static_cast<double>(plan.moves[i].bytes));
      back_end[i] = end;
      t.copies_back.push_back({i, start, end});
    }
    double ready = now;
    for (size_t i : needed_by[p]) ready = std::max(ready, back_end[i]);
    if (ready > now) {
      ++t.late_prefetches;
      t.stall_ms += ready - now;
    }
    // Room: the plan counts a move's bytes off the device from off_from; while its copy out runs
    // they are still there, and a call that would go over the budget with them waits for copies
    // to end (the runtime's host wait for room).
    pending.clear();
    uint64_t held = present[p];
    for (size_t i = 0; i < plan.moves.size(); ++i) {
      const OffloadMove& mv = plan.moves[i];
      if ((i >= pooled.size() || !pooled[i]) && mv.first_absent() <= p && p <= mv.last_absent() && out_end[i] > ready) {
        pending.emplace_back(out_end[i], mv.bytes);
        held += mv.bytes;
      }
    }
    double until = ready;
    if (held > plan.budget) {
      std::sort(pending.begin(), pending.end());
      for (const auto& [end, bytes] : pending) {
        if (held <= plan.budget) break;
        held -= bytes;
        until = end;
      }
    }
    for (const auto& [i, upto] : handed_at[p])  // its bytes, once read (Note [Copies out in pieces])
      until = std::max(until, lanes.moved_by(Lanes::kOut, out_start[i], static_cast<double>(upto)));
    if (until > ready) {
      ++t.room_waits;
      t.room_ms += until - ready;
      ready = until;
    }
    t.call_start_ms[p] = ready;
    now = ready + duration[p];
    t.call_end_ms[p] = now;
    t.compute_ms += duration[p];
    for (size_t i : out_after[p]) {
      const auto [start, end] = lanes.copy(Lanes::kOut, now, static_cast<double>(plan.moves[i].bytes));
      out_start[i] = start;
      out_end[i] = end;
      t.copies_out.push_back({i, start, end});
    }
  }
  // Moves across the iteration's end are back before the next iteration starts.
  double ready = now;
  for (size_t i : needed_by[n]) ready = std::max(ready, back_end[i]);
  if (ready > now) {
    ++t.late_prefetches;
    t.stall_ms += ready - now;
  }
  t.step_ms = ready;
  for (size_t i = 0; i < plan.moves.size(); ++i) {
    const size_t off = plan.moves[i].off_from;
    if (off < n && out_end[i] > t.call_start_ms[off]) ++t.late_offloads;
  }
  t.lower_bound_ms = lower_bound_ms(m, duration, plan.budget, d2h, h2d);
  return t;
}

namespace {

// Bytes that may leave (or come back) from `at` on, each buffer whole or in part.
struct Ready {
  double at = 0;
  double bytes = 0;
};

// The least time by which one lane at `rate` (bytes per ms) can have moved `bytes` of `ready`:
// earliest-ready first, idle only while nothing is ready. Infinity when they hold fewer bytes.
double least_time_to_move(std::vector<Ready>& ready, double bytes, double rate) {
  std::sort(ready.begin(), ready.end(), [](const Ready& a, const Ready& b) { return a.at < b.at; });
  double now = 0, moved = 0;
  for (const Ready& r : ready) {
    now = std::max(now, r.at);
    if (moved + r.bytes >= bytes) return now + (bytes - moved) / rate;
    now += r.bytes / rate;
    moved += r.bytes;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

// Note [The lower bound]
double lower_bound_ms(const SpanModel& m, const std::vector<double>& duration, uint64_t budget, double d2h,
                      double h2d) {
  const size_t n = m.seqs.size();
  const std::vector<uint64_t> none = simulate(m, {});
  const std::vector<double> start = start_times(duration);
  const double compute = n ? start[n - 1] + duration[n - 1] : 0.0;
  double bound = compute;
  std::vector<Ready> out, back;
  for (size_t p = 0; p < n; ++p) {
    if (none[p] <= budget) continue;
    const double e = static_cast<double>(none[p] - budget);
    const double before = start[p], after = compute - before;  // after: p and the calls after it
    // Who can be off the device at p: a movable buffer alive then, not used by p, between two uses.
    // Its copy out starts when the use before p has run at the earliest; its copy back ends before
    // the use after p starts, which leaves at least the compute from that use on.
    out.clear();
    back.clear();
    for (const SpanModel::Life& l : m.lives) {
      if (!l.movable || l.first > p || l.last < p) continue;
      const auto next = std::lower_bound(l.uses.begin(), l.uses.end(), p);
      if (next == l.uses.begin()) continue;
      const bool across = next == l.uses.end();  // back by the span's end (Note [Across the iteration's end])
      if (across ? !(m.across_end && l.through) : *next == p) continue;
      const size_t last = *(next - 1);
      out.push_back({start[last] + duration[last], static_cast<double>(l.bytes)});
      back.push_back({compute - start[across ? n : *next], static_cast<double>(l.bytes)});
    }
    const double gone = least_time_to_move(out, e, d2h);   // the earliest p can start
    const double tail = least_time_to_move(back, e, h2d);  // from p's end: back, then the compute after
    if (std::isfinite(gone) && std::isfinite(tail))
      bound = std::max(bound, std::max(before, gone) + duration[p] + std::max(after - duration[p], tail));
    else  // no plan fits this budget (offload_bound() says so); the bytes alone
      bound = std::max({bound, e / d2h + after, before + e / h2d, e / d2h + e / h2d});
  }
  return bound;
}

std::string timeline_json(const SpanModel& m, const OffloadPlan& plan, const PlanTimeline& t) {
  nlohmann::json events = nlohmann::json::array();
  const auto lane = [&](int tid, const char* name) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  lane(1, "compute");
  lane(2, "device to host");
  lane(3, "host to device");
  for (size_t p = 0; p < m.seqs.size(); ++p)
    events.push_back({{"ph", "X"},
                      {"pid", 1},
                      {"tid", 1},
                      {"name", fmt::format("call {}", m.seqs[p])},
                      {"ts", t.call_start_ms[p] * 1e3},
                      {"dur", (t.call_end_ms[p] - t.call_start_ms[p]) * 1e3}});
  const auto copies = [&](const std::vector<TimedCopy>& list, int tid, const char* what) {
    for (const TimedCopy& c : list) {
      const OffloadMove& mv = plan.moves[c.move];
      events.push_back({{"ph", "X"},
                        {"pid", 1},
                        {"tid", tid},
                        {"name", fmt::format("{} buffer {} ({})", what, mv.life, mib(mv.bytes))},
                        {"ts", c.start_ms * 1e3},
                        {"dur", (c.end_ms - c.start_ms) * 1e3}});
    }
  };
  copies(t.copies_out, 2, "out");
  copies(t.copies_back, 3, "back");
  return nlohmann::json({{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}).dump();
}

std::string check_plan(const SpanModel& m, const OffloadPlan& plan) {
  std::set<std::pair<size_t, size_t>> seen;
  for (const OffloadMove& mv : plan.moves) {
    if (mv.life >= m.lives.size()) return fmt::format("a move names buffer {} of {}", mv.life, m.lives.size());
    const SpanModel::Life& l = m.lives[mv.life];
    if (!l.movable) return fmt::format("buffer {} cannot move (library, or below one granule)", mv.life);
    if (mv.bytes == 0 || mv.offset + mv.bytes != l.bytes || (mv.offset && !l.partial))
      return fmt::format("buffer {} moves {} bytes from {}, not its {} (or a part of it that may move)", mv.life,
                         mv.bytes, mv.offset, l.bytes);
    const auto at = std::find(l.uses.begin(), l.uses.end(), mv.out_after);
    const bool last = at == l.uses.end() || at + 1 == l.uses.end();
    const size_t next = !last ? *(at + 1) : m.across_end && l.through ? m.seqs.size() : SIZE_MAX;
    if (at == l.uses.end() || next != mv.next_use)
      return fmt::format("buffer {}: calls {} and {} are not two consecutive uses", mv.life, mv.out_after, mv.next_use);
    if (mv.first_absent() <= mv.out_after)
      return fmt::format("buffer {} is off the device from call {}, before the use at {} its copy out follows", mv.life,
                         mv.first_absent(), mv.out_after);
    if (mv.first_absent() > mv.last_absent() || mv.prefetch_at > mv.next_use)
      return fmt::format("buffer {}: out after {}, prefetched at {}, used at {}: never off the device, or late",
                         mv.life, mv.out_after, mv.prefetch_at, mv.next_use);
    if (!seen.insert({mv.life, mv.off_from}).second)
      return fmt::format("buffer {} leaves twice at call {}", mv.life, mv.off_from);
  }
  // A buffer is off the device over disjoint ranges (moDNN may send a prefetched buffer away again
  // before its use: two trips over one gap).
  std::vector<const OffloadMove*> by_life;
  for (const OffloadMove& mv : plan.moves) by_life.push_back(&mv);
  std::sort(by_life.begin(), by_life.end(), [](const OffloadMove* a, const OffloadMove* b) {
    return std::pair(a->life, a->off_from) < std::pair(b->life, b->off_from);
  });
  for (size_t k = 1; k < by_life.size(); ++k) {
    if (by_life[k]->life != by_life[k - 1]->life) continue;
    if (by_life[k]->first_absent() <= by_life[k - 1]->last_absent())
      return fmt::format("buffer {} is off the device twice at call {}", by_life[k]->life, by_life[k]->first_absent());
    if (by_life[k]->offset != by_life[k - 1]->offset)
      return fmt::format("buffer {} moves different parts of itself", by_life[k]->life);
  }
  const std::vector<uint64_t> sim = simulate(m, plan.moves);
  const uint64_t peak = sim.empty() ? 0 : *std::max_element(sim.begin(), sim.end());
  if (peak != plan.peak_bytes)
    return fmt::format("the plan says a peak of {}, the simulation {}", plan.peak_bytes, peak);
  if (plan.fits != (peak <= plan.budget)) return "fits disagrees with the peak";
  return {};
}

}  // namespace vcudnn
