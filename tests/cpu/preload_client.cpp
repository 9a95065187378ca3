// A program run under LD_PRELOAD=libvcudnn.so by preload_test.cpp; needs no GPU. Like PyTorch, it
// loads cuDNN itself with RTLD_LOCAL, so vcudnn cannot find it through RTLD_NEXT.
//   statuses: calls hooked functions with arguments cuDNN rejects (or, for cudnnCreate, cannot
//             serve without a GPU) through the global symbol (the hook when preloaded) and through
//             the library's own symbol, and prints both statuses; exit 1 if any differ. The
//             Get*_v7 and Find* (non-Ex) calls are left out: real cuDNN 9.19 crashes on a null
//             handle there (the [gpu] tests cover them).
//   tracked:  the same for functions hooked only to track their device pointers (generated
//             tracked_*.cpp and library_hooks.cpp), cuDNN, cuBLAS and cuBLASLt, the last two also
//             loaded RTLD_LOCAL; also prints whether there are global symbols at all and whether
//             each is another function than the library's own (all_interposed).
//   self:     loads no cuDNN and calls one hooked function, so vcudnn must load cuDNN itself
//             (VCUDNN_CUDNN_LIBRARY); prints the status.
//   dlsym:    loads the driver library named by argv[2] (the toolkit's stub libcuda.so, RTLD_LOCAL)
//             and looks up functions on its handle as Triton's launcher does; prints whether a
//             hooked name came back as the preloaded hook, an unhooked one as the library's own,
//             RTLD_NEXT from this program still meant "after this program", and a missing name
//             still set dlerror.
//   nccl:     loads libnccl.so.2 RTLD_LOCAL (as PyTorch's libraries do) and calls NCCL's hooked
//             functions with a null communicator (rejected without a GPU), alone and inside groups,
//             through the global symbols; prints each status, and whether the global symbols are
//             other functions than the library's own (interposed). nccl-real: the same through the
//             library's own symbols. preload_test.cpp compares the two runs' statuses (one process
//             each: NCCL keeps a group's error for the thread's next group).
//   none:     calls nothing.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

void* g_cudnn = nullptr;
void* g_lib = nullptr;  // where real_fn looks: g_cudnn, or cuBLAS / cuBLASLt in the tracked mode
bool g_all_equal = true;
bool g_all_interposed = true;

template <typename Fn>
Fn real_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(g_lib ? g_lib : g_cudnn, name));
}

template <typename Fn>
Fn global_fn(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  return p ? reinterpret_cast<Fn>(p) : real_fn<Fn>(name);
}

void report(const char* fn, int hooked, int real) {
  std::printf("%s hooked=%d real=%d\n", fn, hooked, real);
  if (hooked != real) g_all_equal = false;
}

// Calls `name` (of type Fn) through the global symbol and through the library's own, reports both.
#define BOTH_AS(Fn, name, ...)                                                                      \
  do {                                                                                              \
    auto hooked = global_fn<Fn>(name);                                                              \
    auto real = real_fn<Fn>(name);                                                                  \
    if (!hooked || !real) {                                                                         \
      std::printf("%s missing\n", name);                                                            \
      g_all_equal = false;                                                                          \
      break;                                                                                        \
    }                                                                                               \
    if (reinterpret_cast<void*>(hooked) == reinterpret_cast<void*>(real)) g_all_interposed = false; \
    report(name, hooked(__VA_ARGS__), real(__VA_ARGS__));                                           \
  } while (0)
#define BOTH(fn, ...) BOTH_AS(decltype(&::fn), #fn, __VA_ARGS__)

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

void* load_local(const char* soname) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) std::printf("cannot load %s: %s\n", soname, dlerror());
  return h;
}

