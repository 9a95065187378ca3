// MemoryManager: vcudnn owns the framework's device memory (VCUDNN_POLICY=offload and
// microbatch+offload). It composes the parts of runtime/memory/ and pool/:
//  - serving: cudaMalloc / cudaMallocAsync from a VmmArena (pool/vmm_arena.h) on the CUDA
//    virtual-memory API, so a buffer keeps its address for life; freed memory stays mapped and is
//    reused across sizes, ordered after its free by tags (runtime/memory/stream_order.h);
//  - access tracking: every access path reports its pointers (memory_access.h); a buffer touched
//    while evicted is restored first (a fault-in), and the streams that used each buffer are
//    remembered so that an eviction copy can wait for them;
//  - room under a device budget: idle memory whose frees are settled is unmapped first, then
//    memory in flight (evictions being copied out, frees not yet done on their stream) is waited
//    for, then resident buffers chosen by the EvictionPolicy (LRU today) are evicted by the
//    Residency mechanism. Evictions also start ahead of need, keeping room for the largest
//    allocation seen, so that allocations and fault-ins rarely wait.
// No device-wide synchronisation anywhere; the host waits only where host_waits.h says, counted.
//
// CUDA-free: the device work goes through the Device interface (runtime/memory/cuda_device.cpp
// in production, a simulated device in the CPU tests). Thread-safe: one mutex for allocation,
// freeing, eviction and restore; the access path takes only the index's shared lock unless a
// buffer it touches is not plainly resident.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/buffer_index.h"
#include "pool/host_pool.h"
#include "pool/placed_pool.h"
#include "pool/vmm_arena.h"
#include "runtime/memory/access_log.h"
#include "runtime/memory/buffer.h"
#include "runtime/memory/device.h"
#include "runtime/memory/eviction_policy.h"
#include "runtime/memory/host_waits.h"
#include "runtime/memory/op_sink.h"
#include "runtime/memory/replay.h"
#include "runtime/memory/residency.h"
#include "runtime/memory/reuse_cache.h"
#include "runtime/memory/stream_order.h"
#include "runtime/memory_access.h"

