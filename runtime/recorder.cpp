// The recorder. Hot-path rules: no host synchronization; no event recorded while the caller's
// stream captures a graph (it would become a graph node); the calls that global-mode capture on
// another thread forbids (event query, create) run in relaxed capture mode (RelaxedCapture); a
// single mutex held only for bookkeeping.
#include "runtime/recorder.h"

#include <algorithm>
#include <climits>

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "planner/mix64.h"
#include "runtime/decode_conv.h"
#include "runtime/hook_scope.h"
#include "runtime/log.h"
#include "runtime/memory/call_scope.h"
#include "runtime/memory/link_probe.h"
#include "runtime/options.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

uint64_t os_thread_id() {
  static thread_local uint64_t tid = static_cast<uint64_t>(::syscall(SYS_gettid));
  return tid;
}

uint32_t intern(std::unordered_map<uint64_t, uint32_t>& index, std::vector<uint64_t>& table, uint64_t key) {
  auto [it, inserted] = index.try_emplace(key, static_cast<uint32_t>(table.size()));
  if (inserted) table.push_back(key);
  return it->second;
}

uint64_t as_u64(const void* p) { return reinterpret_cast<uint64_t>(p); }

// While recording, finished events are collected once this many are pending: often enough to
// keep the pool small, rarely enough to keep event queries off most calls.
constexpr size_t kResolveBatch = 64;

std::string program_name() {
  std::ifstream in("/proc/self/cmdline");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : all)
    if (c == '\0') c = ' ';
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all.size() > 512 ? all.substr(0, 512) : all;
}

// The stream a handle runs on now (queries run on none, but the trace keeps their context).
cudaStream_t stream_of(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  if (real().cudnnGetStream) real().cudnnGetStream(handle, &stream);
  return stream;
}

std::optional<ConvLayer> decode(const ConvDescs& d) {
  auto layer = decode_conv_layer(d.x, d.w, d.conv, d.y);
  if (layer) return layer.value();
  VCUDNN_LOG_DEBUG("convolution descriptors not decoded ({}); the call is recorded without a layer",
                   layer.error().message);
  return std::nullopt;
}

}  // namespace

Recorder::Recorder(RecorderConfig config) : config_(std::move(config)), start_ns_(monotonic_ns()) {}

uint64_t Recorder::now_ns() const { return monotonic_ns() - start_ns_; }

template <typename F>
void Recorder::safely(const char* what, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    fail(what, e.what());
  } catch (...) {
    fail(what, "unknown exception");
  }
}

void Recorder::fail(const char* what, const char* why) noexcept {
  active_.store(false, std::memory_order_relaxed);
  phase_.store(kDone, std::memory_order_relaxed);
  try {
    VCUDNN_LOG_ERROR("recorder stopped: {} failed ({}); calls keep passing through unchanged", what, why);
  } catch (...) {
  }
}

Recorder::ConvProbe Recorder::before_convolution(const ConvCall& call) {
  ConvProbe p;
  safely("before_convolution", [&] { p = before_convolution_impl(call); });
  return p;
}

void Recorder::after_convolution(ConvProbe& p, const ConvCall& call, cudnnStatus_t status) {
  safely("after_convolution", [&] { after_convolution_impl(p, call, status); });
}

namespace {

// The buffers the memory runtime reports while a convolution is in progress on this thread are
// that convolution's accesses (Note [A shadow of values] does not apply: these are plain pointers).
thread_local bool tl_in_conv = false;
thread_local std::vector<memory::BufferUse> tl_conv_uses;
// The start event of this thread's convolution probe in progress, and its stream (Note [GPU time
// without the waits for memory]).
thread_local cudaEvent_t tl_probe_start = nullptr;
thread_local cudaStream_t tl_probe_stream = nullptr;

constexpr uint64_t kUnknownStream = ~uint64_t{0};


CallKind kind_of_api(std::string_view api) {
  if (api.find("Launch") != std::string_view::npos) return CallKind::kLaunch;
  if (api.starts_with("cudaMemcpy") || api.starts_with("cuMemcpy")) return CallKind::kMemcpy;
  if (api.starts_with("cudaMemset") || api.starts_with("cuMemset")) return CallKind::kMemset;
  if (api.starts_with("cudnnBackendExecute")) return CallKind::kGraphExecute;
  return CallKind::kLibrary;
}

}  // namespace

