// Offload planning (planner/offload_plan.h) on hand-made iterations whose answers are known, and
// its invariants on random ones: a convolutional network's forward pass keeps its feature maps
// for the backward pass, which frees them in reverse.
#include "planner/offload_plan.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "tests/common/test_util.h"
#include "tests/cpu/trace_builder.h"

using namespace vcudnn;

namespace {

constexpr uint64_t kMiB = 1 << 20;

using Builder = test::TraceBuilder;

using M = AccessMode;

using test::Chain;
using test::chain;

// The shipped ResNet-50 iteration (tests/data/resnet50_b64_trace.json) and its model, without a plan.
struct Shipped {
  Trace t;
  Lifetimes l;
  SpanModel m;
  std::vector<uint64_t> none;  // bytes on the device at each call
  uint64_t peak = 0;
};
Shipped shipped_resnet50() {
  auto read = read_trace(test::source_dir() + "/tests/data/resnet50_b64_trace.json");
  REQUIRE(read.ok());
  Shipped out{std::move(read.value()), {}, {}, {}, 0};
  out.l = lifetimes(out.t);
  out.m = span_model(out.t, out.l);
  out.none = simulate(out.m, {});
  out.peak = *std::max_element(out.none.begin(), out.none.end());
  return out;
}

OffloadPlan plan_ok(const Trace& t, uint64_t budget, OffloadPolicy p) {
  const Lifetimes l = lifetimes(t);
  auto r = plan_offload(t, l, budget, p);
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  const SpanModel m = span_model(t, l);
  INFO(offload_policy_name(p) << " at " << budget);
  CHECK(check_plan(m, r.value()) == "");
  return r.value();
}

}  // namespace

TEST_CASE("offload plan: names of the policies", "[offload_plan]") {
  for (OffloadPolicy p : kOffloadPolicies) CHECK(offload_policy_from_name(offload_policy_name(p)) == p);
  CHECK_FALSE(offload_policy_from_name("lru"));
}

TEST_CASE("offload plan: vcudnn moves the fewest bytes that bring every call under the budget", "[offload_plan]") {
  // Maps of 8, 16, 24, 32, 40 MiB: the peak is at the turn (all alive + the weight).
  const Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  REQUIRE(parse_trace(nlohmann::json(c.b.t).dump()).ok());
  const Lifetimes l = lifetimes(c.b.t);
  const SpanModel m = span_model(c.b.t, l);
  const std::vector<uint64_t> none = simulate(m, {});
  const uint64_t peak = *std::max_element(none.begin(), none.end());
  CHECK(peak == 1 * kMiB + 8 * kMiB + 2 * (16 + 24 + 32 + 40) * kMiB);

  SECTION("a budget at the peak: nothing moves") {
    const OffloadPlan p = plan_ok(c.b.t, peak, OffloadPolicy::kVcudnn);
    CHECK(p.moves.empty());
    CHECK(p.fits);
    CHECK(p.peak_without == peak);
  }
  SECTION("8 MiB under the peak: one buffer of 8 MiB moves, the smallest that covers the excess") {
    const OffloadPlan p = plan_ok(c.b.t, peak - 8 * kMiB, OffloadPolicy::kVcudnn);
    REQUIRE(p.moves.size() == 1);
    CHECK(p.moves[0].bytes == 8 * kMiB);
    CHECK(p.fits);
    CHECK(p.peak_bytes <= peak - 8 * kMiB);
  }
  SECTION("a deep budget: it fits, and moves no more than vDNN's all-layers policy") {
    const OffloadBound bound = offload_bound(m);
    CHECK(bound.least_bytes < peak);
    const OffloadPlan mine = plan_ok(c.b.t, bound.least_bytes, OffloadPolicy::kVcudnn);
    CHECK(mine.fits);
    const OffloadPlan all = plan_ok(c.b.t, bound.least_bytes, OffloadPolicy::kVdnnAll);
    CHECK(mine.bytes_moved <= all.bytes_moved);
    const OffloadPlan mid = plan_ok(c.b.t, (peak + bound.least_bytes) / 2, OffloadPolicy::kVcudnn);
    CHECK(mid.fits);
    CHECK(mid.bytes_moved < all.bytes_moved);
  }
  SECTION("below the least any plan needs: refused, naming that least") {
    const OffloadBound bound = offload_bound(m);
    const auto r = plan_offload(c.b.t, l, bound.least_bytes - 1, OffloadPolicy::kVcudnn);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find(std::to_string(bound.least_bytes) + " bytes") != std::string::npos);
    CHECK(bound.least_bytes >= l.least_bytes);  // the model's bound is never below the trace's own
  }
}

// Note [Moving part of a buffer]
TEST_CASE("offload plan: with partial moves vcudnn keeps on the device what of a buffer the budget allows",
          "[offload_plan]") {
  const Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  const Lifetimes l = lifetimes(c.b.t);
  OffloadOptions partial;
  partial.partial_moves = true;
  const SpanModel m = span_model(c.b.t, l, partial);
  const std::vector<uint64_t> none = simulate(m, {});
  const uint64_t peak = *std::max_element(none.begin(), none.end());
  // 3 MiB over: whole, the 8 MiB buffer moves; in part, 2 granules of it (4 MiB), the first 4 MiB stay.
  const OffloadPlan whole = plan_ok(c.b.t, peak - 3 * kMiB, OffloadPolicy::kVcudnn);
  REQUIRE(whole.moves.size() == 1);
  CHECK(whole.moves[0].bytes == 8 * kMiB);
  CHECK(whole.moves[0].offset == 0);
  auto r = plan_offload(c.b.t, l, peak - 3 * kMiB, OffloadPolicy::kVcudnn, partial);
  REQUIRE(r.ok());
  CHECK(check_plan(m, r.value()) == "");
  REQUIRE(r->moves.size() == 1);
  CHECK(r->moves[0].life == whole.moves[0].life);
  CHECK(r->moves[0].bytes == 4 * kMiB);
  CHECK(r->moves[0].offset == 4 * kMiB);
  CHECK(r->fits);
  CHECK(r->peak_bytes == peak - 4 * kMiB);
  // The check refuses a part that is not the buffer's end, or a part of a buffer that may not move in part.
  OffloadPlan bad = r.value();
  bad.moves[0].bytes -= 2 * kMiB;
  finish_plan(m, bad);
  CHECK(check_plan(m, bad) != "");
  const SpanModel plain = span_model(c.b.t, l);
  CHECK(check_plan(plain, r.value()) != "");
  // Random budgets: every plan in part fits, keeps its invariants and moves no more than whole buffers.
  const uint64_t least = offload_bound(m).least_bytes;
  for (int k = 0; k <= 8; ++k) {
    const uint64_t budget = least + (peak - least) * static_cast<uint64_t>(k) / 8;
    auto p = plan_offload(c.b.t, l, budget, OffloadPolicy::kVcudnn, partial);
    REQUIRE(p.ok());
    INFO("budget " << budget);
    CHECK(check_plan(m, p.value()) == "");
    CHECK(p->fits);
    CHECK(p->bytes_moved <= plan_ok(c.b.t, budget, OffloadPolicy::kVcudnn).bytes_moved);
    for (const OffloadMove& mv : p->moves) CHECK(mv.offset % (2 * kMiB) == 0);
  }
}

