// Buffer lifetimes and the live-bytes curve (planner/lifetimes.h) of a hand-made iteration whose
// answers are known: a parameter that existed before, two activations kept from forward to
// backward, a gradient allocated and freed in the backward pass.
#include "planner/lifetimes.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "planner/offload_plan.h"
#include "tests/common/test_util.h"
#include "tests/cpu/trace_builder.h"

using namespace vcudnn;

namespace {

constexpr uint64_t kMiB = 1 << 20;

using Builder = test::TraceBuilder;

}  // namespace

TEST_CASE("lifetimes: uses, the live-bytes curve, its peak and what crosses from forward to backward", "[lifetimes]") {
  Builder b;
  const uint32_t param = b.buffer(1 * kMiB), act1 = b.buffer(4 * kMiB), act2 = b.buffer(2 * kMiB),
                 grad = b.buffer(3 * kMiB);
  using M = AccessMode;
  const uint64_t a1 = b.add(CallKind::kAlloc, static_cast<int32_t>(act1));
  const uint64_t f1 = b.add(CallKind::kConvolution, -1, {{param, M::kRead}, {act1, M::kWrite}});
  const uint64_t a2 = b.add(CallKind::kAlloc, static_cast<int32_t>(act2));
  const uint64_t f2 = b.add(CallKind::kLaunch, -1, {{act1, M::kUnknown}, {act2, M::kUnknown}});
  const uint64_t f3 = b.add(CallKind::kConvolution, -1, {{act2, M::kRead}}, ConvKind::kForward);
  const uint64_t g = b.add(CallKind::kAlloc, static_cast<int32_t>(grad));
  const uint64_t turn =
      b.add(CallKind::kConvolution, -1, {{act2, M::kRead}, {grad, M::kWrite}}, ConvKind::kBackwardData);
  const uint64_t free2 = b.add(CallKind::kFree, static_cast<int32_t>(act2));
  const uint64_t bw = b.add(CallKind::kConvolution, -1, {{act1, M::kRead}, {grad, M::kRead}, {param, M::kRead}},
                            ConvKind::kBackwardFilter);
  const uint64_t free1 = b.add(CallKind::kFree, static_cast<int32_t>(act1));
  const uint64_t freeg = b.add(CallKind::kFree, static_cast<int32_t>(grad));
  b.t.complete = true;
  b.t.first_seq = a1;
  b.t.end_seq = b.seq;
  // The trace is valid by the reader's rules.
  REQUIRE(parse_trace(nlohmann::json(b.t).dump()).ok());

  const Lifetimes l = lifetimes(b.t);
  CHECK(l.first_seq == a1);
  CHECK(l.end_seq == freeg + 1);
  CHECK(l.existing_bytes == 1 * kMiB);
  CHECK(l.allocated_bytes == 9 * kMiB);
  CHECK(l.peak_bytes == 10 * kMiB);  // param + act1 + act2 + grad at the gradient's allocation
  CHECK(l.peak_seq == g);
  // What holds it, largest first: act1 (4), grad (3), act2 (2), param (1).
  std::vector<uint32_t> holders;
  for (size_t i : l.at_peak) holders.push_back(l.buffers[i].buffer);
  CHECK(holders == std::vector<uint32_t>{act1, grad, act2, param});
  REQUIRE(l.turn_seq);
  CHECK(*l.turn_seq == turn);
  CHECK(l.alive_across_turn == 10 * kMiB);  // the gradient was allocated just before the turn
  // The least budget: the backward-filter convolution needs act1, grad and param at once.
  CHECK(l.least_bytes == (4 + 3 + 1) * kMiB);
  CHECK(l.least_seq == bw);
  REQUIRE(l.curve.size() == b.t.calls.size());
  const std::vector<uint64_t> live = {5, 5, 7, 7, 7, 10, 10, 8, 8, 4, 1};
  for (size_t i = 0; i < live.size(); ++i) {
    INFO("call " << l.curve[i].seq);
    CHECK(l.curve[i].live_bytes == live[i] * kMiB);
  }
  REQUIRE(l.buffers.size() == 4);
  const auto of = [&](uint32_t buffer) -> const BufferLife& {
    for (const BufferLife& x : l.buffers)
      if (x.buffer == buffer) return x;
    FAIL("no life for buffer " << buffer);
    return l.buffers.front();
  };
  CHECK_FALSE(of(param).alloc_seq);
  CHECK_FALSE(of(param).free_seq);
  CHECK(of(param).uses == std::vector<uint64_t>{f1, bw});
  CHECK(of(act1).alloc_seq == a1);
  CHECK(of(act1).free_seq == free1);
  CHECK(of(act1).uses == std::vector<uint64_t>{f1, f2, bw});
  CHECK(of(act2).alloc_seq == a2);
  CHECK(of(act2).uses == std::vector<uint64_t>{f2, f3, turn});
  CHECK(of(act2).free_seq == free2);
  CHECK(of(grad).uses == std::vector<uint64_t>{turn, bw});

  // A span that starts after act1 and act2 were allocated: they count as existing there.
  const Lifetimes tail = lifetimes(b.t, f2, b.seq);
  CHECK(tail.existing_bytes == (1 + 4 + 2) * kMiB);
  CHECK(tail.allocated_bytes == 3 * kMiB);
  CHECK(tail.peak_bytes == 10 * kMiB);
}