namespace {

// What makes two operations the same one in another iteration: kind, direction, layer, API and
// the sizes of the buffers involved (addresses and times differ from one iteration to the next).
// The buffers a call uses count as a set (the order they are reported in follows their addresses).
// A kernel launch's buffers do not count at all: they are found by scanning its parameters for
// pointers, and a word that is no pointer (padding, a stale field) hits whatever buffer lives at
// that address in this iteration. Under a device budget addresses move from step to step, and the
// transformer's launches gained or lost such a buffer in 1 step of 8 (H100 trace), so no two steps
// were alike.
uint64_t identity_of(const TraceCall& c, const std::vector<TraceBuffer>& buffers) {
  uint64_t h = mix64(static_cast<uint64_t>(c.kind) + 1);
  h = mix64(h ^ (static_cast<uint64_t>(c.conv) << 8) ^ (static_cast<uint64_t>(static_cast<uint32_t>(c.layer)) << 16));
  h = mix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(c.name)));
  if (c.buffer >= 0) h = mix64(h ^ buffers[static_cast<size_t>(c.buffer)].bytes);
  if (c.kind == CallKind::kLaunch) return h;
  uint64_t used = 0;
  for (const BufferAccess& a : c.accesses)
    used += mix64(buffers[a.buffer].bytes ^ (static_cast<uint64_t>(a.mode) << 62));
  return mix64(h ^ used);
}

}  // namespace

std::optional<DetectedIteration> Recorder::on_op(const TraceCall& c, int64_t live_before) {
  if (c.kind == CallKind::kFree) return std::nullopt;  // no operation (Note [Iterations without convolutions])
  auto found = op_detector_.on_op(c.seq, identity_of(c, buffers_), live_before);
  // Convolutions, when there are any, delimit iterations (IterationDetector); so does the program.
  if (!found || detector_.convolutions_seen() > 0 || detector_.explicit_mode()) return std::nullopt;
  VCUDNN_LOG_INFO("iteration found from the operations (no convolutions): calls {}..{}", found->first_seq,
                  found->end_seq);
  return found;
}

std::vector<BufferAccess> Recorder::take_conv_accesses() {
  tl_in_conv = false;
  std::vector<BufferAccess> accesses;
  std::lock_guard<std::mutex> lock(mu_);
  add_uses(accesses, tl_conv_uses.data(), tl_conv_uses.size());
  tl_conv_uses.clear();
  return accesses;
}

// Each buffer once, its modes joined. A use reported after the buffer's free (a race the
// framework's own reference keeps from happening) is dropped rather than make the trace
// contradict itself.
void Recorder::add_uses(std::vector<BufferAccess>& accesses, const memory::BufferUse* uses, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (freed_.count(uses[i].buffer.serial)) continue;
    const uint32_t b = intern_buffer(uses[i].buffer);
    const auto mode = static_cast<uint8_t>(uses[i].mode & 3);
    const auto it =
        std::find_if(accesses.begin(), accesses.end(), [&](const BufferAccess& a) { return a.buffer == b; });
    if (it != accesses.end())
      it->mode = static_cast<AccessMode>(static_cast<uint8_t>(it->mode) | mode);
    else
      accesses.push_back({b, static_cast<AccessMode>(mode)});
  }
}

uint32_t Recorder::intern_buffer(const memory::BufferRef& b) {
  const auto [it, inserted] = buffer_index_.try_emplace(b.serial, static_cast<uint32_t>(buffers_.size()));
  if (inserted) buffers_.push_back({b.serial, b.address, b.bytes, b.library});
  return it->second;
}

int32_t Recorder::intern_name(const char* name) {
  if (!name) return -1;
  const auto [it, inserted] = name_index_.try_emplace(name, static_cast<int32_t>(names_.size()));
  if (inserted) names_.emplace_back(name);
  return it->second;
}