TEST_CASE("offload plan: vDNN's policies follow the paper's rules", "[offload_plan]") {
  const Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  const Lifetimes l = lifetimes(c.b.t);
  const SpanModel m = span_model(c.b.t, l);
  const OffloadPlan all = plan_ok(c.b.t, 1ull << 40, OffloadPolicy::kVdnnAll);
  const OffloadPlan conv = plan_ok(c.b.t, 1ull << 40, OffloadPolicy::kVdnnConv);
  // vdnn-all: every feature map used on both sides of the turn whose backward layers leave room
  // for a trip; the weight (not allocated by the iteration) stays.
  std::vector<size_t> moved_all, moved_conv;
  for (const OffloadMove& mv : all.moves) moved_all.push_back(mv.life);
  for (const OffloadMove& mv : conv.moves) moved_conv.push_back(mv.life);
  for (const OffloadMove& mv : all.moves) {
    CHECK(l.buffers[mv.life].buffer != c.weight);
    CHECK(mv.out_after < mv.next_use);
    // Each leaves after its last forward use and is back for its first backward one, prefetched
    // when the backward layer before it starts (a backward convolution).
    const uint64_t seq = m.seqs[mv.prefetch_at];
    const auto call =
        std::find_if(c.b.t.calls.begin(), c.b.t.calls.end(), [&](const TraceCall& t) { return t.seq == seq; });
    REQUIRE(call != c.b.t.calls.end());
    CHECK(call->kind == CallKind::kConvolution);
    CHECK(call->conv != ConvKind::kForward);
  }
  CHECK(moved_all.size() >= 3);
  // vdnn-conv: a subset, only what forward convolutions read (no pre-activation).
  CHECK(moved_conv.size() < moved_all.size());
  CHECK_FALSE(moved_conv.empty());
  for (size_t life : moved_conv) {
    CHECK(std::find(moved_all.begin(), moved_all.end(), life) != moved_all.end());
    CHECK(std::find(c.pre.begin(), c.pre.end(), l.buffers[life].buffer) == c.pre.end());
  }
  // They ignore the budget: a tight one is reported as not met, not refused.
  const OffloadBound bound = offload_bound(m);
  const OffloadPlan tight = plan_ok(c.b.t, bound.least_bytes, OffloadPolicy::kVdnnConv);
  CHECK(tight.peak_bytes == conv.peak_bytes);
  CHECK(tight.fits == (conv.peak_bytes <= bound.least_bytes));

  SECTION("a trace without a forward-to-backward turn: vDNN does not apply, vcudnn still plans") {
    Builder b;
    const uint32_t x = b.buffer(8 * kMiB), y = b.buffer(8 * kMiB), z = b.buffer(8 * kMiB);
    const uint64_t first = b.add(CallKind::kAlloc, static_cast<int32_t>(x));
    b.add(CallKind::kLaunch, -1, {{x, M::kWrite}});
    b.add(CallKind::kAlloc, static_cast<int32_t>(y));
    b.add(CallKind::kLaunch, -1, {{y, M::kWrite}});
    b.add(CallKind::kAlloc, static_cast<int32_t>(z));
    for (int i = 0; i < 6; ++i) b.add(CallKind::kLaunch, -1, {{y, M::kReadWrite}, {z, M::kRead}});
    b.add(CallKind::kFree, static_cast<int32_t>(z));
    b.add(CallKind::kLaunch, -1, {{y, M::kReadWrite}});  // x comes back meanwhile
    b.add(CallKind::kLaunch, -1, {{x, M::kRead}, {y, M::kRead}});
    b.add(CallKind::kFree, static_cast<int32_t>(x));
    b.add(CallKind::kFree, static_cast<int32_t>(y));
    b.done(first);
    const Lifetimes lt = lifetimes(b.t);
    const auto r = plan_offload(b.t, lt, 16 * kMiB, OffloadPolicy::kVdnnAll);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("vdnn-all needs a forward pass") != std::string::npos);
    const OffloadPlan p = plan_ok(b.t, 16 * kMiB, OffloadPolicy::kVcudnn);
    REQUIRE(p.moves.size() == 1);
    CHECK(lt.buffers[p.moves[0].life].buffer == x);
    CHECK(p.fits);
  }
}

