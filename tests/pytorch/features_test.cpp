// [pytorch] The features together, as users run them (issue "One runtime whose features compose"):
//  - cudnn.benchmark=True under memory ownership and under a 60% budget (its search frees
//    workspaces of up to the whole card; vcudnn once kept them all and the job died of OOM);
//  - micro-batching and memory ownership in one process on the legacy cuDNN path, the
//    micro-batching workspace inside the device budget.
#include <catch2/catch.hpp>

#include <optional>

#include "tests/common/test_util.h"
#include "tests/pytorch/train_run.h"

using namespace vcudnn::test;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

void require_trained(const TrainRun& r, size_t steps) {
  INFO(r.describe());
  REQUIRE(r.ok());
  REQUIRE(r.losses().size() == steps);
  CHECK(r.result.at("finite").get<bool>());
  CHECK(r.result.at("allocator_backend") == "cudaMallocAsync");
}

void require_owned(const TrainRun& r) {
  INFO(r.describe());
  REQUIRE(r.result.at("vcudnn").is_object());
  CHECK(r.stat("active") == 1);
  CHECK(r.stat("allocations") > 0);
}

}  // namespace

TEST_CASE("cudnn.benchmark=True: mobilenet_v3_small trains owned and under a 60% budget", "[pytorch][offload][features]") {
  TempDir tmp;
  const TrainSpec spec{"mobilenet_v3_small", 32, 5, {"--benchmark", "--classes", "1000"}, {}};
  const TrainRun alone = train_model(spec, "alone", tmp);
  require_trained(alone, 5);
  // The search picks algorithms by timing (one sample each), so runs may differ: within 10x PyTorch
  // alone's own spread, and at least 1e-4 relative (fp32 without TF32 over 5 steps: the
  // reassociation of another algorithm). Two runs of PyTorch alone may agree bit for bit and a run
  // under vcudnn still pick other algorithms: vcudnn changes the timings the search sees (its
  // tracking, VMM-mapped memory). That is reported, not failed; bitwise equality under ownership
  // and eviction is checked where the algorithms are fixed (offload_test.cpp).
  std::optional<TrainRun> again;
  const auto same_losses = [&](const TrainRun& r) {
    if (r.result.at("losses") == alone.result.at("losses")) return true;
    if (!again) {
      again = train_model(spec, "again", tmp);
      require_trained(*again, 5);
      WARN("PyTorch alone, run to run: " << max_gap(alone.losses(), again->losses()));
    }
    const double gap = max_gap(alone.losses(), r.losses());
    if (again->result.at("losses") == alone.result.at("losses"))
      WARN("PyTorch alone agreed bit for bit run to run; under vcudnn the losses differ by " << gap
                                                                                            << " (other algorithms chosen)");
    return gap <= std::max(1e-4, 10 * max_gap(alone.losses(), again->losses()));
  };
  const uint64_t steady_reserved = alone.result.at("steady_max_memory_reserved").get<uint64_t>();
  const uint64_t steady_live = alone.result.at("steady_max_memory_allocated").get<uint64_t>();
  WARN("PyTorch alone: first step reserved " << alone.result.at("max_memory_reserved").get<double>() / kMiB
                                             << " MiB (the search), then " << steady_reserved / kMiB << " MiB reserved, "
                                             << steady_live / kMiB << " MiB live");

  const TrainRun owned = train_model(spec, "owned", tmp, {{{"VCUDNN_POLICY", "offload"}}});
  require_trained(owned, 5);
  require_owned(owned);
  {
    INFO(owned.describe());
    WARN("owned: " << owned.exit_line());
    CHECK(same_losses(owned));
    // The search's freed workspaces are reused and given back, not hoarded: the steady state maps
    // no more than 1.15x what PyTorch's own pool reserves.
    CHECK(owned.stat("peakMappedBytes") <= 1.15 * steady_reserved);
    CHECK(owned.stat("evictions") == 0);
  }

  const uint64_t budget = steady_live * 3 / 5;
  const TrainRun tight =
      train_model(spec, "budget60", tmp, {{{"VCUDNN_POLICY", "offload"}, {"VCUDNN_DEVICE_BUDGET", std::to_string(budget)}}});
  require_trained(tight, 5);
  require_owned(tight);
  INFO(tight.describe());
  WARN("budget " << budget / kMiB << " MiB: " << tight.exit_line());
  CHECK(tight.stat("evictions") > 0);
  CHECK(tight.peak_mapped() <= budget);
  CHECK(same_losses(tight));
}

TEST_CASE("micro-batching and memory ownership together train resnet50 on the legacy path within the budget",
          "[pytorch][offload][microbatch][features]") {
  TempDir tmp;
  TrainSpec spec{"resnet50", 32, 4, {"--classes", "1000"}, {{"TORCH_CUDNN_V8_API_DISABLED", "1"}}};
  const TrainRun alone = train_model(spec, "alone", tmp);
  require_trained(alone, 4);
  const uint64_t live = std::max(alone.result.at("max_memory_allocated").get<uint64_t>(),
                                 alone.result.at("steady_max_memory_allocated").get<uint64_t>());
  const uint64_t budget = live * 3 / 5;
  const TrainRun both = train_model(spec, "both", tmp,
                                    {{{"VCUDNN_POLICY", "microbatch+offload"},
                                      {"VCUDNN_WORKSPACE_LIMIT", "64M"},
                                      {"VCUDNN_CACHE", tmp.file("bench.sqlite")},
                                      {"VCUDNN_DEVICE_BUDGET", std::to_string(budget)}}});
  require_trained(both, 4);
  require_owned(both);
  INFO(both.describe());
  const std::string exit = both.exit_line();
  WARN("budget " << budget / kMiB << " MiB (60% of PyTorch's live peak " << live / kMiB << " MiB): " << exit);
  // Both features ran: kernels planned and executed as micro-batches, buffers evicted.
  CHECK(counter_value(exit, "plans") > 0);
  CHECK(counter_value(exit, "executed") > 0);
  CHECK(counter_value(exit, "passthrough") == 0);
  CHECK(counter_value(exit, "stream_peak") <= 64ll << 20);
  CHECK(exit.find("; memory: ") != std::string::npos);
  CHECK(both.stat("evictions") > 0);
  // The budget held, micro-batching workspaces included (they come from the arena).
  CHECK(both.peak_mapped() <= budget);
  // fp32 without TF32: the first loss (forward only, same weights) differs by reassociation only;
  // later ones follow different summation orders through SGD (see pytorch_test.cpp's micro-batching
  // test for the measured drift).
  const auto a = alone.losses();
  const auto b = both.losses();
  CHECK(relative_gap(a[0], b[0]) <= 1e-5);
  CHECK(max_gap(a, b) <= 0.1);
}
