// Iteration detection on sequences recorded from real PyTorch runs (resnet18, legacy cuDNN API,
// recorded by vcudnn on the GPU machine; tests/data/). Each trace holds iteration 1 as PyTorch
// made it; the test replays it, followed by three steady-state iterations (the same calls minus
// the first iteration's algorithm searches), and expects exactly the recorded span back.
#include <catch2/catch.hpp>

#include "planner/trace.h"
#include "runtime/iteration_detector.h"
#include "tests/common/test_util.h"

using namespace vcudnn;

namespace {

struct Replay {
  std::optional<DetectedIteration> found;
  uint64_t found_at = 0;
};

Replay replay(const Trace& t, int iterations) {
  IterationDetector d;
  Replay r;
  uint64_t seq = 0;
  for (int it = 0; it < iterations && !r.found; ++it) {
    for (const auto& c : t.calls) {
      const bool search = c.kind == CallKind::kFindAlgorithmEx || c.kind == CallKind::kFindAlgorithm ||
                          c.kind == CallKind::kGetAlgorithmV7 || c.kind == CallKind::kGetAlgorithmMaxCount;
      if (it > 0 && search) continue;
      const ExecItem item{c.conv, c.layer};
      const bool exec = c.kind == CallKind::kConvolution;
      if (auto f = d.on_call(seq++, exec ? &item : nullptr)) {
        r.found = f;
        r.found_at = seq - 1;
        break;
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("recorded PyTorch iterations are found exactly", "[iteration][recorded]") {
  for (const char* name : {"resnet18_legacy_trace.json", "resnet18_benchmark_trace.json"}) {
    INFO(name);
    auto r = read_trace(vcudnn::test::source_dir() + "/tests/data/" + name);
    REQUIRE(r.ok());
    const Trace& t = r.value();
    REQUIRE(t.complete);
    size_t convs = 0, searches = 0;
    for (const auto& c : t.calls) {
      convs += c.kind == CallKind::kConvolution;
      searches += c.kind == CallKind::kFindAlgorithmEx;
    }
    CHECK(convs == 59);
    if (std::string(name).find("benchmark") != std::string::npos) CHECK(searches > 0);
    REQUIRE(t.calls.back().kind == CallKind::kConvolution);

    auto rep = replay(t, 4);
    REQUIRE(rep.found.has_value());
    CHECK(rep.found->how == "auto");
    CHECK(rep.found->first_seq == 0);
    CHECK(rep.found->end_seq == t.calls.size());  // iteration 1, searches included
    CHECK(rep.found->convolutions == 59);
    // Found at the first forward convolution of iteration 3.
    CHECK(rep.found_at > 2 * convs);

    // Two iterations only: found at exit.
    IterationDetector d;
    uint64_t seq = 0;
    std::optional<DetectedIteration> early;
    for (int it = 0; it < 2; ++it)
      for (const auto& c : t.calls) {
        const ExecItem item{c.conv, c.layer};
        if (auto f = d.on_call(seq++, c.kind == CallKind::kConvolution ? &item : nullptr)) early = f;
      }
    CHECK_FALSE(early.has_value());
    auto at_end = d.on_end();
    REQUIRE(at_end.has_value());
    CHECK(at_end->end_seq == t.calls.size());
  }
}