TEST_CASE("offload plan: what never moves (library buffers, buffers below a granule) counts in the least budget",
          "[offload_plan]") {
  Builder b;
  const uint32_t big = b.buffer(32 * kMiB), lib = b.buffer(16 * kMiB, true), small = b.buffer(1 * kMiB);
  const uint64_t first = b.add(CallKind::kAlloc, static_cast<int32_t>(big));
  b.add(CallKind::kAlloc, static_cast<int32_t>(lib));
  b.add(CallKind::kAlloc, static_cast<int32_t>(small));
  b.add(CallKind::kLaunch, -1, {{big, M::kWrite}, {lib, M::kWrite}, {small, M::kWrite}});
  const uint32_t other = b.buffer(32 * kMiB);
  b.add(CallKind::kLaunch, -1, {{lib, M::kReadWrite}});
  b.add(CallKind::kAlloc, static_cast<int32_t>(other));
  for (int i = 0; i < 8; ++i)
    b.add(CallKind::kLaunch, -1, {{lib, M::kReadWrite}, {small, M::kRead}, {other, M::kWrite}});
  b.add(CallKind::kFree, static_cast<int32_t>(other));
  b.add(CallKind::kLaunch, -1, {{lib, M::kReadWrite}});
  b.add(CallKind::kLaunch, -1, {{big, M::kRead}, {lib, M::kRead}, {small, M::kRead}});
  b.add(CallKind::kFree, static_cast<int32_t>(big));
  b.add(CallKind::kFree, static_cast<int32_t>(lib));
  b.add(CallKind::kFree, static_cast<int32_t>(small));
  b.done(first);
  const Lifetimes l = lifetimes(b.t);
  const SpanModel m = span_model(b.t, l);
  // 49 MiB at the first and last launches; 49 too while `other` is used (big can leave then).
  CHECK(offload_bound(m).least_bytes == 49 * kMiB);
  const OffloadPlan p = plan_ok(b.t, 49 * kMiB, OffloadPolicy::kVcudnn);
  REQUIRE(p.moves.size() == 1);
  CHECK(l.buffers[p.moves[0].life].buffer == big);
  CHECK(p.fits);
  // Granule rounding: a buffer of 3 MiB occupies 4.
  Builder g;
  const uint32_t odd = g.buffer(3 * kMiB);
  const uint64_t f = g.add(CallKind::kAlloc, static_cast<int32_t>(odd));
  g.add(CallKind::kLaunch, -1, {{odd, M::kWrite}});
  g.add(CallKind::kFree, static_cast<int32_t>(odd));
  g.done(f);
  const SpanModel mg = span_model(g.t, lifetimes(g.t));
  CHECK(simulate(mg, {})[1] == 4 * kMiB);
}

TEST_CASE("offload plan: invariants on random iterations and budgets", "[offload_plan]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    std::vector<uint64_t> maps;
    const int n = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) maps.push_back((1 + rng() % 40) * kMiB + (rng() % 3) * 4096);
    const Chain c = chain(maps);
    const Lifetimes l = lifetimes(c.b.t);
    const SpanModel m = span_model(c.b.t, l);
    const OffloadBound bound = offload_bound(m);
    const std::vector<uint64_t> none = simulate(m, {});
    const uint64_t peak = *std::max_element(none.begin(), none.end());
    REQUIRE(bound.least_bytes <= peak);
    for (int k = 0; k < 5; ++k) {
      const uint64_t budget = bound.least_bytes + (peak - bound.least_bytes) * k / 4;
      const OffloadPlan p = plan_ok(c.b.t, budget, OffloadPolicy::kVcudnn);
      INFO("round " << round << " budget " << budget << " least " << bound.least_bytes << " peak " << peak);
      CHECK(p.fits);
      CHECK(p.peak_bytes <= budget);
      // No move is superfluous: taking any one away breaks the budget.
      for (size_t i = 0; i < p.moves.size(); ++i) {
        std::vector<OffloadMove> fewer = p.moves;
        fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
        const std::vector<uint64_t> sim = simulate(m, fewer);
        CHECK(*std::max_element(sim.begin(), sim.end()) > budget);
      }
      for (OffloadPolicy v : {OffloadPolicy::kVdnnAll, OffloadPolicy::kVdnnConv}) plan_ok(c.b.t, budget, v);
      // moDNN fits every budget from the bound up, and never offloads what the call or the next uses.
      const OffloadPlan mo = plan_ok(c.b.t, budget, OffloadPolicy::kModnn);
      CHECK(mo.fits);
      for (const OffloadMove& mv : mo.moves) CHECK(mv.off_from + 2 <= mv.next_use);
    }
  }
}

TEST_CASE("vcudnn plan: the policies side by side from the command line, a budget below the least refused",
          "[offload_plan][cli]") {
  const Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  test::TempDir tmp;
  const std::string path = tmp.file("t.json"), out = tmp.file("plan.json");
  REQUIRE(write_trace(c.b.t, path).ok());
  const Lifetimes l = lifetimes(c.b.t);
  const OffloadBound bound = offload_bound(span_model(c.b.t, l));
  const std::string cli = test::exe_dir() + "/vcudnn";
  {
    const auto r = test::run_process({cli, "plan", path, "--budget", "70%", "--json", out}, {});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("least budget any plan needs: "));
    CHECK_THAT(r.out, Catch::Contains("| vcudnn | yes |"));
    CHECK_THAT(r.out, Catch::Contains("| vdnn-all |"));
    CHECK_THAT(r.out, Catch::Contains("| vdnn-conv |"));
    CHECK_THAT(r.out, Catch::Contains("| modnn | yes |"));
    const auto j = nlohmann::json::parse(test::read_file(out));
    CHECK(j.at("schema") == "vcudnn.plan/1");
    REQUIRE(j.at("plans").size() == 4);
    const auto& mine = j.at("plans").at(0);
    CHECK(mine.at("policy") == "vcudnn");
    CHECK(mine.at("fits") == true);
    CHECK(mine.at("peak").get<uint64_t>() <= j.at("budget").get<uint64_t>());
    const auto& curve = j.at("curves").at("vcudnn");
    CHECK(curve.size() == j.at("curves").at("without").size());
    uint64_t max = 0;
    for (const auto& v : curve) max = std::max(max, v.get<uint64_t>());
    CHECK(max == mine.at("peak").get<uint64_t>());
    CHECK_FALSE(mine.at("moves").empty());
    for (const auto& mv : mine.at("moves")) {
      CHECK(mv.at("out_after").get<uint64_t>() < mv.at("prefetch_at").get<uint64_t>());
      CHECK(mv.at("prefetch_at").get<uint64_t>() <= mv.at("next_use").get<uint64_t>());
    }
  }
  {
    const auto r = test::run_process(
        {cli, "plan", path, "--budget", std::to_string(bound.least_bytes - 1), "--policy", "vcudnn"}, {});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.err, Catch::Contains("below the least any offload plan of this iteration needs"));
    CHECK_THAT(r.err, Catch::Contains(std::to_string(bound.least_bytes) + " bytes"));
  }
  {
    const auto r = test::run_process({cli, "plan", path, "--budget", "70%", "--policy", "lru"}, {});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("--policy lru"));
    const auto bad = test::run_process({cli, "plan", path, "--budget", "70 parsecs"}, {});
    CHECK(bad.exit_code == 2);
    const auto negative = test::run_process({cli, "plan", path, "--budget", "70%", "--h2d-gbps", "-1"}, {});
    CHECK(negative.exit_code == 2);
  }
  {  // time: the link assumed (the trace has none), untimed calls at --call-ms, vcudnn's timeline
    const std::string timeline = tmp.file("timeline.json");
    const auto r = test::run_process(
        {cli, "plan", path, "--budget", "70%", "--policy", "vcudnn", "--call-ms", "0.1", "--timeline", timeline}, {});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("link: 55.0 GB/s out, 55.0 GB/s back, 78.0 GB/s both (assumed"));
    CHECK_THAT(r.out, Catch::Contains("calls have no GPU time in the trace"));
    const auto j = nlohmann::json::parse(test::read_file(timeline));
    CHECK(j.at("traceEvents").size() > c.b.t.calls.size());
    const auto given = test::run_process({cli, "plan", path, "--budget", "70%", "--d2h-gbps", "20"}, {});
    CHECK_THAT(given.out, Catch::Contains("link: 20.0 GB/s out, 55.0 GB/s back, 78.0 GB/s both (given)"));
  }
}

