/* vcudnn public API.
 *
 * Two ways to use vcudnn:
 *  1. Unmodified programs: LD_PRELOAD=libvcudnn.so. Nothing from this header is needed; a program
 *     that wants to mark iterations can look up vcudnnIterationBoundary with dlsym(RTLD_DEFAULT).
 *  2. Framework source: hold a vcudnnHandle_t (C) or a vcudnn::Handle (C++) where the code held a
 *     cudnnHandle_t, and link -lvcudnn. The convolution entry points then take an optional layer
 *     id, which names the layer in vcudnn's trace (and, later, its plan).
 *
 * Compared with µ-cuDNN's UcudnnHandle_t: vcudnnHandle_t is an opaque pointer, so it survives a
 * round trip through void* (TensorFlow keeps handles as void*); copying it copies a reference,
 * never a cuDNN handle; every call is safe from several threads on different handles; layer ids
 * are explicit, never a partial hash of the shape; and it targets the cuDNN 9 API.
 */
#ifndef VCUDNN_VCUDNN_H_
#define VCUDNN_VCUDNN_H_

#include <cudnn.h>
#include <stdint.h>

#if defined(__GNUC__)
#define VCUDNN_API __attribute__((visibility("default")))
#else
#define VCUDNN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vcudnnContext* vcudnnHandle_t;
/* Identifies a layer across iterations; any value but VCUDNN_ANY_LAYER. */
typedef uint64_t vcudnnLayerId_t;
#define VCUDNN_ANY_LAYER ((vcudnnLayerId_t)0)

VCUDNN_API const char* vcudnnGetVersionString(void);

/* Marks the end of an iteration (call it after each optimizer step). Once called, vcudnn stops
 * detecting iterations by itself and uses these marks. */
VCUDNN_API void vcudnnIterationBoundary(void);

VCUDNN_API cudnnStatus_t vcudnnCreate(vcudnnHandle_t* handle);
VCUDNN_API cudnnStatus_t vcudnnDestroy(vcudnnHandle_t handle);
/* The cuDNN handle inside, for every cuDNN function vcudnn does not wrap (NULL for NULL). */
VCUDNN_API cudnnHandle_t vcudnnGetCudnnHandle(vcudnnHandle_t handle);
VCUDNN_API cudnnStatus_t vcudnnSetStream(vcudnnHandle_t handle, cudaStream_t stream);
VCUDNN_API cudnnStatus_t vcudnnGetStream(vcudnnHandle_t handle, cudaStream_t* stream);

