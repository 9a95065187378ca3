// GPU test client: runs convolutions forward, backward-data and backward-filter in a training
// order for several iterations, on several threads (one handle and one stream each), and prints
// a hash of every output plus every algorithm query result. Built twice: plain cuDNN (run with and
// without LD_PRELOAD=libvcudnn.so) and, with VCUDNN_WRAPPED, through vcudnn::Handle. The test
// (passthrough_test.cpp) requires all three to print the same lines.
//   usage: vcudnn_conv_client [--threads N] [--iters N] [--boundary]
// Inputs are random (fixed seeds), outputs are poisoned with NaN before each computation, and
// algorithms are cuDNN's heuristic choice restricted to deterministic ones, so that equal lines
// mean bitwise-equal results.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "tests/gpu/client_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifdef VCUDNN_WRAPPED
#include "vcudnn/vcudnn.h"
using Handle = vcudnn::Handle;
#define LAYER_ARG(id) , static_cast<vcudnn::LayerId>(id)
#else
using Handle = cudnnHandle_t;
#define LAYER_ARG(id)
#endif

using vcudnn::test::packed_strides;

namespace {

struct LayerSpec {
  cudnnDataType_t dtype;
  cudnnTensorFormat_t format;
  std::vector<int> x;       // N, C, spatial...
  int k;                    // output channels
  std::vector<int> kernel;  // spatial
  std::vector<int> pad, stride, dilation;
  int groups;
  cudnnMathType_t math;
  float fwd_alpha = 1, bwdf_beta = 0;  // beta 1: accumulate dw over iterations (Caffe style)
};

std::vector<LayerSpec> layer_specs() {
  return {
      {CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, {8, 16, 32, 32}, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, CUDNN_DEFAULT_MATH},
      {CUDNN_DATA_FLOAT,
       CUDNN_TENSOR_NCHW,
       {8, 32, 32, 32},
       64,
       {1, 1},
       {0, 0},
       {2, 2},
       {1, 1},
       1,
       CUDNN_DEFAULT_MATH,
       0.5f},
      {CUDNN_DATA_HALF,
       CUDNN_TENSOR_NHWC,
       {8, 32, 16, 16},
       32,
       {3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       1,
       CUDNN_TENSOR_OP_MATH},
      {CUDNN_DATA_BFLOAT16,
       CUDNN_TENSOR_NCHW,
       {4, 16, 16, 16},
       16,
       {5, 5},
       {4, 4},
       {1, 1},
       {2, 2},
       1,
       CUDNN_TENSOR_OP_MATH},
      {CUDNN_DATA_FLOAT,
       CUDNN_TENSOR_NCHW,
       {8, 32, 16, 16},
       32,
       {3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       4,
       CUDNN_DEFAULT_MATH,
       1.0f,
       1.0f},
      {CUDNN_DATA_FLOAT,
       CUDNN_TENSOR_NCHW,
       {2, 8, 8, 8, 8},
       8,
       {3, 3, 3},
       {1, 1, 1},
       {1, 1, 1},
       {1, 1, 1},
       1,
       CUDNN_DEFAULT_MATH},
  };
}

size_t elem_size(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }

uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ULL;
  return h;
}

size_t count_nan(const std::vector<unsigned char>& bytes, cudnnDataType_t t) {
  size_t n = 0;
  if (t == CUDNN_DATA_FLOAT) {
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float f;
      std::memcpy(&f, &bytes[i], 4);
      n += std::isnan(f);
    }
    return n;
  }
  for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
    uint16_t b;
    std::memcpy(&b, &bytes[i], 2);
    bool nan = t == CUDNN_DATA_HALF ? ((b & 0x7c00) == 0x7c00 && (b & 0x3ff)) : ((b & 0x7f80) == 0x7f80 && (b & 0x7f));
    n += nan;
  }
  return n;
}

size_t count(const std::vector<int>& dims) {
  size_t n = 1;
  for (int d : dims) n *= d;
  return n;
}

struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
};

