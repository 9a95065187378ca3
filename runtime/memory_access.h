// The interface every access-tracking hook uses (interpose/cudart_hooks.cpp,
// interpose/library_hooks.cpp and the generated hooks). Under VCUDNN_POLICY=offload vcudnn owns
// the framework's device buffers (runtime/memory_manager.h); every call that can carry a device
// pointer reports the pointers it carries here before the real call runs, so that a buffer whose
// memory was moved to the host is brought back first (a software page fault: slower, never
// wrong), and the least-recently-used order stays true.
//
// Cost when memory ownership is off: one relaxed atomic load (active()). When on: a range check
// per word; a word inside the arena's address range costs one shared-lock index lookup.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "pool/buffer_index.h"

namespace vcudnn::memory {

enum class Access : uint8_t { kUnknown = 0, kRead = 1, kWrite = 2, kReadWrite = 3 };

namespace detail {
inline std::atomic<bool> g_active{false};
}  // namespace detail

// True while vcudnn owns device memory (policy offload, arena up). Hooks skip all tracking
// work when false.
inline bool active() { return detail::g_active.load(std::memory_order_relaxed); }

// The stream the access is ordered on (cuDNN and cuBLAS hooks read it from the handle;
// synchronous copies name the default stream they run on); nullopt only when the hook cannot know
// it. A fault-in makes a known stream wait for the copy back on the device; for an unknown
// stream the host waits (counted: host_waits.h).
using StreamRef = std::optional<cudaStream_t>;

// Held by a hook from before its touch() until its real call has returned (the work is queued):
// buffers touched inside the scope are never chosen for eviction by another thread while it lasts
// (an eviction unmaps memory, which a just-queued kernel would otherwise find missing). Nests;
// costs two thread-local stores when ownership is on, nothing when off.
class CallScope {
 public:
  CallScope();
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  bool armed_ = false;
};

// Every word in words[0..n) that points into a vcudnn-owned buffer is an access by `api`:
// evicted buffers are restored first, all of them are marked most recently used, and the recorder
// notes the access. `mode` applies to every word (kUnknown when the hook cannot tell).
// false: a buffer could not be brought back (the budget cannot hold what this call needs; the
// reason is logged); the hook must then return its library's out-of-memory status without
// making the real call. Never throws.
bool touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api);

// The same for a kernel launch: `args[i]` points at parameter i's value, laid out as `layout`
// says (cuKernelGetParamInfo / cuFuncGetParamInfo).
bool touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream, const char* api);
// The same for a packed parameter block (cuLaunchKernel's `extra` CU_LAUNCH_PARAM_BUFFER_POINTER).
bool touch_block(const void* data, size_t bytes, StreamRef stream, const char* api);

// An access vcudnn cannot read the pointers of (a kernel without a parameter layout): every
// evicted buffer is brought back and every buffer counts as used now. False as for touch().
bool touch_everything(StreamRef stream, const char* api);

// Pointers kept by a library beyond the call that passed them (cublasSetWorkspace, dropout states,
// cuBLASLt matmul-descriptor pointer attributes, texture objects): the buffers they point into
// are restored if evicted and never evicted again until freed.
void pin(const uint64_t* words, size_t n, const char* api);

// Pointers that a descriptor carries into later calls (a cuDNN backend variant pack's data
// pointers and workspace): remembered per owner, touched by touch_remembered() when the
// descriptor is used (cudnnBackendExecute), forgotten when it is destroyed.
void remember(const void* owner, const uint64_t* words, size_t n);
void forget(const void* owner);
bool touch_remembered(const void* owner, StreamRef stream, const char* api);

// CUDA graphs (Note [CUDA graphs under a budget] in memory_manager.cpp). A stream capture begins:
// evicted buffers come back, eviction pauses, and every buffer touched until the capture ends stays
// on the device while it lives. It ends: eviction resumes for the rest. A graph is launched: when
// no capture was ever seen, it was built some other way and eviction stops for good, as for
// opaque_graph() (graph nodes added one by one).
void capture_begins(const char* api);
void capture_ends(const char* api);
void graph_launched(const char* api);
void opaque_graph(const char* api);
// A cuDNN graph populated into a CUDA graph keeps its variant pack's pointers: those buffers stay.
void pin_remembered(const void* owner, const char* api);

// A pointer query (cuPointerGetAttribute(s), cudaPointerGetAttributes) about `pointer`: if it lies
// in an evicted buffer, the buffer is mapped again first (the driver rejects an unmapped address),
// its copy back queued; the access that follows orders itself after the copy as usual.
void prepare_query(uint64_t pointer, const char* api);

// `stream` is about to be destroyed (cudaStreamDestroy): what was queued on it is fenced one last
// time, and a new stream with the same handle counts as another stream.
void stream_destroyed(cudaStream_t stream);

// The program waits for the device: construct before the real call (kStream: the stream waited
// for; kAllStreams: the device or context), call done() after it returned successfully. Idle
// memory unused for a whole interval between two waits goes back to the device
// (MemoryManager::synchronized).
class SyncPoint {
 public:
  enum Kind { kStream, kAllStreams };
  SyncPoint(Kind kind, cudaStream_t stream = nullptr);
  void done() noexcept;

 private:
  bool armed_ = false;
  std::vector<std::pair<uint32_t, uint64_t>> marks_;
};

// A call that allocates device memory on its own failed with out-of-memory: vcudnn gives back
// what it holds unused. true: retry the call once.
bool device_out_of_memory(const char* api) noexcept;

// An allocation path vcudnn does not serve (cudaMallocManaged, cudaMallocHost, cudaHostAlloc,
// cuMemAlloc...): passed through, counted in the exit line.
void count_foreign_allocation(const char* api, uint64_t bytes);

}  // namespace vcudnn::memory
