// [gpu] Graph-API convolutions, the path PyTorch 2.x takes by default.
// (1) vcudnn_graph_client (plain cuDNN, built as PyTorch builds a convolution) gives the same bytes
//     twice, and the same bytes under the preloaded vcudnn (VCUDNN_POLICY=record), whose exit line
//     shows every execution recognised as a single-convolution plan of the right kind; also with 4
//     threads building their plans at once.
// (3) the client under VCUDNN_POLICY=microbatch (every sliceable plan taken over by
//     VCUDNN_TEST_FORCE_SPLIT): the plan reports workspace 0, the client passes a null workspace,
//     vcudnn's log shows the kernel split and no failure, and the outputs match the plain run
//     within tolerance; also with 4 threads building their plans at once, and a second process
//     finds every measurement in the cache.
// (2) GraphConvPlan (runtime/graph_conv_plan.h) running a convolution as micro-batches of N/2 and
//     N/4 (and a remainder) matches the whole-batch plan within a relative-L2 tolerance, for every
//     kind, NCHW and NHWC, grouped and depthwise, alignments below 16 bytes; plans built on 4
//     threads at once give the same results.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/graph_conv_plan.h"
#include "tests/common/conv_shape.h"
#include "tests/common/test_util.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

using Env = std::map<std::string, std::optional<std::string>>;
constexpr int kChildTimeoutS = 600;
constexpr int kRepeat = 3;
const char* const kKinds[] = {"fwd", "bwd-data", "bwd-filter"};

// ---- (1) the client, plain and under vcudnn

// The client's arguments for one kind of one convolution.
struct ClientCase {
  const char* name;
  std::vector<std::string> args;
};

std::vector<ClientCase> client_cases() {
  return {
      {"f32_nchw",
       {"--n", "8", "--c", "16", "--k", "32", "--h", "14", "--w", "14", "--r", "3", "--s", "3", "--pad", "1"}},
      {"f32_nhwc_depthwise_strided",
       {"--layout", "nhwc", "--n", "6", "--c", "32", "--k", "32", "--groups", "32", "--h", "15", "--w", "15",
        "--stride", "2", "--pad", "1"}},
      {"bf16_nhwc",
       {"--layout", "nhwc", "--dtype", "bf16", "--n", "4", "--c", "32", "--k", "64", "--h", "10", "--w", "10"}},
  };
}

// The shadow's key for a kind in the exit line's "graph_api:" summary (BackendShadow::summary()).
std::string plans_key(const std::string& kind) {
  if (kind == "fwd") return "conv_fwd_plans";
  if (kind == "bwd-data") return "conv_bwd_data_plans";
  return "conv_bwd_filter_plans";
}

ProcessResult run_client(const ClientCase& c, const std::string& kind, const std::string& out, int threads,
                         const Env& settings) {
  std::vector<std::string> argv{exe_dir() + "/vcudnn_graph_client",
                                "--kind",
                                kind,
                                "--out",
                                out,
                                "--repeat",
                                std::to_string(kRepeat),
                                "--threads",
                                std::to_string(threads)};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  Env env{{"LD_PRELOAD", std::nullopt}};  // run_process already drops the caller's VCUDNN_* settings
  for (const auto& [k, v] : settings) env[k] = v;
  return run_process(argv, env, kChildTimeoutS);
}

Env vcudnn_env(const std::string& log) {
  return {{"LD_PRELOAD", libvcudnn_path()}, {"VCUDNN_POLICY", "record"}, {"VCUDNN_LOG_FILE", log}};
}

