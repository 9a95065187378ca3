// GraphMicroBatcher (graph_microbatcher.h): which plans vcudnn takes over, the first-execution
// benchmark of graph-API micro-batch plans, the decision, and the executions.
#include "runtime/graph_microbatcher.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/barrier.h"
#include "runtime/benchmarker.h"
#include "runtime/conv_descriptors.h"
#include "runtime/decode_conv.h"
#include "runtime/log.h"
#include "runtime/own_memory.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

constexpr int kTimedRuns = 3;  // timing rounds per configuration (Note [Timing rounds]); the median is kept
constexpr cudnnStatus_t kNoWorkspace = CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;

bool sixteen_bit(int32_t dtype) { return dtype == CUDNN_DATA_HALF || dtype == CUDNN_DATA_BFLOAT16; }

uint64_t output_bytes(const ConvLayer& layer, ConvKind kind) {
  if (kind == ConvKind::kForward) return tensor_span_bytes(layer.y);
  if (kind == ConvKind::kBackwardData) return tensor_span_bytes(layer.x);
  uint64_t n = element_bytes(layer.w.dtype);
  for (int i = 0; i < layer.w.nb_dims; ++i) n *= static_cast<uint64_t>(layer.w.dims[i]);
  return n;
}

void clear_cuda_error() {
  if (real_cudart().cudaGetLastError) real_cudart().cudaGetLastError();
}

