// Micro-batching per layer: cuDNN's best undivided algorithm under a workspace limit vs vcudnn's plan.
// The program links real cuDNN and calls it directly for the baseline (cudnnFind*AlgorithmEx with a workspace of
// `limit` bytes, fastest row that succeeded and fits); it dlopen()s libvcudnn.so RTLD_LOCAL and calls the vcudnn*
// C API for the other side, so only those calls go through vcudnn, whose policy comes from the environment
// (VCUDNN_POLICY=microbatch VCUDNN_WORKSPACE_LIMIT=<limit>, set by scripts/bench/microbatch). The first vcudnn call
// of a convolution plans (benchmarks or reads the cache): timed as plan_ms. Then R rounds, each K back-to-back calls
// of either side timed with events on one stream, the order alternating between rounds.
// Writes one JSON object per line: a header, then one per (net, layer, kind).
//   usage: vcudnn_bench_microbatch [--net alexnet|resnet50|vgg16|all] [--dtype fp32|bf16] [--limit BYTES]
//          [--rounds R] [--reps K] [--json FILE] [--vcudnn PATH] [--quick] [--list]
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <unistd.h>

#define VCUDNN_C_API_ONLY
#include <vcudnn/vcudnn.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------------------------
// Errors: every CUDA / cuDNN status is checked; a failure throws, and the (layer, kind) being measured records it.

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Failure(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Failure(std::string(what) + ": " + cudnnGetErrorString(s));
}
#define CUDA_OK(e) check_cuda((e), #e)
#define CUDNN_OK(e) check_cudnn((e), #e)

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "vcudnn_bench_microbatch: %s\n", msg.c_str());
  std::exit(1);
}

// ---------------------------------------------------------------------------------------------------------------
// Layers.

struct Layer {
  std::string name;  // e.g. "conv2 64->192 5x5/1 @27"
  int c, k, r, stride, pad, hw;
  int count = 1;       // occurrences of this shape in the network
  bool first = false;  // the network's first convolution: no backward-data (its input needs no gradient)
};

struct Net {
  std::string name;
  int batch;
  std::vector<Layer> layers;
};

