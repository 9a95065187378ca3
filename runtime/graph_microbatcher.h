// GraphMicroBatcher: the microbatch policy on cuDNN's graph API, the path PyTorch 2.x takes by
// default (Conv_v8.cpp through cudnn-frontend). It takes over the execution plans of single
// convolutions whose workspace exceeds the limit, benchmarks micro-batch sizes at a kernel's first
// execution (GraphConvPlan, the shared SQLite cache), chooses with the legacy path's planner
// (choose_microbatch_plan) and runs the chosen micro-batches back to back on the caller's stream,
// with workspace from the pool it shares with the legacy MicroBatcher (MicroBatchResources).
//
// Note [Taking over a graph-API plan]
// PyTorch reads a plan's workspace size once, right after finalizing it (cudnn-frontend keeps it in
// its plan object), allocates that much from its caching allocator at every execution and passes
// it in the variant pack (a null pointer for 0). vcudnn decides at that read: a plan running one
// convolution vcudnn can slice whose own workspace exceeds VCUDNN_WORKSPACE_LIMIT (every such plan
// under VCUDNN_TEST_FORCE_SPLIT) is taken over: the size read is 0, PyTorch allocates nothing, and
// every execution of the plan runs vcudnn's choice with vcudnn's workspace. A plan whose workspace
// fits stays cuDNN's, untouched: undivided, cuDNN's own engine wins when it fits. The answer for a
// plan never changes while it lives; it is forgotten when the descriptor is destroyed. Where vcudnn
// cannot run its choice (no decision yet under CUDA-graph capture, a pointer less aligned than the
// plans declare, a failure), it runs the caller's own plan with a workspace of the plan's real
// size that it supplies itself, since the caller was told 0.
//
// Note [Numerics class]
// vcudnn must not change what the caller's plan does to the numbers. Engines are chosen only among
// those whose numerical notes the caller's engine also carries (its engine, by global index, rebuilt
// on vcudnn's own graph and its notes read back), except that tensor cores are not a class change
// for 16-bit data; DOWN_CONVERT_INPUTS is never taken. So TF32 (TENSOR_CORE with fp32 data) only
// where the caller's engine used TF32, non-deterministic engines only where the caller's was, and no
// FFT or Winograd for a caller's direct engine. An engine that cannot be read is taken as carrying
// no notes (the strictest mask).
//
// Note [Timing rounds]
// A configuration is timed the way it runs in a training step: back to back on the stream, where
// the host's launch cost of one execution hides behind the GPU time of the one before (or shows,
// where the host is the slower side, as for the smallest micro-batches). One execution timed alone
// on an empty stream also counts the launch the stream waits for, 10-20 us of cuDNN's host work per
// execution: on 0.05-0.1 ms bf16 kernels, configurations 4-6% apart on the GPU timed alike, and the
// graph-path per-layer benchmark found vcudnn's choice 4.3% and 6.3% slower than cuDNN's best at 8
// MiB (first bf16 run, 2026-11-24). Each time is the median of kTimedRuns rounds of
// reps_per_round() executions.
#pragma once

#include <cudnn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/microbatch_dp.h"
#include "planner/microbatch_plan.h"
#include "runtime/backend_shadow.h"
#include "runtime/graph_conv_plan.h"
#include "runtime/microbatch_resources.h"

namespace vcudnn {

// ---- Rules (pure; tested without a GPU)

// Configurations per micro-batch size the benchmark times: the heuristics' first acceptable ones,
// an engine with other knob choices counted apart (config_id()). Four missed faster ones at 8 and
// 64 MiB (the graph-path per-layer benchmark: an engine's later configuration, or an engine ranked
// below four that needed more workspace).
inline constexpr int kGraphEnginesPerBatch = 8;
// Prefix of the benchmark cache's key text for graph-API measurements: a key space of its own in
// the cache's tables (legacy keys are bare JSON), versioned (2: rows name configurations,
// config_id(), not engines; 3: times per execution back to back, Note [Timing rounds]).
inline constexpr const char* kGraphBenchKeySchema = "vcudnn.graph-bench/3";
// Work per timing round, and the most executions in one (Note [Timing rounds]).
inline constexpr double kTimingRoundMs = 0.5;
inline constexpr int kMaxRepsPerRound = 32;

// Executions per timing round for a configuration one execution of which, timed alone, took
// `single_ms`: enough for kTimingRoundMs, at least 1 and at most kMaxRepsPerRound.
int reps_per_round(double single_ms);

// The notes vcudnn's engines may not carry (Note [Numerics class]); `caller` nullopt: unknown.
uint32_t denied_notes_for(std::optional<uint32_t> caller, int32_t dtype);
// Why vcudnn cannot run `layer` as micro-batches (layout, data type, batch), or nullopt when it can:
// packed NCHW or NHWC x and y (the N stride the outermost), an NCHW or NHWC filter, float, double,
// half or bf16 data.
std::optional<std::string> graph_unsliceable(const ConvLayer& layer);
// The micro-batches of a configuration in execution order, each on its measured engine (algo).
std::vector<SplitStep> steps_of(const MicroConfig& config);
// The cache's layer text for one graph-API measurement.
std::string graph_bench_layer_key(const ConvLayer& micro, uint32_t denied_notes, double alpha, double beta,
                                  int64_t base_alignment);

// What vcudnn runs for a plan it took over (vcudnnGetExecutionPlanInfo).
struct GraphPlanInfo {
  int micro_batches = 1;      // executions per call (1: undivided)
  int64_t first_engine = -1;  // global index of the first micro-batch's engine (-1: the caller's plan)
  uint64_t workspace = 0;     // what vcudnn supplies per call
  double predicted_ms = 0;    // the measured configuration's time (0 when the caller's plan runs)
  bool fallback = false;      // the caller's own plan runs, with a workspace over the limit
  std::string description;
};

// ---- The micro-batcher

class GraphMicroBatcher {
 public:
  explicit GraphMicroBatcher(std::shared_ptr<MicroBatchResources> resources);

