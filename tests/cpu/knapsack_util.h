// Random multiple-choice knapsack instances and a checker of a solver's choice, shared by the
// brute-force test (vcudnn_cpu_tests) and the GLPK cross-check (vcudnn_glpk_tests).
#pragma once

#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "planner/knapsack.h"

namespace vcudnn::test {

using Groups = std::vector<std::vector<KnapsackOption>>;

inline Groups random_groups(std::mt19937& rng, int groups, int max_options, uint64_t max_ws) {
  Groups g(groups);
  std::uniform_real_distribution<double> t(0.1, 50.0);
  for (auto& options : g) {
    const int n = 1 + static_cast<int>(rng() % max_options);
    for (int i = 0; i < n; ++i) options.push_back({t(rng), rng() % (max_ws + 1)});
  }
  return g;
}

inline void check_choice(const Groups& g, uint64_t budget, const KnapsackChoice& c) {
  REQUIRE(c.option.size() == g.size());
  double t = 0;
  uint64_t ws = 0;
  for (size_t k = 0; k < g.size(); ++k) {
    REQUIRE(c.option[k] >= 0);
    REQUIRE(c.option[k] < static_cast<int>(g[k].size()));
    t += g[k][c.option[k]].time_ms;
    ws += g[k][c.option[k]].workspace;
  }
  CHECK(ws == c.workspace);
  CHECK(ws <= budget);
  CHECK(t == Approx(c.time_ms).epsilon(1e-12));
}

}  // namespace vcudnn::test