// With no arguments, `vcudnn plan` and `vcudnn trace` take the trace shipped in tests/data (the
// README's main job on a machine without a GPU): every policy at 60% of its peak.
TEST_CASE("vcudnn plan and vcudnn trace without arguments take the shipped ResNet-50 trace", "[offload_plan][cli]") {
  const std::string cli = test::exe_dir() + "/vcudnn";
  const std::string shipped = test::source_dir() + "/tests/data/resnet50_b64_trace.json";
  const auto r = test::run_process({cli, "plan"}, {});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("no trace given: the shipped one"));
  CHECK_THAT(r.out, Catch::Contains("plan " + shipped + ": "));
  CHECK_THAT(r.out, Catch::Contains("(60.0% of the peak)"));
  for (const char* row : {"| vcudnn | yes |", "| vdnn-all | yes |", "| vdnn-conv | yes |", "| modnn | yes |"})
    CHECK_THAT(r.out, Catch::Contains(row));
  const auto budget = test::run_process({cli, "plan", "--budget", "80%", "--policy", "vcudnn"}, {});
  CHECK(budget.exit_code == 0);
  CHECK_THAT(budget.out, Catch::Contains("(80.0% of the peak)"));
  CHECK_THAT(budget.out, !Catch::Contains("| modnn |"));
  const auto t = test::run_process({cli, "trace", "--require-complete"}, {});
  INFO(t.out << t.err);
  CHECK(t.exit_code == 0);
  CHECK_THAT(t.out, Catch::Contains("trace " + shipped + ": schema vcudnn.trace/2"));
  CHECK_THAT(t.out, Catch::Contains("iteration: complete"));
}

// A move takes its buffer off the device only between the use its copy out follows and the copy
// back: every policy's plan for the shipped iteration leaves each call before a move's use as it was
// (from 829fb71 on, vcudnn's and vDNN's moves were off from the iteration's first call,
// which lowered the simulated curve, the least budget and where prefetches could move).
TEST_CASE("offload plan: a buffer is off the device only after the use its copy out follows", "[offload_plan]") {
  const Shipped shipped = shipped_resnet50();
  const auto& [t, l, m, none, peak] = shipped;
  for (OffloadPolicy policy : kOffloadPolicies) {
    INFO(offload_policy_name(policy));
    const auto plan = plan_offload(t, l, peak * 6 / 10, policy);
    REQUIRE(plan.ok());
    REQUIRE_FALSE(plan->moves.empty());
    size_t first_off = none.size();
    for (const OffloadMove& mv : plan->moves) {
      CHECK(mv.first_absent() > mv.out_after);
      CHECK(mv.last_absent() < mv.next_use);
      CHECK(mv.first_absent() <= mv.last_absent());
      first_off = std::min(first_off, mv.first_absent());
    }
    const std::vector<uint64_t> with = simulate(m, plan->moves);
    REQUIRE(with.size() == none.size());
    for (size_t p = 0; p < first_off; ++p) REQUIRE(with[p] == none[p]);
    CHECK(first_off > 0);
  }
}

namespace {

// A plotting program ran, said it wrote `png`, and did: a PNG file of some size.
void check_png_written(const test::ProcessResult& r, const std::string& png) {
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("wrote " + png));
  const std::string bytes = test::read_file(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

}  // namespace

// `vcudnn plan --plot` draws the curves with scripts/plan_plot.py (matplotlib, as for vcudnn trace).
TEST_CASE("vcudnn plan --plot draws device memory with and without the plans", "[offload_plan][cli]") {
  const Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB});
  test::TempDir tmp;
  const std::string path = tmp.file("t.json"), png = tmp.file("plan.png");
  REQUIRE(write_trace(c.b.t, path).ok());
  check_png_written(
      test::run_process({test::exe_dir() + "/vcudnn", "plan", path, "--budget", "80%", "--plot", png}, {}), png);
  CHECK(nlohmann::json::parse(test::read_file(png + ".json")).at("curves").size() == 5);
}

// scripts/bench/offload_plot.py draws the README's plot of step time against device memory from
// scripts/bench/offload's results: one panel per model, a line per policy; a file without PyTorch
// alone to compare with is refused.
TEST_CASE("offload_plot.py draws the shipped offload results, one panel per model", "[offload_plan][cli]") {
  const std::string results = test::source_dir() + "/scripts/bench/results/";
  const std::string script = test::source_dir() + "/scripts/bench/offload_plot.py";
  test::TempDir tmp;
  const std::string png = tmp.file("policies.png");
  check_png_written(
      test::run_process({test::python_executable(), script, results + "offload_step-issue13-resnet50-b128-current.json",
                         results + "offload_step-issue13-vgg16-policies.json", "--out", png},
                        {}),
      png);

  const std::string lone = tmp.file("lone.json");
  {
    nlohmann::json j = nlohmann::json::parse(test::read_file(results + "offload_step-issue13-vgg16-policies.json"));
    j["summaries"]["vgg16"]["rows"].erase("torch-async");
    std::ofstream(lone) << j.dump();
  }
  const auto refused = test::run_process({test::python_executable(), script, lone, "--out", tmp.file("x.png")}, {});
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("no PyTorch-alone row"));
}