  // After a successful cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE):
  // `conv` is what the shadow makes of the plan (nullopt: not a single convolution), *size the real
  // answer, set to 0 when vcudnn takes the plan over (Note [Taking over a graph-API plan]).
  void workspace_size(cudnnBackendDescriptor_t plan, const std::optional<GraphConv>& conv, int64_t* size);
  bool managed(cudnnBackendDescriptor_t plan) const;
  // nullopt unless `plan` was taken over and has run (its decision made).
  std::optional<GraphPlanInfo> plan_info(cudnnBackendDescriptor_t plan) const;
  // A descriptor or a handle was destroyed: what vcudnn keeps for it goes.
  void forget(cudnnBackendDescriptor_t descriptor);
  void handle_destroyed(cudnnHandle_t handle);

  // One execution of a managed plan; `conv` from the shadow with the variant pack.
  cudnnStatus_t execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv);
  // The caller's own plan with a workspace of its real size supplied by vcudnn (the way out of
  // every failure). Never throws.
  cudnnStatus_t run_caller_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv) noexcept;

  // "graph_plans=… graph_split=… …" (keys of their own: the legacy micro-batcher's are plans=…).
  std::string summary() const;

 private:
  struct KernelKey {
    ConvLayer layer;
    ConvKind kind = ConvKind::kForward;
    uint32_t denied_notes = 0;
    double alpha = 1.0, beta = 0.0;
    int64_t base_alignment = kMaxTensorAlignment;
    bool operator==(const KernelKey&) const = default;
  };
  struct KernelKeyHash {
    size_t operator()(const KernelKey& k) const;
  };
  // A kernel's decision, whichever handle runs it.
  struct Decision {
    PlanDecision decision;
    std::vector<SplitStep> steps;  // empty: the caller's plan runs
    std::string description;
  };
  // A decision's plans, built on one handle.
  struct Runner {
    KernelKey key;
    std::shared_ptr<const Decision> decision;
    std::optional<GraphConvSplit> split;  // nullopt: the caller's plan runs
  };
  struct RunnerKey {
    KernelKey key;
    cudnnHandle_t handle = nullptr;
    bool operator==(const RunnerKey&) const = default;
  };
  struct RunnerKeyHash {
    size_t operator()(const RunnerKey& k) const;
  };
  // The engine the caller's plan runs, read through its configuration when the plan was taken over
  // (PyTorch never reads the index itself, so the shadow may not know it).
  struct CallerEngine {
    int64_t engine = -1;
    std::optional<uint32_t> notes;  // nullopt: unknown
  };
  struct Managed {
    int64_t real_workspace = 0;
    CallerEngine caller;
    cudnnHandle_t handle = nullptr;  // the handle `runner` was built on
    std::shared_ptr<const Runner> runner;
  };

  std::shared_ptr<const Runner> runner_for(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv,
                                           cudaStream_t stream);
  KernelKey key_of(cudnnHandle_t handle, const GraphConv& conv, const CallerEngine& caller) const;
  CallerEngine caller_engine(const GraphConv& conv) const;
  std::shared_ptr<const Decision> decide(cudnnHandle_t handle, cudaStream_t stream, const GraphConv& conv,
                                         const KernelKey& key);
  Result<MicroBatchMeasurements> measure(cudnnHandle_t handle, cudaStream_t stream, const GraphConv& conv,
                                         const KernelKey& key, const std::vector<int32_t>& batches);
  std::shared_ptr<const Runner> build_runner(cudnnHandle_t handle, const KernelKey& key,
                                             std::shared_ptr<const Decision> decision);
  cudnnStatus_t run_split(const Runner& runner, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                          const GraphConv& conv, cudaStream_t stream, bool capturing);
  int64_t real_workspace(cudnnBackendDescriptor_t plan) const;

  std::shared_ptr<MicroBatchResources> resources_;
  const MicroBatchSettings& settings_;  // resources_->settings()

  mutable std::shared_mutex managed_mu_;
  std::unordered_map<cudnnBackendDescriptor_t, Managed> managed_;
  std::mutex planning_mu_;  // one kernel decides at a time; guards the two maps below
  std::unordered_map<KernelKey, std::shared_ptr<const Decision>, KernelKeyHash> decisions_;
  std::unordered_map<RunnerKey, std::shared_ptr<const Runner>, RunnerKeyHash> runners_;

  std::atomic<uint64_t> n_managed_{0}, n_plans_{0}, n_split_{0}, n_benchmarked_{0}, n_cache_hits_{0}, plan_ns_{0},
      n_fallbacks_{0}, n_executed_{0}, n_passthrough_{0}, n_errors_{0};
};

}  // namespace vcudnn
