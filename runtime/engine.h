// Engine: the core behind the cuDNN hooks. It applies the features in use (recording,
// micro-batching) to each normalised call and owns the Recorder and the two micro-batchers (legacy
// API, graph API), which share their settings, cache and pools. Hooks call exactly one Engine
// function. The process owns it (runtime/process.h) and prints its part of the
// exit line.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>

#include "runtime/conv_call.h"
#include "runtime/graph_microbatcher.h"
#include "runtime/hook_scope.h"
#include "runtime/microbatcher.h"
#include "runtime/options.h"
#include "runtime/recorder.h"

namespace vcudnn {

class Engine {
 public:
  // The process's engine (Process::get().engine()), started on first use, never at load time.
  static Engine& get();
  explicit Engine(const Options& options);  // use get(); public for NoDestroy

  cudnnStatus_t convolution(HookScope& scope, const ConvCall& call);
  // A graph-API plan of one convolution (cudnnBackendExecute): recorded like a convolution while
  // recording; `run` makes the real call (with its access tracking). A plan the graph micro-batcher
  // took over runs its micro-batches instead, and is recorded with the workspace its caller gave (0).
  template <typename Run>
  cudnnStatus_t graph_convolution(HookScope& scope, cudnnHandle_t handle, cudnnBackendDescriptor_t plan, GraphConv conv,
                                  Run&& run) {
    const bool managed = graph_plan_managed(plan);
    if (managed) conv.workspace_bytes = 0;  // what the caller was told and allocated
    const auto exec = [&] { return managed ? graph_execute(handle, plan, conv) : run(); };
    if (!recording()) {
      recorder_.poll();
      return scope.real(exec);
    }
    Recorder::ConvProbe probe = recorder_.before_graph_convolution(handle, conv);
    const cudnnStatus_t st = scope.real(exec);
    recorder_.after_graph_convolution(probe, handle, conv, st);
    return st;
  }
  // cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) succeeded with *size:
  // 0 for a plan vcudnn takes over (graph_microbatcher.h, Note [Taking over a graph-API plan]).
  // Never throws.
  void graph_workspace_size(cudnnBackendDescriptor_t plan, int64_t* size) noexcept;
  // Whether vcudnn runs this plan's executions (cheap: false without micro-batching).
  bool graph_plan_managed(cudnnBackendDescriptor_t plan) const {
    return graph_microbatcher_ && graph_microbatcher_->managed(plan);
  }
  // What vcudnn runs for a plan it took over (nullopt: not taken over, or not run yet).
  std::optional<GraphPlanInfo> graph_plan_info(cudnnBackendDescriptor_t plan) const {
    return graph_microbatcher_ ? graph_microbatcher_->plan_info(plan) : std::nullopt;
  }
  // A managed plan's execution when vcudnn failed before making it: the caller's plan with a
  // workspace vcudnn supplies. Never throws.
  cudnnStatus_t graph_fallback(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                               cudnnBackendDescriptor_t variant_pack) noexcept;
  // A backend descriptor is being destroyed. Never throws.
  void graph_descriptor_destroyed(cudnnBackendDescriptor_t descriptor) noexcept;
  cudnnStatus_t algo_query(HookScope& scope, const AlgoQuery& query);
  cudnnStatus_t workspace_size(HookScope& scope, const WorkspaceQuery& query);
  cudnnStatus_t max_count(HookScope& scope, const MaxCountQuery& query);
  cudnnStatus_t create(HookScope& scope, cudnnHandle_t* handle);
  cudnnStatus_t destroy(HookScope& scope, cudnnHandle_t handle);
  cudnnStatus_t set_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t stream);
  cudnnStatus_t get_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t* stream);
  void iteration_boundary();

  // Whether the first iteration is still being recorded (the graph-API hook asks before decoding).
  bool recording_now() const { return recording(); }
  // Resolves the recorded iteration's GPU times and writes the trace once they are ready (cheap
  // when there is nothing to do; never throws).
  void poll_recorder() { recorder_.poll(); }

  // The micro-batch plan of a kernel (nullptr under other policies or before its first call).
  std::shared_ptr<const KernelPlan> plan_of(const ConvDescs& desc, ConvKind kind) const;

  // Exit: finish the trace; summary() is the engine's part of the exit line.
  void finish();
  std::string summary() const;

 private:
  bool recording() const { return features_.record && recorder_.active(); }
  cudnnStatus_t graph_execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv);

  Features features_;
  Recorder recorder_;
  std::unique_ptr<MicroBatcher> microbatcher_;             // when micro-batching is on
  std::unique_ptr<GraphMicroBatcher> graph_microbatcher_;  // when micro-batching is on
};

}  // namespace vcudnn