// The client ran, and each thread printed one successful JSON line and wrote a complete output.
std::vector<nlohmann::json> check_client(const ProcessResult& r, int threads) {
  INFO("exit " << r.exit_code << "\n" << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> lines;
  for (const auto& l : grep(r.out, "{\"status\"")) lines.push_back(nlohmann::json::parse(l.substr(l.find('{'))));
  REQUIRE(lines.size() == static_cast<size_t>(threads));
  for (const auto& j : lines) {
    INFO(j.dump());
    CHECK(j.at("status") == "ok");
    CHECK(j.at("nan") == 0);  // every poisoned element was written
    CHECK(j.at("engine").get<int64_t>() >= 0);
    CHECK(j.at("workspace").get<int64_t>() >= 0);
    const size_t element_bytes = j.at("dtype") == "bf16" ? 2 : 4;
    CHECK(read_file(j.at("out").get<std::string>()).size() == j.at("elements").get<size_t>() * element_bytes);
  }
  return lines;
}

std::string exit_line(const std::string& log) {
  const auto lines = grep(log, "exit: ");
  REQUIRE(lines.size() == 1);
  return lines[0];
}

// vcudnn recognised `executions` executions of single-convolution plans of `kind`, and nothing else.
void check_recognised(const std::string& log, const std::string& kind, int executions) {
  INFO(log);
  const std::string line = exit_line(log);
  INFO(line);
  REQUIRE(line.find("graph_api:") != std::string::npos);
  for (const char* k : kKinds) CHECK(counter_value(line, plans_key(k)) == (k == kind ? executions : 0));
  CHECK(counter_value(line, "other_plans") == 0);
  CHECK(counter_value(line, "unknown_plans") == 0);
}

// ---- (3) the client micro-batched by vcudnn

// The client's raw output as floats (fp32 or bf16 bits).
std::vector<float> floats_of(const std::string& bytes, bool bf16) {
  std::vector<float> v;
  const size_t es = bf16 ? 2 : 4;
  for (size_t i = 0; i + es <= bytes.size(); i += es) {
    uint32_t bits = 0;
    if (bf16) {
      uint16_t h = 0;
      std::memcpy(&h, &bytes[i], 2);
      bits = static_cast<uint32_t>(h) << 16;
    } else {
      std::memcpy(&bits, &bytes[i], 4);
    }
    float f = 0;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  return v;
}

// ‖a − b‖₂ / ‖b‖₂, NaN when a has a NaN or the sizes differ.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return NAN;
  double d2 = 0, b2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return NAN;
    const double d = static_cast<double>(a[i]) - b[i];
    d2 += d * d;
    b2 += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d2 / b2);
}

// The same of two raw outputs (empty ones included: NaN).
double raw_rel_l2(const std::string& a, const std::string& b, bool bf16) {
  const std::vector<float> fa = floats_of(a, bf16), fb = floats_of(b, bf16);
  return fa.empty() ? NAN : rel_l2(fa, fb);
}

struct MicrobatchCase {
  ClientCase client;
  const char* force;  // VCUDNN_TEST_FORCE_SPLIT
  bool bf16 = false;
};

std::vector<MicrobatchCase> microbatch_cases() {
  std::vector<MicrobatchCase> cases;
  for (const ClientCase& c : client_cases()) {
    const bool bf16 = std::find(c.args.begin(), c.args.end(), "bf16") != c.args.end();
    cases.push_back({c, std::string(c.name) == "f32_nhwc_depthwise_strided" ? "4" : "3", bf16});
  }
  cases.push_back({{"f32_nchw_grouped",
                    {"--n", "8", "--c", "32", "--k", "32", "--groups", "4", "--h", "12", "--w", "12", "--pad", "1"}},
                   "3",
                   false});
  return cases;
}

// The relative L2 error allowed between the micro-batched and the plain run. Both runs use exact
// fp32 engines (--exact: no TF32, FFT or Winograd; vcudnn's engines carry no numerical note the
// caller's lacks), so forward and backward-data micro-batches compute each output element from the
// same products, summed in an order the engine's configuration for that micro-batch size decides:
// a few fp32 ulps (~1e-7 relative): 1e-5. Backward-filter sums over N: the micro-batches' partial
// sums are accumulated into dw (beta = 1), each rounded to fp32 once more: ~1e-6: 1e-4. bf16
// outputs (forward, backward-data) are rounded to 8 bits of mantissa after an fp32 sum whose order
// may differ: an element may move by one bf16 ulp (2^-8): 1e-2.
double client_tolerance(const std::string& kind, bool bf16) {
  if (bf16) return 1e-2;
  return kind == "bwd-filter" ? 1e-4 : 1e-5;
}

