// Hand-written tracking hooks for the cuDNN, cuBLAS and cuBLASLt functions whose pointers outlive
// the call: a descriptor or handle keeps a device pointer that a later call uses. Those pointers
// are pinned (a library may use them at any time) or remembered with their descriptor and touched
// when it executes. Every other pointer-carrying function is generated (tracked_hook.h).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "interpose/call_builders.h"
#include "interpose/tracked_hook.h"
#include "runtime/backend_shadow.h"
#include "runtime/no_destroy.h"
#include "runtime/process.h"

// cudnnFusedOps* and their types are deprecated in cuDNN 9 but still exported: still hooked.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using namespace vcudnn;
using namespace vcudnn::interpose;

namespace {

constexpr auto kNoReport = [](const char*) { return true; };

// The device pointers each descriptor holds, per attribute (a variant pack gets its data pointers
// and its workspace in separate calls; setting an attribute again replaces its pointers).
// memory::remember takes a descriptor's pointers all at once, so they are kept together here.
class HeldPointers {
 public:
  // Both run after the real call succeeded: an exception is logged (Note [Exception barrier]).
  void set(const void* owner, int64_t attribute, std::vector<uint64_t> words) noexcept {
    try {
      std::lock_guard lock(mu_);
      auto& attributes = held_[owner];
      attributes[attribute] = std::move(words);
      std::vector<uint64_t> all;
      for (const auto& [_, w] : attributes) all.insert(all.end(), w.begin(), w.end());
      memory::remember(owner, all.data(), all.size());
    } catch (...) {
      note_exception("the pointers of a cuDNN descriptor");
    }
  }

