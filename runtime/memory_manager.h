// MemoryManager: vcudnn owns the framework's device memory (VCUDNN_POLICY=offload; issue 4).
//
// cudaMalloc/cudaMallocAsync are served from a VmmArena (pool/vmm_arena.h) on the CUDA
// virtual-memory API, so a buffer keeps its address for life while the physical memory behind it
// can be unmapped (evict: its bytes go to pinned host memory first) and mapped again (restore: the
// bytes come back). Every access path reports its pointers (memory_access.h); an access to an
// evicted buffer restores it first (a fault-in). With a device budget, an allocation that would
// map more than the budget first drops freed buffers kept for reuse, then evicts the least
// recently used buffers; if that cannot make room, it fails with cudaErrorMemoryAllocation.
//
// Ordering (no stream-ordered unmap exists in CUDA, so evictions wait on the host):
//  - Freed buffers are kept mapped, keyed by size, and reused by later allocations of the same
//    size (stream-ordered: the same stream reuses at once; another stream first waits on an event
//    recorded on the freeing stream). They are unmapped only under pressure, after a device-wide
//    synchronisation, so no queued kernel still uses them.
//  - Evict: synchronise the device (every queued reader and writer of the victims is done), copy
//    the victims to host blocks on the transfer stream, wait for the copies, unmap.
//  - Restore: map, copy back on the transfer stream; the consuming stream waits on an event
//    (or, when the hook cannot know the stream, the host waits). The host blocks are released at
//    once: the next copy into them is queued behind on the same transfer stream.
//
// Buffers never evicted: those below one granule (they share granules), those allocated by the
// NVIDIA libraries themselves (their kernels run unseen), those pinned by a hook (pointers kept
// beyond a call), and all of them once a CUDA graph was captured.
//
// CUDA-free: the device work goes through the Device interface (runtime/cuda_memory_device.cpp in
// production, a fake in the CPU tests). Thread-safe: one mutex for allocation, eviction and
// restore; the access path without evictions takes only the index's shared lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/buffer_index.h"
#include "pool/host_pool.h"
#include "pool/vmm_arena.h"
#include "runtime/memory_access.h"

namespace vcudnn::memory {

// The device-side work of the manager.
class Device {
 public:
  virtual ~Device() = default;
  // Every piece of work queued on the device so far has finished.
  virtual bool synchronize() = 0;
  // Copies on the transfer stream (queued, not waited for).
  virtual bool copy_to_host(void* host, uint64_t device, uint64_t bytes) = 0;
  virtual bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) = 0;
  // The host waits for the transfer stream.
  virtual bool finish_transfers() = 0;
  // `consumer` waits (stream-ordered) for what the transfer stream has queued so far.
  virtual bool order_after_transfers(cudaStream_t consumer) = 0;
  // `waiter` waits for what `producer` has queued so far.
  virtual bool order_after(cudaStream_t waiter, cudaStream_t producer) = 0;
};

struct ManagerConfig {
  std::optional<uint64_t> device_budget;  // bytes; nullopt: no eviction, the card's memory caps
  uint64_t device_total = 0;              // the card's memory
  uint64_t host_budget = 0;               // pinned host memory for evicted buffers
  uint64_t host_slab_bytes = pool::HostPool::kDefaultSlabBytes;
  uint64_t reserve_bytes = 0;             // the arena's VA range (0: 4 x device_total + host_budget)
};

// Counters for vcudnnGetMemoryStats and the exit line.
struct ManagerStats {
  uint64_t budget = 0;
  uint64_t mapped = 0;
  uint64_t peak_mapped = 0;
  uint64_t live = 0;
  uint64_t cached = 0;
  uint64_t evicted_now = 0;
  uint64_t host_budget = 0;
  uint64_t host_reserved = 0;
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t cache_hits = 0;
  uint64_t failed_allocations = 0;
  uint64_t evictions = 0;
  uint64_t restores = 0;
  uint64_t fault_ins = 0;
  uint64_t bytes_evicted = 0;
  uint64_t bytes_restored = 0;
  uint64_t tracked_calls = 0;
  uint64_t tracked_hits = 0;
  uint64_t foreign_allocations = 0;
  uint64_t pinned_buffers = 0;
  uint64_t eviction_rounds = 0;  // host synchronisations made to evict
  double fragmentation = 0;
};

enum class Origin { kFramework, kLibrary };  // kLibrary: allocated by an NVIDIA library: never evicted

enum class EvictResult { kOk, kUnknown, kTooSmall, kNotAllowed, kAlreadyEvicted, kNoHostMemory, kFailed };
enum class RestoreResult { kOk, kUnknown, kNotEvicted, kNoRoom, kFailed };

class MemoryManager {
 public:
  MemoryManager(pool::PhysicalBackend& physical, pool::HostBackend& host, Device& device, const ManagerConfig& config);
  ~MemoryManager();
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  // False when the arena could not be set up (no VA range, bad granularity): then nothing is
  // served and the hooks pass through.
  bool ok() const { return arena_.ok(); }
  uint64_t granularity() const { return arena_.granularity(); }