Env microbatch_env(const std::string& log, const std::string& cache, const char* force) {
  return {{"LD_PRELOAD", libvcudnn_path()}, {"VCUDNN_POLICY", "microbatch"},    {"VCUDNN_LOG_FILE", log},
          {"VCUDNN_WORKSPACE_LIMIT", "1M"}, {"VCUDNN_TEST_FORCE_SPLIT", force}, {"VCUDNN_CACHE", cache}};
}

ClientCase exact(ClientCase c) {
  c.args.push_back("--exact");
  return c;
}

// vcudnn took over `plans` plans and ran their executions itself, split unless a 16-bit weight
// gradient (undivided within the limit), with no failure and no fallback to the caller's plan.
void check_microbatched(const std::string& log, const std::string& kind, bool bf16, int plans, int executions) {
  INFO(log);
  const std::string line = exit_line(log);
  INFO(line);
  const bool splits = !(bf16 && kind == "bwd-filter");
  CHECK(counter_value(line, "graph_managed") == plans);
  CHECK(counter_value(line, "graph_plans") == 1);  // one kernel, decided once whatever the threads
  CHECK(counter_value(line, "graph_split") == (splits ? 1 : 0));
  CHECK(counter_value(line, "graph_fallbacks") == 0);
  CHECK(counter_value(line, "graph_errors") == 0);
  CHECK(counter_value(line, "graph_passthrough") == 0);
  CHECK(counter_value(line, "graph_executed") == executions);
  const std::string decided = kind == "fwd"        ? "graph_microbatch: fwd "
                              : kind == "bwd-data" ? "graph_microbatch: bwd_data "
                                                   : "graph_microbatch: bwd_filter ";
  CHECK(grep(log, decided).size() == 1);  // the kernel's decision, with its micro-batches
}

// ---- (2) GraphConvPlan in this process

struct Gpu {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  std::string error;  // empty when both were made
  Gpu() {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) error = "cudaStreamCreate failed";
    if (error.empty() && cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) error = "cudnnCreate failed";
    if (error.empty() && cudnnSetStream(handle, stream) != CUDNN_STATUS_SUCCESS) error = "cudnnSetStream failed";
  }
  ~Gpu() {
    if (handle) cudnnDestroy(handle);
    if (stream) cudaStreamDestroy(stream);
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;
};

struct DeviceMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceMem(size_t n) : bytes(n) {
    if (n && cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~DeviceMem() {
    if (p) cudaFree(p);
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  bool ok() const { return bytes == 0 || p; }
};

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = dist(rng);
  return v;
}

// x, w and dy of one fp32 convolution on the device (random, fixed seeds), read-only.
struct Problem {
  ConvShape shape;
  ConvLayer layer;
  std::unique_ptr<DeviceMem> x, w, y;
  bool ok = true;  // every input is on the device

