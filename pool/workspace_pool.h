// WorkspacePool: stream-ordered device workspace for micro-batched convolutions. Blocks are
// handed out per stream and reused in stream order with no host synchronization: a block last
// used on another stream is reused only after the acquiring stream waits (on the device) for the
// event recorded when it was released. The pool never holds more than `capacity` bytes in all
// nor more than `per_stream_capacity` bytes for blocks last used on one stream; when a request
// would exceed either, free blocks are returned to the backend (stream-ordered) first.
// Knows nothing of CUDA: the backend (runtime/cuda_pool_backend.cpp, or a fake in tests) does the
// allocation, the events and the waits.
//
// Note [Workspace that lives for one call]
// A pool that keeps its blocks holds its largest workspace on the device for the whole run. Where
// vcudnn owns the process's memory that is the wrong trade: under a device budget the kept block is
// memory no plan can use (VGG-16 b64 at a 512 MiB limit kept 401 MiB through every iteration, above
// the budget's peak, so the plan for 90 % moved 1176 MiB each way where 890 did without
// micro-batching), while the arena's own reuse of freed memory makes a fresh block cheap. So the pool
// can give each block back when it is released (Holding::kReturn): a workspace is then an allocation
// and a stream-ordered free around the call, as the framework's own workspaces are, which the
// recorder sees and the offload planner lays out with the iteration's other buffers. On the H100
// (2026-11-25, VGG-16 b64, PyTorch's default path, 512 MiB limit, budget 90 % of PyTorch's live
// peak) the plan then moved 758 MiB each way and the step took 1.18x PyTorch's (1.45x under
// `offload` alone, whose 1.5 GiB cuDNN workspaces at the end of the backward pass leave the budget
// room only late); at 70 % 2.40x with no fault-in (3.53x with on-demand eviction below the least
// budget a plan of PyTorch's own workspaces needs).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace vcudnn::pool {

using StreamHandle = void*;  // cudaStream_t (nullptr = the legacy default stream)
using EventHandle = void*;   // cudaEvent_t

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  // Stream-ordered allocation / free (cudaMallocAsync / cudaFreeAsync). nullptr on failure.
  virtual void* allocate(uint64_t bytes, StreamHandle stream) = 0;
  virtual void release(void* ptr, StreamHandle stream) = 0;
  virtual EventHandle create_event() = 0;  // nullptr on failure
  virtual void destroy_event(EventHandle event) = 0;
  virtual bool record(EventHandle event, StreamHandle stream) = 0;
  // `stream` waits on the device for `event` (cudaStreamWaitEvent); never blocks the host.
  virtual bool wait(StreamHandle stream, EventHandle event) = 0;
};

struct PoolStats {
  uint64_t reserved = 0;              // bytes held from the backend now
  uint64_t peak_reserved = 0;         // most bytes ever held at once
  uint64_t peak_stream_reserved = 0;  // most bytes ever held for one stream
  uint64_t in_use = 0;                // bytes of blocks acquired and not yet released
  uint64_t peak_in_use = 0;
  uint64_t acquires = 0;
  uint64_t reused = 0;              // acquires served by an existing block
  uint64_t cross_stream_waits = 0;  // reuses that made the stream wait for another stream's event
  uint64_t allocations = 0;         // backend allocate() calls that succeeded
  uint64_t frees = 0;               // backend release() calls
  uint64_t failures = 0;            // acquires that returned nothing
};

// One acquired block. `bytes` is the block's size (>= the request).
struct Lease {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  uint64_t id = 0;
};

class WorkspacePool {
 public:
  // `granularity`: requests are rounded up to a multiple of it (never above a capacity).
  // kKeep: released blocks stay for reuse; kReturn: each goes back to the backend when released,
  // stream-ordered (Note [Workspace that lives for one call]).
  enum class Holding { kKeep, kReturn };
  WorkspacePool(PoolBackend& backend, uint64_t capacity, uint64_t per_stream_capacity, uint64_t granularity = 1 << 20,
                Holding holding = Holding::kKeep);
  ~WorkspacePool();  // returns every block to the backend
  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;

  // A block of at least `bytes`, usable in stream order on `stream`. bytes == 0 gives an empty
  // lease (ptr nullptr) without touching the backend. nullopt when it cannot be had within the
  // capacities or the backend fails (counted in failures; the pool stays consistent).
  std::optional<Lease> acquire(StreamHandle stream, uint64_t bytes);
  // Gives the block back after the work using it was enqueued on `stream`: records the block's
  // event on `stream` and makes it available for reuse.
  void release(const Lease& lease, StreamHandle stream);
  // Returns every free block to the backend (stream-ordered on its last stream).
  void trim();

  PoolStats stats() const;
  uint64_t capacity() const { return capacity_; }
  uint64_t per_stream_capacity() const { return per_stream_capacity_; }

 private:
  struct Block {
    void* ptr = nullptr;
    uint64_t bytes = 0;
    StreamHandle stream = nullptr;  // last stream it was used on; its bytes count for that stream
    EventHandle event = nullptr;    // recorded on `stream` at the last release (nullptr: never)
    bool in_use = false;
    // The last release recorded no event: reusable on `stream` only (Note [Blocks without an
    // event], workspace_pool.cpp).
    bool stream_bound = false;
  };
  // By the id of the block's latest lease: a block gets a fresh id each time it is handed out, so a
  // stale copy of an earlier lease (a double release) matches nothing.
  using Blocks = std::map<uint64_t, Block>;

  // All below run with mu_ held.
  std::optional<Lease> acquire_locked(StreamHandle stream, uint64_t bytes);
  std::optional<Lease> reuse_from_other_stream(StreamHandle stream, uint64_t request);
  std::optional<Lease> allocate_block(StreamHandle stream, uint64_t request);
  void* allocate_with_retry(StreamHandle stream, uint64_t request);
  Lease hand_out(Blocks::iterator it);
  bool evict(StreamHandle stream, uint64_t stream_need, uint64_t total_need);
  void free_block(Blocks::iterator it);
  void free_all_free_blocks();
  uint64_t held_by(StreamHandle stream) const;
  uint64_t in_use_by(StreamHandle stream) const;
  void note_stream_peak(StreamHandle stream);

  PoolBackend& backend_;
  const uint64_t capacity_;
  const uint64_t per_stream_capacity_;
  const uint64_t granularity_;  // >= 1
  const Holding holding_;
  mutable std::mutex mu_;
  Blocks blocks_;
  uint64_t next_id_ = 1;
  PoolStats stats_;
};

}  // namespace vcudnn::pool