Buffer device_random(size_t n, cudnnDataType_t t, uint32_t seed, cudaStream_t s) {
  Buffer b{nullptr, n * elem_size(t), t};
  CHECK_CUDA(cudaMalloc(&b.ptr, b.bytes));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<unsigned char> host(b.bytes);
  for (size_t i = 0; i < n; ++i) {
    float v = dist(rng);
    if (t == CUDNN_DATA_FLOAT) std::memcpy(&host[4 * i], &v, 4);
    if (t == CUDNN_DATA_HALF) {
      __half h = __float2half(v);
      std::memcpy(&host[2 * i], &h, 2);
    }
    if (t == CUDNN_DATA_BFLOAT16) {
      __nv_bfloat16 h = __float2bfloat16(v);
      std::memcpy(&host[2 * i], &h, 2);
    }
  }
  CHECK_CUDA(cudaMemcpyAsync(b.ptr, host.data(), b.bytes, cudaMemcpyHostToDevice, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  return b;
}

Buffer device_empty(size_t n, cudnnDataType_t t) {
  Buffer b{nullptr, n * elem_size(t), t};
  CHECK_CUDA(cudaMalloc(&b.ptr, b.bytes));
  return b;
}

std::mutex g_print_mu;
std::vector<std::string> g_lines;

void emit(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_print_mu);
  g_lines.push_back(line);
}

template <typename Perf>
std::string perf_list(const Perf* p, int n) {
  std::ostringstream os;
  for (int i = 0; i < n; ++i) os << (i ? "," : "") << p[i].algo << ":" << p[i].status << ":" << p[i].determinism;
  return os.str();
}

template <typename Perf>
int pick_deterministic(const Perf* p, int n) {
  for (int i = 0; i < n; ++i)
    if (p[i].status == CUDNN_STATUS_SUCCESS && p[i].determinism == CUDNN_DETERMINISTIC &&
        p[i].memory <= (size_t(256) << 20))
      return static_cast<int>(p[i].algo);
  std::fprintf(stderr, "no deterministic algorithm\n");
  std::exit(1);
}

struct Layer {
  LayerSpec spec;
  int id = 0;
  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  cudnnConvolutionDescriptor_t cd = nullptr;
  std::vector<int> ydims, wdims;
  Buffer x, w, dy, y, dx, dw;
  int fwd_algo = 0, bwd_data_algo = 0, bwd_filter_algo = 0;
};

void describe(Layer& L) {
  const LayerSpec& s = L.spec;
  const int nb = static_cast<int>(s.x.size());
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&L.xd));
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&L.yd));
  CHECK_CUDNN(cudnnCreateFilterDescriptor(&L.wd));
  CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&L.cd));
  auto xs = packed_strides(s.x, s.format);
  CHECK_CUDNN(cudnnSetTensorNdDescriptor(L.xd, s.dtype, nb, s.x.data(), xs.data()));
  L.wdims = {s.k, s.x[1] / s.groups};
  L.wdims.insert(L.wdims.end(), s.kernel.begin(), s.kernel.end());
  CHECK_CUDNN(cudnnSetFilterNdDescriptor(L.wd, s.dtype, s.format, nb, L.wdims.data()));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CHECK_CUDNN(cudnnSetConvolutionNdDescriptor(L.cd, nb - 2, s.pad.data(), s.stride.data(), s.dilation.data(),
                                              CUDNN_CROSS_CORRELATION, compute));
  CHECK_CUDNN(cudnnSetConvolutionGroupCount(L.cd, s.groups));
  CHECK_CUDNN(cudnnSetConvolutionMathType(L.cd, s.math));
  L.ydims.resize(nb);
  CHECK_CUDNN(cudnnGetConvolutionNdForwardOutputDim(L.cd, L.xd, L.wd, nb, L.ydims.data()));
  auto ys = packed_strides(L.ydims, s.format);
  CHECK_CUDNN(cudnnSetTensorNdDescriptor(L.yd, s.dtype, nb, L.ydims.data(), ys.data()));
}