  explicit Problem(const ConvShape& s) : shape(s), layer(conv_layer(s)) {
    const auto upload = [this](const std::vector<float>& host) {
      auto d = std::make_unique<DeviceMem>(host.size() * sizeof(float));
      ok = ok && d->ok() && cudaMemcpy(d->p, host.data(), d->bytes, cudaMemcpyHostToDevice) == cudaSuccess;
      return d;
    };
    x = upload(random_floats(elements(s.x_dims()), 11));
    w = upload(random_floats(elements(s.w_dims()), 12));
    y = upload(random_floats(elements(s.y_dims()), 13));
  }
  int64_t output_count(ConvKind kind) const {
    return elements(kind == ConvKind::kForward        ? shape.y_dims()
                    : kind == ConvKind::kBackwardData ? shape.x_dims()
                                                      : shape.w_dims());
  }
};

// One execution into a fresh output (poisoned with NaN, or `prefill` for beta != 0); the host
// copy, or an error.
struct RunResult {
  std::vector<float> out;
  std::string error;
};

RunResult run(const Gpu& gpu, const Problem& p, ConvKind kind, uint64_t workspace_bytes,
              const std::vector<float>* prefill,
              const std::function<cudnnStatus_t(void* x, void* w, void* y, void* ws)>& exec) {
  RunResult r;
  const size_t count = static_cast<size_t>(p.output_count(kind));
  DeviceMem out(count * sizeof(float)), ws(workspace_bytes);
  if (!out.ok() || !ws.ok()) return {{}, "cudaMalloc failed"};
  cudaError_t e = prefill ? cudaMemcpyAsync(out.p, prefill->data(), out.bytes, cudaMemcpyHostToDevice, gpu.stream)
                          : cudaMemsetAsync(out.p, 0xFF, out.bytes, gpu.stream);
  if (e != cudaSuccess) return {{}, std::string("filling the output: ") + cudaGetErrorString(e)};
  void* x = kind == ConvKind::kBackwardData ? out.p : p.x->p;
  void* w = kind == ConvKind::kBackwardFilter ? out.p : p.w->p;
  void* y = kind == ConvKind::kForward ? out.p : p.y->p;
  const cudnnStatus_t st = exec(x, w, y, ws.p);
  if (st != CUDNN_STATUS_SUCCESS) return {{}, std::string("execution: ") + cudnnGetErrorString(st)};
  if ((e = cudaStreamSynchronize(gpu.stream)) != cudaSuccess) return {{}, cudaGetErrorString(e)};
  r.out.resize(count);
  if ((e = cudaMemcpy(r.out.data(), out.p, out.bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
    return {{}, cudaGetErrorString(e)};
  return r;
}

size_t nan_count(const std::vector<float>& v) {
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](float f) { return std::isnan(f); }));
}

// Exact fp32 (no TF32), deterministic, direct or GEMM-based engines (no FFT or Winograd, whose
// rounding differs from a direct sum's by more than reassociation): the comparisons below then
// measure only the split.
constexpr uint32_t kExactNotes =
    note_bit(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) | note_bit(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) |
    note_bit(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) | note_bit(CUDNN_NUMERICAL_NOTE_FFT) |
    note_bit(CUDNN_NUMERICAL_NOTE_WINOGRAD) | note_bit(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) |
    note_bit(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) | note_bit(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13);

// Relative L2 error allowed between the split and the whole batch, fp32 data and compute.
// Forward and backward-data: a micro-batch computes exactly the sums the whole batch computes for
// its samples, so with the same engine the result is usually bitwise equal; but an engine's
// configuration (tiling, split-K) is chosen per problem size and may differ at N/2 or N/4, or the
// engine itself when the whole batch's does not support the micro-batch's alignment, and a
// different summation order over C*R*S in fp32 differs by a few ulps (~1e-7 relative): 1e-5.
// Backward-filter: dw sums over N; accumulating micro-batches into dw (beta = 1) reassociates that
// sum, each partial sum rounded to fp32 once more: still ~1e-6, allowed 1e-4.
double tolerance(ConvKind kind) { return kind == ConvKind::kBackwardFilter ? 1e-4 : 1e-5; }

struct SplitCase {
  ConvShape shape;
  std::vector<int32_t> micro_batches;
};

std::vector<SplitCase> split_cases() {
  ConvShape plain;  // n 8, c 16, k 32, 14x14, 3x3, pad 1
  ConvShape nhwc_strided;
  nhwc_strided.nhwc = true;
  nhwc_strided.c = 32;
  nhwc_strided.k = 64;
  nhwc_strided.h = nhwc_strided.w = 15;
  nhwc_strided.stride = 2;
  ConvShape grouped;
  grouped.c = grouped.k = 32;
  grouped.groups = 4;
  grouped.h = grouped.w = 12;
  ConvShape depthwise;
  depthwise.nhwc = true;
  depthwise.c = depthwise.k = depthwise.groups = 32;
  ConvShape odd;  // samples of 300 (x) and 500 (y) bytes: micro-batches aligned to 8 and 4 bytes only
  odd.n = 4;
  odd.c = 3;
  odd.k = 5;
  odd.h = odd.w = 5;
  ConvShape remainder;  // 10 = 3 + 3 + 3 + 1: a shorter last micro-batch, its own plan
  remainder.n = 10;
  remainder.c = 8;
  remainder.k = 16;
  remainder.h = remainder.w = 9;
  return {{plain, {4, 2}},     {nhwc_strided, {4, 2}}, {grouped, {4, 2}},
          {depthwise, {4, 2}}, {odd, {2, 1}},          {remainder, {5, 2, 3}}};
}

Result<GraphConvSplit> split_like(const Gpu& gpu, const Problem& p, ConvKind kind, int32_t m,
                                  const GraphConvPlan& whole, const GraphConvSplitOptions& base, bool* same_engine) {
  GraphConvSplitOptions o = base;
  o.engine = whole.engine();
  auto split = build_split(gpu.handle, p.layer, kind, m, o);
  *same_engine = split.ok();
  if (split) return split;
  WARN("engine " << whole.engine() << " cannot run micro-batches of " << m << " (" << split.error().message
                 << "); the heuristics choose");
  o.engine.reset();
  return build_split(gpu.handle, p.layer, kind, m, o);
}

}  // namespace

