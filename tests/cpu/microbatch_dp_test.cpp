// The per-layer micro-batch DP and its Pareto fronts: against brute force on small batches,
// against the reference case of µ-cuDNN's own test (research/seed-ucudnn.md §3.2), and on the
// edges (batch 1, a prime batch, a limit below every algorithm's need).
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>

#include "planner/microbatch_dp.h"

using namespace vcudnn;

namespace {

constexpr uint64_t kMiB = 1 << 20;

// Every multiset of measured kernels whose batches sum to `batch` (parts in non-increasing
// (size, algo) order so that each multiset appears once).
std::vector<MicroConfig> all_configs(const MicroBatchMeasurements& m) {
  std::vector<MicroKernel> kernels;
  for (const auto& [size, ks] : m.by_batch) kernels.insert(kernels.end(), ks.begin(), ks.end());
  std::sort(kernels.begin(), kernels.end(), [](const MicroKernel& a, const MicroKernel& b) {
    return a.batch != b.batch ? a.batch > b.batch : a.algo > b.algo;
  });
  std::vector<MicroConfig> out;
  std::function<void(size_t, int32_t, MicroConfig)> rec = [&](size_t from, int32_t left, MicroConfig acc) {
    if (left == 0) {
      out.push_back(acc);
      return;
    }
    for (size_t i = from; i < kernels.size(); ++i) {
      if (kernels[i].batch > left) continue;
      MicroConfig next = acc;
      next.kernels.push_back(kernels[i]);
      next.time_ms += kernels[i].time_ms;
      next.workspace = std::max(next.workspace, kernels[i].workspace);
      rec(i, left - kernels[i].batch, next);
    }
  };
  rec(0, m.mini_batch, MicroConfig{});
  return out;
}

// (workspace, time) staircase of `configs` under `limit`, computed without ParetoFront.
std::vector<std::pair<uint64_t, double>> brute_front(std::vector<MicroConfig> configs, uint64_t limit) {
  std::sort(configs.begin(), configs.end(), [](const MicroConfig& a, const MicroConfig& b) {
    return a.workspace != b.workspace ? a.workspace < b.workspace : a.time_ms < b.time_ms;
  });
  std::vector<std::pair<uint64_t, double>> front;
  for (const auto& c : configs) {
    if (c.workspace > limit) break;
    if (front.empty() || c.time_ms < front.back().second - 1e-12) front.emplace_back(c.workspace, c.time_ms);
  }
  return front;
}

MicroBatchMeasurements random_measurements(std::mt19937& rng, int32_t batch, BatchPolicy policy, int algos) {
  MicroBatchMeasurements m;
  m.mini_batch = batch;
  std::uniform_real_distribution<double> per_sample(0.5, 2.0), fixed(0.0, 1.0);
  std::uniform_int_distribution<uint64_t> ws(0, 64);
  for (int32_t s : candidate_batches(policy, batch))
    for (int a = 0; a < algos; ++a)
      if (rng() % 5 != 0)  // some algorithms fail at some sizes
        m.by_batch[s].push_back({a, s, fixed(rng) + per_sample(rng) * s, ws(rng) * (a == 0 ? 0 : 1)});
  return m;
}

}  // namespace

TEST_CASE("candidate batch sizes follow the policy", "[microbatch]") {
  CHECK(candidate_batches(BatchPolicy::kUndivided, 256) == std::vector<int32_t>{256});
  CHECK(candidate_batches(BatchPolicy::kPowerOfTwo, 256) == std::vector<int32_t>{1, 2, 4, 8, 16, 32, 64, 128, 256});
  CHECK(candidate_batches(BatchPolicy::kPowerOfTwo, 13) == std::vector<int32_t>{1, 2, 4, 8, 13});
  CHECK(candidate_batches(BatchPolicy::kPowerOfTwo, 1) == std::vector<int32_t>{1});
  CHECK(candidate_batches(BatchPolicy::kAll, 5) == std::vector<int32_t>{1, 2, 3, 4, 5});
  CHECK(candidate_batches(BatchPolicy::kAll, 0).empty());
}

TEST_CASE("the DP's front equals brute force on random small cases", "[microbatch]") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 9);
    const auto policy = trial % 3 == 0 ? BatchPolicy::kPowerOfTwo : BatchPolicy::kAll;
    auto m = random_measurements(rng, batch, policy, 3);
    auto all = all_configs(m);
    for (uint64_t limit : {uint64_t{0}, uint64_t{8}, uint64_t{32}, uint64_t{64}}) {
      INFO("trial " << trial << " batch " << batch << " limit " << limit);
      auto expected = brute_front(all, limit);
      ParetoFront f = microbatch_front(m, limit);
      REQUIRE(f.size() == expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        CHECK(f.configs()[i].workspace == expected[i].first);
        CHECK(f.configs()[i].time_ms == Approx(expected[i].second).epsilon(1e-12));
        CHECK(f.configs()[i].batch() == batch);  // every entry covers the mini-batch exactly
      }
      auto best = fastest_microbatch_config(m, limit);
      CHECK(best.has_value() == !expected.empty());
      if (best) CHECK(best->time_ms == Approx(expected.back().second).epsilon(1e-12));
    }
  }
}