VCUDNN_API cudnnStatus_t vcudnnConvolutionForward(
    vcudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnTensorDescriptor_t yDesc, void* y, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnConvolutionBackwardData(
    vcudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc, const void* w,
    const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionBwdDataAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnTensorDescriptor_t dxDesc, void* dx, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnConvolutionBackwardFilter(
    vcudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnFilterDescriptor_t dwDesc, void* dw, vcudnnLayerId_t layer);

VCUDNN_API cudnnStatus_t vcudnnGetConvolutionForwardAlgorithm_v7(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardDataAlgorithm_v7(
    vcudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardFilterAlgorithm_v7(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults, vcudnnLayerId_t layer);

VCUDNN_API cudnnStatus_t vcudnnFindConvolutionForwardAlgorithm(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnFindConvolutionBackwardDataAlgorithm(
    vcudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnFindConvolutionBackwardFilterAlgorithm(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults, vcudnnLayerId_t layer);

VCUDNN_API cudnnStatus_t vcudnnFindConvolutionForwardAlgorithmEx(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnFilterDescriptor_t wDesc,
    const void* w, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, void* y,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults,
    void* workSpace, size_t workSpaceSizeInBytes, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnFindConvolutionBackwardDataAlgorithmEx(
    vcudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void* dx,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults,
    void* workSpace, size_t workSpaceSizeInBytes, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnFindConvolutionBackwardFilterAlgorithmEx(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void* dw,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults,
    void* workSpace, size_t workSpaceSizeInBytes, vcudnnLayerId_t layer);

VCUDNN_API cudnnStatus_t vcudnnGetConvolutionForwardWorkspaceSize(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo,
    size_t* sizeInBytes, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardDataWorkspaceSize(
    vcudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes, vcudnnLayerId_t layer);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardFilterWorkspaceSize(
    vcudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes, vcudnnLayerId_t layer);

VCUDNN_API cudnnStatus_t vcudnnGetConvolutionForwardAlgorithmMaxCount(vcudnnHandle_t handle, int* count);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardDataAlgorithmMaxCount(vcudnnHandle_t handle, int* count);
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionBackwardFilterAlgorithmMaxCount(vcudnnHandle_t handle, int* count);

/* Micro-batching (VCUDNN_POLICY=microbatch): the plan vcudnn made for one convolution. */
typedef enum {
  VCUDNN_CONV_FORWARD = 0,
  VCUDNN_CONV_BACKWARD_DATA = 1,
  VCUDNN_CONV_BACKWARD_FILTER = 2
} vcudnnConvKind_t;

typedef struct {
  int microBatches;      /* cuDNN calls per convolution (1 = undivided) */
  int firstAlgo;         /* algorithm of the first micro-batch */
  size_t workspaceBytes; /* workspace the plan needs (vcudnn supplies it) */
  float predictedMs;     /* sum of the measured times of its micro-batches */
  int fallback;          /* 1: nothing measured fitted the limit; a zero-workspace algorithm runs undivided */
  char description[256]; /* e.g. "2x(algo 1, 128): 3.1 ms, 24.0 MiB" */
} vcudnnPlanInfo_t;

/* The plan for the convolution described in layer terms: xDesc is the input (dx for backward-data),
 * wDesc the filter (dw for backward-filter), yDesc the output (dy for the backward kinds).
 * CUDNN_STATUS_NOT_SUPPORTED when there is none (another policy, or that convolution has not run
 * yet); CUDNN_STATUS_BAD_PARAM for a NULL info or undecodable descriptors. Works for programs
 * that preload vcudnn too (look it up with dlsym). */
VCUDNN_API cudnnStatus_t vcudnnGetConvolutionPlanInfo(vcudnnConvKind_t kind, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc, vcudnnPlanInfo_t* info);

/* The same for a graph-API execution plan (CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) that vcudnn took
 * over, PyTorch's default path (its workspace size read as 0: it exceeded VCUDNN_WORKSPACE_LIMIT).
 * firstAlgo is the global index of the first micro-batch's engine, -1 with fallback 1 when the
 * caller's own plan runs (with a workspace of its own size, supplied by vcudnn). predictedMs is 0
 * then. CUDNN_STATUS_NOT_SUPPORTED when vcudnn did not take the plan over (it fits the limit, or
 * another policy) or the plan has not run yet; CUDNN_STATUS_BAD_PARAM for a NULL info. */
VCUDNN_API cudnnStatus_t vcudnnGetExecutionPlanInfo(cudnnBackendDescriptor_t plan, vcudnnPlanInfo_t* info);

/* Memory ownership (VCUDNN_POLICY=offload): what vcudnn's device arena holds. Byte counts are
 * physical device memory unless named otherwise. */
typedef struct {
  int active;                    /* 1: vcudnn serves the process's cudaMalloc and cudaFree calls */
  uint64_t budgetBytes;          /* VCUDNN_DEVICE_BUDGET (0: none) */
  uint64_t mappedBytes;          /* device memory mapped into the arena now */
  uint64_t peakMappedBytes;      /* most ever mapped at once (never above budgetBytes) */
  uint64_t liveBytes;            /* requested bytes of buffers not freed (evicted included) */
  uint64_t cachedBytes;          /* freed memory kept mapped (idle) for reuse by any size */
  uint64_t evictedBytes;         /* bytes of live buffers held on the host now */
  uint64_t hostBudgetBytes;      /* VCUDNN_HOST_BUDGET: pinned host memory reserved for evictions */
  uint64_t allocations;          /* cudaMalloc / cudaMallocAsync served */
  uint64_t frees;                /* cudaFree / cudaFreeAsync served */
  uint64_t cacheHits;            /* allocations served from freed memory without mapping any */
  uint64_t failedAllocations;    /* answered cudaErrorMemoryAllocation */
  uint64_t evictions;            /* buffers moved to the host */
  uint64_t restores;             /* buffers brought back (fault-ins included) */
  uint64_t faultIns;             /* restores forced by an access to an evicted buffer */
  uint64_t bytesEvicted;         /* total device-to-host bytes */
  uint64_t bytesRestored;        /* total host-to-device bytes */
  uint64_t trackedCalls;         /* calls whose pointers were checked (launches, memcpy, libraries) */
  uint64_t trackedHits;          /* buffer accesses found in them */
  uint64_t foreignAllocations;   /* allocations passed through unserved (managed, host, driver API) */
  double fragmentation;          /* 1 - resident live bytes / mapped bytes */
  uint64_t hostWaits;            /* times the host waited (on one event; never the whole device) */
  uint64_t streamWaits;          /* stream-ordered waits made instead of host waits */
  uint64_t evictionsStarted;     /* copies to the host started (some cancelled by an access) */
  uint64_t evictionsCancelled;   /* evictions an access cancelled before the memory went */
  uint64_t freshBytes;           /* device memory mapped anew by allocations, ever */
  uint64_t trimmedBytes;         /* idle memory unmapped to make room, ever */
} vcudnnMemoryStats_t;

/* Fills *stats; CUDNN_STATUS_BAD_PARAM for NULL. Works under LD_PRELOAD (look it up with dlsym);
 * under other policies active is 0 and the rest is zero. */
VCUDNN_API cudnnStatus_t vcudnnGetMemoryStats(vcudnnMemoryStats_t* stats);
/* Starts peakMappedBytes again from what is mapped now (as torch.cuda.reset_peak_memory_stats does
 * for PyTorch's pool), so that a program can measure its steady state after a warm-up.
 * CUDNN_STATUS_NOT_SUPPORTED when vcudnn does not own memory. */
VCUDNN_API cudnnStatus_t vcudnnResetMemoryPeak(void);

/* Test and tool hooks on one owned buffer (the address cudaMalloc* returned): move it to the host
 * now / bring it back now. CUDNN_STATUS_BAD_PARAM for an address vcudnn does not own, or a buffer
 * below one granule (never evicted); CUDNN_STATUS_NOT_SUPPORTED when eviction is off (no
 * ownership, no device budget, a CUDA graph seen, a pinned or library buffer);
 * CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED when the host budget cannot take it;
 * CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED when the device budget cannot hold it
 * again. Evicting an evicted buffer or restoring a resident one succeeds and does nothing. */
VCUDNN_API cudnnStatus_t vcudnnEvictBuffer(const void* address);
VCUDNN_API cudnnStatus_t vcudnnRestoreBuffer(const void* address);

#ifdef __cplusplus
} /* extern "C" */

/* Define VCUDNN_C_API_ONLY to get the C API alone in C++ (no vcudnn::Handle, no overloads). */
#ifndef VCUDNN_C_API_ONLY
#include <cstddef>

namespace vcudnn {

using LayerId = vcudnnLayerId_t;
inline constexpr LayerId kAnyLayer = VCUDNN_ANY_LAYER;

// Holds a vcudnnHandle_t where framework code held a cudnnHandle_t. It is a reference, like
// cudnnHandle_t itself: copy it freely; cudnnCreate(&h) / cudnnDestroy(h) own the handle.
class Handle {
 public:
  Handle() = default;
  Handle(std::nullptr_t) {}  // NOLINT: frameworks initialise handles with nullptr
  explicit Handle(vcudnnHandle_t h) : h_(h) {}
  // For handles kept as void* (TensorFlow): the same handle comes back, nothing is created.
  explicit Handle(void* opaque) : h_(static_cast<vcudnnHandle_t>(opaque)) {}

  vcudnnHandle_t get() const { return h_; }
  void* opaque() const { return h_; }
  // Any cuDNN function vcudnn does not wrap accepts the handle as is.
  operator cudnnHandle_t() const { return vcudnnGetCudnnHandle(h_); }  // NOLINT
  explicit operator bool() const { return h_ != nullptr; }
  vcudnnHandle_t* out() { return &h_; }

 private:
  vcudnnHandle_t h_ = nullptr;
};

}  // namespace vcudnn

// Overloads with cuDNN's own names, so that changing the handle's type is the only edit a
// framework needs; the trailing layer id is optional.
inline cudnnStatus_t cudnnCreate(vcudnn::Handle* handle) { return vcudnnCreate(handle->out()); }
inline cudnnStatus_t cudnnDestroy(vcudnn::Handle handle) { return vcudnnDestroy(handle.get()); }
inline cudnnStatus_t cudnnSetStream(vcudnn::Handle handle, cudaStream_t stream) {
  return vcudnnSetStream(handle.get(), stream);
}
inline cudnnStatus_t cudnnGetStream(vcudnn::Handle handle, cudaStream_t* stream) {
  return vcudnnGetStream(handle.get(), stream);
}

inline cudnnStatus_t cudnnConvolutionForward(vcudnn::Handle h, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                             const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionFwdAlgo_t algo, void* ws, size_t wsSize,
                                             const void* beta, const cudnnTensorDescriptor_t yDesc, void* y,
                                             vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnConvolutionForward(h.get(), alpha, xDesc, x, wDesc, w, convDesc, algo, ws, wsSize, beta, yDesc, y,
                                  layer);
}
inline cudnnStatus_t cudnnConvolutionBackwardData(vcudnn::Handle h, const void* alpha,
                                                  const cudnnFilterDescriptor_t wDesc, const void* w,
                                                  const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                  const cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t wsSize,
                                                  const void* beta, const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                  vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnConvolutionBackwardData(h.get(), alpha, wDesc, w, dyDesc, dy, convDesc, algo, ws, wsSize, beta, dxDesc,
                                       dx, layer);
}
inline cudnnStatus_t cudnnConvolutionBackwardFilter(vcudnn::Handle h, const void* alpha,
                                                    const cudnnTensorDescriptor_t xDesc, const void* x,
                                                    const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                    const cudnnConvolutionDescriptor_t convDesc,
                                                    cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t wsSize,
                                                    const void* beta, const cudnnFilterDescriptor_t dwDesc, void* dw,
                                                    vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnConvolutionBackwardFilter(h.get(), alpha, xDesc, x, dyDesc, dy, convDesc, algo, ws, wsSize, beta,
                                         dwDesc, dw, layer);
}

inline cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, const int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionForwardAlgorithm_v7(h.get(), xDesc, wDesc, convDesc, yDesc, requested, returned, perf,
                                                 layer);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    vcudnn::Handle h, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionBackwardDataAlgorithm_v7(h.get(), wDesc, dyDesc, convDesc, dxDesc, requested, returned,
                                                      perf, layer);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionBackwardFilterAlgorithm_v7(h.get(), xDesc, dyDesc, convDesc, dwDesc, requested, returned,
                                                        perf, layer);
}

inline cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, const int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionForwardAlgorithm(h.get(), xDesc, wDesc, convDesc, yDesc, requested, returned, perf,
                                               layer);
}
inline cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(
    vcudnn::Handle h, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionBackwardDataAlgorithm(h.get(), wDesc, dyDesc, convDesc, dxDesc, requested, returned,
                                                    perf, layer);
}
inline cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionBackwardFilterAlgorithm(h.get(), xDesc, dyDesc, convDesc, dwDesc, requested, returned,
                                                      perf, layer);
}

inline cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnFilterDescriptor_t wDesc,
    const void* w, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, void* y,
    const int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t wsSize,
    vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionForwardAlgorithmEx(h.get(), xDesc, x, wDesc, w, convDesc, yDesc, y, requested, returned,
                                                 perf, ws, wsSize, layer);
}
inline cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    vcudnn::Handle h, const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void* dx,
    const int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, size_t wsSize,
    vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionBackwardDataAlgorithmEx(h.get(), wDesc, w, dyDesc, dy, convDesc, dxDesc, dx, requested,
                                                      returned, perf, ws, wsSize, layer);
}
inline cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void* dw,
    const int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, size_t wsSize,
    vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnFindConvolutionBackwardFilterAlgorithmEx(h.get(), xDesc, x, dyDesc, dy, convDesc, dwDesc, dw,
                                                        requested, returned, perf, ws, wsSize, layer);
}

inline cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnFilterDescriptor_t wDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnTensorDescriptor_t yDesc,
                                                             cudnnConvolutionFwdAlgo_t algo, size_t* size,
                                                             vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionForwardWorkspaceSize(h.get(), xDesc, wDesc, convDesc, yDesc, algo, size, layer);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    vcudnn::Handle h, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* size, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionBackwardDataWorkspaceSize(h.get(), wDesc, dyDesc, convDesc, dxDesc, algo, size, layer);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    vcudnn::Handle h, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* size, vcudnn::LayerId layer = vcudnn::kAnyLayer) {
  return vcudnnGetConvolutionBackwardFilterWorkspaceSize(h.get(), xDesc, dyDesc, convDesc, dwDesc, algo, size, layer);
}

inline cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(vcudnn::Handle h, int* count) {
  return vcudnnGetConvolutionForwardAlgorithmMaxCount(h.get(), count);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(vcudnn::Handle h, int* count) {
  return vcudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), count);
}
inline cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(vcudnn::Handle h, int* count) {
  return vcudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.get(), count);
}

#endif /* VCUDNN_C_API_ONLY */
#endif /* __cplusplus */

#endif /* VCUDNN_VCUDNN_H_ */
