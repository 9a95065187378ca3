// MicroBatcher (see header): planning at a kernel's first call, execution of plans, the
// framework-facing answers of the workspace and algorithm queries, and WD re-planning.
#include "runtime/microbatcher.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <limits>

#include "runtime/benchmarker.h"
#include "runtime/decode_conv.h"
#include "runtime/log.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// First row of cuDNN's heuristics that needs no workspace and keeps the layer's math.
std::optional<MicroKernel> zero_workspace_kernel(const ConvCall& call, const ConvLayer& layer) {
  MaxCountQuery mq{call.kind, call.handle, nullptr};
  int count = 0;
  mq.count = &count;
  if (call_real(mq) != CUDNN_STATUS_SUCCESS || count <= 0) count = 8;
  count = std::min(count, 64);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(count));
  AlgoQuery q;
  q.kind = call.kind;
  q.variant = QueryVariant::kGetV7;
  q.handle = call.handle;
  q.desc = call.desc;
  q.requested = count;
  int returned = 0;
  q.returned = &returned;
  q.perf = perf.data();
  if (call_real(q) != CUDNN_STATUS_SUCCESS) return std::nullopt;
  for (const AlgoPerf& p : read_perf(q, returned))
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory == 0 && math_type_compatible(layer.conv.math_type, p.math_type))
      return MicroKernel{p.algo, static_cast<int32_t>(layer.x.dims[0]), std::max(0.0f, p.time_ms), 0, p.math_type};
  return std::nullopt;
}

}  // namespace

MicroBatcher::MicroBatcher(std::shared_ptr<MicroBatchResources> resources)
    : resources_(std::move(resources)), settings_(resources_->settings()) {}

std::optional<ConvLayer> MicroBatcher::manageable(const ConvDescs& desc, ConvKind kind) const {
  auto layer = decode_conv_layer(desc.x, desc.w, desc.conv, desc.y);
  if (!layer) return std::nullopt;
  const ConvLayer& l = layer.value();
  const std::string xl = l.x.layout(), yl = l.y.layout();
  const bool ok = (xl == "NCHW" || xl == "NHWC") && (yl == "NCHW" || yl == "NHWC") && element_bytes(l.x.dtype) &&
                  element_bytes(l.y.dtype) && element_bytes(l.w.dtype) && l.x.dims[0] >= 1 &&
                  l.x.dims[0] == l.y.dims[0];
  if (!ok) {
    if (log::enabled(LogLevel::kDebug)) {  // once per layer, and no string building otherwise
      std::lock_guard<std::mutex> lock(unsliceable_mu_);
      if (unsliceable_logged_.emplace(l, true).second)
        VCUDNN_LOG_DEBUG("microbatch: {} {} cannot be sliced along N (layout or data type); its calls pass through",
                         conv_kind_name(kind), l.to_string());
    }
    return std::nullopt;
  }
  return l;
}

std::shared_ptr<const KernelPlan> MicroBatcher::find_plan(const ConvLayer& layer, ConvKind kind) const {
  std::shared_lock<std::shared_mutex> lock(plans_mu_);
  auto it = plans_.find(Key{layer, kind});
  return it == plans_.end() ? nullptr : it->second;
}

