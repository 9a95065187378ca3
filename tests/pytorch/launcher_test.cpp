// [pytorch][launcher] `vcudnn run --policy offload --budget B -- python train_offload.py` trains
// resnet18 with losses bit-identical to the same script without vcudnn, where B is 60% of the plain
// run's peak of live memory: the launcher alone (no LD_PRELOAD or PYTORCH_CUDA_ALLOC_CONF from the
// test) must preload vcudnn, switch PyTorch to cudaMallocAsync and pass the budget, so that vcudnn
// evicts.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

constexpr int kSteps = 4;
constexpr int kBatch = 32;  // as offload_test.cpp: layer1's activations are 24.5 MiB each

struct Run {
  ProcessResult proc;
  nlohmann::json result;  // null when the worker failed
};

std::vector<std::string> worker(const std::string& json_path) {
  return {python_executable(),
          source_dir() + "/tests/pytorch/train_offload.py",
          "--model",
          "resnet18",
          "--batch",
          std::to_string(kBatch),
          "--steps",
          std::to_string(kSteps),
          "--seed",
          "0",
          "--json",
          json_path};
}

Run finish(ProcessResult proc, const std::string& json_path) {
  Run r{std::move(proc), nullptr};
  if (r.proc.exit_code == 0) {
    auto parsed = nlohmann::json::parse(read_file(json_path), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) r.result = std::move(parsed);
  }
  return r;
}

// Neither run inherits a preload or allocator setting (run_process drops VCUDNN_* itself).
std::map<std::string, std::optional<std::string>> base_env() {
  return {{"LD_PRELOAD", std::nullopt},
          {"PYTORCH_CUDA_ALLOC_CONF", std::nullopt},
          {"PYTORCH_ALLOC_CONF", std::nullopt},
          {"TORCH_CUDNN_V8_API_DISABLED", std::nullopt},
          {"PYTHONUNBUFFERED", "1"}};
}

std::string describe(const Run& r) {
  return "exit " + std::to_string(r.proc.exit_code) + "\n--- stdout\n" + r.proc.out + "--- stderr\n" + r.proc.err;
}

}  // namespace

TEST_CASE("vcudnn run --policy offload --budget 60% of the peak: resnet18 bit-identical, evicting",
          "[pytorch][launcher]") {
  TempDir tmp;
  // The plain run uses the allocator `vcudnn run` selects, so that both runs make the same kernels
  // see the same bytes (see offload_test.cpp on why bitwise is the bar).
  auto env = base_env();
  env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync";
  const Run plain = finish(run_process(worker(tmp.file("plain.json")), env, 600), tmp.file("plain.json"));
  INFO("plain: " << describe(plain));
  REQUIRE(plain.result.is_object());
  REQUIRE(plain.result.at("vcudnn").is_null());
  REQUIRE(plain.result.at("max_memory_allocated").is_number());
  const uint64_t peak = plain.result.at("max_memory_allocated").get<uint64_t>();
  const uint64_t budget = peak * 3 / 5;

  std::vector<std::string> argv{exe_dir() + "/vcudnn",
                                "run",
                                "--policy",
                                "offload",
                                "--budget",
                                std::to_string(budget),
                                "--log-level",
                                "info",
                                "--log-file",
                                tmp.file("vcudnn.log"),
                                "--"};
  const auto cmd = worker(tmp.file("run.json"));
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  const Run launched = finish(run_process(argv, base_env(), 600), tmp.file("run.json"));
  const std::string log = read_file(tmp.file("vcudnn.log"));
  INFO("vcudnn run: " << describe(launched) << "--- vcudnn log\n" << log);
  REQUIRE(launched.result.is_object());
  CHECK(launched.proc.err.find("vcudnn run: LD_PRELOAD=" + libvcudnn_path()) != std::string::npos);
  CHECK(launched.result.at("allocator_backend") == "cudaMallocAsync");  // set by the launcher alone
  REQUIRE(launched.result.at("vcudnn").is_object());                    // preloaded: vcudnnGetMemoryStats answered
  CHECK(launched.result.at("vcudnn").at("budgetBytes").get<uint64_t>() <= budget);
  CHECK(launched.result.at("losses") == plain.result.at("losses"));
  const auto exit_lines = grep(log, "exit: ");
  REQUIRE(exit_lines.size() == 1);
  REQUIRE(exit_lines[0].find("; memory: ") != std::string::npos);
  CHECK(counter_value(exit_lines[0], "evictions") > 0);
}
