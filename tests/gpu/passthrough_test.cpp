// [gpu] Pass-through is bitwise identical: the same convolutions (forward, backward-data,
// backward-filter; fp32, fp16 NHWC, bf16, grouped, dilated, 3-D) through plain cuDNN, through the
// preloaded libvcudnn.so and through vcudnn::Handle give identical output hashes, algorithm lists
// and workspace sizes, also with several threads, handles and streams; the recorder's trace of the
// run is complete and timed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "planner/trace.h"
#include "tests/common/test_util.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

constexpr int kLayers = 6;
constexpr int kConvsPerIteration = 3 * kLayers - 1;  // layer 0 has no backward-data

// run_process already drops the caller's VCUDNN_* settings; a preload is given only where asked.
std::map<std::string, std::optional<std::string>> clean_env() { return {{"LD_PRELOAD", std::nullopt}}; }

// The lines that must be equal between runs: outputs, heuristics, algorithms and workspace sizes,
// max counts, search success. Search results themselves depend on timing and are not compared.
std::vector<std::string> comparable(const std::string& out) {
  std::vector<std::string> lines;
  for (const char* prefix : {"out ", "get_v7 ", "algos ", "max_count ", "find ", "done "})
    for (auto& l : grep(out, prefix))
      if (l.rfind(prefix, 0) == 0) lines.push_back(l);
  return lines;
}

ProcessResult run_client(const std::string& exe, const std::vector<std::string>& args,
                         std::map<std::string, std::optional<std::string>> env) {
  auto e = clean_env();
  for (auto& [k, v] : env) e[k] = v;
  std::vector<std::string> argv{exe_dir() + "/" + exe};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, e, 600);
}

void check_outputs_valid(const std::vector<std::string>& lines, int threads) {
  int outs = 0;
  for (const auto& l : lines) {
    if (l.rfind("out ", 0) != 0) continue;
    ++outs;
    INFO(l);
    CHECK(l.find(" nan=0") != std::string::npos);  // every element written, nothing NaN
  }
  CHECK(outs == threads * kConvsPerIteration);
  for (const auto& l : lines)
    if (l.rfind("find ", 0) == 0) CHECK(l.find("ok=1") != std::string::npos);
}

std::string exit_line(const std::string& log) {
  auto lines = grep(log, "exit: ");
  REQUIRE(lines.size() == 1);
  return lines[0];
}

}  // namespace