std::shared_ptr<KernelPlan> MicroBatcher::build(const ConvLayer& layer, ConvKind kind, const PlanDecision& decision,
                                                const MicroBatchMeasurements& m,
                                                const std::optional<MicroKernel>& zero) {
  auto p = std::make_shared<KernelPlan>();
  p->layer = layer;
  p->kind = kind;
  p->decision = decision;
  p->measurements = m;
  const int32_t batch = static_cast<int32_t>(layer.x.dims[0]);
  if (!decision.fallback) {
    p->run = decision.config;
  } else if (zero) {
    p->run = MicroConfig::single(*zero);
    p->fallback = true;
  } else {
    // Nothing within the limit and no zero-workspace algorithm: the least-workspace measurement
    // at the full batch, over the limit, rather than failing the caller's convolution.
    const MicroKernel* least = nullptr;
    if (auto it = m.by_batch.find(batch); it != m.by_batch.end())
      for (const auto& k : it->second)
        if (!least || k.workspace < least->workspace) least = &k;
    if (!least) return nullptr;
    p->run = MicroConfig::single(*least);
    p->fallback = true;
  }
  p->workspace = p->run.workspace;
  p->x_stride_bytes = static_cast<size_t>(layer.x.strides[0]) * element_bytes(layer.x.dtype);
  p->y_stride_bytes = static_cast<size_t>(layer.y.strides[0]) * element_bytes(layer.y.dtype);
  auto w = OwnedFilter::make(layer.w);
  if (!w) {
    VCUDNN_LOG_WARN("microbatch: cannot build descriptors for {}: {}", layer.to_string(), w.error().message);
    return nullptr;
  }
  p->w = std::move(w.value());
  std::vector<MicroKernel> needed = p->run.kernels;
  if (zero) needed.push_back(*zero);  // the pool-miss fallback
  for (const MicroKernel& k : needed) {
    for (auto* side : {&p->x, &p->y}) {
      if (side->count(k.batch)) continue;
      auto t = OwnedTensor::make(side == &p->x ? layer.x : layer.y, k.batch);
      if (!t) {
        VCUDNN_LOG_WARN("microbatch: cannot build descriptors for {}: {}", layer.to_string(), t.error().message);
        return nullptr;
      }
      (*side)[k.batch] = std::move(t.value());
    }
    const int32_t math = k.math_type < 0 ? layer.conv.math_type : k.math_type;
    if (!p->conv.count(math)) {
      auto c = OwnedConvolution::make(layer.conv, math);
      if (!c) {
        VCUDNN_LOG_WARN("microbatch: cannot build descriptors for {}: {}", layer.to_string(), c.error().message);
        return nullptr;
      }
      p->conv[math] = std::move(c.value());
    }
  }
  p->description = p->run.to_string();
  if (p->fallback) p->description += " [fallback: " + decision.reason + "]";
  p->zero_workspace = zero;
  return p;
}