// Trace::alive_at_start: bytes alive that no call of the iteration names (a library's workspace set
// once) are on the device throughout: in the peak, the curve, the least budget and the planner's model.
TEST_CASE("lifetimes: bytes alive but used by no call count everywhere, in the iteration's span only",
          "[lifetimes][offload]") {
  Builder b;
  const uint32_t param = b.buffer(1 * kMiB), act = b.buffer(4 * kMiB);
  using M = AccessMode;
  const uint64_t a = b.add(CallKind::kAlloc, static_cast<int32_t>(act));
  b.add(CallKind::kConvolution, -1, {{param, M::kRead}, {act, M::kWrite}});
  const uint64_t bw =
      b.add(CallKind::kConvolution, -1, {{param, M::kRead}, {act, M::kRead}}, ConvKind::kBackwardFilter);
  b.add(CallKind::kFree, static_cast<int32_t>(act));
  b.t.complete = true;
  b.t.first_seq = a;
  b.t.end_seq = b.seq;
  const Lifetimes before = lifetimes(b.t);
  CHECK(before.untouched_bytes == 0);
  CHECK(before.peak_bytes == 5 * kMiB);
  b.t.alive_at_start = 1 * kMiB + 6 * kMiB;  // the parameter, and 6 MiB no call uses
  REQUIRE(parse_trace(nlohmann::json(b.t).dump()).ok());
  const Lifetimes l = lifetimes(b.t);
  CHECK(l.existing_bytes == 1 * kMiB);
  CHECK(l.untouched_bytes == 6 * kMiB);
  CHECK(l.peak_bytes == 11 * kMiB);
  CHECK(l.least_bytes == 11 * kMiB);  // the convolutions' buffers, and what stays regardless
  CHECK(l.least_seq <= bw);
  const std::vector<uint64_t> live = {11, 11, 11, 7};
  REQUIRE(l.curve.size() == live.size());
  for (size_t i = 0; i < live.size(); ++i) CHECK(l.curve[i].live_bytes == live[i] * kMiB);
  // The planner's model holds it as fixed: no plan can go below it.
  const SpanModel m = span_model(b.t, l);
  CHECK(m.fixed_bytes == 6 * kMiB);
  const std::vector<uint64_t> sim = simulate(m, {});
  CHECK(*std::max_element(sim.begin(), sim.end()) == 11 * kMiB);
  CHECK(offload_bound(m).least_bytes == 11 * kMiB);
  const auto too_small = plan_offload(b.t, l, 10 * kMiB, OffloadPolicy::kVcudnn);
  REQUIRE_FALSE(too_small.ok());
  CHECK_THAT(too_small.error().message, Catch::Contains("6.0 MiB alive that no call of the iteration uses"));
  // Counted only when the span is the trace's iteration (the figure is the bytes alive at its start).
  CHECK(lifetimes(b.t, a + 1, b.seq).untouched_bytes == 0);
  // Fewer bytes alive than the calls name (a recording that began late): nothing added.
  b.t.alive_at_start = 0;
  CHECK(lifetimes(b.t).untouched_bytes == 0);
}

TEST_CASE("lifetimes: a trace without buffers (schema 1 content) gives an empty curve of zeros", "[lifetimes]") {
  Builder b;
  b.add(CallKind::kConvolution);
  b.add(CallKind::kConvolution, -1, {}, ConvKind::kBackwardData);
  const Lifetimes l = lifetimes(b.t);  // incomplete: every call
  CHECK(l.buffers.empty());
  CHECK(l.peak_bytes == 0);
  CHECK(l.curve.size() == 2);
  CHECK(l.turn_seq == std::optional<uint64_t>(101));
  CHECK(l.alive_across_turn == 0);
}

