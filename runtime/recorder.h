// Recorder: appends every intercepted call to a per-process record until the first complete
// iteration is found (IterationDetector), then stops recording, resolves the GPU times of that
// iteration from events without blocking, and writes it as a Trace (VCUDNN_TRACE). Convolutions
// are timed with events on their own stream; nothing here synchronizes the host with the GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "planner/trace.h"
#include "runtime/backend_shadow.h"
#include "runtime/conv_call.h"
#include "runtime/event_pool.h"
#include "runtime/iteration_detector.h"
#include "runtime/memory/op_sink.h"

namespace vcudnn {

struct RecorderConfig {
  std::string trace_path;  // empty: detect and log, write nothing
  size_t max_calls = 200000;
  // Called once with the complete iteration, while the program runs (not at exit), on the hook
  // thread that resolved it, with no lock of the recorder's held: the offload plan is made there.
  std::function<void(const Trace&)> on_iteration;
  // false: no call is timed with CUDA events. For programs whose streams are not CUDA's (the CPU
  // tests' simulated device: on a machine with a GPU, the real runtime would be handed them).
  bool gpu_timing = true;
};

// Also the memory runtime's OpSink: allocations, frees and the buffers of every tracked call join
// the same sequence (trace schema 2). The buffers a convolution uses become its own accesses.
class Recorder : public memory::OpSink {
 public:
  explicit Recorder(RecorderConfig config);