TEST_CASE("µ-cuDNN's reference case: 8 x 32 of the fast algorithm at 64 MiB", "[microbatch]") {
  MicroBatchMeasurements m;
  m.mini_batch = 256;
  for (int32_t s : candidate_batches(BatchPolicy::kPowerOfTwo, 256)) {
    m.by_batch[s].push_back({0, s, 10.0 * s + 0.1, static_cast<uint64_t>(s)});            // slow, s bytes
    if (s * kMiB < 64 * kMiB) m.by_batch[s].push_back({1, s, 0.1 * s + 0.01, s * kMiB});  // fast, s MiB
  }
  ParetoFront f = microbatch_front(m, 64 * kMiB);
  struct Expected {
    double time;
    uint64_t ws;
    size_t kernels;
  };
  const std::vector<Expected> expected = {{2585.60, 1, 256},     {2572.80, 2, 128},      {2566.40, 4, 64},
                                          {2563.20, 8, 32},      {2561.60, 16, 16},      {2560.80, 32, 8},
                                          {2560.40, 64, 4},      {2560.20, 128, 2},      {2560.10, 256, 1},
                                          {28.16, kMiB, 256},    {26.88, 2 * kMiB, 128}, {26.24, 4 * kMiB, 64},
                                          {25.92, 8 * kMiB, 32}, {25.76, 16 * kMiB, 16}, {25.68, 32 * kMiB, 8}};
  REQUIRE(f.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO(f.configs()[i].to_string());
    CHECK(f.configs()[i].time_ms == Approx(expected[i].time).epsilon(1e-9));
    CHECK(f.configs()[i].workspace == expected[i].ws);
    CHECK(f.configs()[i].kernels.size() == expected[i].kernels);
  }
  auto best = fastest_microbatch_config(m, 64 * kMiB);
  REQUIRE(best);
  CHECK(best->kernels.size() == 8);
  for (const auto& k : best->kernels) CHECK((k.algo == 1 && k.batch == 32));
}

TEST_CASE("edges: batch 1, a prime batch, a limit below every need", "[microbatch]") {
  SECTION("batch 1 is undivided") {
    MicroBatchMeasurements m{1, {{1, {{0, 1, 2.0, 0}, {1, 1, 1.0, 100}}}}};
    auto best = fastest_microbatch_config(m, 1000);
    REQUIRE(best);
    CHECK(best->kernels.size() == 1);
    CHECK(best->kernels[0].algo == 1);
    auto tight = fastest_microbatch_config(m, 50);
    REQUIRE(tight);
    CHECK(tight->kernels[0].algo == 0);
  }
  SECTION("a prime batch is covered exactly with power-of-two parts") {
    MicroBatchMeasurements m;
    m.mini_batch = 13;
    for (int32_t s : candidate_batches(BatchPolicy::kPowerOfTwo, 13))
      m.by_batch[s].push_back({0, s, 1.0 + s, static_cast<uint64_t>(s) * 10});  // fixed cost favours few parts
    for (uint64_t limit : {uint64_t{10}, uint64_t{40}, uint64_t{80}, uint64_t{130}}) {
      auto best = fastest_microbatch_config(m, limit);
      REQUIRE(best);
      CHECK(best->batch() == 13);
      CHECK(best->workspace <= limit);
    }
    CHECK(fastest_microbatch_config(m, 130)->kernels.size() == 1);  // undivided when it fits
    CHECK(fastest_microbatch_config(m, 80)->kernels.size() == 3);   // 8 + 4 + 1
    CHECK(fastest_microbatch_config(m, 10)->kernels.size() == 13);  // all ones
  }
  SECTION("no configuration fits: empty front, no choice") {
    MicroBatchMeasurements m{4, {{1, {{1, 1, 1.0, 64}}}, {4, {{1, 4, 3.0, 256}}}}};
    CHECK(microbatch_front(m, 63).empty());
    CHECK_FALSE(fastest_microbatch_config(m, 63).has_value());
  }
}

TEST_CASE("pruning to the Pareto front loses nothing", "[microbatch]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> t(0.1, 100.0);
  std::uniform_int_distribution<uint64_t> ws(0, 1000);
  for (int trial = 0; trial < 50; ++trial) {
    ParetoFront f;
    std::vector<MicroConfig> all;
    for (int i = 0; i < 200; ++i) {
      MicroConfig c = MicroConfig::single({i, 1, std::round(t(rng)), ws(rng)});  // rounding makes ties
      all.push_back(c);
      f.insert(c);
    }
    for (size_t i = 1; i < f.size(); ++i) {  // a staircase
      CHECK(f.configs()[i].workspace > f.configs()[i - 1].workspace);
      CHECK(f.configs()[i].time_ms < f.configs()[i - 1].time_ms);
    }
    for (uint64_t limit = 0; limit <= 1000; limit += 37) {
      double best = 1e300;
      for (const auto& c : all)
        if (c.workspace <= limit) best = std::min(best, c.time_ms);
      const MicroConfig* got = f.fastest_within(limit);
      if (best == 1e300) {
        CHECK(got == nullptr);
      } else {
        REQUIRE(got != nullptr);
        CHECK(got->time_ms == best);
        CHECK(got->workspace <= limit);
      }
    }
  }
}
