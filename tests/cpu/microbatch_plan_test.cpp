// choose_microbatch_plan / choose_network_plan: vcudnn's rules on top of the DP — a split must
// beat undivided by the margin, forced splits for tests, batch 1, a prime batch, and a limit
// below every algorithm's need (fallback naming the least workspace).
#include <catch2/catch.hpp>

#include "planner/microbatch_plan.h"

using namespace vcudnn;

namespace {

MicroBatchMeasurements make(int32_t batch, const std::vector<MicroKernel>& kernels) {
  MicroBatchMeasurements m;
  m.mini_batch = batch;
  for (const auto& k : kernels) m.by_batch[k.batch].push_back(k);
  return m;
}

PlanRequest request(uint64_t limit) {
  PlanRequest r;
  r.limit = limit;
  r.launch_overhead_ms = 0;
  return r;
}

}  // namespace

TEST_CASE("plan: a split that is only a little faster stays undivided", "[microbatch]") {
  // Undivided: algo 0 (no workspace) 10 ms; algo 1 needs 100 bytes at 16 and is 4.8 ms per half.
  auto m = make(32, {{0, 32, 10.0, 0}, {1, 32, 6.0, 200}, {1, 16, 4.8, 100}, {0, 16, 5.0, 0}});
  auto d = choose_microbatch_plan(m, request(150));
  REQUIRE_FALSE(d.fallback);
  REQUIRE(d.undivided);
  CHECK(d.undivided->kernels[0].algo == 0);
  CHECK(d.config.kernels.size() == 2);  // 9.6 ms < 10 * 0.97
  CHECK(d.config.time_ms == Approx(9.6));

  auto close = make(32, {{0, 32, 10.0, 0}, {1, 16, 4.95, 100}});
  auto d2 = choose_microbatch_plan(close, request(150));  // 9.9 ms: inside the 3% margin
  REQUIRE(d2.config.kernels.size() == 1);
  CHECK(d2.config.kernels[0].algo == 0);
  CHECK_THAT(d2.reason, Catch::Contains("margin"));
}

TEST_CASE("plan: the launch overhead counts per micro-batch", "[microbatch]") {
  auto m = make(4, {{0, 4, 1.0, 0}, {1, 1, 0.2, 0}});  // 4 x 0.2 = 0.8 ms, but 4 launches
  PlanRequest r = request(0);
  r.launch_overhead_ms = 0.1;  // 4 x 0.3 = 1.2 > 1.1
  auto d = choose_microbatch_plan(m, r);
  REQUIRE(d.config.kernels.size() == 1);
  CHECK(d.config.time_ms == Approx(1.1));
}

TEST_CASE("plan: batch 1 and a prime batch", "[microbatch]") {
  auto one = make(1, {{2, 1, 0.5, 64}, {0, 1, 0.9, 0}});
  auto d = choose_microbatch_plan(one, request(64));
  REQUIRE(d.config.kernels.size() == 1);
  CHECK(d.config.kernels[0].algo == 2);
  CHECK(choose_microbatch_plan(one, request(63)).config.kernels[0].algo == 0);

  // 13 = 8 + 4 + 1 with powers of two; the fast algorithm exists only at 8 and below.
  auto prime = make(13, {{0, 13, 13.0, 0}, {1, 8, 2.0, 10}, {1, 4, 1.0, 10}, {1, 1, 0.25, 10}, {0, 1, 1.0, 0}});
  auto p = choose_microbatch_plan(prime, request(10));
  CHECK(p.config.batch() == 13);
  CHECK(p.config.time_ms == Approx(3.25));
  CHECK(p.config.workspace == 10);
}

TEST_CASE("plan: a limit below every algorithm's need is a fallback naming the least workspace", "[microbatch]") {
  auto m = make(8, {{1, 8, 1.0, 3 << 20}, {2, 4, 0.4, 2 << 20}});
  auto d = choose_microbatch_plan(m, request(1 << 20));
  CHECK(d.fallback);
  CHECK(d.config.kernels.empty());
  CHECK(d.least_workspace == (2u << 20));
  CHECK_THAT(d.reason, Catch::Contains("1.0 MiB") && Catch::Contains("2.0 MiB"));
  auto none = choose_microbatch_plan(make(8, {}), request(1 << 20));
  CHECK(none.fallback);
  CHECK_THAT(none.reason, Catch::Contains("no algorithm"));
}

TEST_CASE("plan: forced micro-batches take the remainder last, and undivided-only never splits", "[microbatch]") {
  auto m = make(13, {{0, 13, 13.0, 0}, {1, 5, 1.0, 8}, {3, 3, 0.9, 0}, {0, 5, 2.0, 0}});
  PlanRequest r = request(8);
  r.force_split = 5;
  auto d = choose_microbatch_plan(m, r);
  REQUIRE(d.config.kernels.size() == 3);
  CHECK(d.config.kernels[0] == MicroKernel{1, 5, 1.0, 8});
  CHECK(d.config.kernels[1] == MicroKernel{1, 5, 1.0, 8});
  CHECK(d.config.kernels[2] == MicroKernel{3, 3, 0.9, 0});
  CHECK(d.config.batch() == 13);
  r.allow_split = false;
  auto u = choose_microbatch_plan(m, r);
  REQUIRE(u.config.kernels.size() == 1);
  CHECK(u.config.kernels[0].batch == 13);
  // A forced size that was not measured falls back to the normal choice.
  r.allow_split = true;
  r.force_split = 7;
  CHECK(choose_microbatch_plan(m, r).config.batch() == 13);
}

TEST_CASE("plan: the network choice trades workspace between kernels and names the lower bound", "[microbatch]") {
  // Kernel A: 10 ms at 0 B or 2 ms at 100 B; kernel B: 10 ms at 0 B or 5 ms at 100 B.
  std::vector<MicroBatchMeasurements> ks{make(4, {{0, 4, 10.0, 0}, {1, 4, 2.0, 100}}),
                                         make(4, {{0, 4, 10.0, 0}, {1, 4, 5.0, 100}})};
  PlanRequest r = request(0);
  r.allow_split = false;
  auto p = choose_network_plan(ks, 1000, 150, r);
  REQUIRE(p.ok());
  CHECK(p->configs[0].kernels[0].algo == 1);  // the 8 ms saving goes to A
  CHECK(p->configs[1].kernels[0].algo == 0);
  CHECK(p->time_ms == Approx(12.0));
  CHECK(p->workspace == 100);
  auto both = choose_network_plan(ks, 1000, 200, r);
  REQUIRE(both.ok());
  CHECK(both->time_ms == Approx(7.0));
  // Every configuration of A needs workspace: the budget's lower bound is named.
  std::vector<MicroBatchMeasurements> tight{make(4, {{1, 4, 2.0, 100}}), make(4, {{1, 4, 5.0, 100}})};
  auto bad = choose_network_plan(tight, 1000, 150, r);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Catch::Contains("VCUDNN_TOTAL_WORKSPACE") && Catch::Contains("200"));
}