std::shared_ptr<const KernelPlan> MicroBatcher::plan_for(const ConvCall& call, const ConvLayer& layer) {
  const Key key{layer, call.kind};
  std::lock_guard<std::mutex> planning(planning_mu_);
  {
    std::shared_lock<std::shared_mutex> lock(plans_mu_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    if (unmanaged_.count(key)) return nullptr;
  }
  const auto t0 = std::chrono::steady_clock::now();
  BenchCache* cache = resources_->cache();
  const std::vector<int32_t> batches = microbatch_candidate_batches(settings_, call.kind, layer);
  const uint64_t cap = settings_.cap();
  const bool allow_split = microbatch_split_allowed(call.kind, layer);

  std::shared_ptr<KernelPlan> plan;
  auto bench = benchmark_kernel(call, layer, batches, cap, cache);
  PlanDecision decision;
  MicroBatchMeasurements measurements;
  if (bench) {
    n_benchmarked_ += static_cast<uint64_t>(bench->measured);
    n_cache_hits_ += static_cast<uint64_t>(bench->cache_hits);
    measurements = bench->measurements;
    PlanRequest req;
    req.limit = bench->cap;
    req.allow_split = allow_split;
    req.force_split = settings_.force_split;
    decision = choose_microbatch_plan(measurements, req);
  } else {
    decision.fallback = true;
    decision.reason = "benchmark failed: " + bench.error().message;
  }
  plan = build(layer, call.kind, decision, measurements, zero_workspace_kernel(call, layer));
  plan_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  std::unique_lock<std::shared_mutex> lock(plans_mu_);
  if (!plan) {
    unmanaged_[key] = true;
    VCUDNN_LOG_WARN("microbatch: no plan for {} {} ({}); its calls pass through unchanged", conv_kind_name(call.kind),
                    layer.to_string(), decision.reason);
    return nullptr;
  }
  ++n_plans_;
  if (plan->run.kernels.size() > 1) ++n_split_;
  if (plan->fallback) {
    ++n_fallbacks_;
    VCUDNN_LOG_WARN("microbatch: {} {}: {}; running {}", conv_kind_name(call.kind), layer.to_string(), decision.reason,
                    plan->description);
  } else if (plan->run.kernels.size() > 1) {
    VCUDNN_LOG_INFO("microbatch: {} {}: {} ({})", conv_kind_name(call.kind), layer.to_string(), plan->description,
                    decision.reason);
  } else {
    VCUDNN_LOG_DEBUG("microbatch: {} {}: {} ({})", conv_kind_name(call.kind), layer.to_string(), plan->description,
                     decision.reason);
  }
  plans_[key] = plan;
  return plan;
}

cudnnStatus_t MicroBatcher::execute(const KernelPlan& plan, const ConvCall& call, cudaStream_t stream, bool capturing) {
  void* ws = call.workspace;
  size_t ws_bytes = call.workspace_bytes;
  std::optional<pool::Lease> lease;
  pool::WorkspacePool* pool = nullptr;
  const MicroConfig* run = &plan.run;
  MicroConfig zero_run;
  if (plan.workspace > ws_bytes) {
    if (!capturing && (pool = pool_for_current_device())) lease = pool->acquire(stream, plan.workspace);
    if (lease) {
      ws = lease->ptr;
      ws_bytes = lease->bytes;
    } else {
      ++n_pool_misses_;
      if (plan.zero_workspace) {
        zero_run = MicroConfig::single(*plan.zero_workspace);
        run = &zero_run;
        VCUDNN_WARN_LIMITED("microbatch: {} bytes of workspace not available{}; running a zero-workspace algorithm",
                            plan.workspace, capturing ? " during CUDA-graph capture" : " from the pool");
      } else {
        VCUDNN_WARN_LIMITED("microbatch: {} bytes of workspace not available; passing the call through",
                            plan.workspace);
        ++n_passthrough_;
        return call_real(call);
      }
    }
  }
  static const float kOneF = 1.0f;
  static const double kOneD = 1.0;
  const void* one = plan.layer.x.dtype == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&kOneD) : &kOneF;
  int64_t offset = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  for (size_t i = 0; i < run->kernels.size(); ++i) {
    const MicroKernel& k = run->kernels[i];
    const int32_t math = k.math_type < 0 ? plan.layer.conv.math_type : k.math_type;
    ConvCall mc = call;
    mc.desc = {plan.x.at(k.batch)->get(), plan.w->get(), plan.conv.at(math)->get(), plan.y.at(k.batch)->get()};
    mc.algo = k.algo;
    mc.workspace = k.workspace ? ws : nullptr;
    mc.workspace_bytes = k.workspace ? ws_bytes : 0;
    // In layer terms x (x or dx) and y (y or dy) are sliced along N; w (w or dw) never is.
    mc.x = static_cast<char*>(call.x) + offset * static_cast<int64_t>(plan.x_stride_bytes);
    mc.y = static_cast<char*>(call.y) + offset * static_cast<int64_t>(plan.y_stride_bytes);
    if (call.kind == ConvKind::kBackwardFilter && i > 0) mc.beta = one;  // accumulate the weight gradient
    st = call_real(mc);
    if (st != CUDNN_STATUS_SUCCESS) {
      if (i == 0) {
        VCUDNN_WARN_LIMITED("microbatch: {} failed with {}; passing the call through", plan.description,
                            cudnn_status_name(st));
        if (lease) pool->release(*lease, stream);
        ++n_passthrough_;
        return call_real(call);
      }
      VCUDNN_LOG_ERROR("microbatch: micro-batch {} of {} failed with {}", i, plan.description, cudnn_status_name(st));
      break;
    }
    offset += k.batch;
  }
  if (lease) pool->release(*lease, stream);
  ++n_executed_;
  return st;
}

cudnnStatus_t MicroBatcher::convolution(const ConvCall& call) {
  if (!call.handle || !call.alpha || !call.beta || !call.x || !call.w || !call.y) return call_real(call);
  auto layer = manageable(call.desc, call.kind);
  if (!layer) {
    ++n_passthrough_;
    return call_real(call);
  }
  const cudaStream_t stream = handle_stream(call.handle);
  const bool capturing = stream_capturing(stream);
  std::shared_ptr<const KernelPlan> plan = find_plan(*layer, call.kind);
  if (!plan && !capturing) plan = plan_for(call, *layer);
  if (!plan) {
    ++n_passthrough_;
    return call_real(call);
  }
  return execute(*plan, call, stream, capturing);
}

cudnnStatus_t MicroBatcher::workspace_size(const WorkspaceQuery& q) {
  cudnnStatus_t st = call_real(q);
  if (st != CUDNN_STATUS_SUCCESS || !q.size) return st;
  auto layer = manageable(q.desc, q.kind);
  if (!layer) return st;
  {
    std::shared_lock<std::shared_mutex> lock(plans_mu_);
    if (unmanaged_.count(Key{*layer, q.kind})) return st;
  }
  *q.size = 0;  // vcudnn supplies the workspace of this kernel
  return st;
}

