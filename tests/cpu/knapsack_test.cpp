// The exact multiple-choice knapsack (µ-cuDNN's WD) against brute force and against GLPK's
// integer solver, on random instances; infeasible budgets name the lower bound.
#include <catch2/catch.hpp>

#include <glpk.h>

#include <functional>
#include <random>

#include "planner/knapsack.h"
#include "planner/layer_limits.h"

using namespace vcudnn;

namespace {

using Groups = std::vector<std::vector<KnapsackOption>>;

Groups random_groups(std::mt19937& rng, int groups, int max_options, uint64_t max_ws) {
  Groups g(groups);
  std::uniform_real_distribution<double> t(0.1, 50.0);
  for (auto& options : g) {
    const int n = 1 + static_cast<int>(rng() % max_options);
    for (int i = 0; i < n; ++i) options.push_back({t(rng), rng() % (max_ws + 1)});
  }
  return g;
}

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

double glpk(const Groups& g, uint64_t budget) {
  glp_prob* lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  const int rows = static_cast<int>(g.size()) + 1;
  glp_add_rows(lp, rows);
  for (int r = 1; r < rows; ++r) glp_set_row_bnds(lp, r, GLP_FX, 1.0, 1.0);
  glp_set_row_bnds(lp, rows, GLP_UP, 0.0, static_cast<double>(budget));
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  int col = 0;
  for (size_t k = 0; k < g.size(); ++k)
    for (const auto& o : g[k]) {
      col = glp_add_cols(lp, 1);
      glp_set_col_kind(lp, col, GLP_BV);
      glp_set_obj_coef(lp, col, o.time_ms);
      ia.push_back(static_cast<int>(k) + 1), ja.push_back(col), ar.push_back(1.0);
      ia.push_back(rows), ja.push_back(col), ar.push_back(static_cast<double>(o.workspace));
    }
  glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_ON;
  parm.msg_lev = GLP_MSG_OFF;
  const int rc = glp_intopt(lp, &parm);
  const int status = glp_mip_status(lp);
  const double obj = (rc == 0 && status == GLP_OPT) ? glp_mip_obj_val(lp) : -1;
  glp_delete_prob(lp);
  return obj;
}

void check_choice(const Groups& g, uint64_t budget, const KnapsackChoice& c) {
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

TEST_CASE("knapsack matches GLPK on network-sized random instances", "[knapsack][glpk]") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    // ResNet-50 has 159 convolution kernels with about 3.5 desirable configurations each.
    const int groups = 20 + static_cast<int>(rng() % 140);
    Groups g = random_groups(rng, groups, 6, 1000);
    uint64_t least = 0, most = 0;
    for (const auto& options : g) {
      uint64_t lo = UINT64_MAX, hi = 0;
      for (const auto& o : options) lo = std::min(lo, o.workspace), hi = std::max(hi, o.workspace);
      least += lo, most += hi;
    }
    const uint64_t budget = least + (most - least) * (rng() % 100) / 100;
    INFO("trial " << trial << " groups " << groups << " budget " << budget);
    auto r = solve_multiple_choice_knapsack(g, budget);
    REQUIRE(r.ok());
    check_choice(g, budget, r.value());
    const double expected = glpk(g, budget);
    REQUIRE(expected >= 0);
    CHECK(r->time_ms == Approx(expected).epsilon(1e-7));
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