void tracked_cudnn() {
  g_lib = g_cudnn;
  cudnnTensorDescriptor_t x = nullptr, bn = nullptr;
  real_fn<decltype(&::cudnnCreateTensorDescriptor)>("cudnnCreateTensorDescriptor")(&x);
  real_fn<decltype(&::cudnnCreateTensorDescriptor)>("cudnnCreateTensorDescriptor")(&bn);
  auto set4d = real_fn<decltype(&::cudnnSetTensor4dDescriptor)>("cudnnSetTensor4dDescriptor");
  set4d(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 8, 8);
  set4d(bn, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 1, 1);
  float one = 1, zero = 0;
  double mean_factor = 0.1;
  BOTH(cudnnBatchNormalizationForwardInference, nullptr, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, nullptr, x, nullptr,
       bn, nullptr, nullptr, nullptr, nullptr, 1e-5);
  BOTH(cudnnBatchNormalizationForwardTraining, nullptr, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, nullptr, x, nullptr,
       bn, nullptr, nullptr, mean_factor, nullptr, nullptr, 1e-5, nullptr, nullptr);
  BOTH(cudnnAddTensor, nullptr, &one, bn, nullptr, &one, x, nullptr);
  BOTH(cudnnSetTensor, nullptr, x, nullptr, &zero);
  BOTH(cudnnBackendExecute, nullptr, nullptr, nullptr);

  // A real variant pack (no GPU needed): setting its pointers succeeds, a wrong type does not.
  auto create = real_fn<decltype(&::cudnnBackendCreateDescriptor)>("cudnnBackendCreateDescriptor");
  cudnnBackendDescriptor_t pack = nullptr, other = nullptr;
  create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &other);
  void* pointers[2] = {&one, &zero};
  int64_t ids[2] = {1, 2};
  BOTH(cudnnBackendSetAttribute, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 2, ids);
  BOTH(cudnnBackendSetAttribute, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 2, pointers);
  BOTH(cudnnBackendSetAttribute, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, pointers);
  BOTH(cudnnBackendSetAttribute, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_INT64, 1, ids);
  BOTH(cudnnBackendExecute, nullptr, nullptr, pack);
  // Destroyed once each: the hook one descriptor, the real library the other.
  auto destroy_hooked = global_fn<decltype(&::cudnnBackendDestroyDescriptor)>("cudnnBackendDestroyDescriptor");
  auto destroy_real = real_fn<decltype(&::cudnnBackendDestroyDescriptor)>("cudnnBackendDestroyDescriptor");
  if (reinterpret_cast<void*>(destroy_hooked) == reinterpret_cast<void*>(destroy_real)) g_all_interposed = false;
  report("cudnnBackendDestroyDescriptor", destroy_hooked(pack), destroy_real(other));

  cudnnDropoutDescriptor_t dropout = nullptr;
  real_fn<decltype(&::cudnnCreateDropoutDescriptor)>("cudnnCreateDropoutDescriptor")(&dropout);
  BOTH(cudnnSetDropoutDescriptor, dropout, nullptr, 0.5f, nullptr, 0, 42);
}

void tracked_cublas() {
  g_lib = load_local("libcublas.so.13");
  if (!g_lib) {
    g_all_equal = false;
    return;
  }
  float one = 1, zero = 0;
  BOTH(cublasSgemm_v2, nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, nullptr, 2, nullptr, 2, &zero, nullptr, 2);
  // cublas_api.h overloads cublasGemmEx for C++: the exported one takes a cublasComputeType_t.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  BOTH_AS(GemmEx, "cublasGemmEx", nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, nullptr, CUDA_R_32F, 2, nullptr,
          CUDA_R_32F, 2, &zero, nullptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  BOTH(cublasSetWorkspace_v2, nullptr, &one, sizeof(one));
}

