// A program run under LD_PRELOAD=libvcudnn.so by preload_test.cpp; needs no GPU. Like PyTorch, it
// loads cuDNN itself with RTLD_LOCAL, so vcudnn cannot find it through RTLD_NEXT.
//   statuses: calls hooked functions with arguments cuDNN rejects (or, for cudnnCreate, cannot
//             serve without a GPU) through the global symbol (the hook when preloaded) and through
//             the library's own symbol, and prints both statuses; exit 1 if any differ. The
//             Get*_v7 and Find* (non-Ex) calls are left out: real cuDNN 9.19 crashes on a null
//             handle there (the [gpu] tests cover them).
//   self:     loads no cuDNN and calls one hooked function, so vcudnn must load cuDNN itself
//             (VCUDNN_CUDNN_LIBRARY); prints the status.
//   none:     calls nothing.
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

void* g_cudnn = nullptr;
bool g_all_equal = true;

template <typename Fn>
Fn real_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(g_cudnn, name));
}

template <typename Fn>
Fn global_fn(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  return p ? reinterpret_cast<Fn>(p) : real_fn<Fn>(name);
}

#define BOTH(fn, ...)                                   \
  do {                                                  \
    auto hooked = global_fn<decltype(&::fn)>(#fn);      \
    auto real = real_fn<decltype(&::fn)>(#fn);          \
    if (!hooked || !real) {                             \
      std::printf("%s missing\n", #fn);                 \
      g_all_equal = false;                              \
      break;                                            \
    }                                                   \
    int a = hooked(__VA_ARGS__), b = real(__VA_ARGS__); \
    std::printf("%s hooked=%d real=%d\n", #fn, a, b);   \
    if (a != b) g_all_equal = false;                    \
  } while (0)

int run_statuses() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  g_cudnn = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!g_cudnn) {
    std::printf("cannot load libcudnn.so.9: %s\n", dlerror());
    return 2;
  }
  std::printf("interposed=%s\n", dlsym(RTLD_DEFAULT, "cudnnConvolutionForward") ? "yes" : "no");
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t c = nullptr;
  real_fn<decltype(&::cudnnCreateTensorDescriptor)>("cudnnCreateTensorDescriptor")(&x);
  real_fn<decltype(&::cudnnCreateTensorDescriptor)>("cudnnCreateTensorDescriptor")(&y);
  real_fn<decltype(&::cudnnCreateFilterDescriptor)>("cudnnCreateFilterDescriptor")(&w);
  real_fn<decltype(&::cudnnCreateConvolutionDescriptor)>("cudnnCreateConvolutionDescriptor")(&c);
  auto set4d = real_fn<decltype(&::cudnnSetTensor4dDescriptor)>("cudnnSetTensor4dDescriptor");
  set4d(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 8, 8);
  set4d(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 4, 8, 8);
  real_fn<decltype(&::cudnnSetFilter4dDescriptor)>("cudnnSetFilter4dDescriptor")(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                                                 4, 3, 3, 3);
  real_fn<decltype(&::cudnnSetConvolution2dDescriptor)>("cudnnSetConvolution2dDescriptor")(
      c, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);

  cudnnHandle_t h = nullptr;
  float one = 1, zero = 0;
  int n = 0;
  size_t ws = 0;
  cudaStream_t s = nullptr;
  cudnnConvolutionFwdAlgoPerf_t fp[8];
  cudnnConvolutionBwdDataAlgoPerf_t dp[8];
  cudnnConvolutionBwdFilterAlgoPerf_t wp[8];
  cudnnHandle_t created = nullptr;
  BOTH(cudnnCreate, &created);
  BOTH(cudnnSetStream, h, s);
  BOTH(cudnnGetStream, h, &s);
  BOTH(cudnnConvolutionForward, h, &one, x, nullptr, w, nullptr, c, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr,
       0, &zero, y, nullptr);
  BOTH(cudnnConvolutionBackwardData, h, &one, w, nullptr, y, nullptr, c, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, nullptr, 0,
       &zero, x, nullptr);
  BOTH(cudnnConvolutionBackwardFilter, h, &one, x, nullptr, y, nullptr, c, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, nullptr,
       0, &zero, w, nullptr);
  BOTH(cudnnFindConvolutionForwardAlgorithmEx, h, x, nullptr, w, nullptr, c, y, nullptr, 8, &n, fp, nullptr, 0);
  BOTH(cudnnFindConvolutionBackwardDataAlgorithmEx, h, w, nullptr, y, nullptr, c, x, nullptr, 8, &n, dp, nullptr, 0);
  BOTH(cudnnFindConvolutionBackwardFilterAlgorithmEx, h, x, nullptr, y, nullptr, c, w, nullptr, 8, &n, wp, nullptr, 0);
  BOTH(cudnnGetConvolutionForwardWorkspaceSize, h, x, w, c, y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &ws);
  BOTH(cudnnGetConvolutionBackwardDataWorkspaceSize, h, w, y, c, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, &ws);
  BOTH(cudnnGetConvolutionBackwardFilterWorkspaceSize, h, x, y, c, w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, &ws);
  BOTH(cudnnGetConvolutionForwardAlgorithmMaxCount, h, &n);
  BOTH(cudnnGetConvolutionBackwardDataAlgorithmMaxCount, h, &n);
  BOTH(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, h, &n);
  BOTH(cudnnDestroy, h);
  std::printf("all_equal=%s\n", g_all_equal ? "yes" : "no");
  return g_all_equal ? 0 : 1;
}

int run_self() {
  void* p = dlsym(RTLD_DEFAULT, "cudnnGetConvolutionForwardAlgorithmMaxCount");
  if (!p) {
    std::printf("not interposed\n");
    return 2;
  }
  int n = 0;
  int st = reinterpret_cast<decltype(&::cudnnGetConvolutionForwardAlgorithmMaxCount)>(p)(nullptr, &n);
  std::printf("status=%d\n", st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "statuses";
  if (mode == "statuses") return run_statuses();
  if (mode == "self") return run_self();
  if (mode == "none") return 0;
  std::printf("unknown mode %s\n", mode.c_str());
  return 2;
}