cudnnStatus_t MicroBatcher::algo_query(const AlgoQuery& q) {
  cudnnStatus_t st = call_real(q);
  if (st != CUDNN_STATUS_SUCCESS || !q.returned || !q.perf) return st;
  auto layer = manageable(q.desc, q.kind);
  if (!layer) return st;
  {
    std::shared_lock<std::shared_mutex> lock(plans_mu_);
    if (unmanaged_.count(Key{*layer, q.kind})) return st;
  }
  auto* rows = static_cast<cudnnConvolutionFwdAlgoPerf_t*>(q.perf);
  const int n = std::min(*q.returned, q.requested);
  for (int i = 0; i < n; ++i)
    if (rows[i].status == CUDNN_STATUS_SUCCESS) rows[i].memory = 0;  // vcudnn supplies it
  return st;
}

void MicroBatcher::plan_network() {
  if (!settings_.total || network_planned_.exchange(true)) return;
  std::lock_guard<std::mutex> planning(planning_mu_);
  std::vector<std::pair<Key, std::shared_ptr<const KernelPlan>>> kernels;
  {
    std::shared_lock<std::shared_mutex> lock(plans_mu_);
    for (const auto& [k, p] : plans_)
      if (!p->fallback) kernels.emplace_back(k, p);
  }
  if (kernels.empty()) return;
  std::vector<MicroBatchMeasurements> ms;
  double wr_time = 0;
  uint64_t wr_ws = 0;
  for (const auto& [k, p] : kernels) {
    MicroBatchMeasurements m = p->measurements;
    if (!microbatch_split_allowed(k.kind, k.layer))
      for (auto it = m.by_batch.begin(); it != m.by_batch.end();)
        it = it->first == m.mini_batch ? std::next(it) : m.by_batch.erase(it);
    ms.push_back(std::move(m));
    wr_time += p->run.time_ms;
    wr_ws += p->run.workspace;
  }
  const uint64_t per_kernel = std::min(settings_.limit, *settings_.total);
  auto net = choose_network_plan(ms, per_kernel, *settings_.total, PlanRequest{});
  if (!net) {
    VCUDNN_LOG_ERROR(
        "microbatch: {}; keeping the per-kernel plans (each within {}), whose workspace is drawn from a "
        "pool of {}",
        net.error().message, mib(per_kernel), mib(*settings_.total));
    return;
  }
  size_t changed = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto& [k, old] = kernels[i];
    PlanDecision d = old->decision;
    d.config = net->configs[i];
    d.fallback = false;
    d.reason = "network plan (VCUDNN_TOTAL_WORKSPACE)";
    auto fresh = build(k.layer, k.kind, d, old->measurements, old->zero_workspace);
    if (!fresh) continue;
    if (!(fresh->run.kernels == old->run.kernels)) ++changed;
    std::unique_lock<std::shared_mutex> lock(plans_mu_);
    plans_[k] = fresh;
  }
  VCUDNN_LOG_INFO(
      "microbatch: network plan for {} kernels: workspace {} in all (budget {}; per-kernel plans had {}), "
      "predicted {:.3f} ms per iteration (per-kernel plans {:.3f} ms); {} plans changed",
      kernels.size(), mib(net->workspace), mib(*settings_.total), mib(wr_ws), net->time_ms, wr_time, changed);
}

std::string MicroBatcher::summary() const {
  const MicroBatchResources::PoolPeaks peaks = resources_->pool_peaks();
  const uint64_t peak = peaks.reserved, stream_peak = peaks.stream_reserved, misses = n_pool_misses_.load();
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "plans=%" PRIu64 " split=%" PRIu64 " benchmarked=%" PRIu64 " cache_hits=%" PRIu64
                " plan_ms=%.1f fallbacks=%" PRIu64 " executed=%" PRIu64 " passthrough=%" PRIu64 " pool_misses=%" PRIu64
                " workspace_peak=%" PRIu64 " stream_peak=%" PRIu64,
                n_plans_.load(), n_split_.load(), n_benchmarked_.load(), n_cache_hits_.load(), plan_ns_.load() / 1e6,
                n_fallbacks_.load(), n_executed_.load(), n_passthrough_.load(), misses, peak, stream_peak);
  return buf;
}

}  // namespace vcudnn
