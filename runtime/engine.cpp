// The engine: the features per cuDNN call, the load line, its part of the exit line.
#include "runtime/engine.h"

#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <initializer_list>
#include <mutex>

#include "planner/offload_plan.h"
#include "runtime/barrier.h"
#include "runtime/collectives.h"
#include "runtime/decode_conv.h"
#include "runtime/log.h"
#include "runtime/memory_access.h"
#include "runtime/memory_manager.h"
#include "runtime/no_destroy.h"
#include "runtime/offload_replay.h"
#include "runtime/process.h"
#include "runtime/real_api.h"
#include "runtime/stats.h"

namespace vcudnn {
namespace {

std::string version_text(int v) {
  // cuDNN 9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

void log_startup(const Options& o) {
  log::configure_once(o);
  const LibraryInfo& lib = cudnn_library();
  std::string cudnn = lib.found ? "cuDNN " + version_text(static_cast<int>(real().cudnnGetVersion())) + " from " +
                                      lib.path + " (" + lib.how + ")"
                                : "cuDNN NOT FOUND: " + lib.error;
  VCUDNN_LOG_INFO("vcudnn {} active: policy={}{}; {}", VCUDNN_VERSION, o.get(kPolicy),
                  o.get(kTrace).empty() ? "" : ", trace=" + o.get(kTrace), cudnn);
  if (lib.found && lib.missing)
    VCUDNN_LOG_WARN("{} cuDNN entry points missing from {}: {}", lib.missing, lib.path, lib.missing_names);
}

constexpr cudnnStatus_t kOutOfDeviceMemory = CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;

// Memory ownership: the convolution's buffers are brought back first if evicted, in the order of
// the stream set in the handle.
bool touch_pointers(cudnnHandle_t handle, std::initializer_list<const void*> pointers) {
  if (!memory::active()) return true;
  uint64_t words[4] = {};
  size_t n = 0;
  for (const void* p : pointers) words[n++] = reinterpret_cast<uint64_t>(p);
  cudaStream_t stream = nullptr;
  const bool known = real().cudnnGetStream && real().cudnnGetStream(handle, &stream) == CUDNN_STATUS_SUCCESS;
  return memory::touch(words, n, memory::Access::kUnknown, known ? memory::StreamRef(stream) : std::nullopt,
                       "cuDNN convolution");
}

}  // namespace

namespace {

// Under a device budget the recorded iteration becomes the offload plan (offload_replay.h).
RecorderConfig recorder_config(const Options& o) {
  RecorderConfig c;
  c.trace_path = o.get(kTrace);
  if (features_of(o.policy).own_memory) {
    c.on_iteration = [policy = o.get(kOffloadPolicy), placement = o.get(kOffloadPlacement) != "off",
                      partial = o.get(kOffloadPlacement) != "static-whole",
                      across = o.get(kOffloadPlacement) == "static-across" ? AcrossEnd::kWhereFaster
                               : o.get(kOffloadPlacement) == "static"      ? AcrossEnd::kWhereNeeded
                                                                           : AcrossEnd::kNever,
                      asked = o.source[kOffloadPlacement] == OptionSource::kEnvironment,
                      microbatch = features_of(o.policy).microbatch](const Trace& trace) {
      memory::MemoryManager* m = memory::manager();
      if (!m) return;
      // Note [No placement beside unseen collectives]
      bool place = placement;
      if (place && m->budget()) {  // without a budget nothing is planned, nor placed
        const PlacementVerdict v = placement_beside_collectives(collectives_hazard(), asked, collectives::reported());
        if (!v.warning.empty()) VCUDNN_LOG_WARN("offload: {}", v.warning);
        place = v.place;
      }
      const std::string what = replay_recorded_iteration(trace, *m, policy, kFirstRoom, place, partial, across);
      if (!what.empty()) VCUDNN_LOG_INFO("offload: {}", what);
      // Note [Workspaces that decide the budget]: said, never done (it would change the numbers).
      if (m->budget() && !microbatch) {
        if (const std::string advice = workspace_advice(largest_conv_workspace(trace), *m->budget()); !advice.empty())
          VCUDNN_LOG_INFO("offload: {}", advice);
      }
    };
  }
  return c;
}

}  // namespace

Engine::Engine(const Options& o) : features_(features_of(o.policy)), recorder_(recorder_config(o)) {
  log_startup(o);
  // With memory owned, allocations, frees and every call's buffers join the recorded sequence.
  if (features_.record && features_.own_memory) Process::get().connect_recorder(&recorder_);
  if (features_.microbatch) {
    auto resources = std::make_shared<MicroBatchResources>(MicroBatchSettings::from(o));
    microbatcher_ = std::make_unique<MicroBatcher>(resources);
    graph_microbatcher_ = std::make_unique<GraphMicroBatcher>(resources);
    const MicroBatchSettings& s = microbatcher_->settings();
    VCUDNN_LOG_INFO("microbatch: workspace limit {} bytes per convolution{}, batch policy {}, cache {}{}", s.limit,
                    s.total ? ", " + std::to_string(*s.total) + " bytes for the whole network" : "",
                    o.get(kBatchPolicy), s.cache_path.empty() ? "off" : s.cache_path,
                    s.force_split ? ", forced micro-batches of " + std::to_string(*s.force_split) : "");
  }
}

Engine& Engine::get() { return Process::get().engine(); }

cudnnStatus_t Engine::convolution(HookScope& scope, const ConvCall& call) {
  test_fault("engine");
  memory::CallScope memory_scope;  // until the real call has queued its work
  const auto run = [&] { return microbatcher_ ? microbatcher_->convolution(call) : call_real(call); };
  if (!recording()) {
    if (!touch_pointers(call.handle, {call.x, call.w, call.y, call.workspace})) return kOutOfDeviceMemory;
    recorder_.poll();
    cudnnStatus_t st = scope.real(run);
    if (microbatcher_ && microbatcher_->settings().total && !microbatcher_->network_planned())
      microbatcher_->plan_network();  // the first iteration is complete: whole-network choice
    return st;
  }
  // Recording: the probe first, so that the buffers the touch reports are the convolution's.
  Recorder::ConvProbe probe = recorder_.before_convolution(call);
  if (!touch_pointers(call.handle, {call.x, call.w, call.y, call.workspace})) {
    recorder_.after_convolution(probe, call, kOutOfDeviceMemory);
    return kOutOfDeviceMemory;
  }
  cudnnStatus_t st = scope.real(run);
  recorder_.after_convolution(probe, call, st);
  return st;
}

cudnnStatus_t Engine::graph_execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const GraphConv& conv) {
  test_fault("engine");
  memory::CallScope memory_scope;  // until the micro-batches are queued
  if (!touch_pointers(handle, {reinterpret_cast<const void*>(conv.x), reinterpret_cast<const void*>(conv.w),
                               reinterpret_cast<const void*>(conv.y)}))
    return kOutOfDeviceMemory;
  try {
    return graph_microbatcher_->execute(handle, plan, conv);
  } catch (...) {  // before any micro-batch ran (nothing after that allocates): the caller's plan
    note_exception("graph_microbatch");
    return graph_microbatcher_->run_caller_plan(handle, plan, conv);
  }
}

void Engine::graph_workspace_size(cudnnBackendDescriptor_t plan, int64_t* size) noexcept {
  if (!graph_microbatcher_ || !size) return;
  try {
    const std::optional<GraphConv> conv = backend_shadow().convolution(plan, nullptr);
    graph_microbatcher_->workspace_size(plan, conv, size);
  } catch (...) {
    note_exception("cudnnBackendGetAttribute");
  }
}

cudnnStatus_t Engine::graph_fallback(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                     cudnnBackendDescriptor_t variant_pack) noexcept {
  const std::optional<GraphConv> conv = backend_shadow().convolution(plan, variant_pack);
  if (graph_microbatcher_ && conv) return graph_microbatcher_->run_caller_plan(handle, plan, *conv);
  try {
    VCUDNN_LOG_ERROR("graph_microbatch: a plan vcudnn took over cannot be run (its variant pack is unknown)");
  } catch (...) {
  }
  return CUDNN_STATUS_INTERNAL_ERROR;
}

void Engine::graph_descriptor_destroyed(cudnnBackendDescriptor_t descriptor) noexcept {
  if (!graph_microbatcher_) return;
  try {
    graph_microbatcher_->forget(descriptor);
  } catch (...) {
    note_exception("cudnnBackendDestroyDescriptor");
  }
}

std::shared_ptr<const KernelPlan> Engine::plan_of(const ConvDescs& desc, ConvKind kind) const {
  if (!microbatcher_) return nullptr;
  auto layer = decode_conv_layer(desc.x, desc.w, desc.conv, desc.y);
  if (!layer) return nullptr;
  return microbatcher_->find_plan(layer.value(), kind);
}

cudnnStatus_t Engine::algo_query(HookScope& scope, const AlgoQuery& q) {
  test_fault("engine");
  memory::CallScope memory_scope;
  if (q.variant == QueryVariant::kFindEx && !touch_pointers(q.handle, {q.x, q.w, q.y, q.workspace}))
    return kOutOfDeviceMemory;
  const uint64_t t = monotonic_ns();
  cudnnStatus_t st = scope.real([&] { return microbatcher_ ? microbatcher_->algo_query(q) : call_real(q); });
  if (recording()) recorder_.record_query(q, st, t);
  return st;
}

cudnnStatus_t Engine::workspace_size(HookScope& scope, const WorkspaceQuery& q) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  cudnnStatus_t st = scope.real([&] { return microbatcher_ ? microbatcher_->workspace_size(q) : call_real(q); });
  if (recording()) recorder_.record_workspace(q, st, t);
  return st;
}