namespace {

// Every convolution 1 ms, every other call 0.05 ms (allocations and frees included: the model
// treats every call alike).
void time_calls(Trace& t) {
  for (TraceCall& c : t.calls) c.gpu_ms = c.kind == CallKind::kConvolution ? 1.0f : 0.05f;
}

}  // namespace

TEST_CASE("offload plan timing: the compute lane, stalls for late copies back, and the lower bound", "[offload_plan]") {
  Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  time_calls(c.b.t);
  const Lifetimes l = lifetimes(c.b.t);
  const SpanModel m = span_model(c.b.t, l);
  const std::vector<uint64_t> none = simulate(m, {});
  const uint64_t peak = *std::max_element(none.begin(), none.end());
  double compute = 0;
  for (const TraceCall& call : c.b.t.calls) compute += *call.gpu_ms;

  SECTION("no plan: the step is the compute") {
    const OffloadPlan p = plan_ok(c.b.t, peak, OffloadPolicy::kVcudnn);
    const PlanTimeline t = time_plan(c.b.t, m, p, kAssumedLink);
    CHECK(t.untimed_calls == 0);
    CHECK(t.step_ms == Approx(compute));
    CHECK(t.compute_ms == Approx(compute));
    CHECK(t.stall_ms == 0);
    CHECK(t.lower_bound_ms == Approx(compute));
  }
  SECTION("a slow link: copies back issued one call ahead are late; scheduled earlier, they stall less") {
    const LinkModel slow{0.5, 0.5, 0.8};  // 8 MiB take 16.8 ms
    OffloadPlan p = plan_ok(c.b.t, peak * 7 / 10, OffloadPolicy::kVcudnn);
    REQUIRE_FALSE(p.moves.empty());
    const PlanTimeline before = time_plan(c.b.t, m, p, slow);
    CHECK(before.late_prefetches > 0);
    CHECK(before.stall_ms > 0);
    CHECK(before.step_ms == Approx(before.compute_ms + before.stall_ms + before.room_ms));
    CHECK(before.lower_bound_ms <= before.step_ms);
    CHECK(before.lower_bound_ms > before.compute_ms);  // the excess alone takes longer than the compute
    const size_t moved = schedule_prefetches(c.b.t, m, p, slow);
    CHECK(moved > 0);
    CHECK(check_plan(m, p) == "");
    CHECK(p.fits);  // never at the budget's expense
    const PlanTimeline after = time_plan(c.b.t, m, p, slow);
    CHECK(after.stall_ms < before.stall_ms);
    CHECK(after.lower_bound_ms <= after.step_ms);
  }
  SECTION("the H100's link: stalls only where the budget keeps a copy back from starting earlier") {
    OffloadPlan p = plan_ok(c.b.t, peak * 7 / 10, OffloadPolicy::kVcudnn);
    schedule_prefetches(c.b.t, m, p, kAssumedLink);
    const PlanTimeline t = time_plan(c.b.t, m, p, kAssumedLink);
    double copies_back = 0;
    for (const TimedCopy& copy : t.copies_back) copies_back += copy.end_ms - copy.start_ms;
    CHECK(t.step_ms >= t.lower_bound_ms);
    CHECK(t.stall_ms <= copies_back);
    CHECK(t.step_ms < compute * 1.1);  // 0.76 ms at most for the 40 MiB map over a 13.35 ms step
  }
  // Note [Prefetches as early as the budget allows]
  SECTION("prefetches as early as the budget allows: each from the first call the budget holds, in the order of uses") {
    for (const uint64_t percent : {90, 70, 50}) {
      OffloadPlan p = plan_ok(c.b.t, peak * percent / 100, OffloadPolicy::kVcudnn);
      REQUIRE_FALSE(p.moves.empty());
      const OffloadPlan late = p;
      schedule_prefetches_early(m, p);
      INFO(percent << "%");
      CHECK(check_plan(m, p) == "");
      CHECK(p.fits);
      std::vector<size_t> order(p.moves.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return p.moves[a].next_use < p.moves[b].next_use; });
      size_t lane = 0, earlier = 0;
      for (size_t k : order) {
        const OffloadMove& mv = p.moves[k];
        CHECK(mv.prefetch_at <= late.moves[k].prefetch_at);
        earlier += mv.prefetch_at < late.moves[k].prefetch_at;
        CHECK(mv.prefetch_at >= lane);  // the lane's order is the uses' order
        // One call earlier breaks the budget, or comes before its copy out or the copy ahead of it.
        if (mv.prefetch_at > std::max(mv.off_from + 1, lane)) {
          OffloadPlan q = p;
          --q.moves[k].prefetch_at;
          finish_plan(m, q);
          CHECK_FALSE(q.fits);
        }
        lane = mv.prefetch_at;
      }
      if (percent < 90) CHECK(earlier > 0);
    }
  }
  SECTION("the timeline as Chrome trace JSON: three lanes, one event per call and per copy") {
    OffloadPlan p = plan_ok(c.b.t, peak * 7 / 10, OffloadPolicy::kVcudnn);
    const PlanTimeline t = time_plan(c.b.t, m, p, kAssumedLink);
    const auto j = nlohmann::json::parse(timeline_json(m, p, t));
    size_t calls = 0, out = 0, back = 0, lanes = 0;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") == "M") ++lanes;
      if (e.at("ph") != "X") continue;
      const int tid = e.at("tid").get<int>();
      (tid == 1 ? calls : tid == 2 ? out : back) += 1;
      CHECK(e.at("dur").get<double>() >= 0);
    }
    CHECK(lanes == 3);
    CHECK(calls == m.seqs.size());
    CHECK(out == p.moves.size());
    CHECK(back == p.moves.size());
  }
}