void Recorder::allocated(const memory::BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept {
  safely("allocated", [&] { append_memory_op(CallKind::kAlloc, nullptr, stream, &buffer, nullptr, 0); });
}

void Recorder::freed(const memory::BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept {
  safely("freed", [&] { append_memory_op(CallKind::kFree, nullptr, stream, &buffer, nullptr, 0); });
}

void Recorder::used(const char* api, std::optional<cudaStream_t> stream, const memory::BufferUse* uses,
                    size_t n) noexcept {
  safely("used", [&] {
    if (tl_in_conv) {
      tl_conv_uses.insert(tl_conv_uses.end(), uses, uses + n);
      return;
    }
    append_memory_op(kind_of_api(api ? api : ""), api, stream, nullptr, uses, n);
  });
}

void Recorder::append_memory_op(CallKind kind, const char* api, std::optional<cudaStream_t> stream,
                                const memory::BufferRef* buffer, const memory::BufferUse* uses, size_t n) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_.load(std::memory_order_relaxed) != kRecording) return;
  if (call_queues_device_work(kind)) {
    // One hook's call reporting again (a copy's source, then its destination): one operation.
    if (Recorded* same = call_in_progress(api)) {
      add_uses(same->call.accesses, uses, n);
      return;
    }
  }
  Recorded rec;
  TraceCall& c = rec.call;
  c.seq = next_seq_++;
  c.host_us = now_ns() / 1e3;
  c.kind = kind;
  c.thread = intern(thread_index_, threads_, os_thread_id());
  c.handle = intern(handle_index_, handles_, 0);
  c.stream = intern(stream_index_, streams_, stream ? as_u64(*stream) : kUnknownStream);
  c.name = intern_name(api);
  if (buffer) c.buffer = static_cast<int32_t>(intern_buffer(*buffer));
  if (kind == CallKind::kFree) freed_.insert(buffer->serial);
  add_uses(c.accesses, uses, n);
  if (call_queues_device_work(kind)) open_call(rec, api, stream);
  const int64_t live_before = live_;
  rec.live_before = live_;
  if (kind == CallKind::kAlloc) live_ += static_cast<int64_t>(buffer->bytes);
  if (kind == CallKind::kFree) live_ -= static_cast<int64_t>(buffer->bytes);
  memory_seen_ = memory_seen_ || kind == CallKind::kAlloc || kind == CallKind::kFree;
  const uint64_t seq = c.seq;
  calls_.push_back(std::move(rec));
  // Convolutions delimit iterations from the first cuDNN call on (or the first
  // vcudnnIterationBoundary()): what ran before it (the program's setup, recorded since memory
  // ownership began) is no iteration's.
  auto found = cudnn_seen_ || detector_.explicit_mode() ? detector_.on_call(seq, nullptr) : std::nullopt;
  if (!found) found = on_op(calls_.back().call, live_before);
  if (found && steady_enough(*found)) {
    on_detected(*found);
  } else if (calls_.size() >= config_.max_calls) {
    stop_without_iteration("no repeating iteration in the first " + std::to_string(calls_.size()) + " calls");
  }
}

// ---- Note [GPU time of every operation] ---------------------------------------------------------
// While recording, every call that queues device work (a library call, a kernel launch, a copy
// or set; convolutions have their own probe) gets two events on its stream: one when the hook
// reports its buffers, before the real call, and one when the hook's outermost CallScope ends,
// after the real call has queued its work (memory::at_call_end). The time between them is the
// call's GPU time, also when the GPU waits for the host between calls. A second report of the
// same hook's call (a copy reports its source and its destination) joins the first: one
// operation, its accesses joined. Not timed: a call on no known stream, a call on a stream that
// captures a graph (an event would become a node), and a call of another API made inside a hook's
// call (the outer call's events cover it). Both events come from
// the pool and are queried, never waited for, like the convolutions'. A hook's call that ends
// after the recorder finished gives its events straight back.

namespace {

struct OpenOp {  // the hook call in progress on this thread (its real call has not returned)
  uint64_t seq = 0;
  size_t index = 0;           // in calls_
  const char* api = nullptr;  // nullptr: none in progress
  cudaStream_t stream = nullptr;
  int device = -1;
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
};
thread_local OpenOp tl_open;

}  // namespace

// Note [GPU time without the waits for memory]
// A call's start event is recorded when its buffers are reported, before the memory runtime brings
// back those it evicted: under a budget the iterations recorded run with on-demand eviction, and
// their calls' GPU times counted the waits for those copies. On the H100 the plans made from them
// predicted 110-230 ms steps that then took 61-163 ms (VGG-16 b64 and ResNet-50 b128 at 90 % and
// 70 %, 2026-11-25), and the plan's timeline, by which prefetches are held, copies out are laid
// out around and plans compared, was that much off. So when a call's buffers had to come back, its
// start event is recorded again once they are queued: its time is its work's.
void Recorder::waited() noexcept {
  safely("waited", [&] {
    const RealCudart& rt = real_cudart();
    if (!rt.cudaEventRecord) return;
    if (tl_open.start) {
      rt.cudaEventRecord(tl_open.start, tl_open.stream);
    } else if (tl_in_conv && tl_probe_start) {
      rt.cudaEventRecord(tl_probe_start, tl_probe_stream);
    }
  });
}

Recorder::Recorded* Recorder::call_in_progress(const char* api) {
  const OpenOp& o = tl_open;
  if (!o.api || o.api != api || o.index >= calls_.size() || calls_[o.index].call.seq != o.seq) return nullptr;
  return &calls_[o.index];
}

void Recorder::open_call(Recorded& rec, const char* api, std::optional<cudaStream_t> stream) {
  if (tl_open.api) return;  // another API inside one hook's call: a call of its own, untimed
  const auto ended = [](void* self) { static_cast<Recorder*>(self)->op_ended(); };
  if (!memory::at_call_end(ended, this)) return;  // reported outside a hook's call
  tl_open = OpenOp{rec.call.seq, calls_.size(), api};
  if (stream) start_op_timing(rec, *stream);
}