TEST_CASE("graph-API client: two plain runs give the same bytes, every kind", "[gpu][graph_api]") {
  TempDir tmp;
  for (const ClientCase& c : client_cases()) {
    for (const char* kind : kKinds) {
      INFO(c.name << " " << kind);
      const std::string a = tmp.file(std::string(c.name) + "." + kind + ".a");
      const std::string b = tmp.file(std::string(c.name) + "." + kind + ".b");
      const auto ja = check_client(run_client(c, kind, a, 1, {}), 1);
      const auto jb = check_client(run_client(c, kind, b, 1, {}), 1);
      CHECK(ja[0].at("engine") == jb[0].at("engine"));
      const std::string bytes = read_file(a);
      REQUIRE(!bytes.empty());
      const bool same = bytes == read_file(b);  // not printed: raw bytes
      CHECK(same);
    }
  }
}

TEST_CASE("graph-API client under vcudnn (record): the same bytes, every plan recognised", "[gpu][graph_api]") {
  TempDir tmp;
  for (const ClientCase& c : client_cases()) {
    for (const char* kind : kKinds) {
      INFO(c.name << " " << kind);
      const std::string base = tmp.file(std::string(c.name) + "." + kind);
      const auto plain = check_client(run_client(c, kind, base + ".plain", 1, {}), 1);
      const auto preloaded = check_client(run_client(c, kind, base + ".vcudnn", 1, vcudnn_env(base + ".log")), 1);
      CHECK(plain[0].at("engine") == preloaded[0].at("engine"));
      CHECK(plain[0].at("workspace") == preloaded[0].at("workspace"));
      const bool same = read_file(base + ".plain") == read_file(base + ".vcudnn");
      CHECK(same);
      check_recognised(read_file(base + ".log"), kind, kRepeat);
    }
  }
}