// A recorded iteration's allocations, frees and stream settings queue no work: they take no GPU time
// in the plan's timeline, whatever the time given to a call that queues work and has none (the
// shipped ResNet-50 iteration has 1368 allocations and frees and 317 stream settings: at the
// runtime's 5 us each, the model's step was 8.4 ms above the GPU's).
TEST_CASE("offload plan timing: allocations and frees take no GPU time", "[offload_plan]") {
  const Shipped shipped = shipped_resnet50();
  const auto& [t, l, m, none, peak] = shipped;
  const OffloadPlan p = plan_ok(t, peak, OffloadPolicy::kVcudnn);
  double timed = 0;
  size_t untimed_work = 0, memory_events = 0;
  for (const TraceCall& c : t.calls) {
    if (!std::binary_search(m.seqs.begin(), m.seqs.end(), c.seq)) continue;
    if (c.gpu_ms) timed += *c.gpu_ms;
    else if (call_queues_device_work(c.kind)) ++untimed_work;
    memory_events += c.kind == CallKind::kAlloc || c.kind == CallKind::kFree ? 1 : 0;
  }
  REQUIRE(memory_events > 500);
  const double untimed_ms = 0.005;
  const PlanTimeline tl = time_plan(t, m, p, kAssumedLink, untimed_ms);
  CHECK(tl.untimed_calls == untimed_work);
  CHECK(tl.compute_ms == Approx(timed + untimed_ms * static_cast<double>(untimed_work)));
  CHECK(tl.step_ms == Approx(tl.compute_ms));
}

// Note [Both directions at once]: B's copy out is queued first and takes the device-to-host lane at
// its own rate; A's copy back, queued later over the same time, gets what the link has left.
TEST_CASE("offload plan timing: copies out and back at once share the link", "[offload_plan]") {
  using M = AccessMode;
  Builder b;
  const uint32_t a = b.buffer(64 * kMiB), bb = b.buffer(64 * kMiB);
  const uint64_t first = b.add(CallKind::kLaunch, -1, {{a, M::kWrite}});
  b.add(CallKind::kLaunch, -1, {{bb, M::kWrite}});
  b.add(CallKind::kConvolution, -1, {});  // a long call both are away for
  b.add(CallKind::kLaunch, -1, {{a, M::kRead}});
  b.add(CallKind::kLaunch, -1, {{bb, M::kRead}});
  b.done(first);
  for (TraceCall& c : b.t.calls) c.gpu_ms = c.kind == CallKind::kConvolution ? 100.0f : 0.001f;
  const Lifetimes l = lifetimes(b.t);
  const SpanModel m = span_model(b.t, l);
  OffloadPlan p;
  p.budget = 1ull << 40;  // no room to wait for
  p.moves = {{0, 64 * kMiB, 0, 2, 3, 1}, {1, 64 * kMiB, 1, 4, 4, 2}};  // A back for call 3 from call 2
  const double copy_ms = 64.0 * kMiB / 1e6;                           // at 1 GB/s
  const PlanTimeline alone = time_plan(b.t, m, p, {1, 1, 2});         // the sum: no sharing
  const PlanTimeline unknown = time_plan(b.t, m, p, {1, 1, 0});       // no measure: none either
  const PlanTimeline shared = time_plan(b.t, m, p, {1, 1, 1});
  const auto back_of = [](const PlanTimeline& t, size_t move) {
    for (const TimedCopy& c : t.copies_back)
      if (c.move == move) return c;
    return TimedCopy{};
  };
  REQUIRE(alone.copies_out.size() == 2);
  REQUIRE(shared.copies_out.size() == 2);
  for (const PlanTimeline* t : {&alone, &unknown, &shared}) {  // the copies out, queued first, as alone
    CHECK(t->copies_out[0].end_ms - t->copies_out[0].start_ms == Approx(copy_ms));
    CHECK(t->copies_out[1].start_ms == Approx(t->copies_out[0].end_ms));
    CHECK(t->copies_out[1].end_ms - t->copies_out[1].start_ms == Approx(copy_ms));
  }
  // A's copy back starts when its copy out has ended, beside B's copy out.
  CHECK(back_of(alone, 0).start_ms == Approx(alone.copies_out[0].end_ms));
  CHECK(back_of(alone, 0).end_ms - back_of(alone, 0).start_ms == Approx(copy_ms));
  CHECK(back_of(unknown, 0).end_ms == Approx(back_of(alone, 0).end_ms));
  // Shared: a tenth of its rate while B's copy out runs, then all of it: 10 % of the bytes in the
  // overlap, the rest after.
  CHECK(back_of(shared, 0).start_ms == Approx(shared.copies_out[0].end_ms));
  CHECK(back_of(shared, 0).end_ms == Approx(shared.copies_out[1].end_ms + 0.9 * copy_ms));
  // A is due after the 100 ms call: it waits for its copy back, the longer where the link is shared.
  CHECK(alone.stall_ms > 0);
  CHECK(shared.step_ms == Approx(alone.step_ms + 0.9 * copy_ms));
}

// runtime/collectives.h: a DDP rank's all-reduce runs on NCCL's stream beside the backward pass, and
// its time counts the wait for the other ranks: it adds nothing to the compute lane.
TEST_CASE("offload plan timing: NCCL's collectives run beside the compute", "[offload_plan][nccl]") {
  Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB});
  time_calls(c.b.t);
  double compute = 0;
  for (const TraceCall& call : c.b.t.calls) compute += *call.gpu_ms;
  c.b.t.names = {"ncclAllReduce", "cublasSgemm_v2"};
  for (int32_t name : {0, 1}) {
    TraceCall reduce;
    reduce.seq = c.b.t.end_seq - 1;  // placed before the last call, which is renumbered after it
    reduce.kind = CallKind::kLibrary;
    reduce.name = name;
    reduce.gpu_ms = 40.0;
    reduce.accesses = {{c.weight, AccessMode::kUnknown}};
    Trace t = c.b.t;
    t.calls.back().seq = t.end_seq;
    t.calls.insert(t.calls.end() - 1, reduce);
    ++t.end_seq;
    CHECK(is_collective(t, t.calls[t.calls.size() - 2]) == (name == 0));
    const Lifetimes l = lifetimes(t);
    const SpanModel m = span_model(t, l);
    const std::vector<uint64_t> none = simulate(m, {});
    const OffloadPlan p = plan_ok(t, *std::max_element(none.begin(), none.end()), OffloadPolicy::kVcudnn);
    const PlanTimeline tl = time_plan(t, m, p, kAssumedLink);
    INFO(t.names[static_cast<size_t>(name)]);
    CHECK(tl.compute_ms == Approx(name == 0 ? compute : compute + 40.0));
  }
}