// A start event recorded on `stream` and an end event for later: none when the stream captures
// a graph (captured is set: an event would become a graph node) or a call fails.
Recorder::Timing Recorder::start_timing(cudaStream_t stream) {
  Timing t;
  if (!config_.gpu_timing) return t;
  const RealCudart& rt = real_cudart();
  if (!rt.cudaStreamIsCapturing || !rt.cudaGetDevice || !rt.cudaEventRecord) return t;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing(stream, &capture) != cudaSuccess) return t;
  if (capture != cudaStreamCaptureStatusNone) {
    t.captured = true;
    return t;
  }
  if (rt.cudaGetDevice(&t.device) != cudaSuccess) return t;
  t.start = events_.acquire(t.device);
  t.end = events_.acquire(t.device);
  if (!t.start || !t.end || rt.cudaEventRecord(t.start, stream) != cudaSuccess) {
    events_.release(t.device, t.start);
    events_.release(t.device, t.end);
    t.start = t.end = nullptr;
  }
  return t;
}

void Recorder::start_op_timing(Recorded& rec, cudaStream_t stream) {
  const Timing t = start_timing(stream);
  rec.call.captured = t.captured;
  if (!t.end) return;
  rec.start = t.start;
  rec.end = t.end;
  rec.device = t.device;
  tl_open.stream = stream;
  tl_open.device = t.device;
  tl_open.start = t.start;
  tl_open.end = t.end;
}

void Recorder::op_ended() noexcept {
  const OpenOp o = std::exchange(tl_open, OpenOp{});
  if (!o.end) return;
  safely("op_ended", [&] {
    const bool recorded = real_cudart().cudaEventRecord(o.end, o.stream) == cudaSuccess;
    std::lock_guard<std::mutex> lock(mu_);
    const bool listed = phase_.load(std::memory_order_relaxed) != kDone && o.index < calls_.size() &&
                        calls_[o.index].call.seq == o.seq && calls_[o.index].end == o.end;
    if (listed && recorded) {
      pending_.push_back(o.index);
      if (pending_.size() >= kResolveBatch) resolve(/*final=*/false);
      return;
    }
    if (listed) calls_[o.index].start = calls_[o.index].end = nullptr;
    events_.release(o.device, o.start);
    events_.release(o.device, o.end);
  });
}

Recorder::ConvProbe Recorder::before_convolution_impl(const ConvCall& call) {
  return start_probe(call.handle, decode(call.desc));
}

// The host time, the stream, and a start event on it (none while the stream is captured).
Recorder::ConvProbe Recorder::start_probe(cudnnHandle_t handle, std::optional<ConvLayer> layer) {
  ConvProbe p;
  if (!active()) return p;
  p.on = true;
  p.host_ns = now_ns();
  p.layer = std::move(layer);
  tl_in_conv = true;  // the buffers reported until the call ends are its accesses
  tl_conv_uses.clear();
  if (real().cudnnGetStream && real().cudnnGetStream(handle, &p.stream) != CUDNN_STATUS_SUCCESS) return p;
  const Timing t = start_timing(p.stream);
  p.captured = t.captured;  // never add work to a graph being captured
  p.device = t.device;
  p.start = t.start;
  p.end = t.end;
  tl_probe_start = p.start;
  tl_probe_stream = p.stream;
  return p;
}

// The end event; false when the probe was off.
bool Recorder::end_probe(ConvProbe& p, cudnnStatus_t status) {
  tl_probe_start = nullptr;
  if (!p.on) {
    tl_in_conv = false;
    tl_conv_uses.clear();
    return false;
  }
  if (p.end && (status != CUDNN_STATUS_SUCCESS || real_cudart().cudaEventRecord(p.end, p.stream) != cudaSuccess)) {
    events_.release(p.device, p.start);
    events_.release(p.device, p.end);
    p.start = p.end = nullptr;
  }
  return true;
}

// What every recorded convolution carries, from its probe (the end event already recorded).
Recorder::Recorded Recorder::convolution_record(ConvProbe& p, ConvKind kind, cudnnStatus_t status) {
  Recorded rec;
  TraceCall& c = rec.call;
  c.accesses = take_conv_accesses();
  c.host_us = p.host_ns / 1e3;
  c.kind = CallKind::kConvolution;
  c.conv = kind;
  c.status = status;
  c.captured = p.captured;
  rec.start = p.start;
  rec.end = p.end;
  rec.device = p.device;
  return rec;
}

void Recorder::after_convolution_impl(ConvProbe& p, const ConvCall& call, cudnnStatus_t status) {
  if (!end_probe(p, status)) return;
  Recorded rec = convolution_record(p, call.kind, status);
  TraceCall& c = rec.call;
  c.algo = call.algo;
  c.workspace_bytes = call.workspace_bytes;
  c.ptrs = {as_u64(call.x), as_u64(call.w), as_u64(call.y), as_u64(call.workspace)};
  const int32_t dtype = p.layer ? p.layer->x.dtype : CUDNN_DATA_FLOAT;
  c.alpha = read_scaling(call.alpha, dtype);
  c.beta = read_scaling(call.beta, dtype);
  c.user_layer = call.user_layer;
  append(std::move(rec), call.handle, p.stream, p.layer, /*exec=*/true);
}

