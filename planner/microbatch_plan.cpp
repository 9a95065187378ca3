// choose_microbatch_plan and choose_network_plan: the DP's front plus vcudnn's rules (header).
#include "planner/microbatch_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "planner/knapsack.h"

namespace vcudnn {
namespace {

// The measurements with the per-launch overhead added to every kernel.
MicroBatchMeasurements with_overhead(const MicroBatchMeasurements& m, double overhead_ms) {
  MicroBatchMeasurements out = m;
  for (auto& [size, kernels] : out.by_batch)
    for (auto& k : kernels) k.time_ms += overhead_ms;
  return out;
}

const MicroKernel* fastest_at(const MicroBatchMeasurements& m, int32_t size, uint64_t limit) {
  auto it = m.by_batch.find(size);
  if (it == m.by_batch.end()) return nullptr;
  const MicroKernel* best = nullptr;
  for (const auto& k : it->second)
    if (k.batch == size && k.workspace <= limit && (!best || k.time_ms < best->time_ms)) best = &k;
  return best;
}

std::optional<MicroConfig> forced(const MicroBatchMeasurements& m, int32_t size, uint64_t limit) {
  const int32_t batch = m.mini_batch;
  if (size <= 0 || size >= batch) return std::nullopt;
  const MicroKernel* full = fastest_at(m, size, limit);
  const int32_t rest = batch % size;
  const MicroKernel* tail = rest ? fastest_at(m, rest, limit) : nullptr;
  if (!full || (rest && !tail)) return std::nullopt;
  MicroConfig c;
  for (int32_t done = 0; done + size <= batch; done += size) c = MicroConfig::prepend(*full, c);
  if (tail) {
    c.kernels.push_back(*tail);
    c.time_ms += tail->time_ms;
    c.workspace = std::max(c.workspace, tail->workspace);
  }
  return c;
}

uint64_t least_workspace(const MicroBatchMeasurements& m) {
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (const auto& [size, kernels] : m.by_batch)
    for (const auto& k : kernels) least = std::min(least, k.workspace);
  return least;
}

std::string bytes_text(uint64_t b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

PlanDecision choose_microbatch_plan(const MicroBatchMeasurements& raw, const PlanRequest& r) {
  PlanDecision d;
  const MicroBatchMeasurements m = with_overhead(raw, r.launch_overhead_ms);
  if (const MicroKernel* u = fastest_at(m, m.mini_batch, r.limit)) d.undivided = MicroConfig::single(*u);

  if (r.allow_split && r.force_split) {
    if (auto c = forced(m, *r.force_split, r.limit)) {
      d.config = *c;
      d.reason = "forced micro-batches of " + std::to_string(*r.force_split);
      return d;
    }
  }
  std::optional<MicroConfig> best;
  if (r.allow_split) {
    best = fastest_microbatch_config(m, r.limit);
  } else {
    best = d.undivided;
  }
  if (!best) {
    d.fallback = true;
    d.least_workspace = least_workspace(raw);
    d.reason = raw.by_batch.empty() || d.least_workspace == std::numeric_limits<uint64_t>::max()
                   ? "no algorithm could be measured"
                   : "no measured algorithm fits the limit of " + bytes_text(r.limit) + "; the least needs " +
                         bytes_text(d.least_workspace);
    return d;
  }
  if (best->kernels.size() > 1 && d.undivided && best->time_ms > d.undivided->time_ms * (1.0 - r.split_margin)) {
    d.config = *d.undivided;
    d.reason = "undivided: the best split (" + best->to_string() + ") is not faster by more than the margin";
    return d;
  }
  d.config = *best;
  d.reason = best->kernels.size() > 1 ? (d.undivided ? "split beats undivided " + d.undivided->to_string()
                                                     : "split: no undivided algorithm fits the limit")
                                      : "undivided";
  return d;
}

Result<NetworkPlan> choose_network_plan(const std::vector<MicroBatchMeasurements>& kernels, uint64_t per_kernel_limit,
                                        uint64_t total, const PlanRequest& request) {
  std::vector<std::vector<MicroConfig>> fronts;
  std::vector<std::vector<KnapsackOption>> groups;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const MicroBatchMeasurements m = with_overhead(kernels[i], request.launch_overhead_ms);
    std::vector<MicroConfig> options;
    if (request.allow_split) {
      options = microbatch_front(m, per_kernel_limit).configs();
    } else if (auto it = m.by_batch.find(m.mini_batch); it != m.by_batch.end()) {
      ParetoFront undivided;
      for (const auto& k : it->second)
        if (k.workspace <= per_kernel_limit) undivided.insert(MicroConfig::single(k));
      options = undivided.configs();
    }
    if (options.empty())
      return Error{"kernel " + std::to_string(i) + " has no measured configuration within " +
                   bytes_text(per_kernel_limit)};
    std::vector<KnapsackOption> g;
    for (const auto& c : options) g.push_back({c.time_ms, c.workspace});
    fronts.push_back(std::move(options));
    groups.push_back(std::move(g));
  }
  auto choice = solve_multiple_choice_knapsack(groups, total);
  if (!choice) return Error{"VCUDNN_TOTAL_WORKSPACE: " + choice.error().message};
  NetworkPlan plan;
  for (size_t i = 0; i < fronts.size(); ++i) plan.configs.push_back(fronts[i][choice->option[i]]);
  plan.time_ms = choice->time_ms;
  plan.workspace = choice->workspace;
  return plan;
}

}  // namespace vcudnn