namespace vcudnn::memory {

struct ManagerConfig {
  std::optional<uint64_t> device_budget;  // bytes; nullopt: no eviction, the card's memory caps
  uint64_t device_total = 0;              // the card's memory
  uint64_t host_budget = 0;               // pinned host memory for evicted buffers
  uint64_t host_slab_bytes = pool::HostPool::kDefaultSlabBytes;
  // A placed buffer's copy out in pieces of this many bytes, each fenced (Note [Copies out in
  // pieces], planner/offload_plan.h); 0: whole.
  uint64_t copy_piece_bytes = kCopyPiece;
  uint64_t reserve_bytes = 0;  // the arena's VA range (0: 4 x device_total + host_budget)
  bool access_log = false;     // keep the first accesses for VCUDNN_TRACE's path.memory.json
  bool log_iterations = false;  // VCUDNN_LOG_ITERATIONS: one line per iteration the plan followed
};

// Counters for vcudnnGetMemoryStats and the exit line.
struct ManagerStats {
  uint64_t budget = 0;
  uint64_t mapped = 0;
  uint64_t peak_mapped = 0;
  uint64_t peak_held = 0;  // mapped + created chunks not mapped now (physical memory vcudnn held)
  uint64_t live = 0;
  uint64_t idle = 0;  // freed memory kept mapped for reuse
  uint64_t evicted_now = 0;
  uint64_t host_budget = 0;
  uint64_t host_reserved = 0;
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t reused = 0;       // allocations that mapped nothing new
  uint64_t fresh_bytes = 0;  // bytes mapped anew by allocations, ever
  uint64_t failed_allocations = 0;
  uint64_t evictions = 0;
  uint64_t evictions_started = 0;
  uint64_t evictions_cancelled = 0;
  uint64_t restores = 0;
  uint64_t fault_ins = 0;
  uint64_t bytes_evicted = 0;
  uint64_t bytes_restored = 0;
  uint64_t trimmed_bytes = 0;   // idle memory unmapped to make room
  uint64_t room_calls = 0;      // allocations and restores that had to make room
  uint64_t room_ns = 0;         // host time spent making room
  uint64_t released_bytes = 0;  // idle memory given back to the device (stale at a synchronisation, or on its OOM)
  uint64_t oom_retries = 0;     // calls retried after vcudnn gave memory back to the device
  uint64_t serve_calls = 0;     // allocate() and free() calls (bytes 0 aside)
  uint64_t serve_ns = 0;        // host time inside them
  // Reuse without a budget (Note [Reuse without a budget]).
  uint64_t cache_hits = 0;     // allocations served by a buffer freed on their stream, kept whole
  uint64_t cache_flushes = 0;  // times every kept buffer went back to the arena (it had to map, trim or give back)
  uint64_t cached = 0;         // bytes kept now (counted in idle too)
  uint64_t tracked_calls = 0;
  uint64_t tracked_hits = 0;
  uint64_t track_ns = 0;  // host time inside tracked calls' checks (restores they wait for included)
  uint64_t foreign_allocations = 0;
  uint64_t pinned_buffers = 0;
  uint64_t graph_pinned_buffers = 0;  // kept on the device because a captured CUDA graph uses them
  uint64_t graph_pinned_bytes = 0;
  uint64_t host_waits = 0;    // every cause of host_waits.h
  uint64_t stream_waits = 0;  // stream-ordered waits made instead
  uint64_t fences = 0;        // events recorded
  double fragmentation = 0;
  // Replay of an offload plan (replay.h).
  uint64_t planned_offloads = 0;  // copies out started by the plan
  uint64_t prefetches = 0;        // copies back started by the plan
  uint64_t replay_missed = 0;     // planned copies whose buffer was gone or could not move
  uint64_t replans = 0;           // scripts installed after the first
  // A static placement followed (Note [A static placement]).
  uint64_t placed_served = 0;     // allocations served from their slot
  uint64_t placed_fallbacks = 0;  // placed allocations served by the arena (slot busy or no room)
  uint64_t placed_adopted = 0;    // buffers alive through the iteration taken into the pool (adopt_placed)
  uint64_t pool_held = 0;         // physical memory of the pool now
  uint64_t pool_blocks = 0;       // blocks created, ever
  uint64_t pool_mappings = 0;     // ranges mapped onto the pool (or extents of their own), ever
  uint64_t pool_detached = 0;     // restores onto an extent of their own (the pool bytes were taken)
  uint64_t pool_handovers = 0;    // pool bytes taken from a buffer still being copied out
  uint64_t restores_in_pieces = 0;  // copies back queued piece by piece (Note [Copies back in pieces])
  uint64_t pool_shrunk = 0;       // pool memory given back to make room in the arena, ever
  uint64_t resumed = 0;           // brought back before their copy out ended, without a host wait
  // The device's own view of vcudnn's copies (Note [Timing the waits for vcudnn's copies]): waits
  // timed, and those where a stream stood still for the copy, with how long in all.
  uint64_t back_waits_timed = 0;  // a use ordered after its buffer's copy back
  uint64_t back_waits_late = 0;   // ... that stood still for it
  uint64_t back_wait_ns = 0;
  uint64_t out_waits_timed = 0;  // new owners of memory ordered after a copy out of it
  uint64_t out_waits_late = 0;
  uint64_t out_wait_ns = 0;
  // With VCUDNN_LOG_ITERATIONS=on, copies back timed on the device (Residency::take_copy_times).
  uint64_t back_copies_timed = 0;
  uint64_t back_copy_bytes = 0;
  uint64_t back_copy_ns = 0;  // the copies themselves
  uint64_t back_held_ns = 0;  // the in stream waiting for the memory's previous holders
};

// kLibrary: allocated by an NVIDIA library: never evicted. kScratch: vcudnn's workspace for one call
// (Note [Workspace that lives for one call], pool/workspace_pool.h): never evicted, but recorded as
// the framework's buffers are, so that the plan's static placement lays it out.
enum class Origin { kFramework, kLibrary, kScratch };

enum class EvictResult { kOk, kUnknown, kTooSmall, kNotAllowed, kAlreadyEvicted, kNoHostMemory, kFailed };
enum class RestoreResult { kOk, kUnknown, kNotEvicted, kNoRoom, kFailed };

class MemoryManager {
 public:
  // `policy`: nullptr for least recently used.
  MemoryManager(pool::PhysicalBackend& physical, pool::HostBackend& host, Device& device, const ManagerConfig& config,
                std::unique_ptr<EvictionPolicy> policy = nullptr);
  ~MemoryManager();
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  // False when the arena could not be set up (no VA range, bad granularity): then nothing is
  // served and the hooks pass through.
  bool ok() const { return arena_.ok(); }
  uint64_t granularity() const { return arena_.granularity(); }