int out_dim(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

// Adds a convolution unless the same shape is already there (then counts it).
void add_conv(Net& net, const std::string& where, int c, int k, int r, int stride, int pad, int hw,
              bool first = false) {
  for (auto& l : net.layers) {
    if (std::tie(l.c, l.k, l.r, l.stride, l.pad, l.hw) == std::tie(c, k, r, stride, pad, hw)) {
      ++l.count;
      l.first = l.first && first;
      return;
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %d->%d %dx%d/%d @%d", where.c_str(), c, k, r, r, stride, hw);
  net.layers.push_back(Layer{buf, c, k, r, stride, pad, hw, 1, first});
}

// torchvision.models.alexnet.
Net alexnet() {
  Net n{"alexnet", 256, {}};
  add_conv(n, "conv1", 3, 64, 11, 4, 2, 224, true);
  add_conv(n, "conv2", 64, 192, 5, 1, 2, 27);
  add_conv(n, "conv3", 192, 384, 3, 1, 1, 13);
  add_conv(n, "conv4", 384, 256, 3, 1, 1, 13);
  add_conv(n, "conv5", 256, 256, 3, 1, 1, 13);
  return n;
}

// torchvision.models.resnet50 (v1.5: the stride sits on the 3x3), distinct shapes, downsample 1x1s included.
Net resnet50() {
  Net n{"resnet50", 256, {}};
  add_conv(n, "conv1", 3, 64, 7, 2, 3, 224, true);
  int in = 64, hw = out_dim(out_dim(224, 7, 2, 3), 3, 2, 1);  // conv1, then maxpool 3x3/2 pad 1: 56
  const int widths[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  for (int l = 0; l < 4; ++l) {
    const int width = widths[l], out = width * 4;
    for (int b = 0; b < blocks[l]; ++b) {
      const int stride = (b == 0 && l > 0) ? 2 : 1;
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b) + ".";
      add_conv(n, p + "conv1", in, width, 1, 1, 0, hw);
      add_conv(n, p + "conv2", width, width, 3, stride, 1, hw);
      const int hw2 = out_dim(hw, 3, stride, 1);
      add_conv(n, p + "conv3", width, out, 1, 1, 0, hw2);
      if (b == 0) add_conv(n, p + "downsample", in, out, 1, stride, 0, hw);
      in = out;
      hw = hw2;
    }
  }
  return n;
}

// torchvision.models.vgg16 (configuration D), distinct shapes.
Net vgg16() {
  Net n{"vgg16", 64, {}};
  const int cfg[5][3] = {{64, 64, 0}, {128, 128, 0}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}};
  int in = 3, hw = 224;
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < 3 && cfg[b][i]; ++i) {
      add_conv(n, "conv" + std::to_string(b + 1) + "_" + std::to_string(i + 1), in, cfg[b][i], 3, 1, 1, hw,
               b == 0 && i == 0);
      in = cfg[b][i];
    }
    hw /= 2;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// Resources (RAII, so that a failure in the middle of a layer frees what it had).

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, int fill_byte = -1) : bytes(n) {
    if (n == 0) return;
    CUDA_OK(cudaMalloc(&p, n));
    if (fill_byte >= 0) CUDA_OK(cudaMemset(p, fill_byte, n));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv_base = nullptr;  // the baseline's; its math type is set to the chosen row's
  cudnnConvolutionDescriptor_t conv_v = nullptr;     // vcudnn's: the framework's math type, as a framework passes it
  int n = 0, c = 0, h = 0, w_ = 0, k = 0, r = 0, oh = 0, ow = 0;
  size_t elem = 4;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv_base) cudnnDestroyConvolutionDescriptor(conv_base);
    if (conv_v) cudnnDestroyConvolutionDescriptor(conv_v);
  }
  size_t x_bytes() const { return size_t(n) * c * h * w_ * elem; }
  size_t y_bytes() const { return size_t(n) * k * oh * ow * elem; }
  size_t w_bytes() const { return size_t(k) * c * r * r * elem; }
};

void make_descriptors(Descriptors& d, const Layer& l, int batch, bool bf16) {
  const cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  const cudnnTensorFormat_t fmt = bf16 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const cudnnMathType_t math = bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
  d.elem = bf16 ? 2 : 4;
  d.n = batch, d.c = l.c, d.h = l.hw, d.w_ = l.hw, d.k = l.k, d.r = l.r;
  CUDNN_OK(cudnnCreateTensorDescriptor(&d.x));
  CUDNN_OK(cudnnCreateTensorDescriptor(&d.y));
  CUDNN_OK(cudnnCreateFilterDescriptor(&d.w));
  CUDNN_OK(cudnnCreateConvolutionDescriptor(&d.conv_base));
  CUDNN_OK(cudnnCreateConvolutionDescriptor(&d.conv_v));
  CUDNN_OK(cudnnSetTensor4dDescriptor(d.x, fmt, dt, d.n, d.c, d.h, d.w_));
  CUDNN_OK(cudnnSetFilter4dDescriptor(d.w, dt, fmt, d.k, d.c, d.r, d.r));
  for (auto cd : {d.conv_base, d.conv_v}) {
    CUDNN_OK(cudnnSetConvolution2dDescriptor(cd, l.pad, l.pad, l.stride, l.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    CUDNN_OK(cudnnSetConvolutionMathType(cd, math));
  }
  int on = 0, oc = 0;
  CUDNN_OK(cudnnGetConvolution2dForwardOutputDim(d.conv_base, d.x, d.w, &on, &oc, &d.oh, &d.ow));
  if (on != d.n || oc != d.k) throw Failure("unexpected output dimensions");
  CUDNN_OK(cudnnSetTensor4dDescriptor(d.y, fmt, dt, d.n, d.k, d.oh, d.ow));
}

// ---------------------------------------------------------------------------------------------------------------
// vcudnn, loaded RTLD_LOCAL: its exported cudnn* hooks stay invisible to this program's own cudnn* calls.

struct Vcudnn {
  decltype(&::vcudnnCreate) create = nullptr;
  decltype(&::vcudnnDestroy) destroy = nullptr;
  decltype(&::vcudnnSetStream) set_stream = nullptr;
  decltype(&::vcudnnConvolutionForward) fwd = nullptr;
  decltype(&::vcudnnConvolutionBackwardData) bwd_data = nullptr;
  decltype(&::vcudnnConvolutionBackwardFilter) bwd_filter = nullptr;
  decltype(&::vcudnnGetConvolutionPlanInfo) plan_info = nullptr;
  decltype(&::vcudnnGetVersionString) version = nullptr;  // optional
};

template <typename F>
void load_symbol(void* lib, const char* name, F& f, bool required = true) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && required) die(std::string("libvcudnn.so lacks ") + name);
}