cudnnStatus_t Engine::max_count(HookScope& scope, const MaxCountQuery& q) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  cudnnStatus_t st = scope.real([&] { return call_real(q); });
  if (recording()) recorder_.record_max_count(q, st, t);
  return st;
}

cudnnStatus_t Engine::create(HookScope& scope, cudnnHandle_t* handle) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  if (!real().cudnnCreate) return unresolved("cudnnCreate");
  cudnnStatus_t st = scope.real([&] { return real().cudnnCreate(handle); });
  if (recording())
    recorder_.record_handle_call(CallKind::kCreate, handle && st == CUDNN_STATUS_SUCCESS ? *handle : nullptr, nullptr,
                                 st, t);
  return st;
}

cudnnStatus_t Engine::destroy(HookScope& scope, cudnnHandle_t handle) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  if (!real().cudnnDestroy) return unresolved("cudnnDestroy");
  if (graph_microbatcher_) graph_microbatcher_->handle_destroyed(handle);
  cudnnStatus_t st = scope.real([&] { return real().cudnnDestroy(handle); });
  if (recording()) recorder_.record_handle_call(CallKind::kDestroy, handle, nullptr, st, t);
  return st;
}

cudnnStatus_t Engine::set_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t stream) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  if (!real().cudnnSetStream) return unresolved("cudnnSetStream");
  cudnnStatus_t st = scope.real([&] { return real().cudnnSetStream(handle, stream); });
  if (recording())
    recorder_.record_handle_call(CallKind::kSetStream, handle, stream, st, t);
  else
    recorder_.poll();
  return st;
}