  // An allocation ordered on `stream` (nullopt: cudaMalloc, usable on every stream at once).
  // nullopt: out of memory (the budget or the card cannot hold it even after making room).
  // bytes == 0 gives 0.
  std::optional<uint64_t> allocate(uint64_t bytes, StreamRef stream, Origin origin);
  // true if `address` is a live buffer of this manager (then it is freed, ordered on `stream`,
  // or for nullopt after every stream that used it, as cudaFree).
  bool free(uint64_t address, StreamRef stream);
  bool owns(uint64_t address) const;

  // Access tracking (memory_access.h). Every touch*() returns true at once, reporting nothing, once
  // tracking is off (Note [Tracking without a budget]).
  bool tracking() const { return tracking_.load(std::memory_order_relaxed); }
  bool touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api);
  bool touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream, const char* api);
  bool touch_block(const void* data, size_t bytes, StreamRef stream, const char* api);
  bool touch_everything(StreamRef stream, const char* api);
  void pin(const uint64_t* words, size_t n, const char* api);
  void remember(const void* owner, const uint64_t* words, size_t n);
  void forget(const void* owner);
  bool touch_remembered(const void* owner, StreamRef stream, const char* api);
  // CUDA graphs (memory_access.h).
  void capture_begins(const char* api);
  void capture_ends(const char* api);
  void graph_launched(const char* api);
  void opaque_graph(const char* api);
  void pin_remembered(const void* owner, const char* api);
  // The recorder (while it records): allocations, frees and each call's buffers.
  void set_sink(OpSink* sink) { sink_.store(sink, std::memory_order_release); }
  // Offload and prefetch from now on as `script` says (under a budget; on demand where the program
  // strays from it). Replaces an earlier script.
  void install_replay(ReplayScript script);
  // Called (outside the manager's lock, on an allocating thread) when an iteration followed to its
  // end after the plan's first needed on-demand evictions or fault-ins (their count): the caller
  // may plan again with more room (offload_replay.h). Set before or with the first script.
  void set_replanner(std::function<void(uint64_t helped)> replanner);
  std::optional<ReplayStats> replay_stats() const;
  // A pointer query on an evicted buffer: mapped again (its copy back queued) before the driver answers.
  void prepare_query(uint64_t word, const char* api);
  void count_foreign(const char* api, uint64_t bytes);
  void stream_destroyed(Stream stream);

  // The program waited for the device: stream_marks() before the wait (nullopt stream: every
  // stream; no snapshot at all for an event), synchronized() after it returned. Idle memory not
  // reused for a whole interval between two such waits goes back to the device, as
  // cudaMallocAsync's pool gives memory back at synchronisation.
  StreamOrder::Snapshot stream_marks(std::optional<Stream> stream) const { return order_.snapshot(stream); }
  void synchronized(const StreamOrder::Snapshot& done);
  // cudaMemPoolTrimTo (torch.cuda.empty_cache() under cudaMallocAsync, and cudnn.benchmark's
  // search after each convolution): idle memory whose frees are settled is unmapped and free chunks
  // released until at most `keep_bytes` of both stay; no waiting, as the driver's own trim does not
  // wait. Returns the bytes unmapped.
  uint64_t trim_to(uint64_t keep_bytes);
  // A call that allocates device memory on its own (a kernel's code or local memory, a stream)
  // failed for lack of it: vcudnn gives back its idle memory (waiting for the frees that left it,
  // counted) and its free chunks. true when it gave any: the caller retries once.
  bool device_out_of_memory(const char* api);

  // Explicit moves (vcudnnEvictBuffer / vcudnnRestoreBuffer and the tests). evict() completes the
  // eviction before it returns (the host waits for the copy: counted).
  EvictResult evict(uint64_t address);
  RestoreResult restore(uint64_t address, StreamRef stream);

  // cudaMemGetInfo under a budget: (budget - mapped + idle, budget), the total raised to free + the
  // live bytes while evicted buffers make them exceed the budget. Without one: the device's own
  // numbers plus the idle and free-listed memory vcudnn would give back for an allocation.
  std::pair<uint64_t, uint64_t> budget_info() const;
  std::pair<uint64_t, uint64_t> memory_info(uint64_t device_free, uint64_t device_total) const;
  const std::optional<uint64_t>& budget() const { return config_.device_budget; }
  // A stream capture has begun in this process (allocations on a capturing stream then go to CUDA).
  bool graphs_seen() const { return graphs_seen_.load(std::memory_order_relaxed); }
  // No eviction at all once a graph vcudnn did not see built is used (Note [CUDA graphs under a budget]).
  bool eviction_paused() const { return opaque_graphs_.load(std::memory_order_relaxed); }
  // A stream capture is in progress: buffers touched are pinned for the graph, restores are waited for.
  bool capturing() const { return captures_.load(std::memory_order_relaxed) > 0; }
  ManagerStats stats() const;
  void reset_peak();  // peak_mapped starts again from what is mapped now
  const HostWaitCounts& host_waits() const { return host_waits_; }
  std::string summary() const;                              // the exit line's "offload: ..." part
  std::string replay_summary(const ManagerStats& s) const;  // "" without a plan
  std::string placed_summary(const ManagerStats& s) const;  // "" without a placement
  std::string driver_costs() const;                         // " driver: ..." when the backend measures
  const char* policy_name() const { return policy_->name(); }

  using AccessRecord = AccessLog::Record;
  std::vector<AccessRecord> access_log() const { return log_.records(); }
  static constexpr size_t kAccessLogCap = AccessLog::kCap;

 private:
  // All below with mu_ held.
  Buffer* new_buffer();
  bool publish(Buffer* b, uint64_t address, uint64_t span, uint64_t bytes, Origin origin, StreamRef stream);
  void recycle(Buffer* b);
  bool is_live(const Buffer* b) const;
  uint64_t granules_for(uint64_t bytes) const;
  uint64_t free_granules() const;
  // Runs attempt() until it succeeds, making room for `need` granules between tries: reap
  // finished evictions, trim settled idle memory, wait for memory in flight, evict.
  template <typename Attempt>
  bool with_room(uint64_t need, Attempt&& attempt);
  uint64_t reap();
  uint64_t trim(uint64_t granules);
  bool wait_for_idle();
  bool start_evictions(uint64_t granules);
  void evict_ahead();
  void order_new_owner(const pool::TagSet& waits, StreamRef stream);
  RestoreResult restore_locked(Buffer* b, StreamRef stream, bool fault);
  void settle_restore(Buffer* b, StreamRef stream);
  void stop_evicting(Buffer* b);
  uint64_t unevictable_bytes() const;
  uint64_t restore_all_locked();  // every evicted buffer back and settled; returns how many
  size_t begin_evictions(const std::vector<Buffer*>& victims);  // returns how many started
  void run_due(const std::vector<Replayer::Due>& due);
  // Note [A static placement]: an allocation served from its slot (nullopt: the arena serves it).
  std::optional<uint64_t> allocate_placed(uint32_t slot, uint64_t bytes, StreamRef stream, Origin origin,
                                          Replayer* replay);
  RestoreResult restore_placed(Buffer* b, StreamRef stream, bool fault);
  // A buffer alive through the iteration that the placement places (Note [Across the iteration's
  // end]), away from the arena: its pool slot takes it, at its own address. false: not this one.
  bool adopt_placed(Buffer* b);
  uint64_t pool_held() const;          // the physical memory of the pools (the current and retired ones)
  void sync_budgets();                 // the arena's budget: the device budget less the pools'
  bool physical_fits(uint64_t bytes);  // `bytes` more physical memory fit the budget now
  bool make_physical_room(uint64_t bytes);
  bool room_for_slot(const pool::PlacedPool& p, uint32_t slot);  // Note [Room for a slot's blocks]
  void note_physical();                      // the peak of arena + pools
  void reap_pools();                         // detached extents settled, retired pools drained
  uint64_t shrink_pools(uint64_t granules);  // pool blocks no buffer holds given back; returns granules
  // Note [Reuse without a budget].
  bool reusing(StreamRef stream) const {
    return stream && !config_.device_budget && !tracking() && !capturing();
  }
  void uncache(Buffer* b, uint32_t stream_id);  // back to the arena, freed after its stream's work so far
  void flush_cache();
  void pin_for_graph(const pool::HitList& hits);

  // The access path. Called without mu_.
  bool on_hits(const pool::HitList& hits, Access mode, StreamRef stream, const char* api);

  ManagerConfig config_;
  pool::PhysicalBackend& physical_;
  Device& device_;
  pool::VmmArena arena_;
  pool::HostPool host_;
  pool::BufferIndex index_;
  StreamOrder order_;
  Residency residency_;
  std::unique_ptr<EvictionPolicy> policy_;
  AccessLog log_;
  HostWaitCounts host_waits_;

  mutable std::mutex mu_;
  std::deque<Buffer> storage_;                  // Buffer objects live for the process (recycled)
  std::vector<Buffer*> spare_;                  // recycled objects
  std::unordered_map<uint64_t, Buffer*> live_;  // by address
  std::vector<Buffer*> evicting_;               // kEvicting, oldest first
  ReuseCache cache_;                            // freed buffers kept whole: in live_, marked `cached`
  uint64_t cache_interval_ = 0;                 // synchronisation intervals that allocated
  uint64_t allocations_at_sync_ = 0;
  uint64_t evicting_granules_ = 0;
  uint64_t largest_granules_ = 0;   // the largest allocation so far: the room evict_ahead() keeps
  uint64_t live_requested_ = 0;     // requested bytes of live buffers
  uint64_t evicted_requested_ = 0;  // the part of it evicted now
  std::atomic<bool> graphs_seen_{false};
  std::atomic<uint32_t> captures_{0};       // stream captures in progress
  std::atomic<bool> opaque_graphs_{false};  // a graph vcudnn did not see captured was used
  std::atomic<OpSink*> sink_{nullptr};
  std::unique_ptr<Replayer> replay_owner_;  // under mu_; an installed script is never freed before exit
  // Re-planning (set_replanner): the on-demand help the current script needed, judged per followed
  // iteration; the first iteration after an install is its warm-up and not judged.
  void judge_iteration();
  void take_copy_waits();  // with mu_ held (Note [Timing the waits for vcudnn's copies])
  // With VCUDNN_LOG_ITERATIONS=on, the late copies back since the last report: (action + 1, ms).
  std::vector<std::pair<uint32_t, double>> late_backs_;
  void maybe_replan();
  // VCUDNN_LOG_ITERATIONS (Note [What an iteration cost]): judge_iteration() finds one ended, the
  // next allocation logs it outside the lock.
  struct IterationMark {
    ManagerStats stats;
    pool::PhysicalBackend::CallTotals driver;
    uint64_t late = 0;  // late prefetches of the script followed
    uint64_t ns = 0;    // the host's clock
  };
  void report_iteration();
  std::atomic<bool> report_due_{false};
  uint64_t reported_iterations_ = 0;  // the current script's iterations_done() last reported (under mu_)
  std::mutex report_mu_;
  std::optional<IterationMark> report_mark_;  // under report_mu_
  uint64_t reports_ = 0;                      // under report_mu_
  std::function<void(uint64_t)> replanner_;  // under mu_
  std::atomic<uint64_t> replan_wanted_{0};   // the help counted, when a re-plan is due
  uint64_t judged_iterations_ = 0;           // the current script's iterations_done() last judged
  uint64_t waits_taken_iterations_ = 0;      // ... whose copies' timed waits were last taken
  uint64_t help_at_judge_ = 0;               // on-demand evictions + fault-ins then
  uint64_t installs_ = 0;
  std::vector<std::unique_ptr<Replayer>> replaced_;
  std::atomic<Replayer*> replay_{nullptr};
  std::unique_ptr<pool::PlacedPool> placed_;                // the current script's placement (under mu_)
  std::vector<std::unique_ptr<pool::PlacedPool>> retired_;  // earlier scripts' pools, until drained
  std::unordered_map<uint64_t, uint32_t> through_slots_;    // placed_'s external slots, by buffer serial
  uint64_t peak_physical_ = 0;                              // arena mapped + pools held, at its most
  OpSink* recording_sink() const {
    OpSink* s = sink_.load(std::memory_order_acquire);
    return s && s->recording() ? s : nullptr;
  }
  uint64_t serial_ = 0;
  ManagerStats counters_;  // the fields the manager counts itself; under mu_

  std::mutex remembered_mu_;
  std::unordered_map<const void*, std::vector<uint64_t>> remembered_;

  void stop_tracking_if_done();
  class ServeTimer;
  class TrackTimer;
  std::atomic<uint64_t> track_ns_{0};
  std::atomic<uint64_t> serve_calls_{0};
  std::atomic<uint64_t> serve_ns_{0};
  std::atomic<bool> tracking_{true};
  std::atomic<uint64_t> tracked_calls_{0};
  std::atomic<uint64_t> tracked_hits_{0};
  std::atomic<uint64_t> foreign_{0};
};

// The process's manager, or nullptr when the policy does not own memory or it could not start.
// Created on the first allocation hook (CUDA is usable then), never destroyed.
MemoryManager* manager();
int manager_device();  // the GPU the arena lives on; -1 without a manager

}  // namespace vcudnn::memory
