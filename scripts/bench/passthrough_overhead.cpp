// Host cost of an intercepted cuDNN call. In one process (normally under
// LD_PRELOAD=libvcudnn.so) it times the same calls two ways, interleaved round by round:
// through the global symbol (vcudnn's hook when preloaded) and through the real library's own
// symbol (dlsym on libcudnn.so.9: never intercepted). The difference is vcudnn's overhead.
// Many small convolutions keep the GPU side short; every batch is synchronized outside the timing.
// Prints one JSON object.   usage: vcudnn_bench_passthrough [--rounds N] [--batch N]
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(e)                                               \
  do {                                                              \
    cudaError_t s_ = (e);                                           \
    if (s_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #e, cudaGetErrorString(s_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)
#define CHECK_CUDNN(e)                                               \
  do {                                                               \
    cudnnStatus_t s_ = (e);                                          \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                \
      std::fprintf(stderr, "%s: %s\n", #e, cudnnGetErrorString(s_)); \
      std::exit(1);                                                  \
    }                                                                \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

struct Fns {
  decltype(&::cudnnConvolutionForward) conv;
  decltype(&::cudnnSetStream) set_stream;
  decltype(&::cudnnGetConvolutionForwardWorkspaceSize) ws_size;
  decltype(&::cudnnGetConvolutionForwardAlgorithm_v7) get_v7;
};

struct Conv {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t c;
  void *xp, *wp, *yp;
};

Conv make_conv(int n) {
  Conv v{};
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&v.x));
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&v.y));
  CHECK_CUDNN(cudnnCreateFilterDescriptor(&v.w));
  CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&v.c));
  CHECK_CUDNN(cudnnSetTensor4dDescriptor(v.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, 8, 8, 8));
  CHECK_CUDNN(cudnnSetTensor4dDescriptor(v.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, 8, 8, 8));
  CHECK_CUDNN(cudnnSetFilter4dDescriptor(v.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 8, 8, 3, 3));
  CHECK_CUDNN(cudnnSetConvolution2dDescriptor(v.c, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CHECK_CUDA(cudaMalloc(&v.xp, size_t(n) * 8 * 8 * 8 * 4));
  CHECK_CUDA(cudaMalloc(&v.yp, size_t(n) * 8 * 8 * 8 * 4));
  CHECK_CUDA(cudaMalloc(&v.wp, 8 * 8 * 9 * 4));
  CHECK_CUDA(cudaMemset(v.xp, 0x3c, size_t(n) * 8 * 8 * 8 * 4));
  CHECK_CUDA(cudaMemset(v.wp, 0x3c, 8 * 8 * 9 * 4));
  return v;
}

// Microseconds per call of `call`, run `batch` times, then the stream is drained (untimed).
template <typename F>
double time_batch(int batch, cudaStream_t s, F&& call) {
  auto t0 = Clock::now();
  for (int i = 0; i < batch; ++i) call();
  auto t1 = Clock::now();
  CHECK_CUDA(cudaStreamSynchronize(s));
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / batch;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 100, batch = 200, distinct = 400;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (a == "--batch") batch = std::atoi(argv[i + 1]);
    if (a == "--distinct") distinct = std::atoi(argv[i + 1]);
  }
  void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    std::fprintf(stderr, "libcudnn.so.9 is not loaded\n");
    return 1;
  }
  Fns hooked{&::cudnnConvolutionForward, &::cudnnSetStream, &::cudnnGetConvolutionForwardWorkspaceSize,
             &::cudnnGetConvolutionForwardAlgorithm_v7};
  Fns direct{reinterpret_cast<decltype(&::cudnnConvolutionForward)>(dlsym(lib, "cudnnConvolutionForward")),
             reinterpret_cast<decltype(&::cudnnSetStream)>(dlsym(lib, "cudnnSetStream")),
             reinterpret_cast<decltype(&::cudnnGetConvolutionForwardWorkspaceSize)>(
                 dlsym(lib, "cudnnGetConvolutionForwardWorkspaceSize")),
             reinterpret_cast<decltype(&::cudnnGetConvolutionForwardAlgorithm_v7)>(
                 dlsym(lib, "cudnnGetConvolutionForwardAlgorithm_v7"))};
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(hooked.conv), &info);
  const std::string hooked_in = info.dli_fname ? info.dli_fname : "?";

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudnnHandle_t h;
  CHECK_CUDNN(direct.set_stream ? cudnnCreate(&h) : CUDNN_STATUS_NOT_INITIALIZED);
  CHECK_CUDNN(cudnnSetStream(h, s));
  Conv v = make_conv(1);
  const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  const float one = 1, zero = 0;
  auto conv = [&](const Fns& f, const Conv& c) {
    return f.conv(h, &one, c.x, c.xp, c.w, c.wp, c.c, algo, nullptr, 0, &zero, c.y, c.yp);
  };
  CHECK_CUDNN(conv(direct, v));
  CHECK_CUDA(cudaStreamSynchronize(s));

  // While vcudnn records (no iteration has repeated yet): convolutions of distinct shapes, first
  // run once directly so that cuDNN's own first-use costs stay out of both timings.
  std::vector<Conv> shapes;
  for (int n = 2; n < distinct + 2; ++n) shapes.push_back(make_conv(n));
  for (const auto& c : shapes) CHECK_CUDNN(conv(direct, c));
  CHECK_CUDA(cudaStreamSynchronize(s));
  double rec_hooked = 0, rec_direct = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool use_hooked = pass == 0;
    auto t0 = Clock::now();
    for (const auto& c : shapes) conv(use_hooked ? hooked : direct, c);
    auto t1 = Clock::now();
    CHECK_CUDA(cudaStreamSynchronize(s));
    (use_hooked ? rec_hooked : rec_direct) = std::chrono::duration<double, std::micro>(t1 - t0).count() / distinct;
  }
  // Mark the end of that "iteration" the way a framework linked to vcudnn would, so that the
  // recorder stops and what follows measures the steady state.
  if (auto boundary = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "vcudnnIterationBoundary"))) boundary();

  struct Series {
    const char* name;
    std::vector<double> hooked, direct;
  };
  std::vector<Series> series{
      {"conv_fwd", {}, {}}, {"set_stream", {}, {}}, {"ws_size", {}, {}}, {"get_algo_v7", {}, {}}};
  size_t ws = 0;
  int n_algo = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[16];
  for (int r = 0; r < rounds + 2; ++r) {  // two warm-up rounds
    for (int order = 0; order < 2; ++order) {
      const bool hooked_first = (r % 2 == 0) == (order == 0);
      const Fns& f = hooked_first ? hooked : direct;
      double a = time_batch(batch, s, [&] { conv(f, v); });
      double b = time_batch(batch, s, [&] { f.set_stream(h, s); });
      double c = time_batch(batch, s, [&] { f.ws_size(h, v.x, v.w, v.c, v.y, algo, &ws); });
      double d = time_batch(batch / 10, s, [&] { f.get_v7(h, v.x, v.w, v.c, v.y, 16, &n_algo, perf); });
      if (r < 2) continue;
      double vals[4] = {a, b, c, d};
      for (int i = 0; i < 4; ++i) (hooked_first ? series[i].hooked : series[i].direct).push_back(vals[i]);
    }
  }
  CHECK_CUDA(cudaGetLastError());

  nlohmann::json out;
  out["hooked_symbol_in"] = hooked_in;
  out["rounds"] = rounds;
  out["batch"] = batch;
  // Overhead = median of the per-round differences: the two timings of a round are taken back
  // to back, so slow drifts of the machine cancel.
  for (const auto& sr : series) {
    std::vector<double> diff;
    for (size_t i = 0; i < sr.hooked.size(); ++i) diff.push_back(sr.hooked[i] - sr.direct[i]);
    out["calls"][sr.name] = {{"hooked_us", quantile(sr.hooked, 0.5)},
                             {"direct_us", quantile(sr.direct, 0.5)},
                             {"overhead_us", quantile(diff, 0.5)},
                             {"overhead_p25_us", quantile(diff, 0.25)},
                             {"overhead_p75_us", quantile(diff, 0.75)}};
  }
  out["first_calls_distinct_shapes"] = {{"count", distinct},
                                        {"hooked_us", rec_hooked},
                                        {"direct_us", rec_direct},
                                        {"overhead_us", rec_hooked - rec_direct}};
  std::printf("%s\n", out.dump().c_str());
  CHECK_CUDNN(cudnnDestroy(h));
  return 0;
}
