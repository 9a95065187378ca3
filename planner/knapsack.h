// The network-wide choice (µ-cuDNN's "WD"): one configuration per convolution kernel, total
// workspace within a budget, least total time. An exact multiple-choice knapsack solved without
// a solver library (tests cross-check it against GLPK and brute force).
#pragma once

#include <cstdint>
#include <vector>

#include "planner/result.h"

namespace vcudnn {

struct KnapsackOption {
  double time_ms = 0;
  uint64_t workspace = 0;
};

struct KnapsackChoice {
  std::vector<int> option;  // per group, the index chosen
  double time_ms = 0;
  uint64_t workspace = 0;
};

// Errors: an empty group, or a budget under the least possible total (the message names it).
Result<KnapsackChoice> solve_multiple_choice_knapsack(const std::vector<std::vector<KnapsackOption>>& groups,
                                                      uint64_t budget);

}  // namespace vcudnn
