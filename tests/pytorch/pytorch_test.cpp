// [pytorch] An unmodified PyTorch on cuDNN's legacy API (TORCH_CUDNN_V8_API_DISABLED=1) trains
// resnet18 under LD_PRELOAD=libvcudnn.so: losses bit-identical to PyTorch alone, the exit summary
// counts the convolutions, the trace holds one complete, timed iteration, also when PyTorch
// searches algorithms (cudnn.benchmark=True) during the first iteration.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>

#include "planner/trace.h"
#include "tests/common/test_util.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

constexpr int kIters = 5;
// resnet18: 20 convolutions (17 in the blocks and stem, 3 downsample); the stem's input needs no
// gradient, so 19 backward-data.
constexpr int kFwd = 20, kBwdData = 19, kBwdFilter = 20;

struct Run {
  ProcessResult proc;
  nlohmann::json result;
  std::string log;
};

Run train(bool preload, bool benchmark, const TempDir& tmp, const std::string& tag) {
  std::map<std::string, std::optional<std::string>> env{{"TORCH_CUDNN_V8_API_DISABLED", "1"},
                                                        {"LD_PRELOAD", std::nullopt},
                                                        {"VCUDNN_POLICY", std::nullopt},
                                                        {"VCUDNN_TRACE", std::nullopt},
                                                        {"VCUDNN_LOG_FILE", std::nullopt},
                                                        {"VCUDNN_LOG_LEVEL", std::nullopt},
                                                        {"PYTHONUNBUFFERED", "1"}};
  if (preload) {
    env["LD_PRELOAD"] = libvcudnn_path();
    env["VCUDNN_TRACE"] = tmp.file(tag + ".json");
    env["VCUDNN_LOG_FILE"] = tmp.file(tag + ".log");
  }
  std::vector<std::string> argv{python_executable(), source_dir() + "/tests/pytorch/train_resnet18.py", "--iters",
                                std::to_string(kIters)};
  if (benchmark) argv.push_back("--benchmark");
  Run r;
  r.proc = run_process(argv, env, 600);
  if (preload) r.log = read_file(tmp.file(tag + ".log"));
  auto lines = grep(r.proc.out, "\"losses\"");
  if (r.proc.exit_code == 0 && !lines.empty()) r.result = nlohmann::json::parse(lines.back());
  return r;
}

void check_trace(const std::string& path, bool expect_find_ex) {
  auto r = read_trace(path);
  REQUIRE(r.ok());
  const Trace& t = r.value();
  CHECK(t.complete);
  CHECK(t.detected_by == "auto");
  CHECK(t.first_seq == 0);  // iteration 1, whose algorithm searches come before its convolutions
  std::map<ConvKind, int> convs;
  int ws_queries = 0, find_ex = 0, untimed = 0;
  for (const auto& c : t.calls) {
    if (c.kind == CallKind::kGetWorkspaceSize) ++ws_queries;
    if (c.kind == CallKind::kFindAlgorithmEx) ++find_ex;
    if (c.kind != CallKind::kConvolution) continue;
    ++convs[c.conv];
    CHECK(c.layer >= 0);
    if (!c.gpu_ms || *c.gpu_ms <= 0) ++untimed;
  }
  CHECK(convs[ConvKind::kForward] == kFwd);
  CHECK(convs[ConvKind::kBackwardData] == kBwdData);
  CHECK(convs[ConvKind::kBackwardFilter] == kBwdFilter);
  CHECK(untimed == 0);
  // resnet18 has 11 distinct convolution shapes; each is one layer for all three kinds.
  CHECK(t.layers.size() == 11);
  CHECK(t.threads.size() == 2);  // forward on the Python thread, backward on autograd's
  // Without cudnn.benchmark PyTorch queries the workspace size before every convolution; with it,
  // it searches (FindEx) each of the 11 shapes during iteration 1 instead.
  if (expect_find_ex) {
    CHECK(find_ex >= 11);
  } else {
    CHECK(find_ex == 0);
    CHECK(ws_queries >= kFwd + kBwdData + kBwdFilter);
  }
  auto cli = run_process({exe_dir() + "/vcudnn", "trace", path, "--require-complete"});
  INFO(cli.out << cli.err);
  CHECK(cli.exit_code == 0);
}

void check_summary(const std::string& log) {
  auto lines = grep(log, "exit: ");
  REQUIRE(lines.size() == 1);
  CHECK(counter_value(lines[0], "conv_fwd") == kFwd * kIters);
  CHECK(counter_value(lines[0], "conv_bwd_data") == kBwdData * kIters);
  CHECK(counter_value(lines[0], "conv_bwd_filter") == kBwdFilter * kIters);
  CHECK(counter_value(lines[0], "set_stream") > 0);
}

}  // namespace

TEST_CASE("resnet18 on the legacy path: identical losses with and without vcudnn", "[pytorch]") {
  TempDir tmp;
  Run alone = train(false, false, tmp, "alone");
  INFO(alone.proc.out << alone.proc.err);
  REQUIRE(alone.proc.exit_code == 0);
  REQUIRE(alone.result.at("legacy_api").get<bool>());
  Run with = train(true, false, tmp, "with");
  INFO(with.proc.out << with.proc.err << with.log);
  REQUIRE(with.proc.exit_code == 0);
  REQUIRE(alone.result.at("losses").size() == kIters);
  CHECK(with.result.at("losses") == alone.result.at("losses"));  // bit for bit
  check_summary(with.log);
  check_trace(tmp.file("with.json"), false);
}

TEST_CASE("resnet18 with cudnn.benchmark: first-iteration search, complete trace", "[pytorch]") {
  TempDir tmp;
  Run alone = train(false, true, tmp, "alone");
  INFO(alone.proc.out << alone.proc.err);
  REQUIRE(alone.proc.exit_code == 0);
  Run with = train(true, true, tmp, "bench");
  INFO(with.proc.out << with.proc.err << with.log);
  REQUIRE(with.proc.exit_code == 0);
  // The search picks algorithms by timing, so two runs (with or without vcudnn) may use different
  // ones, and SGD amplifies the difference step by step. The first loss comes from the same
  // weights and data: it agrees to TF32 reassociation (cuDNN's default for fp32 convolutions in
  // PyTorch, 10-bit mantissa), 1e-3 relative. Later losses only need to be finite and falling.
  const auto a = alone.result.at("loss_values").get<std::vector<double>>();
  const auto b = with.result.at("loss_values").get<std::vector<double>>();
  REQUIRE(a.size() == b.size());
  CHECK(std::abs(a[0] - b[0]) <= 1e-3 * std::abs(a[0]));
  for (double v : b) CHECK(std::isfinite(v));
  CHECK(b.back() < 0.5 * b.front());
  check_summary(with.log);
  check_trace(tmp.file("bench.json"), true);
}
