// [gpu] Micro-batching (VCUDNN_POLICY=microbatch) changes results only by floating-point reassociation:
// vcudnn_microbatch_client's outputs under the preloaded library (forced splits, the benchmark cache
// reused by a second process, normal planning, a zero workspace limit) match plain cuDNN's within a
// relative-L2 tolerance per dtype and math, and the exit summary shows that the splitting happened.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

using Env = std::map<std::string, std::optional<std::string>>;

constexpr int kCases = 7;
constexpr int kKinds = 3;                           // fwd, bwd_data, bwd_filter
constexpr int kOutputs = kCases * kKinds * 2;       // beta 0 and 1
constexpr int kWorkspaceQueries = kCases * kKinds;  // one per case and kind
constexpr int kChildTimeoutS = 600;

// ‖vcudnn − reference‖₂ / ‖reference‖₂ allowed per case of the client (significant bits count the
// implicit one).
struct Tolerance {
  const char* case_name;
  double rel_l2;
  const char* why;
};
constexpr Tolerance kTolerances[] = {
    {"f32_nchw", 1e-5, "fp32 FMA: only the algorithm and the summation order differ"},
    {"f32_nhwc_tf32", 5e-3, "TF32: inputs rounded to 11 significant bits, so two algorithms differ by ~1e-3"},
    {"bf16_nhwc", 2e-2, "bf16: outputs rounded to 8 significant bits"},
    {"f16_nchw", 5e-3, "fp16: outputs rounded to 11 significant bits, and the summation order differs"},
    {"f32_grouped", 1e-5, "fp32 FMA: only the algorithm and the summation order differ"},
    {"f32_3d", 1e-5, "fp32 FMA: only the algorithm and the summation order differ"},
    {"f32_batch1", 1e-5, "fp32 FMA: only the algorithm and the summation order differ"},
};

// The test's own environment without LD_PRELOAD (run_process drops the caller's VCUDNN_* settings)
// and without a forced split unless the test asks for one.
Env clean_env() { return {{"LD_PRELOAD", std::nullopt}, {"VCUDNN_TEST_FORCE_SPLIT", std::nullopt}}; }

ProcessResult run_client(const std::string& out_dir, const Env& settings) {
  std::filesystem::create_directories(out_dir);
  Env env = clean_env();
  for (const auto& [k, v] : settings) env[k] = v;
  return run_process({exe_dir() + "/vcudnn_microbatch_client", "--out", out_dir, "--iters", "3"}, env, kChildTimeoutS);
}

Env microbatch_env(const std::string& cache, const std::string& limit, bool force_split) {
  // The forced split: micro-batches of 5 samples, the last takes the rest.
  std::optional<std::string> split;
  if (force_split) split = std::string("5");
  return {{"LD_PRELOAD", libvcudnn_path()}, {"VCUDNN_POLICY", "microbatch"}, {"VCUDNN_WORKSPACE_LIMIT", limit},
          {"VCUDNN_CACHE", cache},          {"VCUDNN_LOG_LEVEL", "info"},    {"VCUDNN_TEST_FORCE_SPLIT", split}};
}

// Lines of `out` that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& out, const std::string& prefix) {
  std::vector<std::string> lines;
  for (auto& l : grep(out, prefix))
    if (l.rfind(prefix, 0) == 0) lines.push_back(l);
  return lines;
}

// The client ran to the end and wrote every output completely.
void check_client_ran(const ProcessResult& r) {
  REQUIRE(r.exit_code == 0);
  REQUIRE(lines_starting(r.out, "done").size() == 1);
  const auto outs = lines_starting(r.out, "out ");
  CHECK(outs.size() == kOutputs);
  for (const auto& l : outs) {
    INFO(l);
    CHECK(counter_value(l, "nan") == 0);
  }
  CHECK(lines_starting(r.out, "ws ").size() == kWorkspaceQueries);
}

// The byte count at the end of a "ws <case> <kind> <bytes>" line.
long long ws_bytes(const std::string& line) {
  std::istringstream in(line);
  std::string tag, name, kind;
  long long bytes = -1;
  in >> tag >> name >> kind >> bytes;
  return bytes;
}

