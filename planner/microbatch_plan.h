// The per-convolution decision on top of the DP: which configuration a kernel runs, and the
// network-wide choice under a total budget. Rules beyond µ-cuDNN's DP, for a GPU where splitting
// rarely pays (../shared/DESIGN.md):
//  - every micro-batch costs a launch the measurements do not show: `launch_overhead_ms` is added
//    per micro-kernel before comparing;
//  - a split is taken only when it beats the best undivided algorithm within the limit by more
//    than `split_margin` (relative), so measurement noise cannot make vcudnn slower than cuDNN's
//    own choice;
//  - when nothing measured fits the limit the decision is a fallback (the runtime then runs a
//    zero-workspace algorithm undivided and warns), with the least workspace that would fit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/microbatch_dp.h"
#include "planner/result.h"

namespace vcudnn {

struct PlanRequest {
  uint64_t limit = 0;
  bool allow_split = true;             // false: undivided only (e.g. 16-bit backward-filter)
  std::optional<int32_t> force_split;  // tests: micro-batches of this size, the last one the remainder
  double launch_overhead_ms = 0.004;
  double split_margin = 0.03;
};

struct PlanDecision {
  MicroConfig config;                    // empty when fallback
  std::optional<MicroConfig> undivided;  // the best undivided configuration within the limit
  bool fallback = false;
  uint64_t least_workspace = 0;  // fallback: the least workspace any measured algorithm needs
  std::string reason;            // one line for the log
};

PlanDecision choose_microbatch_plan(const MicroBatchMeasurements& m, const PlanRequest& request);

// µ-cuDNN WD: one configuration per kernel from its front within `per_kernel_limit`, sum of
// workspaces <= total, least total time. Error (naming the lower bound) when even the smallest
// configurations do not fit.
struct NetworkPlan {
  std::vector<MicroConfig> configs;  // per kernel
  double time_ms = 0;
  uint64_t workspace = 0;
};
Result<NetworkPlan> choose_network_plan(const std::vector<MicroBatchMeasurements>& kernels, uint64_t per_kernel_limit,
                                        uint64_t total, const PlanRequest& request);

}  // namespace vcudnn
