// Trace: one iteration of intercepted calls, as the recorder saw it and as the planner reads
// it. Versioned JSON, schema documented in planner/trace_schema.md ("vcudnn.trace/2").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/conv_layer.h"
#include "planner/result.h"

namespace vcudnn {

inline constexpr std::string_view kTraceSchema = "vcudnn.trace/2";

// What an intercepted call did. Convolution-related kinds also carry a ConvKind.
enum class CallKind : uint8_t {
  kCreate,
  kDestroy,
  kSetStream,
  kGetStream,
  kConvolution,          // cudnnConvolution{Forward,BackwardData,BackwardFilter}
  kGetAlgorithmV7,       // cudnnGetConvolution*Algorithm_v7
  kFindAlgorithm,        // cudnnFindConvolution*Algorithm
  kFindAlgorithmEx,      // cudnnFindConvolution*AlgorithmEx
  kGetWorkspaceSize,     // cudnnGetConvolution*WorkspaceSize
  kGetAlgorithmMaxCount, // cudnnGetConvolution*AlgorithmMaxCount
  // Schema 2: every other operation of the iteration.
  kGraphExecute,  // a cuDNN graph-API plan other than one convolution (fusion, norm, attention, ...)
  kLibrary,       // another cuDNN, cuBLAS or cuBLASLt call that takes device pointers (a GEMM, ...)
  kLaunch,        // a kernel launch (runtime or driver)
  kMemcpy,        // a copy (cudaMemcpy*, cuMemcpy*)
  kMemset,        // a set (cudaMemset*, cuMemset*)
  kAlloc,         // an allocation vcudnn served (cudaMalloc*, the framework's or a library's)
  kFree,          // its free
  kSync           // the host waited for a stream or the device
};
inline constexpr int kCallKindCount = 18;
std::string_view call_kind_name(CallKind kind);
std::optional<CallKind> call_kind_from_name(std::string_view name);
// Kinds that name a convolution direction (ConvKind): convolutions, searches, workspace and
// max-count queries. All of them but the max-count query also describe one layer.
bool call_has_conv_kind(CallKind kind);
bool call_has_layer(CallKind kind);
// Kinds that queue work on a stream and carry a GPU time in a trace (Note [GPU time of every
// operation]); the others (allocations, frees, stream and algorithm queries, host waits) queue none.
bool call_queues_device_work(CallKind kind);

// One row of a cudnn*AlgoPerf_t result (the three structs share this layout).
struct AlgoPerf {
  int32_t algo = 0;
  int32_t status = 0;
  float time_ms = 0;
  uint64_t memory = 0;
  int32_t determinism = 0;
  int32_t math_type = 0;
  bool operator==(const AlgoPerf&) const = default;
};

// How a call used a buffer.
enum class AccessMode : uint8_t { kUnknown = 0, kRead = 1, kWrite = 2, kReadWrite = 3 };
std::string_view access_mode_name(AccessMode mode);  // "u", "r", "w", "rw"

struct BufferAccess {
  uint32_t buffer = 0;  // index into Trace::buffers
  AccessMode mode = AccessMode::kUnknown;
  bool operator==(const BufferAccess&) const = default;
};

// A device buffer vcudnn served while recording (or that existed when recording started).
struct TraceBuffer {
  uint64_t id = 0;       // vcudnn's serial number of the allocation (unique in the process)
  uint64_t address = 0;
  uint64_t bytes = 0;    // as requested
  bool library = false;  // allocated by an NVIDIA library for itself
  bool operator==(const TraceBuffer&) const = default;
};

// Host-device link bandwidths measured when memory ownership started (GB/s, pinned memory).
struct LinkBandwidth {
  double device_to_host = 0;
  double host_to_device = 0;
  double both = 0;  // both directions at once, the sum
  bool operator==(const LinkBandwidth&) const = default;
};

// Pointer roles, in layer terms: x holds x or dx, w holds w or dw, y holds y or dy.
enum PtrSlot { kPtrX = 0, kPtrW = 1, kPtrY = 2, kPtrWorkspace = 3 };

struct TraceCall {
  uint64_t seq = 0;     // process-wide order of interception
  double host_us = 0;   // host time since recording started, at entry
  uint32_t thread = 0;  // index into Trace::threads
  uint32_t handle = 0;  // index into Trace::handles
  uint32_t stream = 0;  // index into Trace::streams
  CallKind kind = CallKind::kConvolution;
  ConvKind conv = ConvKind::kForward;
  int32_t status = 0;              // cudnnStatus_t returned to the caller
  int32_t layer = -1;              // index into Trace::layers; -1 when none or undecodable
  int32_t algo = -1;               // algorithm passed (convolution, workspace query)
  uint64_t workspace_bytes = 0;    // passed (convolution, FindEx) or returned (workspace query)
  std::array<uint64_t, 4> ptrs{};  // PtrSlot order; 0 when absent
  double alpha = 0, beta = 0;      // convolution scaling factors, read as the data type says
  int32_t requested = 0;           // requestedAlgoCount (queries)
  int32_t returned = 0;            // *returnedAlgoCount, or the max count
  std::vector<AlgoPerf> perf;      // results of Get/Find
  uint64_t user_layer = 0;         // layer id given through the wrapped handle; 0 = none
  std::optional<float> gpu_ms;     // device time between events around the call
  bool captured = false;           // stream was capturing a CUDA graph: no events were recorded
  // Schema 2.
  int32_t name = -1;                   // index into Trace::names: the API or kernel; -1 none
  int32_t buffer = -1;                 // alloc, free: index into Trace::buffers
  uint64_t bytes = 0;                  // memcpy, memset: bytes moved or set (0 when unknown)
  std::vector<BufferAccess> accesses;  // the buffers the call used, each once