std::string exit_line(const std::string& log) {
  auto lines = grep(log, "exit: ");
  REQUIRE(lines.size() == 1);
  return lines[0];
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

const Tolerance* tolerance_of(const std::string& file_name) {
  const std::string name = file_name.substr(0, file_name.find('.'));
  for (const auto& t : kTolerances)
    if (name == t.case_name) return &t;
  return nullptr;
}

// Compares every file of `ref_dir` with the file of the same name in `dir`.
void compare_with_reference(const std::string& ref_dir, const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(ref_dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  double max_err = 0;
  std::string worst;
  int compared = 0;
  for (const auto& name : names) {
    INFO(dir << "/" << name);
    const std::string path = dir + "/" + name;
    const Tolerance* tol = tolerance_of(name);
    REQUIRE(tol != nullptr);
    const bool present = std::filesystem::exists(path);
    CHECK(present);
    if (!present) continue;
    const bool same_size = std::filesystem::file_size(path) == std::filesystem::file_size(ref_dir + "/" + name);
    CHECK(same_size);
    if (!same_size) continue;
    const std::vector<float> r = read_floats(ref_dir + "/" + name), a = read_floats(path);
    REQUIRE(!r.empty());
    size_t nan = 0;
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      nan += std::isnan(a[i]) ? 1 : 0;
      const double d = static_cast<double>(a[i]) - r[i];
      diff2 += d * d;
      ref2 += static_cast<double>(r[i]) * r[i];
    }
    CHECK(nan == 0);
    REQUIRE(ref2 > 0);  // random inputs: a zero reference means the reference run is broken
    const double err = std::sqrt(diff2 / ref2);
    INFO("relative L2 error " << err << ", tolerance " << tol->rel_l2 << " (" << tol->why << ")");
    CHECK(err <= tol->rel_l2);
    if (compared == 0 || (!std::isnan(max_err) && (std::isnan(err) || err > max_err))) {  // NaN is the worst
      max_err = err;
      worst = name;
    }
    ++compared;
  }
  INFO("max relative L2 error " << max_err << " in " << dir << "/" << worst);
  CHECK(compared == kOutputs);
}

}  // namespace

TEST_CASE("micro-batched convolutions match plain cuDNN: forced splits, cache reuse, planning, no workspace", "[gpu]") {
  TempDir tmp;
  const std::string ref_dir = tmp.file("ref"), cache = tmp.file("bench.sqlite");

  {  // (a) the reference: plain cuDNN, no vcudnn
    const auto ref = run_client(ref_dir, {});
    INFO("reference run\n" << ref.out << ref.err);
    check_client_ran(ref);
  }

  {  // (b) every managed convolution split into micro-batches of 5; measures fill the cache
    const auto r = run_client(tmp.file("b"), microbatch_env(cache, "64M", true));
    INFO("run (b) forced split\n" << r.out << r.err);
    check_client_ran(r);
    compare_with_reference(ref_dir, tmp.file("b"));
    const std::string line = exit_line(r.err);
    INFO(line);
    CHECK(counter_value(line, "plans") > 0);
    CHECK(counter_value(line, "split") > 0);
    CHECK(counter_value(line, "benchmarked") > 0);
    for (const auto& l : lines_starting(r.out, "ws ")) {  // vcudnn supplies the workspace
      INFO(l);
      CHECK(ws_bytes(l) == 0);
    }
  }

  {  // (c) a second process with the same cache measures nothing
    const auto r = run_client(tmp.file("c"), microbatch_env(cache, "64M", true));
    INFO("run (c) forced split, cached\n" << r.out << r.err);
    check_client_ran(r);
    compare_with_reference(ref_dir, tmp.file("c"));
    const std::string line = exit_line(r.err);
    INFO(line);
    CHECK(counter_value(line, "benchmarked") == 0);
    CHECK(counter_value(line, "cache_hits") > 0);
    CHECK(counter_value(line, "split") > 0);
  }

  {  // (d) normal planning under 8 MiB
    const auto r = run_client(tmp.file("d"), microbatch_env(cache, "8M", false));
    INFO("run (d) planned, 8 MiB\n" << r.out << r.err);
    check_client_ran(r);
    compare_with_reference(ref_dir, tmp.file("d"));
    const std::string line = exit_line(r.err);
    INFO(line);
    CHECK(counter_value(line, "plans") > 0);
  }

  {  // (e) no workspace at all: zero-workspace algorithms only
    const auto r = run_client(tmp.file("e"), microbatch_env(cache, "0", false));
    INFO("run (e) planned, no workspace\n" << r.out << r.err);
    check_client_ran(r);
    compare_with_reference(ref_dir, tmp.file("e"));
    const std::string line = exit_line(r.err);
    INFO(line);
    CHECK(counter_value(line, "plans") > 0);
    CHECK(counter_value(line, "fallbacks") >= 0);  // present in the summary
  }

  {  // (f) whole-network budget (µ-cuDNN WD): re-planned once the first iteration is complete
    Env env = microbatch_env(cache, "64M", false);
    env["VCUDNN_TOTAL_WORKSPACE"] = "4M";
    const auto r = run_client(tmp.file("f"), env);
    INFO("run (f) network budget 4 MiB\n" << r.out << r.err);
    check_client_ran(r);
    compare_with_reference(ref_dir, tmp.file("f"));
    CHECK(grep(r.err, "network plan for").size() == 1);
    const std::string line = exit_line(r.err);
    INFO(line);
    CHECK(counter_value(line, "workspace_peak") <= 4ll << 20);
  }
}