Vcudnn load_vcudnn(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("cannot load " + path + ": " + dlerror());
  Vcudnn v;
  load_symbol(lib, "vcudnnCreate", v.create);
  load_symbol(lib, "vcudnnDestroy", v.destroy);
  load_symbol(lib, "vcudnnSetStream", v.set_stream);
  load_symbol(lib, "vcudnnConvolutionForward", v.fwd);
  load_symbol(lib, "vcudnnConvolutionBackwardData", v.bwd_data);
  load_symbol(lib, "vcudnnConvolutionBackwardFilter", v.bwd_filter);
  load_symbol(lib, "vcudnnGetConvolutionPlanInfo", v.plan_info);
  load_symbol(lib, "vcudnnGetVersionString", v.version, false);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Convolution kinds.

enum Kind { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };
const char* const kKindNames[] = {"fwd", "bwd_data", "bwd_filter"};

const char* algo_name(Kind kind, int algo) {
  static const char* const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
                                    "WINOGRAD",      "WINOGRAD_NONFUSED"};
  static const char* const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_filter[] = {"ALGO_0",    "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                           "FFT_TILING"};
  switch (kind) {
    case kFwd:
      return algo >= 0 && algo < 8 ? fwd[algo] : "?";
    case kBwdData:
      return algo >= 0 && algo < 6 ? bwd_data[algo] : "?";
    case kBwdFilter:
      return algo >= 0 && algo < 7 ? bwd_filter[algo] : "?";
  }
  return "?";
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "DEFAULT";
    case CUDNN_TENSOR_OP_MATH:
      return "TENSOR_OP";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "TENSOR_OP_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
      return "FMA";
  }
  return "?";
}

struct Row {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnMathType_t math;
};

template <typename Perf>
std::vector<Row> to_rows(const Perf* perf, int n) {
  std::vector<Row> rows;
  for (int i = 0; i < n; ++i)
    rows.push_back(Row{static_cast<int>(perf[i].algo), perf[i].status, perf[i].time, perf[i].memory, perf[i].mathType});
  return rows;
}

// The buffers of one layer. Inputs (x, w, dy) are filled once with a small constant and never written, so every
// call sees the same data; each kind writes its own output (y, dx, dw).
struct Buffers {
  DeviceBuffer x, w, dy, y, dx, dw;
};

// One measurement context: the real cuDNN handle and vcudnn's handle on the same stream.
struct Ctx {
  cudnnHandle_t h = nullptr;
  vcudnnHandle_t vh = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  Vcudnn v;
  void* ws = nullptr;  // the baseline's workspace: `limit` bytes
  size_t limit = 0;
  int rounds = 5, reps = 10;
};

const float kOne = 1.0f, kZero = 0.0f;