Recorder::ConvProbe Recorder::before_graph_convolution(cudnnHandle_t handle, const GraphConv& conv) {
  ConvProbe p;
  safely("before_graph_convolution", [&] { p = start_probe(handle, conv.layer); });
  return p;
}

void Recorder::after_graph_convolution(ConvProbe& p, cudnnHandle_t handle, const GraphConv& conv,
                                       cudnnStatus_t status) {
  safely("after_graph_convolution", [&] {
    if (!end_probe(p, status)) return;
    Recorded rec = convolution_record(p, conv.kind, status);
    TraceCall& c = rec.call;
    c.algo = static_cast<int32_t>(std::clamp<int64_t>(conv.engine, -1, INT32_MAX));
    c.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(conv.workspace_bytes.value_or(0), 0));
    c.ptrs = {conv.x, conv.w, conv.y, conv.workspace};
    c.alpha = conv.alpha;
    c.beta = conv.beta;
    append(std::move(rec), handle, p.stream, p.layer, /*exec=*/true);
  });
}

void Recorder::record_query(const AlgoQuery& q, cudnnStatus_t status, uint64_t host_ns) {
  if (!active()) return;
  safely("record_query", [&] {
    Recorded rec;
    TraceCall& c = rec.call;
    c.host_us = (host_ns - start_ns_) / 1e3;
    c.kind = q.variant == QueryVariant::kGetV7  ? CallKind::kGetAlgorithmV7
             : q.variant == QueryVariant::kFind ? CallKind::kFindAlgorithm
                                                : CallKind::kFindAlgorithmEx;
    c.conv = q.kind;
    c.status = status;
    c.requested = q.requested;
    c.returned = (status == CUDNN_STATUS_SUCCESS && q.returned) ? *q.returned : 0;
    c.perf = read_perf(q, c.returned);
    c.user_layer = q.user_layer;
    if (q.variant == QueryVariant::kFindEx) {
      c.ptrs = {as_u64(q.x), as_u64(q.w), as_u64(q.y), as_u64(q.workspace)};
      c.workspace_bytes = q.workspace_bytes;
    }
    append(std::move(rec), q.handle, stream_of(q.handle), decode(q.desc), false);
  });
}

void Recorder::record_workspace(const WorkspaceQuery& q, cudnnStatus_t status, uint64_t host_ns) {
  if (!active()) return;
  safely("record_workspace", [&] {
    Recorded rec;
    TraceCall& c = rec.call;
    c.host_us = (host_ns - start_ns_) / 1e3;
    c.kind = CallKind::kGetWorkspaceSize;
    c.conv = q.kind;
    c.status = status;
    c.algo = q.algo;
    c.workspace_bytes = (status == CUDNN_STATUS_SUCCESS && q.size) ? *q.size : 0;
    c.user_layer = q.user_layer;
    append(std::move(rec), q.handle, stream_of(q.handle), decode(q.desc), false);
  });
}

void Recorder::record_max_count(const MaxCountQuery& q, cudnnStatus_t status, uint64_t host_ns) {
  if (!active()) return;
  safely("record_max_count", [&] {
    Recorded rec;
    TraceCall& c = rec.call;
    c.host_us = (host_ns - start_ns_) / 1e3;
    c.kind = CallKind::kGetAlgorithmMaxCount;
    c.conv = q.kind;
    c.status = status;
    c.returned = (status == CUDNN_STATUS_SUCCESS && q.count) ? *q.count : 0;
    append(std::move(rec), q.handle, stream_of(q.handle), std::nullopt, false);
  });
}

void Recorder::record_handle_call(CallKind kind, cudnnHandle_t handle, cudaStream_t stream, cudnnStatus_t status,
                                  uint64_t host_ns) {
  if (!active()) return;
  safely("record_handle_call", [&] {
    Recorded rec;
    rec.call.host_us = (host_ns - start_ns_) / 1e3;
    rec.call.kind = kind;
    rec.call.status = status;
    append(std::move(rec), handle, stream, std::nullopt, false);
  });
}

int32_t Recorder::intern_layer(const ConvLayer& layer) {
  auto [it, inserted] = layer_index_.try_emplace(layer, static_cast<int32_t>(layers_.size()));
  if (inserted) layers_.push_back(layer);
  return it->second;
}

