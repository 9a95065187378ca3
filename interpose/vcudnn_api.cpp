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

// The convolution family: one row each in runtime/cudnn_api.def, as the cuDNN hooks.
#define VCUDNN_UNPAREN(...) __VA_ARGS__
#define VCUDNN_HANDLE unwrap(h)
#define VCUDNN_LAYER layer
#define VCUDNN_LAYER_PARAM_layered , vcudnnLayerId_t layer
#define VCUDNN_LAYER_PARAM_unlayered
#define VCUDNN_CUDNN_HOOK(short_name, fn)
#define VCUDNN_CUDNN_CONV(short_name, fn, params, call, layered)                                  \
  cudnnStatus_t v##fn(vcudnnHandle_t h, VCUDNN_UNPAREN params VCUDNN_LAYER_PARAM_##layered) { \
    return run(HookId::short_name, true, call);                                                \
  }
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_CONV
#undef VCUDNN_CUDNN_HOOK
#undef VCUDNN_LAYER_PARAM_unlayered
#undef VCUDNN_LAYER_PARAM_layered
#undef VCUDNN_LAYER
#undef VCUDNN_HANDLE
#undef VCUDNN_UNPAREN

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

cudnnStatus_t vcudnnGetExecutionPlanInfo(cudnnBackendDescriptor_t plan, vcudnnPlanInfo_t* info) {
  if (!info) return CUDNN_STATUS_BAD_PARAM;
  try {
    const std::optional<GraphPlanInfo> p = Engine::get().graph_plan_info(plan);
    if (!p) return CUDNN_STATUS_NOT_SUPPORTED;
    *info = vcudnnPlanInfo_t{};
    info->microBatches = p->micro_batches;
    info->firstAlgo = static_cast<int>(p->first_engine);
    info->workspaceBytes = p->workspace;
    info->predictedMs = static_cast<float>(p->predicted_ms);
    info->fallback = p->fallback ? 1 : 0;
    std::snprintf(info->description, sizeof info->description, "%s", p->description.c_str());
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