  bool operator==(const TraceCall&) const = default;
};

struct Trace {
  std::string vcudnn_version;
  int64_t cudnn_version = 0;
  std::string cudnn_library;
  int64_t pid = 0;
  std::string program;
  // How the iteration was delimited: "explicit" (vcudnnIterationBoundary), "auto" (repeating
  // call sequence), or "none" (no repeat found before the recorder stopped; complete = false).
  std::string detected_by = "none";
  bool complete = false;
  uint64_t first_seq = 0;  // seq of the first call of the iteration
  uint64_t end_seq = 0;    // one past the seq of its last call
  // Where the calls' GPU times come from: "iteration" (the recorded iteration's own events), or
  // "next" (the same operations in the iteration after it, where they matched; the runtime's
  // Note [GPU times from the next iteration]). next_timed: how many calls took the next one's.
  std::string gpu_times = "iteration";
  uint64_t next_timed = 0;
  // Bytes alive (allocated through vcudnn, not yet freed) when the iteration starts, used by it or
  // not: a buffer no call of the iteration uses (a library's workspace set once, memory kept for
  // later) is in no call's accesses, yet holds the device. Recorded under memory ownership only.
  std::optional<uint64_t> alive_at_start;
  std::vector<ConvLayer> layers;
  std::vector<uint64_t> threads;  // OS thread ids
  std::vector<uint64_t> handles;  // cudnnHandle_t values
  std::vector<uint64_t> streams;  // cudaStream_t values (0 = legacy default stream)
  std::vector<std::string> names;          // API and kernel names the calls refer to
  std::vector<TraceBuffer> buffers;        // every buffer a call allocates, frees or uses
  std::optional<LinkBandwidth> link;       // when memory was owned
  std::vector<TraceCall> calls;

  bool operator==(const Trace&) const = default;
};

// An NCCL collective or point-to-point call (a `library` call named nccl*, runtime/collectives.h):
// it runs on NCCL's own stream beside the compute, and its GPU time includes waiting for the other
// ranks.
bool is_collective(const Trace& trace, const TraceCall& call);

void to_json(nlohmann::json& j, const Trace& trace);
void from_json(const nlohmann::json& j, Trace& trace);

Result<Trace> parse_trace(std::string_view text);
// The largest trace file read: a recorded iteration of a large model is a few MiB.
inline constexpr uint64_t kMaxTraceBytes = 256ull << 20;
// Refuses what is not a regular file, and files over kMaxTraceBytes, by name.
Result<Trace> read_trace(const std::string& path);
// Writes atomically (temporary file + rename), so a reader never sees half a trace.
Status write_trace(const Trace& trace, const std::string& path);

}  // namespace vcudnn