void Recorder::append(Recorded&& rec, cudnnHandle_t handle, cudaStream_t stream, const std::optional<ConvLayer>& layer,
                      bool exec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_.load(std::memory_order_relaxed) != kRecording) {  // stopped while we were in the call
    events_.release(rec.device, rec.start);
    events_.release(rec.device, rec.end);
    return;
  }
  TraceCall& c = rec.call;
  c.seq = next_seq_++;
  cudnn_seen_ = true;
  c.thread = intern(thread_index_, threads_, os_thread_id());
  c.handle = intern(handle_index_, handles_, as_u64(handle));
  c.stream = intern(stream_index_, streams_, as_u64(stream));
  if (layer) c.layer = intern_layer(*layer);
  const ExecItem item{c.conv, c.layer};
  const uint64_t seq = c.seq;
  rec.live_before = live_;
  if (rec.end) pending_.push_back(calls_.size());
  calls_.push_back(std::move(rec));
  if (pending_.size() >= kResolveBatch) resolve(/*final=*/false);  // bounds the events in flight
  auto found = detector_.on_call(seq, exec ? &item : nullptr);
  if (!found) found = on_op(calls_.back().call, live_);
  if (found && steady_enough(*found)) {
    on_detected(*found);
  } else if (calls_.size() >= config_.max_calls) {
    stop_without_iteration("no repeating iteration in the first " + std::to_string(calls_.size()) + " calls");
  }
}

void Recorder::explicit_boundary() {
  safely("explicit_boundary", [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_.load(std::memory_order_relaxed) != kRecording) return;
    if (auto found = detector_.on_explicit_boundary(next_seq_)) on_detected(*found);
  });
}

// Note [A steady iteration]
// A training step's first run is not a steady one: it allocates what every later step keeps
// (gradients on the first backward, an optimizer's state on the first update), so its live bytes
// end higher than they begin, and its peak lacks that state (resnet18's momentum buffers: 5% of
// its steady live peak on the H100). Where convolutions delimit iterations, an iteration runs from
// one step's last backward convolution to the next one's: the first two repeats hold the
// allocation of gradients and of the optimizer's state, the third is steady. An iteration found
// automatically is taken only when it ends at the live bytes it began with, give or take 1% of
// its peak, and frees as many buffers as it allocates, give or take 1% of them (at least 2): one
// period of a repeating sequence of allocations and frees holds each of its events once. Bytes
// alone were not enough: ResNet-50 at batch 128 allocates its momentum buffers (161 of them,
// 98 MiB) in a repeat whose peak is 10.6 GiB, so that repeat passed and its plan never matched a
// later step (the replay lost the script at every iteration). Otherwise recording goes on and
// the detector's next repeat (one step later) is tried. A program whose memory grows every step
// (losses kept on the device) never passes: the iteration found after kMostUnsteady refusals is
// taken anyway, and the log says by how much memory grew. Iterations marked by
// vcudnnIterationBoundary() are taken as given, and OpRepeatDetector's windows begin and end at
// one level by construction. Without memory ownership no allocation is seen and every iteration
// passes.
namespace {
constexpr size_t kMostUnsteady = 3;
}  // namespace

size_t Recorder::index_of(uint64_t seq) const {
  const auto it =
      std::lower_bound(calls_.begin(), calls_.end(), seq, [](const Recorded& r, uint64_t s) { return r.call.seq < s; });
  return static_cast<size_t>(it - calls_.begin());
}

int64_t Recorder::live_at(uint64_t seq) const {
  const size_t i = index_of(seq);
  return i == calls_.size() ? live_ : calls_[i].live_before;
}

bool Recorder::steady_enough(const DetectedIteration& it) {
  if (it.how != "auto" || !memory_seen_) return true;
  const int64_t begin = live_at(it.first_seq), end = live_at(it.end_seq);
  int64_t peak = std::max(begin, end);
  int64_t allocs = 0, frees = 0;
  for (size_t i = index_of(it.first_seq); i < calls_.size() && calls_[i].call.seq < it.end_seq; ++i) {
    peak = std::max(peak, calls_[i].live_before);
    allocs += calls_[i].call.kind == CallKind::kAlloc;
    frees += calls_[i].call.kind == CallKind::kFree;
  }
  const int64_t growth = end - begin;
  const bool balanced = std::abs(allocs - frees) <= std::max<int64_t>(2, (allocs + frees) / 100);
  if (std::abs(growth) <= std::max<int64_t>(peak, 0) / 100 && balanced) return true;
  const double mib = static_cast<double>(growth) / (1 << 20);
  if (unsteady_ == kMostUnsteady) {
    VCUDNN_LOG_INFO(
        "iteration at calls {}..{}: live bytes still change by {:.1f} MiB over it (memory grows every iteration); "
        "taken after {} such",
        it.first_seq, it.end_seq, mib, kMostUnsteady);
    return true;
  }
  ++unsteady_;
  VCUDNN_LOG_INFO(
      "repeat at calls {}..{} is no steady iteration: live bytes change by {:.1f} MiB over it, {} allocations "
      "against {} frees (state allocated once: gradients, an optimizer's); recording goes on",
      it.first_seq, it.end_seq, mib, allocs, frees);
  return false;
}

