// The exact multiple-choice knapsack (µ-cuDNN's WD) against brute force on random instances
// (knapsack_glpk_test.cpp checks it against GLPK); infeasible budgets name the lower bound.
#include <catch2/catch.hpp>

#include <functional>
#include <random>

#include "planner/knapsack.h"
#include "planner/layer_limits.h"
#include "tests/cpu/knapsack_util.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

double brute_force(const Groups& g, uint64_t budget) {
  double best = -1;
  std::function<void(size_t, uint64_t, double)> rec = [&](size_t i, uint64_t ws, double time) {
    if (ws > budget) return;
    if (i == g.size()) {
      if (best < 0 || time < best) best = time;
      return;
    }
    for (const auto& o : g[i]) rec(i + 1, ws + o.workspace, time + o.time_ms);
  };
  rec(0, 0, 0);
  return best;  // -1: infeasible
}

}  // namespace

TEST_CASE("knapsack matches brute force on small random instances", "[knapsack]") {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    Groups g = random_groups(rng, 1 + static_cast<int>(rng() % 6), 4, 40);
    const uint64_t budget = rng() % 160;
    INFO("trial " << trial << " budget " << budget);
    const double expected = brute_force(g, budget);
    auto r = solve_multiple_choice_knapsack(g, budget);
    if (expected < 0) {
      CHECK_FALSE(r.ok());
      continue;
    }
    REQUIRE(r.ok());
    CHECK(r->time_ms == Approx(expected).epsilon(1e-12));
    check_choice(g, budget, r.value());
  }
}

TEST_CASE("knapsack: infeasible budgets and empty groups are errors", "[knapsack]") {
  Groups g = {{{1.0, 10}, {0.5, 30}}, {{2.0, 5}}, {{1.0, 0}, {0.1, 100}}};
  auto r = solve_multiple_choice_knapsack(g, 14);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("15 bytes") != std::string::npos);  // 10 + 5 + 0
  auto ok = solve_multiple_choice_knapsack(g, 15);
  REQUIRE(ok.ok());
  CHECK(ok->option == std::vector<int>{0, 0, 0});
  auto roomy = solve_multiple_choice_knapsack(g, 1000);
  REQUIRE(roomy.ok());
  CHECK(roomy->option == std::vector<int>{1, 0, 1});
  CHECK(roomy->time_ms == Approx(2.6));
  Groups empty = {{{1.0, 1}}, {}};
  auto e = solve_multiple_choice_knapsack(empty, 100);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("kernel 1") != std::string::npos);
  auto none = solve_multiple_choice_knapsack({}, 0);
  REQUIRE(none.ok());
  CHECK(none->time_ms == 0);
}

TEST_CASE("per-layer limits follow the budget left at each layer", "[limits]") {
  const std::vector<uint64_t> live = {0, 40, 99, 100, 150};
  CHECK(per_layer_limits(100, live) == std::vector<uint64_t>{100, 60, 1, 0, 0});
  CHECK(per_layer_limits(100, live, 50) == std::vector<uint64_t>{50, 50, 1, 0, 0});
  CHECK(per_layer_limits(0, {0}) == std::vector<uint64_t>{0});
  CHECK(per_layer_limits(100, {}).empty());
}