  // An allocation ordered on `stream` (nullopt: cudaMalloc, usable on every stream at once).
  // nullopt: out of memory (the budget cannot hold it even after evicting). bytes == 0 gives 0.
  std::optional<uint64_t> allocate(uint64_t bytes, StreamRef stream, Origin origin);
  // true if `address` is a live buffer of this manager (then it is freed: ordered on `stream`,
  // or, for nullopt, after a device synchronisation as cudaFree does).
  bool free(uint64_t address, StreamRef stream);
  bool owns(uint64_t address) const;

  // Access tracking (memory_access.h).
  bool touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api);
  bool touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream, const char* api);
  bool touch_block(const void* data, size_t bytes, StreamRef stream, const char* api);
  bool touch_everything(StreamRef stream, const char* api);
  void pin(const uint64_t* words, size_t n, const char* api);
  void remember(const void* owner, const uint64_t* words, size_t n);
  void forget(const void* owner);
  bool touch_remembered(const void* owner, StreamRef stream, const char* api);
  void note_graph_use(const char* api);
  void count_foreign(const char* api, uint64_t bytes);

  // Explicit moves (vcudnnEvictBuffer / vcudnnRestoreBuffer and the tests).
  EvictResult evict(uint64_t address);
  RestoreResult restore(uint64_t address, StreamRef stream);

  // cudaMemGetInfo under a budget: (budget - mapped, budget).
  std::pair<uint64_t, uint64_t> budget_info() const;
  const std::optional<uint64_t>& budget() const { return config_.device_budget; }
  bool graphs_seen() const { return graphs_seen_.load(std::memory_order_relaxed); }
  ManagerStats stats() const;
  std::string summary() const;  // the exit line's "offload: ..." part

  // The accesses of the first calls (call index, buffer id, mode), for the trace.
  struct AccessRecord {
    uint64_t call = 0;
    uint64_t buffer = 0;  // allocation sequence number
    Access mode = Access::kUnknown;
  };
  std::vector<AccessRecord> access_log() const;
  static constexpr size_t kAccessLogCap = 1u << 20;

 private:
  struct Buffer {
    uint64_t address = 0;
    uint64_t bytes = 0;  // requested
    uint64_t span = 0;   // occupied in the arena
    uint64_t serial = 0;
    bool large = false;
    bool library = false;
    std::atomic<bool> pinned{false};
    std::atomic<bool> evicted{false};
    std::atomic<uint64_t> last_use{0};
    std::atomic<bool> pending{false};  // restored for one stream; others must wait for the copy
    std::vector<pool::HostBlock> host;  // while evicted
    bool cached = false;                // freed, kept mapped for reuse
    std::optional<cudaStream_t> stream;  // the stream it was freed on (cached)
  };

  // All below with mu_ held.
  Buffer* take_cached(uint64_t span, StreamRef stream);
  Buffer* new_buffer();
  bool make_room(uint64_t granules, uint64_t protect_from_tick);
  bool drop_cache();
  bool evict_locked(const std::vector<Buffer*>& victims);
  // `protect`: buffers used at or after this tick are not evicted to make room.
  RestoreResult restore_locked(Buffer* b, StreamRef stream, uint64_t protect, bool fault);
  uint64_t free_granules() const;
  uint64_t span_of(uint64_t bytes) const;
  void release_to_arena(Buffer* b);

  // Marks the hits used now; restores the evicted ones. Called without mu_.
  bool on_hits(const std::vector<pool::Hit>& hits, Access mode, StreamRef stream, const char* api);
  void log_accesses(const std::vector<pool::Hit>& hits, Access mode);

  ManagerConfig config_;
  Device& device_;
  pool::VmmArena arena_;
  pool::HostPool host_;
  pool::BufferIndex index_;

  mutable std::mutex mu_;
  std::deque<Buffer> storage_;                    // Buffer objects live for the process (recycled)
  std::vector<Buffer*> spare_;                    // recycled objects
  std::unordered_map<uint64_t, Buffer*> live_;    // by address
  std::multimap<uint64_t, Buffer*> cache_;        // freed, mapped, by span
  uint64_t cached_bytes_ = 0;
  uint64_t live_requested_ = 0;     // requested bytes of live buffers
  uint64_t evicted_requested_ = 0;  // the part of it evicted now
  std::unordered_map<Buffer*, cudaStream_t> pending_;  // restored for a stream, copy maybe in flight
  std::atomic<uint64_t> evicted_count_{0};        // buffers evicted now: 0 keeps the access path lock-free
  std::atomic<bool> graphs_seen_{false};
  bool host_reserved_ = false;

  std::mutex remembered_mu_;
  std::unordered_map<const void*, std::vector<uint64_t>> remembered_;

  mutable std::mutex log_mu_;
  std::vector<AccessRecord> log_;
  std::atomic<bool> log_full_{false};

  ManagerStats counters_;  // under mu_
  std::atomic<uint64_t> tracked_calls_{0};
  std::atomic<uint64_t> tracked_hits_{0};
  std::atomic<uint64_t> foreign_{0};
  uint64_t serial_ = 0;
};

// The process's manager, or nullptr when the policy does not own memory or it could not start.
// Created on the first allocation hook (CUDA is usable then), never destroyed.
MemoryManager* manager();
int manager_device();  // the GPU the arena lives on; -1 without a manager

}  // namespace vcudnn::memory