  void drop(const void* owner) noexcept {
    try {
      std::lock_guard lock(mu_);
      held_.erase(owner);
      memory::forget(owner);
    } catch (...) {
      note_exception("the pointers of a cuDNN descriptor");
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, std::map<int64_t, std::vector<uint64_t>>> held_;
};

// NoDestroy: a descriptor may be destroyed during process teardown.
HeldPointers& held() {
  static NoDestroy<HeldPointers> instance;
  return instance.get();
}

std::vector<uint64_t> pointer_words(const void* array, int64_t count) {
  std::vector<uint64_t> words;
  if (!array || count <= 0) return words;
  const auto* pointers = static_cast<void* const*>(array);
  for (int64_t i = 0; i < count; ++i) words.push_back(tracked_word(pointers[i]));
  return words;
}

// Dropout states are written by cudnnSetDropoutDescriptor and used by every later dropout and RNN
// call through the descriptor: pinned, and this call's access reported.
bool pin_and_touch(void* states, cudnnHandle_t handle, const char* api) {
  const uint64_t word = tracked_word(states);
  memory::pin(&word, 1, api);
  return memory::touch(&word, 1, memory::Access::kUnknown, stream_in(handle), api);
}

// A CUDA graph populated by cuDNN replays the variant pack's pointers without vcudnn seeing it:
// they stay on the device.
bool graph_use(cudnnBackendDescriptor_t variant_pack, const char* api) {
  memory::pin_remembered(variant_pack, api);
  return memory::touch_remembered(variant_pack, std::nullopt, api);
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

// ---- cuDNN backend (graph API). The shadow (runtime/backend_shadow.h) learns what each plan runs;
// the variant pack carries the pointers to cudnnBackendExecute.

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t* descriptor) {
  const cudnnStatus_t status =
      Tracked<&::cudnnBackendCreateDescriptor>::call(Library::kCudnn, __func__, kNoReport, descriptorType, descriptor);
  if (status == CUDNN_STATUS_SUCCESS && descriptor) backend_shadow().created(*descriptor, descriptorType);
  return status;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void* arrayOfElements) {
  const cudnnStatus_t status = Tracked<&::cudnnBackendSetAttribute>::call(
      Library::kCudnn, __func__, kNoReport, descriptor, attributeName, attributeType, elementCount, arrayOfElements);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  backend_shadow().set(descriptor, attributeName, attributeType, elementCount, arrayOfElements);
  if (attributeType == CUDNN_TYPE_VOID_PTR && memory::active()) {
    try {
      held().set(descriptor, attributeName, pointer_words(arrayOfElements, elementCount));
    } catch (...) {
      note_exception(__func__);
    }
  }
  return status;
}

// Heuristics answer with engine configurations, and plans with their workspace size, here. A plan
// vcudnn takes over answers 0 (runtime/graph_microbatcher.h, Note [Taking over a graph-API plan]).
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                       int64_t* elementCount, void* arrayOfElements) {
  const cudnnStatus_t status =
      Tracked<&::cudnnBackendGetAttribute>::call(Library::kCudnn, __func__, kNoReport, descriptor, attributeName,
                                                 attributeType, requestedElementCount, elementCount, arrayOfElements);
  if (status != CUDNN_STATUS_SUCCESS || !arrayOfElements) return status;
  const bool workspace_size = attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
                              attributeType == CUDNN_TYPE_INT64 && requestedElementCount >= 1;
  // Programs often pass no element count for the workspace size, a single value.
  const int64_t count = elementCount ? std::min(*elementCount, requestedElementCount) : workspace_size ? 1 : 0;
  if (count > 0) backend_shadow().got(descriptor, attributeName, attributeType, count, arrayOfElements);
  if (workspace_size && count > 0)
    if (Engine* engine = Process::get().engine_if_started())
      engine->graph_workspace_size(descriptor, static_cast<int64_t*>(arrayOfElements));
  return status;
}

// A plan of one convolution goes through the engine (recorded like a legacy convolution while
// the first iteration is recorded; micro-batched when vcudnn took it over); every other plan
// straight to cuDNN.
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
  BackendShadow& shadow = backend_shadow();
  const GraphKind kind = shadow.classify(executionPlan);
  shadow.count_execution(kind);
  const auto execute = [&] {
    return Tracked<&::cudnnBackendExecute>::call(
        Library::kCudnn, "cudnnBackendExecute",
        [&](const char* api) { return memory::touch_remembered(variantPack, stream_in(handle), api); }, handle,
        executionPlan, variantPack);
  };
  if (kind != GraphKind::kConvForward && kind != GraphKind::kConvBackwardData && kind != GraphKind::kConvBackwardFilter)
    return execute();
  // After the recorded iteration (and without an engine) a convolution vcudnn did not take over is
  // not decoded at all.
  Engine* engine = Process::get().engine_if_started();
  if (!engine) return execute();
  const bool managed = engine->graph_plan_managed(executionPlan);
  if (!managed && !engine->recording_now()) {
    engine->poll_recorder();
    return execute();
  }
  // The caller allocated no workspace for a managed plan: its own plan runs only with vcudnn's.
  const auto fallback = [&] {
    return managed ? engine->graph_fallback(handle, executionPlan, variantPack) : execute();
  };
  HookScope scope(HookId::backend_execute);
  if (scope.nested()) return fallback();
  return guarded(scope, "cudnnBackendExecute", fallback, [&] {
    const std::optional<GraphConv> conv = shadow.convolution(executionPlan, variantPack);
    return conv ? engine->graph_convolution(scope, handle, executionPlan, *conv, execute) : scope.real(fallback);
  });
}

cudnnStatus_t cudnnBackendPopulateCudaGraph(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                            cudnnBackendDescriptor_t variantPack, cudaGraph_t graph) {
  return Tracked<&::cudnnBackendPopulateCudaGraph>::call(
      Library::kCudnn, __func__, [&](const char* api) { return graph_use(variantPack, api); }, handle, executionPlan,
      variantPack, graph);
}

cudnnStatus_t cudnnBackendUpdateCudaGraph(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                          cudnnBackendDescriptor_t variantPack, cudaGraph_t graph) {
  return Tracked<&::cudnnBackendUpdateCudaGraph>::call(
      Library::kCudnn, __func__, [&](const char* api) { return graph_use(variantPack, api); }, handle, executionPlan,
      variantPack, graph);
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  if (memory::active()) held().drop(descriptor);
  backend_shadow().destroyed(descriptor);
  if (Engine* engine = Process::get().engine_if_started()) engine->graph_descriptor_destroyed(descriptor);
  return Tracked<&::cudnnBackendDestroyDescriptor>::call(Library::kCudnn, __func__, kNoReport, descriptor);
}

// ---- cuDNN fused ops (legacy): the variant parameter pack carries the pointers to the execute.

cudnnStatus_t cudnnSetFusedOpsVariantParamPackAttribute(cudnnFusedOpsVariantParamPack_t varPack,
                                                        cudnnFusedOpsVariantParamLabel_t paramLabel, void* ptr) {
  const cudnnStatus_t status = Tracked<&::cudnnSetFusedOpsVariantParamPackAttribute>::call(
      Library::kCudnn, __func__, kNoReport, varPack, paramLabel, ptr);
  // Labels below the scalars are device pointers; the scalars point at host values.
  if (status == CUDNN_STATUS_SUCCESS && paramLabel < CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES && memory::active()) {
    try {
      held().set(varPack, paramLabel, {tracked_word(ptr)});
    } catch (...) {
      note_exception(__func__);
    }
  }
  return status;
}

cudnnStatus_t cudnnFusedOpsExecute(cudnnHandle_t handle, const cudnnFusedOpsPlan_t plan,
                                   cudnnFusedOpsVariantParamPack_t varPack) {
  return Tracked<&::cudnnFusedOpsExecute>::call(
      Library::kCudnn, __func__,
      [&](const char* api) { return memory::touch_remembered(varPack, stream_in(handle), api); }, handle, plan,
      varPack);
}

cudnnStatus_t cudnnDestroyFusedOpsVariantParamPack(cudnnFusedOpsVariantParamPack_t varPack) {
  if (memory::active()) held().drop(varPack);
  return Tracked<&::cudnnDestroyFusedOpsVariantParamPack>::call(Library::kCudnn, __func__, kNoReport, varPack);
}

// ---- cuDNN dropout states.

cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc, cudnnHandle_t handle, float dropout,
                                        void* states, size_t stateSizeInBytes, unsigned long long seed) {
  return Tracked<&::cudnnSetDropoutDescriptor>::call(
      Library::kCudnn, __func__, [&](const char* api) { return pin_and_touch(states, handle, api); }, dropoutDesc,
      handle, dropout, states, stateSizeInBytes, seed);
}

cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc, cudnnHandle_t handle, float dropout,
                                            void* states, size_t stateSizeInBytes, unsigned long long seed) {
  return Tracked<&::cudnnRestoreDropoutDescriptor>::call(
      Library::kCudnn, __func__, [&](const char* api) { return pin_and_touch(states, handle, api); }, dropoutDesc,
      handle, dropout, states, stateSizeInBytes, seed);
}

// ---- cuBLAS: the handle keeps its workspace for every later call.

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
  return Tracked<&::cublasSetWorkspace_v2>::call(
      Library::kCublas, __func__,
      [&](const char* api) {
        const uint64_t word = tracked_word(workspace);
        memory::pin(&word, 1, api);
        return true;
      },
      handle, workspace, workspaceSizeInBytes);
}

// ---- cuBLASLt: pointer attributes of a matmul descriptor (bias, scales, amax, epilogue aux)
// are read by every cublasLtMatmul using it. An 8-byte value that is not a pointer (a stride or
// leading dimension) matches no buffer and pins nothing.

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  return Tracked<&::cublasLtMatmulDescSetAttribute>::call(
      Library::kCublasLt, __func__,
      [&](const char* api) {
        if (buf && sizeInBytes == sizeof(uint64_t)) {
          uint64_t word = 0;
          std::memcpy(&word, buf, sizeof(word));
          memory::pin(&word, 1, api);
        }
        return true;
      },
      matmulDesc, attr, buf, sizeInBytes);
}

}  // extern "C"
#pragma GCC visibility pop