void Recorder::on_detected(const DetectedIteration& it) {
  detected_ = it;
  active_.store(false, std::memory_order_relaxed);
  phase_.store(kResolving, std::memory_order_relaxed);
  VCUDNN_LOG_INFO("iteration found ({}): calls {}..{} ({} calls, {} convolutions); recording stopped", it.how,
                  it.first_seq, it.end_seq, it.end_seq - it.first_seq, it.convolutions);
  // Completed by the next poll(), outside this lock (on_iteration).
}

void Recorder::stop_without_iteration(const std::string& why) {
  active_.store(false, std::memory_order_relaxed);
  phase_.store(kResolving, std::memory_order_relaxed);
  VCUDNN_LOG_WARN("{}; recording stopped. Call vcudnnIterationBoundary() after each iteration to mark them.", why);
  outcome_ = why;
}

void Recorder::poll_slow() {
  safely("poll", [&] {
    std::optional<Trace> trace;
    {
      std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
      if (!lock.owns_lock() || phase_.load(std::memory_order_relaxed) != kResolving) return;
      if (resolve(false)) trace = complete(false);
    }
    if (trace && config_.on_iteration) config_.on_iteration(*trace);
  });
}

bool Recorder::resolve(bool final) {
  const RealCudart& rt = real_cudart();
  const bool recording = phase_.load(std::memory_order_relaxed) == kRecording;
  auto wanted = [&](const TraceCall& c) {
    if (recording) return true;
    if (!detected_) return true;  // an incomplete trace keeps everything
    // The iteration and the one after it (Note [GPU times from the next iteration]).
    return c.seq >= detected_->first_seq && c.seq < detected_->end_seq + (detected_->end_seq - detected_->first_seq);
  };
  std::optional<RelaxedCapture> relaxed;
  while (!pending_.empty()) {
    Recorded& r = calls_[pending_.front()];
    if (wanted(r.call)) {
      if (!relaxed) relaxed.emplace();
      cudaError_t q = rt.cudaEventQuery ? rt.cudaEventQuery(r.end) : cudaErrorNotReady;
      if (q == cudaErrorNotReady && !final) return false;
      float ms = 0;
      if (q == cudaSuccess && rt.cudaEventElapsedTime(&ms, r.start, r.end) == cudaSuccess) r.call.gpu_ms = ms;
    }
    events_.release(r.device, r.start);
    events_.release(r.device, r.end);
    r.start = r.end = nullptr;
    pending_.pop_front();
  }
  return true;
}

std::optional<Trace> Recorder::complete(bool final) {
  phase_.store(kDone, std::memory_order_relaxed);
  Trace trace = build_trace();
  size_t timed = 0, work = 0, convs = 0, captured = 0;
  for (const auto& c : trace.calls) {
    convs += c.kind == CallKind::kConvolution;
    if (!call_queues_device_work(c.kind)) continue;
    ++work;
    timed += c.gpu_ms.has_value();
    captured += c.captured;
  }
  std::string what = trace.complete ? "iteration of " + std::to_string(trace.calls.size()) + " calls (" +
                                          std::to_string(convs) + " convolutions, " + trace.detected_by + ")"
                                    : outcome_ + "; " + std::to_string(trace.calls.size()) + " calls recorded";
  what += "; GPU time for " + std::to_string(timed) + " of " + std::to_string(work) + " calls that queue work";
  if (trace.next_timed) what += " (" + std::to_string(trace.next_timed) + " from the next iteration)";
  if (captured) what += ", " + std::to_string(captured) + " captured into graphs";
  const std::string& path_pattern = config_.trace_path;
  if (!path_pattern.empty()) {
    const std::string path = expand_path(path_pattern);
    Status st = write_trace(trace, path);
    if (st) {
      what += "; trace written to " + path;
      VCUDNN_LOG_INFO("trace: {}", what);
    } else {
      what += "; trace NOT written: " + st.error().message;
      VCUDNN_LOG_ERROR("VCUDNN_TRACE: {}", st.error().message);
    }
  } else {
    VCUDNN_LOG_DEBUG("trace: {} (VCUDNN_TRACE not set)", what);
  }
  outcome_ = what + (final ? " (at exit)" : "");
  calls_.clear();
  calls_.shrink_to_fit();
  if (!trace.complete) return std::nullopt;
  return trace;
}