TEST_CASE("pass-through is bitwise identical: direct, preloaded, wrapped handle", "[gpu]") {
  TempDir tmp;
  const int iters = 4;
  const std::vector<std::string> args{"--threads", "1", "--iters", std::to_string(iters)};
  auto direct = run_client("vcudnn_conv_client", args, {});
  INFO(direct.err);
  REQUIRE(direct.exit_code == 0);
  const auto expected = comparable(direct.out);
  check_outputs_valid(expected, 1);

  auto preload = run_client("vcudnn_conv_client", args,
                            {{"LD_PRELOAD", libvcudnn_path()},
                             {"VCUDNN_TRACE", tmp.file("preload.json")},
                             {"VCUDNN_LOG_FILE", tmp.file("preload.log")}});
  const std::string preload_log = read_file(tmp.file("preload.log"));
  INFO(preload.err << preload_log);
  REQUIRE(preload.exit_code == 0);
  CHECK(comparable(preload.out) == expected);

  std::vector<std::string> wrapped_args = args;
  wrapped_args.push_back("--boundary");
  auto wrapped = run_client("vcudnn_conv_client_wrapped", wrapped_args,
                            {{"VCUDNN_TRACE", tmp.file("wrapped.json")}, {"VCUDNN_LOG_FILE", tmp.file("wrapped.log")}});
  const std::string wrapped_log = read_file(tmp.file("wrapped.log"));
  INFO(wrapped.err << wrapped_log);
  REQUIRE(wrapped.exit_code == 0);
  CHECK(comparable(wrapped.out) == expected);

  {  // the exit summary counts every call
    const std::string line = exit_line(preload_log);
    CHECK(counter_value(line, "conv_fwd") == kLayers * iters);
    CHECK(counter_value(line, "conv_bwd_data") == (kLayers - 1) * iters);
    CHECK(counter_value(line, "conv_bwd_filter") == kLayers * iters);
    CHECK(counter_value(line, "get_algo_v7_fwd") == kLayers);
    CHECK(counter_value(line, "find_algo_ex_bwd_filter") == kLayers);
    CHECK(counter_value(line, "find_algo_fwd") == 1);
    CHECK(counter_value(line, "ws_size_bwd_data") == kLayers);
    CHECK(counter_value(line, "max_count_fwd") == 1);
    CHECK(counter_value(line, "create") == 1);
    CHECK(counter_value(line, "set_stream") == 1);
    const std::string wline = exit_line(wrapped_log);
    CHECK(counter_value(wline, "conv_fwd") == kLayers * iters);
    CHECK(wline.find(" through vcudnnHandle_t") != std::string::npos);
  }

  {  // the preloaded run's trace holds one complete, timed iteration
    auto r = read_trace(tmp.file("preload.json"));
    REQUIRE(r.ok());
    const Trace& t = r.value();
    CHECK(t.complete);
    CHECK(t.detected_by == "auto");
    CHECK(t.layers.size() == kLayers);
    CHECK(t.threads.size() == 1);
    CHECK(t.handles.size() == 1);
    CHECK(t.streams.size() == 2);  // the new handle's default stream (0), then the client's stream
    CHECK(t.first_seq == 0);       // iteration 1, with the algorithm searches that precede it
    std::map<ConvKind, int> convs;
    int searches = 0;
    std::set<int32_t> layers_seen;
    std::set<uint32_t> conv_streams;
    for (const auto& c : t.calls) {
      if (c.kind == CallKind::kFindAlgorithmEx || c.kind == CallKind::kGetAlgorithmV7) ++searches;
      if (c.kind != CallKind::kConvolution) continue;
      ++convs[c.conv];
      INFO("seq " << c.seq);
      CHECK(c.status == 0);
      REQUIRE(c.gpu_ms.has_value());
      CHECK(*c.gpu_ms > 0);
      CHECK(c.ptrs[kPtrX] != 0);
      CHECK(c.ptrs[kPtrWorkspace] != 0);
      CHECK(c.layer >= 0);
      layers_seen.insert(c.layer);
      conv_streams.insert(c.stream);
      const auto& L = t.layers.at(c.layer);
      if (c.conv == ConvKind::kForward && L.x.dims[1] == 32 && L.w.dims[2] == 1) CHECK(c.alpha == 0.5);
      if (c.conv == ConvKind::kBackwardFilter && L.conv.groups == 4) CHECK(c.beta == 1.0);
      if (c.conv == ConvKind::kBackwardFilter && L.conv.groups == 1) CHECK(c.beta == 0.0);
    }
    CHECK(convs[ConvKind::kForward] == kLayers);
    CHECK(convs[ConvKind::kBackwardData] == kLayers - 1);
    CHECK(convs[ConvKind::kBackwardFilter] == kLayers);
    CHECK(layers_seen.size() == kLayers);
    REQUIRE(conv_streams.size() == 1);
    CHECK(t.streams.at(*conv_streams.begin()) != 0);
    CHECK(searches == 6 * kLayers);
    bool has_nhwc = false, has_3d = false;
    for (const auto& L : t.layers) {
      has_nhwc |= L.x.layout() == "NHWC";
      has_3d |= L.conv.spatial_dims == 3;
    }
    CHECK(has_nhwc);
    CHECK(has_3d);
  }

  {  // the wrapped run's trace uses the explicit boundaries and the layer ids
    auto r = read_trace(tmp.file("wrapped.json"));
    REQUIRE(r.ok());
    const Trace& t = r.value();
    CHECK(t.complete);
    CHECK(t.detected_by == "explicit");
    int convs = 0;
    for (const auto& c : t.calls) {
      if (c.kind != CallKind::kConvolution) continue;
      ++convs;
      CHECK(c.user_layer >= 1);
      CHECK(c.user_layer <= kLayers);
    }
    CHECK(convs == kConvsPerIteration);
  }
}

TEST_CASE("several handles on several threads and streams pass through bitwise", "[gpu]") {
  TempDir tmp;
  const int threads = 4, iters = 3;
  const std::vector<std::string> args{"--threads", std::to_string(threads), "--iters", std::to_string(iters)};
  auto direct = run_client("vcudnn_conv_client", args, {});
  INFO(direct.err);
  REQUIRE(direct.exit_code == 0);
  const auto expected = comparable(direct.out);
  check_outputs_valid(expected, threads);
  for (const char* policy : {"record", "passthrough"}) {
    {
      INFO("policy " << policy);
      auto pre = run_client("vcudnn_conv_client", args,
                            {{"LD_PRELOAD", libvcudnn_path()},
                             {"VCUDNN_POLICY", policy},
                             {"VCUDNN_LOG_FILE", tmp.file(std::string(policy) + ".log")}});
      const std::string log = read_file(tmp.file(std::string(policy) + ".log"));
      INFO(pre.err << log);
      REQUIRE(pre.exit_code == 0);
      CHECK(comparable(pre.out) == expected);
      const std::string line = exit_line(log);
      CHECK(counter_value(line, "conv_fwd") == threads * kLayers * iters);
      CHECK(counter_value(line, "conv_bwd_filter") == threads * kLayers * iters);
      CHECK(counter_value(line, "create") == threads);
      CHECK(counter_value(line, "destroy") == threads);
    }
  }
  {  // wrapped handles on several threads
    auto w = run_client("vcudnn_conv_client_wrapped", args, {});
    INFO(w.err);
    REQUIRE(w.exit_code == 0);
    CHECK(comparable(w.out) == expected);
  }
}