// A device buffer of vcudnn's own for one benchmark (cudaMalloc / cudaFree semantics, the arena
// when memory is owned), grown on demand.
class OwnBuffer {
 public:
  OwnBuffer() = default;
  ~OwnBuffer() { free_own(ptr_, std::nullopt); }
  OwnBuffer(const OwnBuffer&) = delete;
  OwnBuffer& operator=(const OwnBuffer&) = delete;
  bool ensure(uint64_t bytes) {
    if (bytes <= bytes_) return true;
    free_own(ptr_, std::nullopt);
    ptr_ = allocate_own(bytes, std::nullopt);
    bytes_ = ptr_ ? bytes : 0;
    return ptr_ != nullptr;
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Workspace for one execution, in the stream's order: a pool block when it fits the pool (and the
// stream is not being captured: a captured graph would replay a block the pool hands out again),
// else memory of vcudnn's own allocated and freed on the stream (graph nodes under capture).
class StreamWorkspace {
 public:
  StreamWorkspace(MicroBatchResources& resources, cudaStream_t stream, uint64_t bytes, bool capturing)
      : stream_(stream) {
    if (bytes == 0) return;
    if (!capturing && (pool_ = resources.pool_for_current_device()) && bytes <= pool_->per_stream_capacity())
      lease_ = pool_->acquire(stream, bytes);
    if (lease_) {
      ptr_ = lease_->ptr;
      return;
    }
    ptr_ = allocate_own(bytes, stream);
    own_ = ptr_ != nullptr;
    failed_ = !own_;
  }
  ~StreamWorkspace() { release(); }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;

  bool ok() const { return !failed_; }
  void* get() const { return ptr_; }
  // After the work using it is enqueued.
  void release() {
    if (lease_) pool_->release(*lease_, stream_);
    lease_.reset();
    if (own_) free_own(ptr_, stream_);
    own_ = false;
    ptr_ = nullptr;
  }

 private:
  cudaStream_t stream_;
  pool::WorkspacePool* pool_ = nullptr;
  std::optional<pool::Lease> lease_;
  void* ptr_ = nullptr;
  bool own_ = false, failed_ = false;
};

// Two events of vcudnn's own for timing plans on a stream.
class Timer {
 public:
  Timer() {
    const RealCudart& rt = real_cudart();
    ok_ = rt.cudaEventCreateWithFlags && rt.cudaEventRecord && rt.cudaEventSynchronize && rt.cudaEventElapsedTime &&
          rt.cudaEventDestroy && rt.cudaEventCreateWithFlags(&start_, cudaEventDefault) == cudaSuccess &&
          rt.cudaEventCreateWithFlags(&end_, cudaEventDefault) == cudaSuccess;
    if (!ok_) clear_cuda_error();
  }
  ~Timer() {
    const RealCudart& rt = real_cudart();
    if (!rt.cudaEventDestroy) return;
    if (start_) rt.cudaEventDestroy(start_);
    if (end_) rt.cudaEventDestroy(end_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  bool ok() const { return ok_; }

  // Milliseconds per execution, the way a kernel runs in a training step: back to back on the stream,
  // the host's launch cost hidden behind the previous execution (or showing, where the host is the
  // slower side). After a warm-up, one execution timed alone says how many to put in a round
  // (kTimingRoundMs of work, at most kMaxRepsPerRound); the median of kTimedRuns rounds, divided by that
  // count. Timed one at a time, a 0.05 ms kernel also counts the 10-20 us of launch that the empty
  // stream waits for: configurations 4-6% apart on the GPU looked alike (Note [Timing rounds]).
  // An error says what failed.
  Result<double> time(const GraphConvPlan& plan, cudnnHandle_t handle, cudaStream_t stream, void* x, void* w, void* y,
                      void* workspace) {
    if (!ok_) return Error{"no CUDA events"};
    cudnnStatus_t st = plan.execute(handle, x, w, y, workspace);
    if (st != CUDNN_STATUS_SUCCESS) return Error{std::string("execution failed: ") + cudnn_status_name(st)};
    auto single = round(plan, handle, stream, x, w, y, workspace, 1);
    if (!single) return single.error();
    const int reps = reps_per_round(single.value());
    std::vector<double> ms;
    for (int i = 0; i < kTimedRuns; ++i) {
      auto t = round(plan, handle, stream, x, w, y, workspace, reps);
      if (!t) return t.error();
      ms.push_back(t.value() / reps);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  // Milliseconds of `reps` back-to-back executions between two events.
  Result<double> round(const GraphConvPlan& plan, cudnnHandle_t handle, cudaStream_t stream, void* x, void* w, void* y,
                       void* workspace, int reps) {
    const RealCudart& rt = real_cudart();
    if (rt.cudaEventRecord(start_, stream) != cudaSuccess) return cuda_failure("cudaEventRecord");
    for (int r = 0; r < reps; ++r) {
      const cudnnStatus_t st = plan.execute(handle, x, w, y, workspace);
      if (st != CUDNN_STATUS_SUCCESS) {
        rt.cudaEventRecord(end_, stream);  // the stream drains before the error is returned
        rt.cudaEventSynchronize(end_);
        return Error{std::string("execution failed: ") + cudnn_status_name(st)};
      }
    }
    if (rt.cudaEventRecord(end_, stream) != cudaSuccess) return cuda_failure("cudaEventRecord");
    if (rt.cudaEventSynchronize(end_) != cudaSuccess) return cuda_failure("cudaEventSynchronize");
    float t = 0;
    if (rt.cudaEventElapsedTime(&t, start_, end_) != cudaSuccess) return cuda_failure("cudaEventElapsedTime");
    return static_cast<double>(t);
  }

  static Error cuda_failure(const char* what) {
    clear_cuda_error();
    return Error{std::string(what) + " failed"};
  }
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  bool ok_ = false;
};

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

}  // namespace

// ---- Rules

int reps_per_round(double single_ms) {
  if (!(single_ms > 0)) return kMaxRepsPerRound;  // below the events' resolution (or not a number)
  const double n = std::ceil(kTimingRoundMs / single_ms);
  return n >= kMaxRepsPerRound ? kMaxRepsPerRound : std::max(1, static_cast<int>(n));
}

uint32_t denied_notes_for(std::optional<uint32_t> caller, int32_t dtype) {
  uint32_t all = 0;
  for (int n = 0; n < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++n)
    all |= note_bit(static_cast<cudnnBackendNumericalNote_t>(n));
  uint32_t denied = all & ~caller.value_or(0);
  if (sixteen_bit(dtype)) denied &= ~note_bit(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);  // not a class change for 16-bit data
  return denied | note_bit(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
}

std::optional<std::string> graph_unsliceable(const ConvLayer& l) {
  const std::string xl = l.x.layout(), yl = l.y.layout();
  if ((xl != "NCHW" && xl != "NHWC") || (yl != "NCHW" && yl != "NHWC"))
    return "x and y are not packed NCHW or NHWC (" + xl + ", " + yl + ")";
  if (l.w.format != CUDNN_TENSOR_NCHW && l.w.format != CUDNN_TENSOR_NHWC) return "the filter is neither NCHW nor NHWC";
  if (!element_bytes(l.x.dtype) || !element_bytes(l.y.dtype) || !element_bytes(l.w.dtype))
    return "a data type other than float, double, half or bf16";
  if (l.x.dims[0] < 1 || l.x.dims[0] != l.y.dims[0] || l.x.dims[0] > INT32_MAX) return "x and y disagree on N";
  return std::nullopt;
}

std::vector<SplitStep> steps_of(const MicroConfig& config) {
  std::vector<SplitStep> steps;
  for (const MicroKernel& k : config.kernels) steps.push_back({k.batch, static_cast<int64_t>(k.algo)});
  return steps;
}

std::string graph_bench_layer_key(const ConvLayer& micro, uint32_t denied_notes, double alpha, double beta,
                                  int64_t base_alignment) {
  return fmt::format("{} denied={:#x} alpha={} beta={} align={} {}", kGraphBenchKeySchema, denied_notes, alpha, beta,
                     base_alignment, nlohmann::json(micro).dump());
}

// ---- Keys

size_t GraphMicroBatcher::KernelKeyHash::operator()(const KernelKey& k) const {
  size_t h = k.layer.hash();
  h = mix(h, static_cast<size_t>(k.kind));
  h = mix(h, k.denied_notes);
  h = mix(h, std::hash<double>()(k.alpha));
  h = mix(h, std::hash<double>()(k.beta));
  return mix(h, static_cast<size_t>(k.base_alignment));
}

size_t GraphMicroBatcher::RunnerKeyHash::operator()(const RunnerKey& k) const {
  return mix(KernelKeyHash()(k.key), std::hash<const void*>()(k.handle));
}

GraphMicroBatcher::GraphMicroBatcher(std::shared_ptr<MicroBatchResources> resources)
    : resources_(std::move(resources)), settings_(resources_->settings()) {}

// ---- Which plans are taken over (Note [Taking over a graph-API plan])

void GraphMicroBatcher::workspace_size(cudnnBackendDescriptor_t plan, const std::optional<GraphConv>& conv,
                                       int64_t* size) {
  if (!size || *size < 0) return;
  {
    std::shared_lock<std::shared_mutex> lock(managed_mu_);
    if (managed_.count(plan)) {  // read again: the same answer
      *size = 0;
      return;
    }
  }
  if (!conv) return;
  if (!settings_.force_split && static_cast<uint64_t>(*size) <= settings_.cap()) return;  // fits: cuDNN's
  if (auto why = graph_unsliceable(conv->layer)) {
    VCUDNN_LOG_DEBUG("graph_microbatch: {} {} cannot be sliced along N ({}); its plan stays cuDNN's",
                     conv_kind_name(conv->kind), conv->layer.to_string(), *why);
    return;
  }
  {
    std::unique_lock<std::shared_mutex> lock(managed_mu_);
    managed_[plan] = Managed{*size, caller_engine(*conv), nullptr, nullptr};
  }
  ++n_managed_;
  VCUDNN_LOG_DEBUG("graph_microbatch: {} {}: plan {} needs {} bytes of workspace; vcudnn supplies it (answered 0)",
                   conv_kind_name(conv->kind), conv->layer.to_string(), static_cast<const void*>(plan), *size);
  *size = 0;
}

bool GraphMicroBatcher::managed(cudnnBackendDescriptor_t plan) const {
  std::shared_lock<std::shared_mutex> lock(managed_mu_);
  return managed_.count(plan) != 0;
}

std::optional<GraphPlanInfo> GraphMicroBatcher::plan_info(cudnnBackendDescriptor_t plan) const {
  std::shared_ptr<const Runner> runner;
  int64_t real = 0;
  {
    std::shared_lock<std::shared_mutex> lock(managed_mu_);
    const auto it = managed_.find(plan);
    if (it == managed_.end() || !it->second.runner) return std::nullopt;
    runner = it->second.runner;
    real = it->second.real_workspace;
  }
  GraphPlanInfo info;
  info.description = runner->decision->description;
  if (!runner->split) {
    info.workspace = static_cast<uint64_t>(real);
    info.fallback = true;
    return info;
  }
  const GraphConvSplit& s = *runner->split;
  info.micro_batches = static_cast<int>(s.steps.size());
  info.first_engine = s.steps.empty() ? -1 : s.plans[s.steps[0].plan].engine();
  info.workspace = s.workspace_bytes;
  info.predicted_ms = runner->decision->decision.config.time_ms;
  return info;
}

void GraphMicroBatcher::forget(cudnnBackendDescriptor_t descriptor) {
  {
    std::shared_lock<std::shared_mutex> lock(managed_mu_);
    if (!managed_.count(descriptor)) return;  // most destroyed descriptors: variant packs, tensors
  }
  std::unique_lock<std::shared_mutex> lock(managed_mu_);
  managed_.erase(descriptor);
}

void GraphMicroBatcher::handle_destroyed(cudnnHandle_t handle) {
  {
    std::lock_guard<std::mutex> planning(planning_mu_);
    for (auto it = runners_.begin(); it != runners_.end();)
      it = it->first.handle == handle ? runners_.erase(it) : std::next(it);
  }
  std::unique_lock<std::shared_mutex> lock(managed_mu_);
  for (auto& [plan, m] : managed_) {
    if (m.handle != handle) continue;
    m.handle = nullptr;
    m.runner.reset();
  }
}

int64_t GraphMicroBatcher::real_workspace(cudnnBackendDescriptor_t plan) const {
  std::shared_lock<std::shared_mutex> lock(managed_mu_);
  const auto it = managed_.find(plan);
  return it == managed_.end() ? 0 : it->second.real_workspace;
}

// ---- Deciding

GraphMicroBatcher::CallerEngine GraphMicroBatcher::caller_engine(const GraphConv& conv) const {
  CallerEngine c;
  c.engine = conv.engine;
  if (c.engine >= 0 || !conv.engine_config) return c;  // known: its notes are read on vcudnn's graph
  auto e = configuration_engine(conv.engine_config);
  if (!e) {
    VCUDNN_LOG_DEBUG("graph_microbatch: the engine of the caller's configuration cannot be read ({})",
                     e.error().message);
    return c;
  }
  c.engine = e->engine;
  c.notes = e->notes;
  return c;
}

GraphMicroBatcher::KernelKey GraphMicroBatcher::key_of(cudnnHandle_t handle, const GraphConv& conv,
                                                       const CallerEngine& caller) const {
  KernelKey k;
  k.layer = conv.layer;
  k.kind = conv.kind;
  k.alpha = conv.alpha;
  k.beta = conv.beta;
  const auto at = [](uint64_t p) { return pointer_alignment(reinterpret_cast<const void*>(p)); };
  k.base_alignment = std::min({at(conv.x), at(conv.w), at(conv.y)});
  std::optional<uint32_t> notes = caller.notes;
  if (!notes && caller.engine >= 0) {
    GraphConvPlanSpec spec;
    spec.x_alignment = spec.w_alignment = spec.y_alignment = k.base_alignment;
    spec.alpha = conv.alpha;
    spec.beta = conv.beta;
    auto n = engine_numerical_notes(handle, conv.layer, conv.kind, caller.engine, spec);
    if (n)
      notes = n.value();
    else
      VCUDNN_LOG_DEBUG(
          "graph_microbatch: the notes of the caller's engine are unknown ({}); the strictest mask applies",
          n.error().message);
  }
  k.denied_notes = denied_notes_for(notes, conv.layer.x.dtype);
  return k;
}

Result<MicroBatchMeasurements> GraphMicroBatcher::measure(cudnnHandle_t handle, cudaStream_t stream,
                                                          const GraphConv& conv, const KernelKey& key,
                                                          const std::vector<int32_t>& batches) {
  auto dev = bench_device();
  if (!dev) return dev.error();
  BenchCache* cache = resources_->cache();
  const uint64_t cap = settings_.cap();
  const ConvLayer& layer = key.layer;
  MicroBatchMeasurements out;
  out.mini_batch = static_cast<int32_t>(layer.x.dims[0]);
  BenchKey bk{
      dev->name, dev->sm_count, static_cast<int32_t>(real().cudnnGetVersion()), "", static_cast<int32_t>(key.kind), 0};
  const auto key_for = [&](int32_t b) {
    bk.layer = graph_bench_layer_key(micro_layer(layer, b), key.denied_notes, key.alpha, key.beta, key.base_alignment);
    bk.micro_batch = b;
  };
  std::vector<int32_t> todo;
  std::vector<int32_t> sizes = batches;
  std::sort(sizes.rbegin(), sizes.rend());
  for (int32_t b : sizes) {
    key_for(b);
    if (cache) {
      if (auto rows = cache->lookup(bk, cap, /*exact=*/true)) {
        auto& kernels = out.by_batch[b];
        for (const BenchRow& r : *rows) kernels.push_back({r.algo, b, r.time_ms, r.workspace, -1});
        ++n_cache_hits_;
        continue;
      }
    }
    todo.push_back(b);
  }
  if (todo.empty()) return out;

  // x and w are the caller's, read only; the output is vcudnn's own (never the caller's).
  OwnBuffer scratch, workspace;
  if (!scratch.ensure(output_bytes(layer, key.kind))) return Error{"no device memory for a scratch output"};
  void* x = key.kind == ConvKind::kBackwardData ? scratch.get() : reinterpret_cast<void*>(conv.x);
  void* w = key.kind == ConvKind::kBackwardFilter ? scratch.get() : reinterpret_cast<void*>(conv.w);
  void* y = key.kind == ConvKind::kForward ? scratch.get() : reinterpret_cast<void*>(conv.y);
  Timer timer;
  if (!timer.ok()) return Error{"cannot create CUDA events"};
  for (int32_t b : todo) {
    auto g = split_geometry(layer, b, key.base_alignment);
    if (!g) return g.error();
    GraphConvPlanSpec spec;
    spec.batch = b;
    spec.x_alignment = g->x_alignment;
    spec.w_alignment = g->w_alignment;
    spec.y_alignment = g->y_alignment;
    spec.alpha = key.alpha;
    spec.beta = key.beta;
    spec.max_workspace = cap;
    spec.denied_notes = key.denied_notes;
    std::vector<BenchRow> rows;
    for (int e = 0; e < kGraphEnginesPerBatch; ++e) {
      auto plan = GraphConvPlan::build(handle, layer, key.kind, spec);
      if (!plan) {
        if (e == 0) VCUDNN_LOG_DEBUG("graph_microbatch: {}", plan.error().message);
        break;
      }
      spec.excluded_configs.push_back(plan->config());
      if (!workspace.ensure(plan->workspace_bytes())) {
        VCUDNN_LOG_DEBUG("graph_microbatch: no memory for {} bytes of benchmark workspace", plan->workspace_bytes());
        continue;
      }
      auto t = timer.time(plan.value(), handle, stream, x, w, y, workspace.get());
      if (!t) {
        VCUDNN_LOG_DEBUG("graph_microbatch: engine {} at micro-batch {}: {}", plan->engine(), b, t.error().message);
        continue;
      }
      rows.push_back(BenchRow{static_cast<int32_t>(plan->config()), -1, 1, t.value(), plan->workspace_bytes()});
    }
    std::sort(rows.begin(), rows.end(), [](const BenchRow& a, const BenchRow& c) { return a.time_ms < c.time_ms; });
    auto& kernels = out.by_batch[b];
    for (const BenchRow& r : rows) kernels.push_back({r.algo, b, r.time_ms, r.workspace, -1});
    ++n_benchmarked_;
    if (cache) {
      key_for(b);
      std::string error;
      if (!cache->store(bk, cap, rows, &error)) VCUDNN_WARN_LIMITED("benchmark cache: {}", error);
    }
  }
  return out;
}

std::shared_ptr<const GraphMicroBatcher::Decision> GraphMicroBatcher::decide(cudnnHandle_t handle, cudaStream_t stream,
                                                                             const GraphConv& conv,
                                                                             const KernelKey& key) {
  auto d = std::make_shared<Decision>();
  auto m = measure(handle, stream, conv, key, microbatch_candidate_batches(settings_, key.kind, key.layer));
  if (m) {
    PlanRequest req;
    req.limit = settings_.cap();
    req.allow_split = microbatch_split_allowed(key.kind, key.layer);
    req.force_split = settings_.force_split;
    d->decision = choose_microbatch_plan(m.value(), req);
  } else {
    d->decision.fallback = true;
    d->decision.reason = "benchmark failed: " + m.error().message;
  }
  ++n_plans_;
  const std::string kernel = std::string(conv_kind_name(key.kind)) + " " + key.layer.to_string();
  const std::string undivided =
      d->decision.undivided ? d->decision.undivided->to_string() : std::string("none within the limit");
  if (d->decision.fallback) {
    ++n_fallbacks_;
    d->description = "the caller's plan [fallback: " + d->decision.reason + "]";
    VCUDNN_LOG_WARN("graph_microbatch: {}: {}; its workspace comes from vcudnn, over the limit", kernel,
                    d->decision.reason);
    return d;
  }
  d->steps = steps_of(d->decision.config);
  d->description = d->decision.config.to_string();
  if (d->steps.size() > 1) ++n_split_;
  VCUDNN_LOG_INFO(
      "graph_microbatch: {}: {}; best undivided within the limit: {} ({}); the caller's engine {}, vcudnn's "
      "engines without the numerical notes {:#x}",
      kernel, d->description, undivided, d->decision.reason, conv.engine, key.denied_notes);
  return d;
}

std::shared_ptr<const GraphMicroBatcher::Runner> GraphMicroBatcher::build_runner(
    cudnnHandle_t handle, const KernelKey& key, std::shared_ptr<const Decision> decision) {
  auto r = std::make_shared<Runner>();
  r->key = key;
  r->decision = std::move(decision);
  if (r->decision->steps.empty()) return r;
  GraphConvSplitOptions o;
  o.alpha = key.alpha;
  o.beta = key.beta;
  o.max_workspace = settings_.cap();
  o.denied_notes = key.denied_notes;
  o.base_alignment = key.base_alignment;
  auto split = build_steps_split(handle, key.layer, key.kind, r->decision->steps, o);
  if (!split) {
    // The measured engines may not take the split's offsets (Note [Alignment of offset pointers]):
    // the same micro-batches on the engines the heuristics offer.
    std::vector<SplitStep> steps = r->decision->steps;
    for (SplitStep& s : steps) s.engine.reset();
    auto retry = build_steps_split(handle, key.layer, key.kind, steps, o);
    if (!retry) {
      ++n_fallbacks_;
      VCUDNN_LOG_WARN("graph_microbatch: {} {}: cannot build {} ({}); the caller's plan runs", conv_kind_name(key.kind),
                      key.layer.to_string(), r->decision->description, retry.error().message);
      return r;
    }
    VCUDNN_LOG_DEBUG("graph_microbatch: {} ({}); engines from the heuristics instead", split.error().message,
                     r->decision->description);
    r->split = std::move(retry.value());
    return r;
  }
  r->split = std::move(split.value());
  return r;
}

std::shared_ptr<const GraphMicroBatcher::Runner> GraphMicroBatcher::runner_for(cudnnHandle_t handle,
                                                                               cudnnBackendDescriptor_t plan,
                                                                               const GraphConv& conv,
                                                                               cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  CallerEngine caller;
  {
    std::shared_lock<std::shared_mutex> lock(managed_mu_);
    if (auto it = managed_.find(plan); it != managed_.end()) caller = it->second.caller;
  }
  if (caller.engine < 0) caller.engine = conv.engine;
  const KernelKey key = key_of(handle, conv, caller);
  std::shared_ptr<const Runner> runner;
  {
    std::lock_guard<std::mutex> planning(planning_mu_);
    const RunnerKey rk{key, handle};
    if (auto it = runners_.find(rk); it != runners_.end()) {
      runner = it->second;
    } else {
      std::shared_ptr<const Decision> d;
      if (auto dit = decisions_.find(key); dit != decisions_.end()) {
        d = dit->second;
      } else {
        GraphConv known = conv;
        known.engine = caller.engine;  // for the log
        d = decide(handle, stream, known, key);
        decisions_[key] = d;
      }
      runner = build_runner(handle, key, d);
      runners_[rk] = runner;
    }
  }
  {
    std::unique_lock<std::shared_mutex> lock(managed_mu_);
    if (auto it = managed_.find(plan); it != managed_.end()) {
      it->second.handle = handle;
      it->second.runner = runner;
    }
  }
  plan_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return runner;
}

// ---- Executing

cudnnStatus_t GraphMicroBatcher::execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv) {
  if (!handle || !conv.x || !conv.w || !conv.y) {
    ++n_passthrough_;
    return run_caller_plan(handle, plan, conv);
  }
  const cudaStream_t stream = handle_stream(handle);
  const bool capturing = stream_capturing(stream);
  std::shared_ptr<const Runner> runner;
  {
    std::shared_lock<std::shared_mutex> lock(managed_mu_);
    if (auto it = managed_.find(plan); it != managed_.end() && it->second.handle == handle) runner = it->second.runner;
  }
  if (!runner && capturing) {  // no benchmark inside a capture
    VCUDNN_WARN_LIMITED("graph_microbatch: {} {} first runs during CUDA-graph capture; the caller's plan runs",
                        conv_kind_name(conv.kind), conv.layer.to_string());
    ++n_passthrough_;
    return run_caller_plan(handle, plan, conv);
  }
  if (!runner) runner = runner_for(handle, plan, conv, stream);
  if (!runner || !runner->split) {
    ++n_passthrough_;
    return run_caller_plan(handle, plan, conv);
  }
  return run_split(*runner, handle, plan, conv, stream, capturing);
}

cudnnStatus_t GraphMicroBatcher::run_split(const Runner& runner, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                           const GraphConv& conv, cudaStream_t stream, bool capturing) {
  const GraphConvSplit& s = *runner.split;
  auto* x = reinterpret_cast<char*>(conv.x);
  auto* w = reinterpret_cast<void*>(conv.w);
  auto* y = reinterpret_cast<char*>(conv.y);
  if (pointer_alignment(x) < s.geometry.x_alignment || pointer_alignment(w) < s.geometry.w_alignment ||
      pointer_alignment(y) < s.geometry.y_alignment) {
    VCUDNN_LOG_DEBUG("graph_microbatch: pointers less aligned than {} declares; the caller's plan runs",
                     runner.decision->description);
    ++n_passthrough_;
    return run_caller_plan(handle, plan, conv);
  }
  StreamWorkspace ws(*resources_, stream, s.workspace_bytes, capturing);
  if (!ws.ok()) {
    ++n_errors_;
    VCUDNN_WARN_LIMITED("graph_microbatch: {} bytes of workspace not available for {}", s.workspace_bytes,
                        runner.decision->description);
    return kNoWorkspace;
  }
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const GraphConvSplit::Step& step = s.steps[i];
    const uint64_t first = static_cast<uint64_t>(step.slice.offset);
    const cudnnStatus_t st = s.plans[step.plan].execute(handle, x + first * s.geometry.x_sample_bytes, w,
                                                        y + first * s.geometry.y_sample_bytes, ws.get());
    if (st == CUDNN_STATUS_SUCCESS) continue;
    ++n_errors_;
    ws.release();
    if (i == 0) {  // nothing ran yet
      VCUDNN_WARN_LIMITED("graph_microbatch: {} failed with {}; the caller's plan runs", runner.decision->description,
                          cudnn_status_name(st));
      return run_caller_plan(handle, plan, conv);
    }
    VCUDNN_LOG_ERROR("graph_microbatch: micro-batch {} of {} failed with {}", i, runner.decision->description,
                     cudnn_status_name(st));
    return st;
  }
  ws.release();
  ++n_executed_;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t GraphMicroBatcher::run_caller_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                                 const GraphConv& conv) noexcept {
  try {
    const RealBackend& b = real_backend();
    if (!b.complete()) return CUDNN_STATUS_NOT_INITIALIZED;
    const int64_t bytes = std::max<int64_t>({real_workspace(plan), conv.workspace_bytes.value_or(0), 0});
    const cudaStream_t stream = handle_stream(handle);
    StreamWorkspace ws(*resources_, stream, static_cast<uint64_t>(bytes), stream_capturing(stream));
    if (!ws.ok()) {
      VCUDNN_WARN_LIMITED("graph_microbatch: {} bytes of workspace for the caller's plan not available", bytes);
      return kNoWorkspace;
    }
    const int64_t uids[] = {conv.x_uid, conv.w_uid, conv.y_uid};
    void* const pointers[] = {reinterpret_cast<void*>(conv.x), reinterpret_cast<void*>(conv.w),
                              reinterpret_cast<void*>(conv.y)};
    const cudnnStatus_t st = execute_plan(handle, plan, uids, pointers, ws.get());
    ws.release();
    return st;
  } catch (...) {
    note_exception("graph_microbatch: the caller's plan");
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
}

std::string GraphMicroBatcher::summary() const {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "graph_managed=%" PRIu64 " graph_plans=%" PRIu64 " graph_split=%" PRIu64 " graph_benchmarked=%" PRIu64
                " graph_cache_hits=%" PRIu64 " graph_plan_ms=%.1f graph_fallbacks=%" PRIu64 " graph_executed=%" PRIu64
                " graph_passthrough=%" PRIu64 " graph_errors=%" PRIu64,
                n_managed_.load(), n_plans_.load(), n_split_.load(), n_benchmarked_.load(), n_cache_hits_.load(),
                plan_ns_.load() / 1e6, n_fallbacks_.load(), n_executed_.load(), n_passthrough_.load(),
                n_errors_.load());
  return buf;
}

}  // namespace vcudnn