Trace Recorder::build_trace() const {
  Trace t;
  t.vcudnn_version = VCUDNN_VERSION;
  t.cudnn_version = real().cudnnGetVersion ? static_cast<int64_t>(real().cudnnGetVersion()) : 0;
  t.cudnn_library = cudnn_library().path;
  t.pid = ::getpid();
  t.program = program_name();
  t.link = memory::measured_link();  // Note [Measuring the host link]
  if (memory_seen_)
    t.alive_at_start = static_cast<uint64_t>(std::max<int64_t>(0, live_at(detected_ ? detected_->first_seq : 0)));
  if (detected_) {
    t.detected_by = detected_->how;
    t.complete = true;
    t.first_seq = detected_->first_seq;
    t.end_seq = detected_->end_seq;
  } else {
    t.first_seq = 0;
    t.end_seq = next_seq_;
  }
  std::unordered_map<uint64_t, uint32_t> th, ha, st;
  std::unordered_map<int32_t, int32_t> la, na;
  std::unordered_map<uint32_t, uint32_t> bu;
  const auto buffer = [&](uint32_t b) {
    const auto [it, inserted] = bu.try_emplace(b, static_cast<uint32_t>(t.buffers.size()));
    if (inserted) t.buffers.push_back(buffers_[b]);
    return it->second;
  };
  for (const auto& r : calls_) {
    if (r.call.seq < t.first_seq || r.call.seq >= t.end_seq) continue;
    TraceCall c = r.call;
    c.thread = intern(th, t.threads, threads_[c.thread]);
    c.handle = intern(ha, t.handles, handles_[c.handle]);
    c.stream = intern(st, t.streams, streams_[c.stream]);
    if (c.layer >= 0) {
      auto [it, inserted] = la.try_emplace(c.layer, static_cast<int32_t>(t.layers.size()));
      if (inserted) t.layers.push_back(layers_[c.layer]);
      c.layer = it->second;
    }
    if (c.name >= 0) {
      auto [it, inserted] = na.try_emplace(c.name, static_cast<int32_t>(t.names.size()));
      if (inserted) t.names.push_back(names_[static_cast<size_t>(c.name)]);
      c.name = it->second;
    }
    if (c.buffer >= 0) c.buffer = static_cast<int32_t>(buffer(static_cast<uint32_t>(c.buffer)));
    for (BufferAccess& a : c.accesses) a.buffer = buffer(a.buffer);
    t.calls.push_back(std::move(c));
  }
  t.next_timed = take_next_iteration_times(t);
  if (t.next_timed) t.gpu_times = "next";
  return t;
}

// Note [GPU times from the next iteration] (iteration_detector.h). mu_ held; `t` holds the
// iteration's calls in the order of calls_.
size_t Recorder::take_next_iteration_times(Trace& t) const {
  if (!detected_) return 0;
  const uint64_t first = detected_->first_seq, end = detected_->end_seq, next_end = end + (end - first);
  std::vector<uint64_t> ours, next;
  std::vector<const TraceCall*> next_calls;
  for (const Recorded& r : calls_) {
    if (r.call.seq >= first && r.call.seq < end) {
      ours.push_back(identity_of(r.call, buffers_));
    } else if (r.call.seq >= end && r.call.seq < next_end) {
      next.push_back(identity_of(r.call, buffers_));
      next_calls.push_back(&r.call);
    }
  }
  const std::vector<int64_t> match = align_ops(ours, next);
  size_t taken = 0;
  for (size_t i = 0; i < match.size() && i < t.calls.size(); ++i) {
    if (match[i] < 0) continue;
    const TraceCall& same = *next_calls[static_cast<size_t>(match[i])];
    if (!same.gpu_ms || !call_queues_device_work(same.kind)) continue;
    t.calls[i].gpu_ms = same.gpu_ms;
    ++taken;
  }
  return taken;
}

void Recorder::finish() {
  safely("finish", [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_.load(std::memory_order_relaxed) == kRecording) {
      if (calls_.empty()) {
        outcome_ = "nothing recorded";
        phase_.store(kDone, std::memory_order_relaxed);
        return;
      }
      if (auto found = detector_.on_end()) {
        detected_ = found;
        VCUDNN_LOG_INFO("iteration found at exit ({}): calls {}..{}", found->how, found->first_seq, found->end_seq);
      } else {
        outcome_ =
            "no complete iteration found (" + std::to_string(detector_.convolutions_seen()) + " convolutions seen)";
        if (!config_.trace_path.empty())
          VCUDNN_LOG_WARN("{}; the trace holds every recorded call and says complete=false", outcome_);
      }
      active_.store(false, std::memory_order_relaxed);
      phase_.store(kResolving, std::memory_order_relaxed);
    }
    if (phase_.load(std::memory_order_relaxed) == kResolving) {
      resolve(/*final=*/true);
      (void)complete(/*final=*/true);
    }
  });
}

std::string Recorder::outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_;
}

}  // namespace vcudnn