// `vcudnn trace` prints the memory summary of a schema-2 trace, and refuses a schema-1 one.
TEST_CASE("vcudnn trace: live peak and the bytes across the turn, from the command line", "[lifetimes][cli]") {
  Builder b;
  const uint32_t act = b.buffer(3 * kMiB), grad = b.buffer(kMiB);
  b.add(CallKind::kAlloc, static_cast<int32_t>(act));
  b.add(CallKind::kConvolution, -1, {{act, AccessMode::kWrite}});
  b.add(CallKind::kAlloc, static_cast<int32_t>(grad));
  const uint64_t turn = b.add(CallKind::kConvolution, -1, {{act, AccessMode::kRead}, {grad, AccessMode::kWrite}},
                              ConvKind::kBackwardData);
  b.add(CallKind::kFree, static_cast<int32_t>(act));
  b.t.link = LinkBandwidth{50, 52, 75};
  b.t.calls[1].gpu_ms = 0.25f;
  b.t.gpu_times = "next";
  b.t.next_timed = 1;
  test::TempDir tmp;
  const std::string path = tmp.file("t.json");
  REQUIRE(write_trace(b.t, path).ok());
  const auto r = test::run_process({test::exe_dir() + "/vcudnn", "trace", path}, {});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains(
                        "2 buffers; 0.0 MiB alive at the start, 4.0 MiB allocated; live peak 4.0 MiB at call 102"));
  CHECK_THAT(r.out,
             Catch::Contains("forward to backward at call " + std::to_string(turn) + ": 4.0 MiB alive across it"));
  CHECK_THAT(r.out,
             Catch::Contains("at the peak: 3.0 MiB buffer 1, allocated at call 100, used 2 times, last at call " +
                             std::to_string(turn)));
  CHECK_THAT(r.out, Catch::Contains("least device memory any offload plan needs: 4.0 MiB (call " +
                                    std::to_string(turn) + ":"));
  CHECK_THAT(r.out, Catch::Contains("host link: 50.0 GB/s device to host"));
  CHECK_THAT(r.out, Catch::Contains("GPU times: 1 calls take those of the same operation in the next iteration"));

  auto j = nlohmann::json::parse(test::read_file(path));
  j["schema"] = "vcudnn.trace/1";
  { std::ofstream(path) << j.dump(); }
  const auto old = test::run_process({test::exe_dir() + "/vcudnn", "trace", path}, {});
  CHECK(old.exit_code == 1);
  CHECK_THAT(old.err, Catch::Contains("record it again"));
}

// `vcudnn trace --plot` draws the iteration with scripts/trace_plot.py (matplotlib: scripts/install-deps
// installs it). The PNG is a PNG, and the script names the peak it drew.
TEST_CASE("vcudnn trace --plot draws memory over the iteration", "[lifetimes][cli]") {
  Builder b;
  const uint32_t param = b.buffer(2 * kMiB), act = b.buffer(6 * kMiB), tmp_buf = b.buffer(kMiB);
  b.add(CallKind::kAlloc, static_cast<int32_t>(act));
  b.add(CallKind::kConvolution, -1, {{param, AccessMode::kRead}, {act, AccessMode::kWrite}});
  b.add(CallKind::kAlloc, static_cast<int32_t>(tmp_buf));
  b.add(CallKind::kLaunch, -1, {{tmp_buf, AccessMode::kUnknown}});
  b.add(CallKind::kFree, static_cast<int32_t>(tmp_buf));
  b.add(CallKind::kConvolution, -1, {{act, AccessMode::kRead}, {param, AccessMode::kRead}}, ConvKind::kBackwardFilter);
  b.add(CallKind::kFree, static_cast<int32_t>(act));
  test::TempDir tmp;
  const std::string path = tmp.file("t.json"), png = tmp.file("t.png");
  REQUIRE(write_trace(b.t, path).ok());
  const auto r =
      test::run_process({test::exe_dir() + "/vcudnn", "trace", path, "--plot", png, "--budget", "5000000"}, {});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains(png + ": peak 9.0 MiB at call 102"));  // 2 + 6 + 1 at the temporary
  const std::string bytes = test::read_file(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}