void tracked_cublaslt() {
  g_lib = load_local("libcublasLt.so.13");
  if (!g_lib) {
    g_all_equal = false;
    return;
  }
  float one = 1, zero = 0;
  BOTH(cublasLtMatmul, nullptr, nullptr, &one, nullptr, nullptr, nullptr, nullptr, &zero, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, 0, nullptr);
  // A real descriptor (host memory only): an 8-byte pointer attribute is accepted, a short one not.
  cublasLtMatmulDesc_t desc = nullptr;
  real_fn<decltype(&::cublasLtMatmulDescCreate)>("cublasLtMatmulDescCreate")(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  void* bias = &one;
  BOTH(cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  BOTH(cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, 4);
  real_fn<decltype(&::cublasLtMatmulDescDestroy)>("cublasLtMatmulDescDestroy")(desc);
}

int run_tracked() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  g_cudnn = load_local("libcudnn.so.9");
  if (!g_cudnn) return 2;
  std::printf("global_symbols=%s\n", dlsym(RTLD_DEFAULT, "cudnnBackendExecute") ? "yes" : "no");
  tracked_cudnn();
  tracked_cublas();
  tracked_cublaslt();
  std::printf("all_interposed=%s\n", g_all_interposed ? "yes" : "no");
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

std::string file_of(void* p) {
  Dl_info info{};
  return p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : "";
}

int run_dlsym(const char* driver) {
  void* h = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  void* hook = dlsym(RTLD_DEFAULT, "cuLaunchKernelEx");  // the preloaded library's
  void* launch = dlsym(h, "cuLaunchKernelEx");
  void* query = dlsym(h, "cuPointerGetAttribute");
  void* init = dlsym(h, "cuInit");                     // not hooked
  void* proc = dlsym(h, "cuGetProcAddress_v2");        // the runtime's own lookups keep the driver's
  void* next = dlsym(RTLD_NEXT, "cuLaunchKernelEx");   // the next object after this program: the preload
  dlerror();
  void* missing = dlsym(h, "cuNoSuchFunction");
  const char* error = dlerror();
  std::printf("hook_found=%d\n", hook != nullptr);
  std::printf("launch_is_hook=%d\n", launch && launch == hook);
  std::printf("query_is_hook=%d\n", query && query == dlsym(RTLD_DEFAULT, "cuPointerGetAttribute"));
  std::printf("unhooked_is_driver=%d\n", init && file_of(init) == file_of(dlsym(h, "cuDriverGetVersion")) &&
                                           file_of(init).find("libcuda") != std::string::npos);
  std::printf("proc_is_driver=%d\n", proc && file_of(proc).find("libcuda") != std::string::npos);
  std::printf("rtld_next_is_hook=%d\n", next && next == hook);
  std::printf("missing_sets_error=%d\n", missing == nullptr && error != nullptr);
  return 0;
}

// NCCL's functions as the C ABI has them (enums are ints), so that no nccl.h is needed.
using NcclComm = void*;
using NcclBuffers = int (*)(const void*, void*, size_t, int, int, NcclComm, void*);       // AllReduce
using NcclOne = int (*)(const void*, size_t, int, int, NcclComm, void*);                  // Send, Recv, Bcast
using NcclGroup = int (*)();
using NcclPreMulSum = int (*)(int*, void*, int, int, NcclComm);
using NcclRegister = int (*)(NcclComm, void*, size_t, void**);

int run_nccl(bool hooked) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  void* nccl = load_local("libnccl.so.2");
  if (!nccl) return 3;
  bool interposed = true;
  auto fn = [&](const char* name) {
    void* own = dlsym(nccl, name);
    void* global = dlsym(RTLD_DEFAULT, name);
    if (!global || global == own) interposed = false;
    return hooked && global ? global : own;
  };
  const auto all_reduce = reinterpret_cast<NcclBuffers>(fn("ncclAllReduce"));
  const auto send = reinterpret_cast<NcclOne>(fn("ncclSend"));
  const auto recv = reinterpret_cast<NcclOne>(fn("ncclRecv"));
  const auto start = reinterpret_cast<NcclGroup>(fn("ncclGroupStart"));
  const auto end = reinterpret_cast<NcclGroup>(fn("ncclGroupEnd"));
  const auto pre_mul_sum = reinterpret_cast<NcclPreMulSum>(fn("ncclRedOpCreatePreMulSum"));
  const auto reg = reinterpret_cast<NcclRegister>(fn("ncclCommRegister"));
  if (!all_reduce || !send || !recv || !start || !end || !pre_mul_sum || !reg) {
    std::printf("missing NCCL functions\n");
    return 2;
  }
  constexpr int kFloat32 = 7, kSum = 0, kScalarDevice = 0;
  float data[4] = {1, 2, 3, 4};
  int op = 0;
  void* handle = nullptr;
  std::printf("interposed=%s\n", interposed ? "yes" : "no");
  std::printf("ncclAllReduce=%d\n", all_reduce(data, data, 4, kFloat32, kSum, nullptr, nullptr));
  std::printf("ncclSend=%d\n", send(data, 4, kFloat32, 1, nullptr, nullptr));
  std::printf("ncclRecv=%d\n", recv(data, 4, kFloat32, 1, nullptr, nullptr));
  int r[4];  // statuses in call order (a function's arguments are evaluated in no set order)
  r[0] = start();
  r[1] = end();
  std::printf("empty group=%d,%d\n", r[0], r[1]);
  r[0] = start();
  r[1] = start();
  r[2] = end();
  r[3] = end();
  std::printf("nested empty groups=%d,%d,%d,%d\n", r[0], r[1], r[2], r[3]);
  r[0] = start();
  r[1] = all_reduce(data, data + 1, 2, kFloat32, kSum, nullptr, nullptr);
  r[2] = end();
  std::printf("group of ncclAllReduce=%d,%d,%d\n", r[0], r[1], r[2]);
  std::printf("ncclRedOpCreatePreMulSum=%d\n", pre_mul_sum(&op, data, kFloat32, kScalarDevice, nullptr));
  std::printf("ncclCommRegister=%d\n", reg(nullptr, data, sizeof(data), &handle));
  return 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "statuses";
  if (mode == "dlsym") return argc > 2 ? run_dlsym(argv[2]) : 2;
  if (mode == "statuses") return run_statuses();
  if (mode == "tracked") return run_tracked();
  if (mode == "self") return run_self();
  if (mode == "nccl" || mode == "nccl-real") return run_nccl(mode == "nccl");
  if (mode == "none") return 0;
  std::printf("unknown mode %s\n", mode.c_str());
  return 2;
}