std::vector<Row> find_rows(Ctx& c, Kind kind, Descriptors& d, Buffers& b) {
  int max_count = 0, returned = 0;
  switch (kind) {
    case kFwd: {
      CUDNN_OK(cudnnGetConvolutionForwardAlgorithmMaxCount(c.h, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
      CUDNN_OK(cudnnFindConvolutionForwardAlgorithmEx(c.h, d.x, b.x.p, d.w, b.w.p, d.conv_base, d.y, b.y.p, max_count,
                                                      &returned, perf.data(), c.ws, c.limit));
      return to_rows(perf.data(), returned);
    }
    case kBwdData: {
      CUDNN_OK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(c.h, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
      CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithmEx(c.h, d.w, b.w.p, d.y, b.dy.p, d.conv_base, d.x, b.dx.p,
                                                           max_count, &returned, perf.data(), c.ws, c.limit));
      return to_rows(perf.data(), returned);
    }
    case kBwdFilter: {
      CUDNN_OK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(c.h, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
      CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithmEx(c.h, d.x, b.x.p, d.y, b.dy.p, d.conv_base, d.w, b.dw.p,
                                                             max_count, &returned, perf.data(), c.ws, c.limit));
      return to_rows(perf.data(), returned);
    }
  }
  return {};
}

cudnnStatus_t run_baseline(Ctx& c, Kind kind, Descriptors& d, Buffers& b, const Row& row) {
  void* ws = row.memory ? c.ws : nullptr;
  switch (kind) {
    case kFwd:
      return cudnnConvolutionForward(c.h, &kOne, d.x, b.x.p, d.w, b.w.p, d.conv_base,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(row.algo), ws, row.memory, &kZero, d.y,
                                     b.y.p);
    case kBwdData:
      return cudnnConvolutionBackwardData(c.h, &kOne, d.w, b.w.p, d.y, b.dy.p, d.conv_base,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(row.algo), ws, row.memory, &kZero,
                                          d.x, b.dx.p);
    case kBwdFilter:
      return cudnnConvolutionBackwardFilter(c.h, &kOne, d.x, b.x.p, d.y, b.dy.p, d.conv_base,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(row.algo), ws, row.memory,
                                            &kZero, d.w, b.dw.p);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// vcudnn supplies the workspace: none is passed. The algorithm passed is the zero-workspace one a framework with no
// workspace would name (algo 0); the microbatch policy replaces it with its plan.
cudnnStatus_t run_vcudnn(Ctx& c, Kind kind, Descriptors& d, Buffers& b, vcudnnLayerId_t id) {
  switch (kind) {
    case kFwd:
      return c.v.fwd(c.vh, &kOne, d.x, b.x.p, d.w, b.w.p, d.conv_v, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr,
                     0, &kZero, d.y, b.y.p, id);
    case kBwdData:
      return c.v.bwd_data(c.vh, &kOne, d.w, b.w.p, d.y, b.dy.p, d.conv_v, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0,
                          &kZero, d.x, b.dx.p, id);
    case kBwdFilter:
      return c.v.bwd_filter(c.vh, &kOne, d.x, b.x.p, d.y, b.dy.p, d.conv_v, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                            nullptr, 0, &kZero, d.w, b.dw.p, id);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// Milliseconds per call of K back-to-back calls on the stream; throws (after draining the stream) on a failed call.
double time_reps(Ctx& c, const std::function<cudnnStatus_t()>& call, const char* who) {
  CUDA_OK(cudaEventRecord(c.e0, c.s));
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  for (int i = 0; i < c.reps && st == CUDNN_STATUS_SUCCESS; ++i) st = call();
  CUDA_OK(cudaEventRecord(c.e1, c.s));
  CUDA_OK(cudaEventSynchronize(c.e1));
  if (st != CUDNN_STATUS_SUCCESS) throw Failure(std::string(who) + " call failed: " + cudnnGetErrorString(st));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, c.e0, c.e1));
  return static_cast<double>(ms) / c.reps;
}

// Linear-interpolated quantile.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// Measures one (layer, kind). Never throws: failures land in the row's "error" fields.
json measure(Ctx& c, const Net& net, const Layer& l, Kind kind, bool bf16, vcudnnLayerId_t id) {
  json row = {{"net", net.name},
              {"layer", l.name},
              {"kind", kKindNames[kind]},
              {"dtype", bf16 ? "bf16" : "fp32"},
              {"limit", c.limit},
              {"batch", net.batch},
              {"count", l.count},
              {"shape", {{"c", l.c}, {"k", l.k}, {"r", l.r}, {"stride", l.stride}, {"pad", l.pad}, {"hw", l.hw}}}};
  json base = {{"algo", nullptr}, {"workspace", nullptr}, {"ms", nullptr}, {"p25", nullptr}, {"p75", nullptr}};
  json vc = {{"micro_batches", nullptr}, {"first_algo", nullptr},  {"workspace", nullptr}, {"predicted_ms", nullptr},
             {"fallback", nullptr},      {"description", nullptr}, {"ms", nullptr},        {"p25", nullptr},
             {"p75", nullptr},           {"plan_ms", nullptr}};
  row["ratio"] = nullptr;
  try {
    Descriptors d;
    make_descriptors(d, l, net.batch, bf16);
    row["shape"]["out_hw"] = d.oh;
    Buffers b;
    // 0x3c in every byte: ~0.0115 as fp32 (0x3c3c3c3c) and as bf16 (0x3c3c); no NaN, no denormal.
    b.x = DeviceBuffer(d.x_bytes(), 0x3c);
    b.w = DeviceBuffer(d.w_bytes(), 0x3c);
    b.dy = DeviceBuffer(d.y_bytes(), 0x3c);
    b.y = DeviceBuffer(kind == kFwd ? d.y_bytes() : 0);
    b.dx = DeviceBuffer(kind == kBwdData ? d.x_bytes() : 0);
    b.dw = DeviceBuffer(kind == kBwdFilter ? d.w_bytes() : 0);
    CUDA_OK(cudaDeviceSynchronize());

    // Baseline: cuDNN's own search under the limit.
    auto t0 = Clock::now();
    std::vector<Row> rows = find_rows(c, kind, d, b);
    CUDA_OK(cudaDeviceSynchronize());
    base["find_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const Row* best = nullptr;
    int fitting = 0;
    json all = json::array();
    for (const auto& r : rows) {
      all.push_back({{"algo", r.algo},
                     {"status", static_cast<int>(r.status)},
                     {"ms", r.time},
                     {"memory", r.memory},
                     {"math", math_name(r.math)}});
      if (r.status != CUDNN_STATUS_SUCCESS || r.memory > c.limit || r.time < 0) continue;
      ++fitting;
      if (!best || r.time < best->time) best = &r;
    }
    base["find_rows"] = all;
    if (!best) throw Failure("cuDNN found no algorithm that succeeds within the limit");
    const Row chosen = *best;
    CUDNN_OK(cudnnSetConvolutionMathType(d.conv_base, chosen.math));
    base["algo"] = chosen.algo;
    base["algo_name"] = algo_name(kind, chosen.algo);
    base["math"] = math_name(chosen.math);
    base["workspace"] = chosen.memory;
    base["find_row_ms"] = chosen.time;
    base["candidates"] = fitting;
    auto baseline_call = [&] { return run_baseline(c, kind, d, b, chosen); };
    CUDNN_OK(baseline_call());  // warm-up
    CUDA_OK(cudaStreamSynchronize(c.s));

    // vcudnn: the first call plans.
    bool v_ok = true;
    try {
      CUDA_OK(cudaDeviceSynchronize());
      t0 = Clock::now();
      cudnnStatus_t st = run_vcudnn(c, kind, d, b, id);
      cudaError_t ce = cudaDeviceSynchronize();
      vc["plan_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      check_cuda(ce, "cudaDeviceSynchronize after the first vcudnn call");
      check_cudnn(st, "first vcudnn call (plans)");
      vcudnnPlanInfo_t info{};
      cudnnStatus_t pst = c.v.plan_info(static_cast<vcudnnConvKind_t>(kind), d.x, d.w, d.conv_v, d.y, &info);
      if (pst == CUDNN_STATUS_SUCCESS) {
        info.description[sizeof info.description - 1] = '\0';
        vc["micro_batches"] = info.microBatches;
        vc["first_algo"] = info.firstAlgo;
        vc["first_algo_name"] = algo_name(kind, info.firstAlgo);
        vc["workspace"] = info.workspaceBytes;
        vc["predicted_ms"] = info.predictedMs;
        vc["fallback"] = info.fallback != 0;
        vc["description"] = info.description;
      } else {
        vc["plan_info_error"] =
            std::string("vcudnnGetConvolutionPlanInfo: ") + cudnnGetErrorString(pst) +
            (pst == CUDNN_STATUS_NOT_SUPPORTED ? " (no plan: is VCUDNN_POLICY=microbatch set?)" : "");
      }
      check_cudnn(run_vcudnn(c, kind, d, b, id), "vcudnn warm-up call");
      CUDA_OK(cudaStreamSynchronize(c.s));
    } catch (const Failure& e) {
      vc["error"] = e.what();
      v_ok = false;
    }

    std::vector<double> tb, tv;
    for (int r = 0; r < c.rounds; ++r) {
      const bool base_first = r % 2 == 0;
      for (int side = 0; side < 2; ++side) {
        const bool is_base = (side == 0) == base_first;
        if (is_base) {
          tb.push_back(time_reps(c, baseline_call, "baseline"));
        } else if (v_ok) {
          try {
            tv.push_back(time_reps(
                c, [&] { return run_vcudnn(c, kind, d, b, id); }, "vcudnn"));
          } catch (const Failure& e) {
            vc["error"] = e.what();
            v_ok = false;
          }
        }
      }
    }
    base["ms"] = quantile(tb, 0.5);
    base["p25"] = quantile(tb, 0.25);
    base["p75"] = quantile(tb, 0.75);
    base["rounds_ms"] = tb;
    if (v_ok && !tv.empty()) {
      vc["ms"] = quantile(tv, 0.5);
      vc["p25"] = quantile(tv, 0.25);
      vc["p75"] = quantile(tv, 0.75);
      vc["rounds_ms"] = tv;
      if (quantile(tb, 0.5) > 0) row["ratio"] = quantile(tv, 0.5) / quantile(tb, 0.5);
    }
  } catch (const Failure& e) {
    row["error"] = e.what();
  }
  row["baseline"] = base;
  row["vcudnn"] = vc;
  // A failure that broke the CUDA context makes every later measurement meaningless: stop.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    row["fatal"] = std::string("CUDA context unusable: ") + cudaGetErrorString(e);
  }
  return row;
}

std::string fmt_ms(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v.get<double>());
  return buf;
}

void progress(int i, int total, const json& row) {
  const json& b = row["baseline"];
  const json& v = row["vcudnn"];
  std::string line;
  for (const std::string& part :
       {std::string("["), std::to_string(i), std::string("/"), std::to_string(total), std::string("] "),
        row["net"].get<std::string>(), std::string(" "), row["layer"].get<std::string>(), std::string(" "),
        row["kind"].get<std::string>(), std::string(": ")})
    line.append(part);
  if (row.contains("error")) {
    line += "ERROR " + row["error"].get<std::string>();
  } else {
    char buf[256];
    std::snprintf(buf, sizeof buf, "cuDNN %s %.1f MiB %s ms | vcudnn ", b.value("algo_name", "?").c_str(),
                  mib(b["workspace"].get<size_t>()), fmt_ms(b["ms"]).c_str());
    line += buf;
    if (v.contains("error")) {
      line += "ERROR " + v["error"].get<std::string>();
    } else {
      line += (v["description"].is_string() ? v["description"].get<std::string>() : std::string("(no plan info)")) +
              " " + fmt_ms(v["ms"]) + " ms";
      if (row["ratio"].is_number()) {
        std::snprintf(buf, sizeof buf, " ratio %.3f", row["ratio"].get<double>());
        line += buf;
      }
      line += " (plan " + fmt_ms(v["plan_ms"]) + " ms)";
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) die("bad byte count: " + s);
  double mul = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mul = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mul = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    die("bad byte count: " + s);
  return static_cast<size_t>(v * mul);
}

std::string self_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string p(buf);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

void usage() {
  std::fprintf(stderr,
               "usage: vcudnn_bench_microbatch [--net alexnet|resnet50|vgg16|all] [--dtype fp32|bf16] [--limit BYTES]\n"
               "       [--rounds R] [--reps K] [--json FILE] [--vcudnn PATH] [--quick] [--list]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string net_arg = "all", dtype = "fp32", json_path, vcudnn_path = self_dir() + "/libvcudnn.so";
  size_t limit = 64ull << 20;
  int rounds = 5, reps = 10;
  bool quick = false, list = false;  // --list: print the layers and exit (no GPU needed)
  std::string cmdline;
  for (int i = 0; i < argc; ++i) {
    if (i) cmdline.push_back(' ');
    cmdline.append(argv[i]);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--net")
      net_arg = value();
    else if (a == "--dtype")
      dtype = value();
    else if (a == "--limit")
      limit = parse_bytes(value());
    else if (a == "--rounds")
      rounds = std::atoi(value().c_str());
    else if (a == "--reps")
      reps = std::atoi(value().c_str());
    else if (a == "--json")
      json_path = value();
    else if (a == "--vcudnn")
      vcudnn_path = value();
    else if (a == "--quick")
      quick = true;
    else if (a == "--list")
      list = true;
    else
      usage();
  }
  if (dtype != "fp32" && dtype != "bf16") usage();
  if (rounds < 1 || reps < 1) usage();
  const bool bf16 = dtype == "bf16";

  std::vector<Net> nets;
  if (quick) {
    Net a = alexnet();
    a.layers.resize(2);
    nets.push_back(a);
  } else {
    if (net_arg == "alexnet" || net_arg == "all") nets.push_back(alexnet());
    if (net_arg == "resnet50" || net_arg == "all") nets.push_back(resnet50());
    if (net_arg == "vgg16" || net_arg == "all") nets.push_back(vgg16());
    if (nets.empty()) usage();
  }

  if (list) {
    for (const auto& n : nets)
      for (const auto& l : n.layers)
        std::printf(
            "%s\n",
            json({{"net", n.name}, {"batch", n.batch}, {"layer", l.name}, {"count", l.count}, {"first", l.first}})
                .dump()
                .c_str());
    return 0;
  }

  std::FILE* out = stdout;
  if (!json_path.empty()) {
    out = std::fopen(json_path.c_str(), "a");
    if (!out) die("cannot open " + json_path + ": " + std::strerror(errno));
  }
  auto emit = [&](const json& j) {
    std::fprintf(out, "%s\n", j.dump().c_str());
    std::fflush(out);
  };

  const char* policy = std::getenv("VCUDNN_POLICY");
  if (!policy || std::string(policy) != "microbatch")
    std::fprintf(stderr, "warning: VCUDNN_POLICY is %s, not microbatch: vcudnn will make no plans\n",
                 policy ? policy : "unset");
  if (const char* env_limit = std::getenv("VCUDNN_WORKSPACE_LIMIT"); env_limit && parse_bytes(env_limit) != limit)
    std::fprintf(stderr, "warning: VCUDNN_WORKSPACE_LIMIT=%s differs from --limit %zu\n", env_limit, limit);

  Ctx c;
  c.limit = limit;
  c.rounds = rounds;
  c.reps = reps;
  try {
    int dev = 0;
    CUDA_OK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    int driver = 0, runtime = 0;
    CUDA_OK(cudaDriverGetVersion(&driver));
    CUDA_OK(cudaRuntimeGetVersion(&runtime));
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&cudnnConvolutionForward), &info);
    const std::string cudnn_path = info.dli_fname ? info.dli_fname : "?";

    c.v = load_vcudnn(vcudnn_path);
    CUDA_OK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&c.e0));
    CUDA_OK(cudaEventCreate(&c.e1));
    CUDNN_OK(cudnnCreate(&c.h));
    CUDNN_OK(cudnnSetStream(c.h, c.s));
    CUDNN_OK(c.v.create(&c.vh));
    CUDNN_OK(c.v.set_stream(c.vh, c.s));
    if (limit) CUDA_OK(cudaMalloc(&c.ws, limit));

    int total = 0;
    for (const auto& n : nets)
      for (const auto& l : n.layers) total += l.first ? 2 : 3;
    json layers = json::object();
    for (const auto& n : nets) layers[n.name] = n.layers.size();
    auto env = [](const char* k) -> json {
      const char* v = std::getenv(k);
      return v ? json(v) : json(nullptr);
    };
    emit({{"header", true},
          {"gpu", prop.name},
          {"sm_count", prop.multiProcessorCount},
          {"cc", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"memory_bytes", prop.totalGlobalMem},
          {"driver_version", driver},
          {"runtime_version", runtime},
          {"cudnn_version", cudnnGetVersion()},
          {"cudnn_cudart_version", cudnnGetCudartVersion()},
          {"cudnn_library", cudnn_path},
          {"vcudnn_library", vcudnn_path},
          {"vcudnn_version", c.v.version ? c.v.version() : "?"},
          {"env",
           {{"VCUDNN_POLICY", env("VCUDNN_POLICY")},
            {"VCUDNN_WORKSPACE_LIMIT", env("VCUDNN_WORKSPACE_LIMIT")},
            {"VCUDNN_BATCH_POLICY", env("VCUDNN_BATCH_POLICY")},
            {"VCUDNN_CACHE", env("VCUDNN_CACHE")}}},
          {"limit", limit},
          {"dtype", dtype},
          {"rounds", rounds},
          {"reps", reps},
          {"layers", layers},
          {"measurements", total},
          {"command", cmdline}});
    std::fprintf(stderr, "%s, cuDNN %zu, %s, limit %.0f MiB: %d measurements\n", prop.name, cudnnGetVersion(),
                 dtype.c_str(), mib(limit), total);

    int i = 0;
    for (size_t ni = 0; ni < nets.size(); ++ni) {
      const Net& n = nets[ni];
      for (size_t li = 0; li < n.layers.size(); ++li) {
        const Layer& l = n.layers[li];
        const vcudnnLayerId_t id = (ni + 1) * 1000 + li + 1;  // one per (net, layer); fwd and backward share it
        for (Kind kind : {kFwd, kBwdData, kBwdFilter}) {
          if (kind == kBwdData && l.first) continue;
          json row = measure(c, n, l, kind, bf16, id);
          emit(row);
          progress(++i, total, row);
          if (row.contains("fatal")) die(row["fatal"].get<std::string>());
        }
      }
    }
    if (c.ws) cudaFree(c.ws);
    check_cudnn(c.v.destroy(c.vh), "vcudnnDestroy");
    CUDNN_OK(cudnnDestroy(c.h));
    cudaEventDestroy(c.e0);
    cudaEventDestroy(c.e1);
    cudaStreamDestroy(c.s);
  } catch (const Failure& e) {
    die(e.what());
  }
  if (out != stdout) std::fclose(out);
  return 0;
}