TEST_CASE("offload plan: moDNN offloads on demand, least delay first, and prefetches by its Eq. 9", "[offload_plan]") {
  Chain c = chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  time_calls(c.b.t);
  const Lifetimes l = lifetimes(c.b.t);
  const SpanModel m = span_model(c.b.t, l);
  const std::vector<uint64_t> none = simulate(m, {});
  const uint64_t peak = *std::max_element(none.begin(), none.end());
  SECTION("a budget at the peak: nothing moves") { CHECK(plan_ok(c.b.t, peak, OffloadPolicy::kModnn).moves.empty()); }
  SECTION("under the peak: it fits; what it offloads comes back before its next use, early enough on a fast link") {
    const uint64_t budget = peak * 7 / 10;
    const OffloadPlan p = plan_ok(c.b.t, budget, OffloadPolicy::kModnn);
    REQUIRE_FALSE(p.moves.empty());
    CHECK(p.fits);
    for (const OffloadMove& mv : p.moves) {
      CHECK(l.buffers[mv.life].alloc_seq);  // weights (not allocated by the iteration) stay
      CHECK(mv.prefetch_at < mv.next_use);  // prefetched, not loaded on demand, with the H100's link
    }
    const PlanTimeline t = time_plan(c.b.t, m, p, kAssumedLink);
    CHECK(t.step_ms >= t.lower_bound_ms);
    // vcudnn moves no more bytes for the same budget.
    CHECK(plan_ok(c.b.t, budget, OffloadPolicy::kVcudnn).bytes_moved <= p.bytes_moved);
  }
  SECTION("a link too slow to hide anything: copies back are issued earlier than one call ahead") {
    const LinkModel slow{0.5, 0.5, 0.8};
    const auto r = plan_offload(c.b.t, l, peak * 7 / 10, OffloadPolicy::kModnn, {}, slow);
    REQUIRE(r.ok());
    CHECK(check_plan(m, r.value()) == "");
    CHECK(std::any_of(r.value().moves.begin(), r.value().moves.end(),
                      [](const OffloadMove& mv) { return mv.prefetch_at + 1 < mv.next_use; }));
  }
}

// Note [The lower bound]: bytes leave only once their use before the excess has run, and come back
// before their next use, after which its compute remains. Ten calls of 1 ms; buffer A (2 MB, used by
// calls 0, 4 and 9) is the only one that can be off the device at call 5, where a fixed 4 MB buffer
// takes the budget. At 1 GB/s A's copy out starts at 5 ms and ends at 7, so call 5 runs 7-8 ms; A's
// copy back takes 2 ms from 8 and call 9 (1 ms) follows: 12 ms. Letting the bytes leave from the
// iteration's start (the bound before 2026-11-24) gave only the compute, 10 ms.
TEST_CASE("offload lower bound: bytes leave after their use and return before the next, not earlier",
          "[offload_plan]") {
  SpanModel m;
  for (uint64_t seq = 0; seq < 10; ++seq) m.seqs.push_back(seq);
  constexpr uint64_t kMB = 1000 * 1000;
  m.lives.push_back({0, 9, {0, 4, 9}, 2 * kMB, true});  // A
  m.lives.push_back({5, 5, {5}, 4 * kMB, false});       // the excess's cause
  const std::vector<double> duration(10, 1.0);
  const double rate = 1e6;  // bytes per ms: 1 GB/s
  CHECK(lower_bound_ms(m, duration, 4 * kMB, rate, rate) == Approx(12.0));
  CHECK(lower_bound_ms(m, duration, 6 * kMB, rate, rate) == Approx(10.0));  // no excess: the compute
  // A used by call 5 too: nothing can be off there; the bytes alone, as before (4 ms of link, within
  // the compute).
  m.lives[0].uses = {0, 5, 9};
  CHECK(lower_bound_ms(m, duration, 4 * kMB, rate, rate) == Approx(10.0));
  // Two candidates, A and B (2 MB, used by calls 1 and 8: ready at 2 ms, 2 ms of compute after its
  // next use). 2 MB over a budget of 8 MB: B can be out by 4 ms, A back 3 ms before the end: the
  // compute, 10 ms.
  m.lives[0].uses = {0, 4, 9};
  m.lives.push_back({0, 9, {1, 8}, 2 * kMB, true});  // B
  m.lives[1].bytes = 6 * kMB;
  CHECK(lower_bound_ms(m, duration, 8 * kMB, rate, rate) == Approx(10.0));
  // 4 MB over: both go. Out: B 2-4 ms, A 5-7; call 5 runs 7-8. Back, from the end backwards: A's
  // bytes are due 1 ms before the end, B's 2 ms: the lane needs 5 ms after call 5. 8 + 5 = 13 ms.
  m.lives[1].bytes = 8 * kMB;
  CHECK(lower_bound_ms(m, duration, 8 * kMB, rate, rate) == Approx(13.0));
}