  // memory::OpSink
  bool recording() const noexcept override { return active(); }
  void allocated(const memory::BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept override;
  void freed(const memory::BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept override;
  void used(const char* api, std::optional<cudaStream_t> stream, const memory::BufferUse* uses,
            size_t n) noexcept override;
  void waited() noexcept override;

  // Still recording (no iteration found yet, limit not reached).
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // Around a convolution: before() reads the stream, decodes the layer and records the start
  // event; after() records the end event and appends the call.
  struct ConvProbe {
    bool on = false;
    uint64_t host_ns = 0;
    cudaStream_t stream = nullptr;
    int device = -1;
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    bool captured = false;
    std::optional<ConvLayer> layer;
  };
  ConvProbe before_convolution(const ConvCall& call);
  void after_convolution(ConvProbe& probe, const ConvCall& call, cudnnStatus_t status);
  // The same for a graph-API plan of one convolution (cudnnBackendExecute; backend_shadow.h):
  // recorded as a convolution whose algo is the engine's global index (-1 unknown).
  ConvProbe before_graph_convolution(cudnnHandle_t handle, const GraphConv& conv);
  void after_graph_convolution(ConvProbe& probe, cudnnHandle_t handle, const GraphConv& conv, cudnnStatus_t status);

  void record_query(const AlgoQuery& q, cudnnStatus_t status, uint64_t host_ns);
  void record_workspace(const WorkspaceQuery& q, cudnnStatus_t status, uint64_t host_ns);
  void record_max_count(const MaxCountQuery& q, cudnnStatus_t status, uint64_t host_ns);
  // create / destroy / set_stream / get_stream
  void record_handle_call(CallKind kind, cudnnHandle_t handle, cudaStream_t stream, cudnnStatus_t status,
                          uint64_t host_ns);

  void explicit_boundary();
  // Cheap when there is nothing to do; resolves GPU times and writes the trace once ready.
  void poll() noexcept override {
    if (phase_.load(std::memory_order_relaxed) == kResolving) poll_slow();
  }
  bool finished() const noexcept override { return phase_.load(std::memory_order_relaxed) == kDone; }
  // Process exit: close the last segment, take what GPU times are ready, write the trace.
  void finish();
  // One phrase for the exit summary ("iteration of 184 calls ... written to X").
  std::string outcome() const;

 private:
  enum Phase { kRecording, kResolving, kDone };
  // Every public entry runs its work through safely(): an exception (out of memory, say) stops
  // the recorder with one error line and never reaches the application.
  template <typename F>
  void safely(const char* what, F&& f) noexcept;
  void fail(const char* what, const char* why) noexcept;
  ConvProbe before_convolution_impl(const ConvCall& call);
  ConvProbe start_probe(cudnnHandle_t handle, std::optional<ConvLayer> layer);
  bool end_probe(ConvProbe& p, cudnnStatus_t status);
  void after_convolution_impl(ConvProbe& probe, const ConvCall& call, cudnnStatus_t status);
  struct Recorded {
    TraceCall call;  // thread/handle/stream/layer are indices into the tables below
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    int device = -1;
    int64_t live_before = 0;  // live_ when the call was appended (before an allocation or free counts)
  };

  Recorded convolution_record(ConvProbe& p, ConvKind kind, cudnnStatus_t status);
  void append(Recorded&& rec, cudnnHandle_t handle, cudaStream_t stream, const std::optional<ConvLayer>& layer,
              bool exec);
  int32_t intern_layer(const ConvLayer& layer);
  uint32_t intern_buffer(const memory::BufferRef& b);  // mu_ held
  int32_t intern_name(const char* name);               // mu_ held
  void append_memory_op(CallKind kind, const char* api, std::optional<cudaStream_t> stream,
                        const memory::BufferRef* buffer, const memory::BufferUse* uses, size_t n);
  std::vector<BufferAccess> take_conv_accesses();
  // Both with mu_ held, after a call was appended: the operation detector's turn.
  std::optional<DetectedIteration> on_op(const TraceCall& c, int64_t live_before);
  void add_uses(std::vector<BufferAccess>& accesses, const memory::BufferUse* uses, size_t n);  // mu_ held
  // Note [GPU time of every operation], all with mu_ held but op_ended: the call a hook is in
  // (reports of it join), the start event of a library call, launch or copy (before `rec` is
  // appended), and its end event once the hook's real call has queued.
  Recorded* call_in_progress(const char* api);  // this thread's hook call, if it reported `api` already
  void open_call(Recorded& rec, const char* api, std::optional<cudaStream_t> stream);
  struct Timing {
    int device = -1;
    cudaEvent_t start = nullptr;  // recorded on the stream
    cudaEvent_t end = nullptr;    // to record when the call has queued its work
    bool captured = false;        // the stream captures a graph: no events
  };
  Timing start_timing(cudaStream_t stream);
  void start_op_timing(Recorded& rec, cudaStream_t stream);
  void op_ended() noexcept;
  // Note [GPU times from the next iteration]: the iteration's calls take the times of the same
  // operations in the iteration recorded after it; how many did.
  size_t take_next_iteration_times(Trace& t) const;
  // Note [A steady iteration]: an automatic iteration is taken only when it ends at the live bytes
  // it began with; false: refused, recording goes on (mu_ held).
  bool steady_enough(const DetectedIteration& it);
  size_t index_of(uint64_t seq) const;  // the first of calls_ at or after `seq` (mu_ held)
  int64_t live_at(uint64_t seq) const;  // live_ before the call `seq` (now, when none has it yet)
  void on_detected(const DetectedIteration& it);
  void stop_without_iteration(const std::string& why);
  void poll_slow();
  // Resolves pending events in order; with `final`, unready ones become null. True when every
  // call of the iteration has its time (or never will).
  bool resolve(bool final);
  // Builds and writes the trace; returns it when complete (for on_iteration).
  std::optional<Trace> complete(bool final);
  Trace build_trace() const;
  uint64_t now_ns() const;

  RecorderConfig config_;
  std::atomic<bool> active_{true};
  std::atomic<int> phase_{kRecording};
  mutable std::mutex mu_;
  uint64_t start_ns_ = 0;
  uint64_t next_seq_ = 0;
  std::vector<Recorded> calls_;
  std::deque<size_t> pending_;  // indices of calls whose events are not resolved yet
  std::vector<ConvLayer> layers_;
  std::unordered_map<ConvLayer, int32_t> layer_index_;
  std::unordered_map<uint64_t, uint32_t> thread_index_, handle_index_, stream_index_;
  std::vector<uint64_t> threads_, handles_, streams_;
  std::unordered_map<uint64_t, uint32_t> buffer_index_;  // by serial
  std::unordered_set<uint64_t> freed_;                   // serials whose free was recorded
  std::vector<TraceBuffer> buffers_;
  std::unordered_map<std::string, int32_t> name_index_;
  std::vector<std::string> names_;
  IterationDetector detector_;
  OpRepeatDetector op_detector_;  // Note [Iterations without convolutions]
  int64_t live_ = 0;              // bytes allocated minus freed since recording started
  bool cudnn_seen_ = false;       // a cuDNN call was recorded: IterationDetector's sequence starts
  bool memory_seen_ = false;      // an allocation or free was recorded: live_ means something
  size_t unsteady_ = 0;           // iterations refused as not steady (Note [A steady iteration])
  std::optional<DetectedIteration> detected_;
  std::string outcome_ = "recording";
  EventPool events_;
};

}  // namespace vcudnn