TEST_CASE("graph-API client with 4 threads building plans at once, plain and under vcudnn",
          "[gpu][graph_api][threads]") {
  constexpr int kThreads = 4;
  TempDir tmp;
  for (const ClientCase& c : client_cases()) {
    for (const char* kind : kKinds) {
      INFO(c.name << " " << kind);
      const std::string base = tmp.file(std::string(c.name) + "." + kind);
      check_client(run_client(c, kind, base + ".ref", 1, {}), 1);
      const std::string ref = read_file(base + ".ref");
      check_client(run_client(c, kind, base + ".plain", kThreads, {}), kThreads);
      check_client(run_client(c, kind, base + ".vcudnn", kThreads, vcudnn_env(base + ".log")), kThreads);
      for (int t = 0; t < kThreads; ++t) {
        INFO("thread " << t);
        const bool plain_same = read_file(base + ".plain." + std::to_string(t)) == ref;
        const bool vcudnn_same = read_file(base + ".vcudnn." + std::to_string(t)) == ref;
        CHECK(plain_same);
        CHECK(vcudnn_same);
      }
      check_recognised(read_file(base + ".log"), kind, kThreads * kRepeat);
    }
  }
}

TEST_CASE("graph conv plan: micro-batches of N/2 and N/4 match the whole batch, every kind",
          "[gpu][graph_api][split]") {
  Gpu gpu;
  REQUIRE(gpu.error.empty());
  for (const SplitCase& sc : split_cases()) {
    const Problem p(sc.shape);
    REQUIRE(p.ok);
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      INFO(sc.shape.name() << " " << conv_kind_name(kind));
      GraphConvPlanSpec spec;
      spec.denied_notes = kExactNotes;
      auto whole = GraphConvPlan::build(gpu.handle, p.layer, kind, spec);
      if (!whole) FAIL(whole.error().message);
      INFO("whole batch: engine " << whole->engine() << ", workspace " << whole->workspace_bytes());
      const RunResult ref =
          run(gpu, p, kind, whole->workspace_bytes(), nullptr,
              [&](void* x, void* w, void* y, void* ws) { return whole->execute(gpu.handle, x, w, y, ws); });
      REQUIRE(ref.error.empty());
      REQUIRE(nan_count(ref.out) == 0);

      GraphConvSplitOptions options;
      options.denied_notes = kExactNotes;
      for (int32_t m : sc.micro_batches) {
        INFO("micro-batch " << m);
        bool same_engine = false;
        auto split = split_like(gpu, p, kind, m, whole.value(), options, &same_engine);
        if (!split) FAIL(split.error().message);
        const auto slices = split_batch(sc.shape.n, m);
        CHECK(split->steps.size() == slices.size());
        if (kind == ConvKind::kBackwardFilter) {  // accumulating plans after the first micro-batch
          for (size_t i = 0; i < split->steps.size(); ++i)
            CHECK(split->plans[split->steps[i].plan].spec().beta == (i == 0 ? 0.0 : 1.0));
        }
        for (const auto& plan : split->plans) {
          INFO("plan at batch " << plan.batch() << ": engine " << plan.engine() << " (" << plan.heuristic_mode()
                                << "), alignments x " << plan.spec().x_alignment << " y " << plan.spec().y_alignment);
          CHECK(plan.spec().x_alignment == split->geometry.x_alignment);
          if (same_engine) CHECK(plan.engine() == whole->engine());
        }
        const RunResult got = run(
            gpu, p, kind, split->workspace_bytes, nullptr,
            [&](void* x, void* w, void* y, void* ws) { return execute_split(split.value(), gpu.handle, x, w, y, ws); });
        REQUIRE(got.error.empty());
        CHECK(nan_count(got.out) == 0);
        const double err = rel_l2(got.out, ref.out);
        INFO("relative L2 error " << err << ", tolerance " << tolerance(kind));
        CHECK(err <= tolerance(kind));
      }
    }
  }
}