// Note [The lower bound], and prefetches scheduled on one lane: on the shipped ResNet-50 iteration
// (GPU times from the H100, its measured link), vcudnn's plan at every budget from 90% to 40% of
// the peak fits, its predicted step is at least the lower bound and within 1.15x of it, and no
// other policy's is shorter. (Prefetches placed each alone, as before the lane, predicted 44.0,
// 63.7, 81.4 and 100.9 ms at 90-60%; on the lane 39.4, 52.8, 75.1 and 95.7.)
TEST_CASE("offload plan: vcudnn within 1.15x of the lower bound on the shipped trace, faster than the other policies",
          "[offload_plan]") {
  const Shipped shipped = shipped_resnet50();
  const auto& [t, l, m, none, peak] = shipped;
  REQUIRE(t.link.has_value());
  const LinkModel link{t.link->device_to_host, t.link->host_to_device, t.link->both};
  const auto timeline = [&](const Trace& trace, uint64_t budget, OffloadPolicy policy) {
    auto plan = plan_offload(trace, l, budget, policy, {}, link);
    REQUIRE(plan.ok());
    CHECK(check_plan(m, plan.value()) == "");
    schedule_prefetches(t, m, plan.value(), link);
    CHECK(check_plan(m, plan.value()) == "");
    return std::pair(plan.value(), time_plan(t, m, plan.value(), link));
  };
  for (int percent : {90, 80, 70, 60, 50, 40}) {
    INFO(percent << "% of the peak");
    const uint64_t budget = peak * static_cast<uint64_t>(percent) / 100;
    const auto [mine, time] = timeline(t, budget, OffloadPolicy::kVcudnn);
    CHECK(mine.fits);
    CHECK(time.step_ms >= time.lower_bound_ms);
    CHECK(time.step_ms <= 1.15 * time.lower_bound_ms);
    for (OffloadPolicy other : {OffloadPolicy::kVdnnAll, OffloadPolicy::kVdnnConv, OffloadPolicy::kModnn}) {
      INFO(offload_policy_name(other));
      const PlanTimeline theirs = timeline(t, budget, other).second;
      CHECK(time.step_ms <= theirs.step_ms);
      CHECK(theirs.step_ms >= time.lower_bound_ms);  // a bound for every plan, not only vcudnn's
    }
    // The bound holds the excess at every call: out before it, back after it, never both at once.
    double excess = 0;
    for (uint64_t v : none) excess = std::max(excess, v > budget ? static_cast<double>(v - budget) : 0.0);
    CHECK(time.lower_bound_ms >=
          excess / (link.device_to_host_gbps * 1e6) + excess / (link.host_to_device_gbps * 1e6) - 1e-9);
  }
  // At 90%: the copies back on time, at most a call's wait for room.
  const auto [plan, time] = timeline(t, peak * 9 / 10, OffloadPolicy::kVcudnn);
  CHECK(time.late_prefetches == 0);
  CHECK(time.step_ms <= 1.02 * time.compute_ms);
}

// Note [Workspaces that decide the budget]: the largest convolution workspace of the shipped
// iterations (found as the accessed buffer at the convolution's workspace pointer; the graph API's
// calls pass no workspace size), and the advice only where it is a tenth of the budget or more.
TEST_CASE("offload plan: the largest convolution workspace, and when micro-batching is worth saying",
          "[offload_plan]") {
  auto vgg = read_trace(test::source_dir() + "/tests/data/vgg16_b64_trace.json");
  auto resnet = read_trace(test::source_dir() + "/tests/data/resnet50_b64_trace.json");
  REQUIRE(vgg.ok());
  REQUIRE(resnet.ok());
  const ConvWorkspace v = largest_conv_workspace(vgg.value());
  CHECK(v.bytes == 1646379687);  // conv1_1's backward filter, 1570.1 MiB
  CHECK(v.seq == 1584);
  const ConvWorkspace r = largest_conv_workspace(resnet.value());
  CHECK(r.bytes / (1 << 20) == 302);
  CHECK(r.seq == 6933);
  // The VGG iteration at the runtime's 90 % target: said, naming the policy and the call.
  const std::string said = workspace_advice(v, 5395ull << 20);
  CHECK(said.find("1570.1 MiB (call 1584, 29% of the budget)") != std::string::npos);
  CHECK(said.find("VCUDNN_POLICY=microbatch+offload") != std::string::npos);
  CHECK(workspace_advice(v, v.bytes * 10) != "");
  CHECK(workspace_advice(v, v.bytes * 10 + 10) == "");
  // ResNet-50 b64's 302 MiB against a 90 % budget (about 4.9 GiB): not worth saying.
  CHECK(workspace_advice(r, 4900ull << 20) == "");
  CHECK(workspace_advice({}, 1) == "");
  // Outside the iteration nothing counts.
  Trace none = vgg.value();
  none.first_seq = none.end_seq;
  CHECK(largest_conv_workspace(none).bytes == 0);
}

// `vcudnn plan --workspace-limit`: the shipped VGG-16 iteration as if micro-batching held every
// convolution workspace to 512 MiB. Its least budget (4031.5 MiB, from 4819.5) is what the H100
// measured for the iteration recorded under microbatch+offload at that limit (2026-11-25); the
// advice is then silent (no workspace is a tenth of the budget), and a percentage is refused.
TEST_CASE("vcudnn plan --workspace-limit: the iteration with its convolution workspaces bounded",
          "[offload_plan][cli]") {
  const std::string cli = test::exe_dir() + "/vcudnn";
  const std::string vgg = test::source_dir() + "/tests/data/vgg16_b64_trace.json";
  const auto plain = test::run_process({cli, "plan", vgg, "--budget", "5395M", "--policy", "vcudnn"}, {});
  INFO(plain.out << plain.err);
  CHECK(plain.exit_code == 0);
  CHECK_THAT(plain.out, Catch::Contains("least budget any plan needs: 4819.5 MiB"));
  CHECK_THAT(plain.out, Catch::Contains("convolution workspaces reach 1570.1 MiB"));
  const auto bounded =
      test::run_process({cli, "plan", vgg, "--budget", "5395M", "--policy", "vcudnn", "--workspace-limit", "512M"}, {});
  INFO(bounded.out << bounded.err);
  CHECK(bounded.exit_code == 0);
  CHECK_THAT(bounded.out, Catch::Contains("workspace limit 512.0 MiB: 8 convolution workspaces bounded (the largest "
                                          "by 1058.1 MiB)"));
  CHECK_THAT(bounded.out, Catch::Contains("least budget any plan needs: 4031.5 MiB"));
  CHECK_THAT(bounded.out, !Catch::Contains("convolution workspaces reach"));
  // Below the bounded least budget, as below any least budget: refused, naming it.
  const auto below =
      test::run_process({cli, "plan", vgg, "--budget", "4000M", "--policy", "vcudnn", "--workspace-limit", "512M"}, {});
  CHECK(below.exit_code == 3);
  const auto pct = test::run_process({cli, "plan", vgg, "--workspace-limit", "5%"}, {});
  CHECK(pct.exit_code == 2);
  CHECK_THAT(pct.err, Catch::Contains("--workspace-limit 5%"));
}
