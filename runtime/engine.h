// Engine: the per-process core behind the hooks. It applies the policy (pass-through, or
// pass-through plus recording) to each normalised call, owns the Recorder, and prints the load
// and exit lines. Hooks call exactly one Engine function.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>

#include "runtime/conv_call.h"
#include "runtime/hook_scope.h"
#include "runtime/microbatcher.h"
#include "runtime/options.h"
#include "runtime/recorder.h"

namespace vcudnn {

class Engine {
 public:
  // The process's engine, initialised on first use (never at load time: see real_api.cpp). It
  // registers the exit handler, so processes that never call cuDNN print nothing.
  static Engine& get();
  explicit Engine(const Options& options);  // use get(); public for NoDestroy

  cudnnStatus_t convolution(HookScope& scope, const ConvCall& call);
  cudnnStatus_t algo_query(HookScope& scope, const AlgoQuery& query);
  cudnnStatus_t workspace_size(HookScope& scope, const WorkspaceQuery& query);
  cudnnStatus_t max_count(HookScope& scope, const MaxCountQuery& query);
  cudnnStatus_t create(HookScope& scope, cudnnHandle_t* handle);
  cudnnStatus_t destroy(HookScope& scope, cudnnHandle_t handle);
  cudnnStatus_t set_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t stream);
  cudnnStatus_t get_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t* stream);
  void iteration_boundary();

  // The micro-batch plan of a kernel (nullptr under other policies or before its first call).
  std::shared_ptr<const KernelPlan> plan_of(const ConvDescs& desc, ConvKind kind) const;

  // Exit: finish the trace, print the summary line.
  void at_exit();
  std::string summary() const;

 private:
  bool recording() const { return policy_ != Policy::kPassthrough && recorder_.active(); }

  Policy policy_;
  Recorder recorder_;
  std::unique_ptr<MicroBatcher> microbatcher_;  // VCUDNN_POLICY=microbatch
};

}  // namespace vcudnn
