// The exact multiple-choice knapsack against GLPK's integer solver on network-sized random
// instances. Its own executable (vcudnn_glpk_tests), so that vcudnn_cpu_tests runs on machines
// without libglpk (the GPU machine).
#include <catch2/catch.hpp>

#include <glpk.h>

#include "planner/knapsack.h"
#include "tests/cpu/knapsack_util.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

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

}  // namespace

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
