// Micro-batching per layer: cuDNN's best undivided algorithm under a workspace limit vs vcudnn's plan.
// The program links real cuDNN and calls it directly for the baseline (cudnnFind*AlgorithmEx with a workspace of
// `limit` bytes, fastest row that succeeded and fits); it dlopen()s libvcudnn.so RTLD_LOCAL and calls the vcudnn*
// C API for the other side, so only those calls go through vcudnn, whose policy comes from the environment
// (VCUDNN_POLICY=microbatch VCUDNN_WORKSPACE_LIMIT=<limit>, set by scripts/bench/microbatch). The first vcudnn call
// of a convolution plans (benchmarks or reads the cache): timed as plan_ms. Then R rounds, each K back-to-back calls
// of either side timed with events on one stream, the order alternating between rounds.
// Writes one JSON object per line: a header, then one per (net, layer, kind).
//   usage: vcudnn_bench_microbatch [--net alexnet|resnet50|vgg16|all] [--dtype fp32|bf16] [--limit BYTES]
//          [--rounds R] [--reps K] [--batch N] [--json FILE] [--vcudnn PATH] [--quick] [--list]
#include <cuda_runtime_api.h>
#include <cudnn.h>

#define VCUDNN_C_API_ONLY
#include <vcudnn/vcudnn.h>

#include <string>
#include <vector>

#include "conv_nets.h"
#include "layer_bench.h"

namespace {

using namespace vcudnn::bench;

// ---------------------------------------------------------------------------------------------------------------
// Descriptors.

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
  decltype(&::vcudnnIterationBoundary) boundary = nullptr;  // optional
};

Vcudnn load_library(const std::string& path) {
  void* lib = open_vcudnn(path);
  Vcudnn v;
  load_symbol(lib, "vcudnnCreate", v.create);
  load_symbol(lib, "vcudnnDestroy", v.destroy);
  load_symbol(lib, "vcudnnSetStream", v.set_stream);
  load_symbol(lib, "vcudnnConvolutionForward", v.fwd);
  load_symbol(lib, "vcudnnConvolutionBackwardData", v.bwd_data);
  load_symbol(lib, "vcudnnConvolutionBackwardFilter", v.bwd_filter);
  load_symbol(lib, "vcudnnGetConvolutionPlanInfo", v.plan_info);
  load_symbol(lib, "vcudnnGetVersionString", v.version, false);
  load_symbol(lib, "vcudnnIterationBoundary", v.boundary, false);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Convolution kinds.

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
struct Ctx : BenchCtx {
  cudnnHandle_t h = nullptr;
  vcudnnHandle_t vh = nullptr;
  Vcudnn v;

  // bench_main's hooks.
  void load_vcudnn(const std::string& path) {
    v = load_library(path);
    iteration_boundary = v.boundary;
  }
  void describe(json&) {}
  json measure(const std::vector<Net>& nets, size_t ni, size_t li, Kind kind, bool bf16);
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

// Measures one (layer, kind). Never throws: failures land in the row's "error" fields.
json measure(Ctx& c, const Net& net, const Layer& l, Kind kind, bool bf16, vcudnnLayerId_t id) {
  json row = row_start(net, l, kind, bf16, c.limit);
  json base = null_fields({"algo", "workspace", "ms", "p25", "p75"});
  json vc = null_fields({"micro_batches", "first_algo", "workspace", "predicted_ms", "fallback", "description", "ms",
                         "p25", "p75", "plan_ms"});
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
      cudnnStatus_t st = first_call_as_iteration(c, [&] { return run_vcudnn(c, kind, d, b, id); });
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

    time_rounds(
        c, baseline_call, [&] { return run_vcudnn(c, kind, d, b, id); }, v_ok, row, base, vc);
  } catch (const Failure& e) {
    row["error"] = e.what();
  }
  finish_row(row, std::move(base), std::move(vc));
  return row;
}

json Ctx::measure(const std::vector<Net>& nets, size_t ni, size_t li, Kind kind, bool bf16) {
  const vcudnnLayerId_t id = (ni + 1) * 1000 + li + 1;  // one per (net, layer); fwd and backward share it
  return ::measure(*this, nets[ni], nets[ni].layers[li], kind, bf16, id);
}

}  // namespace

int main(int argc, char** argv) { return bench_main<Ctx>(argc, argv, "vcudnn_bench_microbatch"); }