TEST_CASE("graph conv plan: a weight gradient accumulated into dw (alpha 0.5, beta 1) splits as well",
          "[gpu][graph_api][split]") {
  Gpu gpu;
  REQUIRE(gpu.error.empty());
  ConvShape s;
  s.n = 12;
  const Problem p(s);
  const ConvKind kind = ConvKind::kBackwardFilter;
  const std::vector<float> prefill = random_floats(p.output_count(kind), 14);
  GraphConvPlanSpec spec;
  spec.denied_notes = kExactNotes;
  spec.alpha = 0.5;
  spec.beta = 1.0;
  auto whole = GraphConvPlan::build(gpu.handle, p.layer, kind, spec);
  if (!whole) FAIL(whole.error().message);
  const RunResult ref = run(gpu, p, kind, whole->workspace_bytes(), &prefill, [&](void* x, void* w, void* y, void* ws) {
    return whole->execute(gpu.handle, x, w, y, ws);
  });
  REQUIRE(ref.error.empty());
  CHECK(rel_l2(ref.out, prefill) > 0.01);  // the gradient was added
  GraphConvSplitOptions options;
  options.denied_notes = kExactNotes;
  options.alpha = 0.5;
  options.beta = 1.0;
  for (int32_t m : {6, 4, 5}) {
    INFO("micro-batch " << m);
    bool same_engine = false;
    auto split = split_like(gpu, p, kind, m, whole.value(), options, &same_engine);
    if (!split) FAIL(split.error().message);
    for (const auto& plan : split->plans) CHECK(plan.spec().alpha == 0.5);
    const RunResult got = run(gpu, p, kind, split->workspace_bytes, &prefill, [&](void* x, void* w, void* y, void* ws) {
      return execute_split(split.value(), gpu.handle, x, w, y, ws);
    });
    REQUIRE(got.error.empty());
    const double err = rel_l2(got.out, ref.out);
    INFO("relative L2 error " << err);
    CHECK(err <= tolerance(kind));
  }
}

TEST_CASE("graph conv plan: splits built on 4 threads at once give the same results",
          "[gpu][graph_api][split][threads]") {
  constexpr int kThreads = 4;
  ConvShape plain;
  ConvShape depthwise;
  depthwise.nhwc = true;
  depthwise.c = depthwise.k = depthwise.groups = 32;
  for (const ConvShape& s : {plain, depthwise}) {
    const Problem p(s);
    REQUIRE(p.ok);
    const int32_t m = static_cast<int32_t>(s.n / 4);
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      INFO(s.name() << " " << conv_kind_name(kind) << ", micro-batch " << m);
      GraphConvSplitOptions options;
      options.denied_notes = kExactNotes;
      std::vector<int64_t> ref_engines;
      RunResult ref;
      {
        Gpu gpu;
        REQUIRE(gpu.error.empty());
        auto split = build_split(gpu.handle, p.layer, kind, m, options);
        if (!split) FAIL(split.error().message);
        for (const auto& plan : split->plans) ref_engines.push_back(plan.engine());
        ref = run(gpu, p, kind, split->workspace_bytes, nullptr, [&](void* x, void* w, void* y, void* ws) {
          return execute_split(split.value(), gpu.handle, x, w, y, ws);
        });
        REQUIRE(ref.error.empty());
        REQUIRE(nan_count(ref.out) == 0);
      }
      // Each thread: its own handle and stream, its own plans (no Catch2 assertion off the main thread).
      struct ThreadResult {
        std::vector<int64_t> engines;
        RunResult run;
      };
      std::vector<ThreadResult> results(kThreads);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          ThreadResult& r = results[t];
          Gpu gpu;
          if (!gpu.error.empty()) {
            r.run.error = gpu.error;
            return;
          }
          auto split = build_split(gpu.handle, p.layer, kind, m, options);
          if (!split) {
            r.run.error = split.error().message;
            return;
          }
          for (const auto& plan : split->plans) r.engines.push_back(plan.engine());
          r.run = run(gpu, p, kind, split->workspace_bytes, nullptr, [&](void* x, void* w, void* y, void* ws) {
            return execute_split(split.value(), gpu.handle, x, w, y, ws);
          });
        });
      }
      for (auto& t : threads) t.join();
      for (int t = 0; t < kThreads; ++t) {
        INFO("thread " << t);
        const ThreadResult& r = results[t];
        REQUIRE(r.run.error.empty());
        CHECK(nan_count(r.run.out) == 0);
        CHECK(r.engines == ref_engines);  // the heuristics answer the same on every thread
        if (r.engines == ref_engines) {
          const bool same_bits = r.run.out == ref.out;  // the same plans: the same bits
          CHECK(same_bits);
        } else {
          CHECK(rel_l2(r.run.out, ref.out) <= tolerance(kind));
        }
      }
    }
  }
}