cudnnStatus_t Engine::get_stream(HookScope& scope, cudnnHandle_t handle, cudaStream_t* stream) {
  test_fault("engine");
  const uint64_t t = monotonic_ns();
  if (!real().cudnnGetStream) return unresolved("cudnnGetStream");
  cudnnStatus_t st = scope.real([&] { return real().cudnnGetStream(handle, stream); });
  if (recording())
    recorder_.record_handle_call(CallKind::kGetStream, handle, stream && st == CUDNN_STATUS_SUCCESS ? *stream : nullptr,
                                 st, t);
  return st;
}

void Engine::iteration_boundary() {
  if (features_.record) recorder_.explicit_boundary();
}

std::string Engine::summary() const {
  const Stats& s = stats();
  const uint64_t calls = s.total_calls();
  const double self_ms = s.self_ns.load() / 1e6;
  std::string line = std::to_string(calls) + " calls (" + s.calls_text() + ")";
  if (s.wrapped_calls.load()) line += ", " + std::to_string(s.wrapped_calls.load()) + " through vcudnnHandle_t";
  if (s.nested_calls.load()) line += ", " + std::to_string(s.nested_calls.load()) + " nested inside cuDNN";
  char buf[96];
  std::snprintf(buf, sizeof buf, "; %.3f ms inside vcudnn (%.2f us/call)", self_ms,
                calls ? self_ms * 1e3 / static_cast<double>(calls) : 0.0);
  line += buf;
  if (features_.record) line += "; recorder: " + recorder_.outcome();
  if (microbatcher_) line += "; microbatch: " + microbatcher_->summary();
  if (graph_microbatcher_) line += "; graph_microbatch: " + graph_microbatcher_->summary();
  return line;
}

void Engine::finish() {
  if (features_.record) recorder_.finish();
}

}  // namespace vcudnn
