// MicroBatcher: the microbatch policy (µ-cuDNN on the legacy API). At the first call of a
// convolution kernel (layer fingerprint + kind) it benchmarks the candidate micro-batch sizes
// (Benchmarker, SQLite cache), chooses a plan (planner/microbatch_plan.h) and builds the plan's
// own descriptors; every call of that kernel then runs the plan: one real cuDNN call per
// micro-batch with pointers offset by the N stride, backward-filter accumulating with beta = 1
// after the first micro-batch, back to back on the caller's stream with workspace from vcudnn's
// stream-ordered pool (no host synchronization). What the framework sees stays consistent:
// workspace-size queries report 0 for the kernels vcudnn supplies, and algorithm queries return
// cuDNN's own rows with memory 0. Calls vcudnn cannot slice (strided layouts, other data types,
// CUDA-graph capture without a plan) pass through unchanged, with a debug line.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/microbatch_plan.h"
#include "pool/workspace_pool.h"
#include "runtime/conv_call.h"
#include "runtime/conv_descriptors.h"
#include "runtime/microbatch_resources.h"

namespace vcudnn {

// A kernel's plan with the descriptors it runs with. Immutable once published.
struct KernelPlan {
  ConvLayer layer;
  ConvKind kind = ConvKind::kForward;
  PlanDecision decision;
  MicroBatchMeasurements measurements;
  MicroConfig run;  // what executes (the decision's config, or the fallback)
  bool fallback = false;
  std::optional<MicroKernel> zero_workspace;  // undivided, no workspace: runs when the pool cannot supply
  uint64_t workspace = 0;                     // run.workspace
  size_t x_stride_bytes = 0;                  // bytes per sample of x / y (the N stride)
  size_t y_stride_bytes = 0;
  std::unique_ptr<OwnedFilter> w;
  std::map<int32_t, std::unique_ptr<OwnedTensor>> x, y;       // by micro-batch size
  std::map<int32_t, std::unique_ptr<OwnedConvolution>> conv;  // by math type
  std::string description;
};

class MicroBatcher {
 public:
  // The settings, the cache and the pools are shared with the graph API's micro-batcher.
  explicit MicroBatcher(std::shared_ptr<MicroBatchResources> resources);

  // The calls (the Engine has already counted and timed them).
  cudnnStatus_t convolution(const ConvCall& call);
  cudnnStatus_t workspace_size(const WorkspaceQuery& q);
  cudnnStatus_t algo_query(const AlgoQuery& q);

  // WD: re-plans every kernel seen so far under VCUDNN_TOTAL_WORKSPACE (called once the first
  // iteration is complete). No-op without a total.
  void plan_network();
  bool network_planned() const { return network_planned_.load(); }

  // The plan of a kernel, if it exists.
  std::shared_ptr<const KernelPlan> find_plan(const ConvLayer& layer, ConvKind kind) const;

  std::string summary() const;  // "plans=... split=... ..."
  const MicroBatchSettings& settings() const { return settings_; }
  MicroBatchResources& resources() const { return *resources_; }

 private:
  struct Key {
    ConvLayer layer;
    ConvKind kind;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.layer.hash() * 31 + static_cast<size_t>(k.kind); }
  };

  // The layer when vcudnn can slice this call, else nullopt (reason logged at debug, once).
  std::optional<ConvLayer> manageable(const ConvDescs& desc, ConvKind kind) const;
  std::shared_ptr<const KernelPlan> plan_for(const ConvCall& call, const ConvLayer& layer);
  std::shared_ptr<KernelPlan> build(const ConvLayer& layer, ConvKind kind, const PlanDecision& decision,
                                    const MicroBatchMeasurements& m, const std::optional<MicroKernel>& zero);
  cudnnStatus_t execute(const KernelPlan& plan, const ConvCall& call, cudaStream_t stream, bool capturing);
  pool::WorkspacePool* pool_for_current_device() { return resources_->pool_for_current_device(); }

  std::shared_ptr<MicroBatchResources> resources_;
  const MicroBatchSettings& settings_;  // resources_->settings()

  mutable std::shared_mutex plans_mu_;
  std::unordered_map<Key, std::shared_ptr<const KernelPlan>, KeyHash> plans_;
  std::unordered_map<Key, bool, KeyHash> unmanaged_;  // kernels that failed to plan: pass through
  std::mutex planning_mu_;                            // one kernel benchmarks at a time
  std::atomic<bool> network_planned_{false};
  mutable std::mutex unsliceable_mu_;
  mutable std::unordered_map<ConvLayer, bool> unsliceable_logged_;  // debug lines, once per layer

  std::atomic<uint64_t> n_plans_{0}, n_split_{0}, n_benchmarked_{0}, n_cache_hits_{0}, plan_ns_{0}, n_fallbacks_{0},
      n_executed_{0}, n_passthrough_{0}, n_pool_misses_{0};
};

}  // namespace vcudnn