TEST_CASE("graph-API client under microbatch: plans taken over, workspace 0, outputs within tolerance, every kind",
          "[gpu][graph_api][microbatch]") {
  TempDir tmp;
  for (const MicrobatchCase& mc : microbatch_cases()) {
    const ClientCase c = exact(mc.client);
    for (const char* kind : kKinds) {
      INFO(c.name << " " << kind << ", micro-batches of " << mc.force);
      const std::string base = tmp.file(std::string(c.name) + "." + kind);
      const std::string cache = base + ".sqlite";
      const auto plain = check_client(run_client(c, kind, base + ".plain", 1, {}), 1);
      const auto mb =
          check_client(run_client(c, kind, base + ".mb", 1, microbatch_env(base + ".log", cache, mc.force)), 1);
      INFO("plain: " << plain[0].dump() << "\nmicrobatch: " << mb[0].dump());
      CHECK(mb[0].at("workspace") == 0);  // vcudnn supplies it: the client allocated none
      const double err = raw_rel_l2(read_file(base + ".mb"), read_file(base + ".plain"), mc.bf16);
      INFO("relative L2 error " << err << ", tolerance " << client_tolerance(kind, mc.bf16));
      CHECK(err <= client_tolerance(kind, mc.bf16));
      const std::string log = read_file(base + ".log");
      check_recognised(log, kind, kRepeat);
      check_microbatched(log, kind, mc.bf16, 1, kRepeat);
      CHECK(counter_value(exit_line(log), "graph_benchmarked") > 0);

      // A second process plans from the cache: nothing measured, the same bytes.
      const auto again =
          check_client(run_client(c, kind, base + ".again", 1, microbatch_env(base + ".log2", cache, mc.force)), 1);
      const std::string log2 = read_file(base + ".log2");
      INFO(log2);
      CHECK(counter_value(exit_line(log2), "graph_benchmarked") == 0);
      CHECK(counter_value(exit_line(log2), "graph_cache_hits") > 0);
      const bool same = read_file(base + ".again") == read_file(base + ".mb");
      CHECK(same);
    }
  }
}

TEST_CASE("graph-API client under microbatch with 4 threads building their plans at once",
          "[gpu][graph_api][microbatch][threads]") {
  constexpr int kThreads = 4;
  TempDir tmp;
  for (const MicrobatchCase& mc : microbatch_cases()) {
    const ClientCase c = exact(mc.client);
    for (const char* kind : kKinds) {
      INFO(c.name << " " << kind << ", micro-batches of " << mc.force);
      const std::string base = tmp.file(std::string(c.name) + "." + kind);
      check_client(run_client(c, kind, base + ".ref", 1, {}), 1);
      const std::string ref = read_file(base + ".ref");
      const auto lines = check_client(
          run_client(c, kind, base + ".mb", kThreads, microbatch_env(base + ".log", base + ".sqlite", mc.force)),
          kThreads);
      for (const auto& j : lines) CHECK(j.at("workspace") == 0);
      const std::string first = read_file(base + ".mb.0");
      for (int t = 0; t < kThreads; ++t) {
        INFO("thread " << t);
        const std::string out = read_file(base + ".mb." + std::to_string(t));
        const double err = raw_rel_l2(out, ref, mc.bf16);
        INFO("relative L2 error " << err);
        CHECK(err <= client_tolerance(kind, mc.bf16));
        const bool same = out == first;  // one decision, the same plans on every handle
        CHECK(same);
      }
      const std::string log = read_file(base + ".log");
      check_recognised(log, kind, kThreads * kRepeat);
      check_microbatched(log, kind, mc.bf16, kThreads, kThreads * kRepeat);
    }
  }
}
