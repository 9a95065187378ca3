// The wrapped-handle C API (include/vcudnn/vcudnn.h). A vcudnnHandle_t owns one real cuDNN
// handle; calls through it take the same path as interposed calls, plus the caller's layer id.
// The C++ overloads would make decltype(&::cudnnCreate) in real_api.h ambiguous here.
#define VCUDNN_C_API_ONLY
#include "vcudnn/vcudnn.h"

#include <cstdio>
#include <memory>

#include "interpose/call_builders.h"
#include "runtime/decode_conv.h"
#include "runtime/memory_manager.h"
#include "runtime/real_api.h"

struct vcudnnContext {
  cudnnHandle_t cudnn = nullptr;
};

using namespace vcudnn;
using namespace vcudnn::interpose;

namespace {

cudnnHandle_t unwrap(vcudnnHandle_t h) { return h ? h->cudnn : nullptr; }

}  // namespace

extern "C" {

const char* vcudnnGetVersionString(void) { return VCUDNN_VERSION; }

void vcudnnIterationBoundary(void) {
  barrier(
      "vcudnnIterationBoundary",
      [] {
        Engine::get().iteration_boundary();
        return 0;
      },
      [] { return 0; }, 0);
}

cudnnStatus_t vcudnnCreate(vcudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  return barrier(
      "vcudnnCreate",
      [&] {
        auto ctx = std::make_unique<vcudnnContext>();
        HookScope scope(HookId::create, /*wrapped=*/true);
        cudnnStatus_t st = Engine::get().create(scope, &ctx->cudnn);
        if (st == CUDNN_STATUS_SUCCESS) *handle = ctx.release();
        return st;
      },
      [] { return CUDNN_STATUS_ALLOC_FAILED; }, CUDNN_STATUS_ALLOC_FAILED);
}

cudnnStatus_t vcudnnDestroy(vcudnnHandle_t handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  std::unique_ptr<vcudnnContext> ctx(handle);
  HookScope scope(HookId::destroy, true);
  const cudnnStatus_t st = guarded(
      scope, "vcudnnDestroy", [&] { return real().cudnnDestroy ? real().cudnnDestroy(ctx->cudnn) : unresolved("cudnnDestroy"); },
      [&] { return Engine::get().destroy(scope, ctx->cudnn); });
  if (st != CUDNN_STATUS_SUCCESS) ctx.release();  // the handle is still alive: keep the wrapper
  return st;
}

cudnnHandle_t vcudnnGetCudnnHandle(vcudnnHandle_t handle) { return unwrap(handle); }

cudnnStatus_t vcudnnSetStream(vcudnnHandle_t handle, cudaStream_t stream) {
  HookScope scope(HookId::set_stream, true);
  return guarded(
      scope, "vcudnnSetStream",
      [&] { return real().cudnnSetStream ? real().cudnnSetStream(unwrap(handle), stream) : unresolved("cudnnSetStream"); },
      [&] { return Engine::get().set_stream(scope, unwrap(handle), stream); });
}

cudnnStatus_t vcudnnGetStream(vcudnnHandle_t handle, cudaStream_t* stream) {
  HookScope scope(HookId::get_stream, true);
  return guarded(
      scope, "vcudnnGetStream",
      [&] { return real().cudnnGetStream ? real().cudnnGetStream(unwrap(handle), stream) : unresolved("cudnnGetStream"); },
      [&] { return Engine::get().get_stream(scope, unwrap(handle), stream); });
}

cudnnStatus_t vcudnnConvolutionForward(vcudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                       const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                       const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                       void* ws, size_t wsSize, const void* beta, const cudnnTensorDescriptor_t yDesc,
                                       void* y, vcudnnLayerId_t layer) {
  return run(HookId::conv_fwd, true,
             forward_call(unwrap(h), alpha, xDesc, x, wDesc, w, convDesc, algo, ws, wsSize, beta, yDesc, y, layer));
}

cudnnStatus_t vcudnnConvolutionBackwardData(vcudnnHandle_t h, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                            const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                            const cudnnConvolutionDescriptor_t convDesc,
                                            cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t wsSize,
                                            const void* beta, const cudnnTensorDescriptor_t dxDesc, void* dx,
                                            vcudnnLayerId_t layer) {
  return run(
      HookId::conv_bwd_data, true,
      backward_data_call(unwrap(h), alpha, wDesc, w, dyDesc, dy, convDesc, algo, ws, wsSize, beta, dxDesc, dx, layer));
}

cudnnStatus_t vcudnnConvolutionBackwardFilter(vcudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                              const void* x, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                              const cudnnConvolutionDescriptor_t convDesc,
                                              cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t wsSize,
                                              const void* beta, const cudnnFilterDescriptor_t dwDesc, void* dw,
                                              vcudnnLayerId_t layer) {
  return run(HookId::conv_bwd_filter, true,
             backward_filter_call(unwrap(h), alpha, xDesc, x, dyDesc, dy, convDesc, algo, ws, wsSize, beta, dwDesc, dw,
                                  layer));
}

cudnnStatus_t vcudnnGetConvolutionForwardAlgorithm_v7(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc, const int requested,
                                                      int* returned, cudnnConvolutionFwdAlgoPerf_t* perf,
                                                      vcudnnLayerId_t layer) {
  return run(HookId::get_algo_v7_fwd, true,
             algo_query(ConvKind::kForward, QueryVariant::kGetV7, unwrap(h), {xDesc, wDesc, convDesc, yDesc}, requested,
                        returned, perf, layer));
}

cudnnStatus_t vcudnnGetConvolutionBackwardDataAlgorithm_v7(vcudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc, const int requested,
                                                           int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf,
                                                           vcudnnLayerId_t layer) {
  return run(HookId::get_algo_v7_bwd_data, true,
             algo_query(ConvKind::kBackwardData, QueryVariant::kGetV7, unwrap(h), {dxDesc, wDesc, convDesc, dyDesc},
                        requested, returned, perf, layer));
}

cudnnStatus_t vcudnnGetConvolutionBackwardFilterAlgorithm_v7(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t dwDesc, const int requested,
                                                             int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf,
                                                             vcudnnLayerId_t layer) {
  return run(HookId::get_algo_v7_bwd_filter, true,
             algo_query(ConvKind::kBackwardFilter, QueryVariant::kGetV7, unwrap(h), {xDesc, dwDesc, convDesc, dyDesc},
                        requested, returned, perf, layer));
}

cudnnStatus_t vcudnnFindConvolutionForwardAlgorithm(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                    const cudnnFilterDescriptor_t wDesc,
                                                    const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t yDesc, const int requested,
                                                    int* returned, cudnnConvolutionFwdAlgoPerf_t* perf,
                                                    vcudnnLayerId_t layer) {
  return run(HookId::find_algo_fwd, true,
             algo_query(ConvKind::kForward, QueryVariant::kFind, unwrap(h), {xDesc, wDesc, convDesc, yDesc}, requested,
                        returned, perf, layer));
}

cudnnStatus_t vcudnnFindConvolutionBackwardDataAlgorithm(vcudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                         const cudnnTensorDescriptor_t dyDesc,
                                                         const cudnnConvolutionDescriptor_t convDesc,
                                                         const cudnnTensorDescriptor_t dxDesc, const int requested,
                                                         int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf,
                                                         vcudnnLayerId_t layer) {
  return run(HookId::find_algo_bwd_data, true,
             algo_query(ConvKind::kBackwardData, QueryVariant::kFind, unwrap(h), {dxDesc, wDesc, convDesc, dyDesc},
                        requested, returned, perf, layer));
}

cudnnStatus_t vcudnnFindConvolutionBackwardFilterAlgorithm(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnFilterDescriptor_t dwDesc, const int requested,
                                                           int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf,
                                                           vcudnnLayerId_t layer) {
  return run(HookId::find_algo_bwd_filter, true,
             algo_query(ConvKind::kBackwardFilter, QueryVariant::kFind, unwrap(h), {xDesc, dwDesc, convDesc, dyDesc},
                        requested, returned, perf, layer));
}

cudnnStatus_t vcudnnFindConvolutionForwardAlgorithmEx(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc, void* y, const int requested,
                                                      int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws,
                                                      size_t wsSize, vcudnnLayerId_t layer) {
  return run(HookId::find_algo_ex_fwd, true,
             find_ex_query(ConvKind::kForward, unwrap(h), {xDesc, wDesc, convDesc, yDesc}, x, w, y, requested, returned,
                           perf, ws, wsSize, layer));
}

cudnnStatus_t vcudnnFindConvolutionBackwardDataAlgorithmEx(vcudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                           const void* w, const cudnnTensorDescriptor_t dyDesc,
                                                           const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                           const int requested, int* returned,
                                                           cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
                                                           size_t wsSize, vcudnnLayerId_t layer) {
  return run(HookId::find_algo_ex_bwd_data, true,
             find_ex_query(ConvKind::kBackwardData, unwrap(h), {dxDesc, wDesc, convDesc, dyDesc}, dx, w, dy, requested,
                           returned, perf, ws, wsSize, layer));
}

cudnnStatus_t vcudnnFindConvolutionBackwardFilterAlgorithmEx(
    vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void* dw,
    const int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, size_t wsSize,
    vcudnnLayerId_t layer) {
  return run(HookId::find_algo_ex_bwd_filter, true,
             find_ex_query(ConvKind::kBackwardFilter, unwrap(h), {xDesc, dwDesc, convDesc, dyDesc}, x, dw, dy,
                           requested, returned, perf, ws, wsSize, layer));
}

cudnnStatus_t vcudnnGetConvolutionForwardWorkspaceSize(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                       const cudnnFilterDescriptor_t wDesc,
                                                       const cudnnConvolutionDescriptor_t convDesc,
                                                       const cudnnTensorDescriptor_t yDesc,
                                                       cudnnConvolutionFwdAlgo_t algo, size_t* size,
                                                       vcudnnLayerId_t layer) {
  return run(HookId::ws_size_fwd, true,
             WorkspaceQuery{
                 ConvKind::kForward, unwrap(h), {xDesc, wDesc, convDesc, yDesc}, static_cast<int>(algo), size, layer});
}

cudnnStatus_t vcudnnGetConvolutionBackwardDataWorkspaceSize(vcudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                            const cudnnTensorDescriptor_t dyDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnTensorDescriptor_t dxDesc,
                                                            cudnnConvolutionBwdDataAlgo_t algo, size_t* size,
                                                            vcudnnLayerId_t layer) {
  return run(
      HookId::ws_size_bwd_data, true,
      WorkspaceQuery{
          ConvKind::kBackwardData, unwrap(h), {dxDesc, wDesc, convDesc, dyDesc}, static_cast<int>(algo), size, layer});
}

cudnnStatus_t vcudnnGetConvolutionBackwardFilterWorkspaceSize(vcudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                              const cudnnTensorDescriptor_t dyDesc,
                                                              const cudnnConvolutionDescriptor_t convDesc,
                                                              const cudnnFilterDescriptor_t gradDesc,
                                                              cudnnConvolutionBwdFilterAlgo_t algo, size_t* size,
                                                              vcudnnLayerId_t layer) {
  return run(HookId::ws_size_bwd_filter, true,
             WorkspaceQuery{ConvKind::kBackwardFilter,
                            unwrap(h),
                            {xDesc, gradDesc, convDesc, dyDesc},
                            static_cast<int>(algo),
                            size,
                            layer});
}

cudnnStatus_t vcudnnGetConvolutionForwardAlgorithmMaxCount(vcudnnHandle_t h, int* count) {
  return run(HookId::max_count_fwd, true, MaxCountQuery{ConvKind::kForward, unwrap(h), count});
}

cudnnStatus_t vcudnnGetConvolutionBackwardDataAlgorithmMaxCount(vcudnnHandle_t h, int* count) {
  return run(HookId::max_count_bwd_data, true, MaxCountQuery{ConvKind::kBackwardData, unwrap(h), count});
}

cudnnStatus_t vcudnnGetConvolutionBackwardFilterAlgorithmMaxCount(vcudnnHandle_t h, int* count) {
  return run(HookId::max_count_bwd_filter, true, MaxCountQuery{ConvKind::kBackwardFilter, unwrap(h), count});
}

cudnnStatus_t vcudnnGetConvolutionPlanInfo(vcudnnConvKind_t kind, const cudnnTensorDescriptor_t xDesc,
                                           const cudnnFilterDescriptor_t wDesc,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           const cudnnTensorDescriptor_t yDesc, vcudnnPlanInfo_t* info) {
  if (!info || kind < VCUDNN_CONV_FORWARD || kind > VCUDNN_CONV_BACKWARD_FILTER) return CUDNN_STATUS_BAD_PARAM;
  try {
    if (!decode_conv_layer(xDesc, wDesc, convDesc, yDesc)) return CUDNN_STATUS_BAD_PARAM;
    auto plan = Engine::get().plan_of({xDesc, wDesc, convDesc, yDesc}, static_cast<ConvKind>(kind));
    if (!plan) return CUDNN_STATUS_NOT_SUPPORTED;
    *info = vcudnnPlanInfo_t{};
    info->microBatches = static_cast<int>(plan->run.kernels.size());
    info->firstAlgo = plan->run.kernels.empty() ? -1 : plan->run.kernels[0].algo;
    info->workspaceBytes = plan->workspace;
    info->predictedMs = static_cast<float>(plan->run.time_ms);
    info->fallback = plan->fallback ? 1 : 0;
    std::snprintf(info->description, sizeof info->description, "%s", plan->description.c_str());
    return CUDNN_STATUS_SUCCESS;
  } catch (...) {
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}


cudnnStatus_t vcudnnGetMemoryStats(vcudnnMemoryStats_t* out) {
  if (!out) return CUDNN_STATUS_BAD_PARAM;
  *out = vcudnnMemoryStats_t{};
  try {
    const memory::MemoryManager* m = memory::manager();
    if (!m) return CUDNN_STATUS_SUCCESS;
    const memory::ManagerStats s = m->stats();
    out->active = 1;
    out->budgetBytes = s.budget;
    out->mappedBytes = s.mapped;
    out->peakMappedBytes = s.peak_mapped;
    out->liveBytes = s.live;
    out->cachedBytes = s.idle;
    out->evictedBytes = s.evicted_now;
    out->hostBudgetBytes = s.host_budget;
    out->allocations = s.allocations;
    out->frees = s.frees;
    out->cacheHits = s.reused;
    out->failedAllocations = s.failed_allocations;
    out->evictions = s.evictions;
    out->restores = s.restores;
    out->faultIns = s.fault_ins;
    out->bytesEvicted = s.bytes_evicted;
    out->bytesRestored = s.bytes_restored;
    out->trackedCalls = s.tracked_calls;
    out->trackedHits = s.tracked_hits;
    out->foreignAllocations = s.foreign_allocations;
    out->fragmentation = s.fragmentation;
    out->hostWaits = s.host_waits;
    out->streamWaits = s.stream_waits;
    out->evictionsStarted = s.evictions_started;
    out->evictionsCancelled = s.evictions_cancelled;
    out->freshBytes = s.fresh_bytes;
    out->trimmedBytes = s.trimmed_bytes;
    return CUDNN_STATUS_SUCCESS;
  } catch (...) {
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}

cudnnStatus_t vcudnnResetMemoryPeak(void) {
  try {
    memory::MemoryManager* m = memory::manager();
    if (!m) return CUDNN_STATUS_NOT_SUPPORTED;
    m->reset_peak();
    return CUDNN_STATUS_SUCCESS;
  } catch (...) {
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}

cudnnStatus_t vcudnnEvictBuffer(const void* address) {
  try {
    memory::MemoryManager* m = memory::manager();
    if (!m) return CUDNN_STATUS_NOT_SUPPORTED;
    switch (m->evict(reinterpret_cast<uint64_t>(address))) {
      case memory::EvictResult::kOk:
        return CUDNN_STATUS_SUCCESS;
      case memory::EvictResult::kUnknown:
      case memory::EvictResult::kTooSmall:
        return CUDNN_STATUS_BAD_PARAM;
      case memory::EvictResult::kAlreadyEvicted:
        return CUDNN_STATUS_SUCCESS;
      case memory::EvictResult::kNotAllowed:
        return CUDNN_STATUS_NOT_SUPPORTED;
      case memory::EvictResult::kNoHostMemory:
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
      case memory::EvictResult::kFailed:
        break;
    }
    return CUDNN_STATUS_EXECUTION_FAILED;
  } catch (...) {
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}

cudnnStatus_t vcudnnRestoreBuffer(const void* address) {
  try {
    memory::MemoryManager* m = memory::manager();
    if (!m) return CUDNN_STATUS_NOT_SUPPORTED;
    switch (m->restore(reinterpret_cast<uint64_t>(address), std::nullopt)) {
      case memory::RestoreResult::kOk:
      case memory::RestoreResult::kNotEvicted:
        return CUDNN_STATUS_SUCCESS;
      case memory::RestoreResult::kUnknown:
        return CUDNN_STATUS_BAD_PARAM;
      case memory::RestoreResult::kNoRoom:
        return CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
      case memory::RestoreResult::kFailed:
        break;
    }
    return CUDNN_STATUS_EXECUTION_FAILED;
  } catch (...) {
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}

}  // extern "C"