void run_thread(int t, int iters, bool boundary) {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Handle h;
  CHECK_CUDNN(cudnnCreate(&h));
  CHECK_CUDNN(cudnnSetStream(h, stream));
  cudaStream_t got = nullptr;
  CHECK_CUDNN(cudnnGetStream(h, &got));
  if (got != stream) {
    std::fprintf(stderr, "cudnnGetStream returned another stream\n");
    std::exit(1);
  }
  int max_fwd = 0, max_bd = 0, max_bf = 0;
  CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_fwd));
  CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_bd));
  CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_bf));
  emit("max_count t=" + std::to_string(t) + " fwd=" + std::to_string(max_fwd) + " bwd_data=" + std::to_string(max_bd) +
       " bwd_filter=" + std::to_string(max_bf));

  std::vector<Layer> layers;
  for (const auto& spec : layer_specs()) {
    Layer L;
    L.spec = spec;
    L.id = static_cast<int>(layers.size());
    describe(L);
    const uint32_t seed = 1000u * t + 10u * L.id;
    L.x = device_random(count(spec.x), spec.dtype, seed + 1, stream);
    L.w = device_random(count(L.wdims), spec.dtype, seed + 2, stream);
    L.dy = device_random(count(L.ydims), spec.dtype, seed + 3, stream);
    L.y = device_empty(count(L.ydims), spec.dtype);
    L.dx = device_empty(count(spec.x), spec.dtype);
    L.dw = device_empty(count(L.wdims), spec.dtype);
    layers.push_back(L);
  }

  // Algorithm queries, as a framework makes them before the first iteration.
  size_t ws_bytes = 0;
  void* ws = nullptr;
  const std::string tl = "t=" + std::to_string(t) + " l=";
  for (auto& L : layers) {
    const std::string id = tl + std::to_string(L.id);
    int n = 0;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fp(max_fwd);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> dp(max_bd);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> wp(max_bf);
    CHECK_CUDNN(
        cudnnGetConvolutionForwardAlgorithm_v7(h, L.xd, L.wd, L.cd, L.yd, max_fwd, &n, fp.data() LAYER_ARG(L.id + 1)));
    emit("get_v7 " + id + " fwd n=" + std::to_string(n) + " " + perf_list(fp.data(), n));
    L.fwd_algo = pick_deterministic(fp.data(), n);
    CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, L.wd, L.yd, L.cd, L.xd, max_bd, &n,
                                                            dp.data() LAYER_ARG(L.id + 1)));
    emit("get_v7 " + id + " bwd_data n=" + std::to_string(n) + " " + perf_list(dp.data(), n));
    L.bwd_data_algo = pick_deterministic(dp.data(), n);
    CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, L.xd, L.yd, L.cd, L.wd, max_bf, &n,
                                                              wp.data() LAYER_ARG(L.id + 1)));
    emit("get_v7 " + id + " bwd_filter n=" + std::to_string(n) + " " + perf_list(wp.data(), n));
    L.bwd_filter_algo = pick_deterministic(wp.data(), n);
    size_t a = 0, b = 0, c = 0;
    CHECK_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(
        h, L.xd, L.wd, L.cd, L.yd, static_cast<cudnnConvolutionFwdAlgo_t>(L.fwd_algo), &a LAYER_ARG(L.id + 1)));
    CHECK_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, L.wd, L.yd, L.cd, L.xd, static_cast<cudnnConvolutionBwdDataAlgo_t>(L.bwd_data_algo),
        &b LAYER_ARG(L.id + 1)));
    CHECK_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, L.xd, L.yd, L.cd, L.wd, static_cast<cudnnConvolutionBwdFilterAlgo_t>(L.bwd_filter_algo),
        &c LAYER_ARG(L.id + 1)));
    emit("algos " + id + " fwd=" + std::to_string(L.fwd_algo) + "/" + std::to_string(a) +
         " bwd_data=" + std::to_string(L.bwd_data_algo) + "/" + std::to_string(b) +
         " bwd_filter=" + std::to_string(L.bwd_filter_algo) + "/" + std::to_string(c));
    ws_bytes = std::max({ws_bytes, a, b, c});
  }
  ws_bytes = std::max(ws_bytes, size_t(64) << 20);
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  for (auto& L : layers) {  // benchmark-mode searches: results vary with timing, only the count is printed
    const std::string id = tl + std::to_string(L.id);
    int n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fp(max_fwd);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> dp(max_bd);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> wp(max_bf);
    CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(h, L.xd, L.x.ptr, L.wd, L.w.ptr, L.cd, L.yd, L.y.ptr, max_fwd,
                                                       &n1, fp.data(), ws, ws_bytes LAYER_ARG(L.id + 1)));
    CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(h, L.wd, L.w.ptr, L.yd, L.dy.ptr, L.cd, L.xd, L.dx.ptr,
                                                            max_bd, &n2, dp.data(), ws, ws_bytes LAYER_ARG(L.id + 1)));
    CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, L.xd, L.x.ptr, L.yd, L.dy.ptr, L.cd, L.wd, L.dw.ptr,
                                                              max_bf, &n3, wp.data(), ws,
                                                              ws_bytes LAYER_ARG(L.id + 1)));
    if (L.id == 0)
      CHECK_CUDNN(
          cudnnFindConvolutionForwardAlgorithm(h, L.xd, L.wd, L.cd, L.yd, max_fwd, &n4, fp.data() LAYER_ARG(L.id + 1)));
    if (L.id == 1)
      CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(h, L.wd, L.yd, L.cd, L.xd, max_bd, &n4,
                                                            dp.data() LAYER_ARG(L.id + 1)));
    if (L.id == 2)
      CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(h, L.xd, L.yd, L.cd, L.wd, max_bf, &n4,
                                                              wp.data() LAYER_ARG(L.id + 1)));
    emit("find " + id + " ok=" + std::to_string(n1 > 0 && n2 > 0 && n3 > 0 && (L.id > 2 || n4 > 0)));
  }
  for (auto& L : layers)
    if (L.spec.bwdf_beta != 0) CHECK_CUDA(cudaMemsetAsync(L.dw.ptr, 0, L.dw.bytes, stream));

  const float one = 1, zero = 0;
  for (int it = 0; it < iters; ++it) {
    for (auto& L : layers) {
      CHECK_CUDA(cudaMemsetAsync(L.y.ptr, 0xff, L.y.bytes, stream));  // NaN poison
      const float alpha = L.spec.fwd_alpha;
      CHECK_CUDNN(cudnnConvolutionForward(h, &alpha, L.xd, L.x.ptr, L.wd, L.w.ptr, L.cd,
                                          static_cast<cudnnConvolutionFwdAlgo_t>(L.fwd_algo), ws, ws_bytes, &zero, L.yd,
                                          L.y.ptr LAYER_ARG(L.id + 1)));
    }
    for (auto it_l = layers.rbegin(); it_l != layers.rend(); ++it_l) {
      Layer& L = *it_l;
      if (L.id != 0) {
        CHECK_CUDA(cudaMemsetAsync(L.dx.ptr, 0xff, L.dx.bytes, stream));
        CHECK_CUDNN(cudnnConvolutionBackwardData(h, &one, L.wd, L.w.ptr, L.yd, L.dy.ptr, L.cd,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(L.bwd_data_algo), ws,
                                                 ws_bytes, &zero, L.xd, L.dx.ptr LAYER_ARG(L.id + 1)));
      }
      if (L.spec.bwdf_beta == 0) CHECK_CUDA(cudaMemsetAsync(L.dw.ptr, 0xff, L.dw.bytes, stream));
      const float beta = L.spec.bwdf_beta;
      CHECK_CUDNN(cudnnConvolutionBackwardFilter(h, &one, L.xd, L.x.ptr, L.yd, L.dy.ptr, L.cd,
                                                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(L.bwd_filter_algo), ws,
                                                 ws_bytes, &beta, L.wd, L.dw.ptr LAYER_ARG(L.id + 1)));
    }
#ifdef VCUDNN_WRAPPED
    if (boundary) vcudnnIterationBoundary();
#else
    (void)boundary;
#endif
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());
  for (auto& L : layers) {
    for (auto [name, buf] : {std::pair<const char*, Buffer*>{"y", &L.y}, {"dx", &L.dx}, {"dw", &L.dw}}) {
      if (L.id == 0 && std::string(name) == "dx") continue;
      std::vector<unsigned char> host(buf->bytes);
      CHECK_CUDA(cudaMemcpy(host.data(), buf->ptr, buf->bytes, cudaMemcpyDeviceToHost));
      char line[200];
      std::snprintf(line, sizeof line, "out t=%d l=%d %s hash=%016llx nan=%zu", t, L.id, name,
                    static_cast<unsigned long long>(fnv1a(host)), count_nan(host, buf->dtype));
      emit(line);
    }
    for (Buffer* b : {&L.x, &L.w, &L.dy, &L.y, &L.dx, &L.dw}) CHECK_CUDA(cudaFree(b->ptr));
    cudnnDestroyTensorDescriptor(L.xd);
    cudnnDestroyTensorDescriptor(L.yd);
    cudnnDestroyFilterDescriptor(L.wd);
    cudnnDestroyConvolutionDescriptor(L.cd);
  }
  CHECK_CUDA(cudaFree(ws));
  CHECK_CUDNN(cudnnDestroy(h));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, iters = 4;
  bool boundary = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--boundary")
      boundary = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(run_thread, t, iters, boundary);
  for (auto& th : pool) th.join();
  std::sort(g_lines.begin(), g_lines.end());
  for (const auto& l : g_lines) std::printf("%s\n", l.c_str());
  std::printf("done threads=%d iters=%d\n", threads, iters);
  return 0;
}
