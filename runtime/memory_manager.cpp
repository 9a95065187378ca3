// MemoryManager (see header): serving, freeing, room under the budget, and the access path.
#include "runtime/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "runtime/hook_scope.h"
#include "runtime/log.h"
#include "runtime/memory/call_scope.h"

namespace vcudnn::memory {
namespace {

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Rounds of with_room() before it gives up; each round makes progress or ends the loop.
constexpr int kMaxRoomRounds = 256;
// Free chunks kept after a synchronisation (created, unmapped): enough for the next evictions'
// room without a cuMemCreate, little enough to matter to no one.
constexpr uint64_t kKeptFreeChunks = 64;
// Without a budget, fresh stretches of this many granules (32 MiB on the H100) or more are mapped
// as one extent (vmm_arena.h): cudnn.benchmark's search and PyTorch's probe of the free memory
// allocate and free tens of GiB per convolution, which granule by granule took seconds each.
constexpr uint64_t kExtentMinGranules = 16;
// Under a budget, every large buffer of two granules or more is its own extent(s), so that it is
// evicted and restored with a few calls instead of two per granule (Note [Extents under a budget]).
constexpr uint64_t kBudgetExtentMinGranules = 2;
// Buffers kept whole for reuse on their stream, at most (Note [Reuse without a budget]).
constexpr uint64_t kKeptBytes = 64ull << 20;

// Timed waits (Note [Timing the waits for vcudnn's copies]): the cookie's high half says what
// waited, the low half a planned copy back's action + 1. A wait shorter than kLateCopyMs is the
// timing's noise (a timed event's resolution is about half a microsecond; the wait itself costs a
// few): the copy was on time.
constexpr uint64_t kWaitForCopyBack = 1ull << 32;
constexpr uint64_t kWaitForCopyOut = 2ull << 32;
constexpr double kLateCopyMs = 0.02;

}  // namespace

MemoryManager::MemoryManager(pool::PhysicalBackend& physical, pool::HostBackend& host, Device& device,
                             const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy)
    : config_(config),
      physical_(physical),
      device_(device),
      arena_(physical, config.reserve_bytes ? config.reserve_bytes : 4 * config.device_total + config.host_budget,
             config.device_budget.value_or(config.device_total),
             config.device_budget ? kBudgetExtentMinGranules : kExtentMinGranules, config.device_budget.has_value()),
      host_(host, config.device_budget ? config.host_budget : 0, config.host_slab_bytes),
      order_(device),
      residency_(arena_, host_, device, order_),
      policy_(policy ? std::move(policy) : make_lru_policy()) {
  // Pinned memory up front: cudaHostAlloc is slow and synchronising, never on the hot path.
  if (config_.device_budget && arena_.ok()) host_.reserve(config_.host_budget);
  residency_.time_copies_back(config_.log_iterations);
  residency_.set_copy_piece(config_.copy_piece_bytes);
}

MemoryManager::~MemoryManager() = default;

void MemoryManager::reset_peak() {
  arena_.reset_peak();
  std::lock_guard<std::mutex> lock(mu_);
  peak_physical_ = placed_ || !retired_.empty() ? arena_.mapped_bytes() + pool_held() : 0;
}

Buffer* MemoryManager::new_buffer() {
  if (!spare_.empty()) {
    Buffer* b = spare_.back();
    spare_.pop_back();
    return b;
  }
  return &storage_.emplace_back();
}

void MemoryManager::recycle(Buffer* b) {
  b->host.clear();
  b->in_use.store(0);
  b->ready = {};
  b->copied_out = {};
  b->copied_pieces.clear();
  b->piece_bytes = 0;
  b->restoring.store(false);
  b->streams.store(0);
  b->pinned.store(false);
  b->state.store(BufferState::kResident);
  b->prefetch_action = -1;
  b->indexed = false;
  b->cached = false;
  b->next_cached = nullptr;
  b->placed_pool = nullptr;
  b->kept = 0;
  b->handed_over = false;
  spare_.push_back(b);
}

bool MemoryManager::is_live(const Buffer* b) const {
  const auto it = live_.find(b->address);
  return it != live_.end() && it->second == b;
}

uint64_t MemoryManager::granules_for(uint64_t bytes) const {
  const uint64_t g = arena_.granularity();
  return g == 0 ? 0 : std::max<uint64_t>(1, bytes / g + (bytes % g != 0));
}

uint64_t MemoryManager::free_granules() const {
  const uint64_t g = arena_.granularity();
  const uint64_t cap = arena_.budget_bytes();
  const uint64_t mapped = arena_.mapped_bytes();
  return g == 0 || mapped >= cap ? 0 : (cap - mapped) / g;
}

// ---------------------------------------------------------------------------------------------
// Serving

// The host time of allocate() and free(), for the exit line: what serving the program's memory costs
// it (the real cudaMallocAsync and cudaFreeAsync pair costs about 0.7 us on the H100's host:
// scripts/bench/results/offload_micro-issue9.json).
class MemoryManager::ServeTimer {
 public:
  explicit ServeTimer(MemoryManager& m) : m_(m), t0_(monotonic_ns()) {}
  ~ServeTimer() {
    m_.serve_ns_.fetch_add(monotonic_ns() - t0_, std::memory_order_relaxed);
    m_.serve_calls_.fetch_add(1, std::memory_order_relaxed);
  }
  ServeTimer(const ServeTimer&) = delete;
  ServeTimer& operator=(const ServeTimer&) = delete;

 private:
  MemoryManager& m_;
  uint64_t t0_;
};

// Under a budget, the host time of the access checks (restores waited for included), for
// VCUDNN_LOG_ITERATIONS: what tracking costs a step.
class MemoryManager::TrackTimer {
 public:
  explicit TrackTimer(MemoryManager& m) : m_(m), t0_(monotonic_ns()) {}
  ~TrackTimer() { m_.track_ns_.fetch_add(monotonic_ns() - t0_, std::memory_order_relaxed); }
  TrackTimer(const TrackTimer&) = delete;
  TrackTimer& operator=(const TrackTimer&) = delete;

 private:
  MemoryManager& m_;
  uint64_t t0_;
};

std::optional<uint64_t> MemoryManager::allocate(uint64_t bytes, StreamRef stream, Origin origin) {
  if (bytes == 0) return uint64_t{0};
  if (report_due_.load(std::memory_order_relaxed)) report_iteration();
  const ServeTimer timer(*this);
  if (replan_wanted_.load(std::memory_order_relaxed) != 0) maybe_replan();
  std::unique_lock<std::mutex> lock(mu_);
  // The plan's copies due at this allocation first: they make its room.
  Replayer* replay = replay_.load(std::memory_order_acquire);
  if (replay) {
    std::vector<Replayer::Due> due;
    replay->on_alloc(bytes, due);
    run_due(due);
    judge_iteration();
    if (placed_) {
      if (const int64_t slot = replay->pending_allocation(); slot >= 0) {
        if (const auto address = allocate_placed(static_cast<uint32_t>(slot), bytes, stream, origin, replay))
          return address;
      }
    }
  }
  if (const uint64_t span = arena_.span_of(bytes); span < arena_.granularity() && reusing(stream)) {
    const uint32_t id = order_.id_of(*stream);
    if (Buffer* b = cache_.take(span, id)) {
      b->bytes = bytes;
      b->serial = ++serial_;
      b->library = origin == Origin::kLibrary;
      b->scratch = origin == Origin::kScratch;
      b->last_use.store(next_tick());
      b->streams.store(StreamOrder::bit_of(id));
      live_requested_ += bytes;
      ++counters_.allocations;
      ++counters_.reused;
      ++counters_.cache_hits;
      return b->address;
    }
  }
  const pool::Lifetime lifetime = stream ? pool::Lifetime::kShort : pool::Lifetime::kLong;
  pool::TagSet waits;
  std::optional<pool::Allocation> a;
  const auto attempt = [&] {
    waits.clear();
    a = arena_.allocate(bytes, lifetime, &waits);
    if (!a && !cache_.empty()) {  // the card is full: the kept buffers first (Note [Reuse without a budget])
      flush_cache();
      waits.clear();
      a = arena_.allocate(bytes, lifetime, &waits);
    }
    return a.has_value();
  };
  if (!with_room(granules_for(bytes), attempt)) {
    ++counters_.failed_allocations;
    VCUDNN_WARN_LIMITED(
        "offload: an allocation of {} ({}) does not fit: the device budget is {}, {} mapped ({} idle), of which {} "
        "cannot be evicted (buffers below one granule, library and pinned buffers){}; cudaErrorMemoryAllocation",
        bytes, mib(bytes), config_.device_budget ? mib(*config_.device_budget) : "none (the card)",
        mib(arena_.mapped_bytes()), mib(arena_.idle_bytes()), mib(unevictable_bytes()),
        eviction_paused() ? "; eviction is off (a CUDA graph vcudnn did not see built was used)" : "");
    return std::nullopt;
  }
  order_new_owner(waits, stream);
  Buffer* b = new_buffer();
  if (!publish(b, a->address, a->bytes, bytes, origin, stream)) {
    arena_.free(b->address);
    recycle(b);
    ++counters_.failed_allocations;
    return std::nullopt;
  }
  if (a->fresh == 0) ++counters_.reused;
  counters_.fresh_bytes += a->fresh * arena_.granularity();
  if (a->fresh && placed_) note_physical();
  if (replay) replay->bind(b);
  evict_ahead();
  return b->address;
}

// A new buffer at [address, address + span) for `bytes`: its fields, its place in the pointer index
// (while accesses are tracked) and among the live buffers, counted and told to the recorder. false
// when the index refuses it (cannot happen: the arena and the pool never hand out overlapping
// ranges; refused rather than guessed): the caller gives its memory back.
bool MemoryManager::publish(Buffer* b, uint64_t address, uint64_t span, uint64_t bytes, Origin origin,
                            StreamRef stream) {
  b->address = address;
  b->span = span;
  b->bytes = bytes;
  b->large = span >= arena_.granularity();
  b->serial = ++serial_;
  b->library = origin == Origin::kLibrary;
  b->scratch = origin == Origin::kScratch;
  b->last_use.store(next_tick());
  // Its first accesses may be ones vcudnn cannot see: an eviction fences the stream it was
  // allocated on (the legacy stream for cudaMalloc) whatever else it learns.
  b->streams.store(StreamOrder::bit_of(order_.id_of(stream ? *stream : nullptr)));
  // Untracked, nothing looks pointers up any more (Note [Tracking without a budget]).
  b->indexed = tracking();
  if (b->indexed && !index_.add(address, span, reinterpret_cast<uint64_t>(b))) {
    VCUDNN_LOG_ERROR("offload: internal error: buffer at {:#x} overlaps a tracked one", address);
    return false;
  }
  live_.emplace(address, b);
  live_requested_ += bytes;
  largest_granules_ = std::max(largest_granules_, span / arena_.granularity());
  ++counters_.allocations;
  if (OpSink* sink = recording_sink()) sink->allocated({b->serial, b->address, b->bytes, b->library}, stream);
  return true;
}

// Memory reused from a free on another stream is usable once that free is done there.
void MemoryManager::order_new_owner(const pool::TagSet& waits, StreamRef stream) {
  for (const pool::FreeTag& t : waits.tags()) {
    if (stream && order_.order(*stream, t, kWaitForCopyOut)) continue;
    // cudaMalloc's memory is usable on every stream at once (or a fence could not be recorded, or
    // the stream is being captured).
    if (order_.settled(t)) continue;
    host_waits_.add(capturing() ? HostWait::k_graph : HostWait::k_sync_allocation);
    order_.wait_host(t);
  }
}

bool MemoryManager::free(uint64_t address, StreamRef stream) {
  const ServeTimer timer(*this);
  std::unique_lock<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  if (it == live_.end()) return false;
  Buffer* b = it->second;
  if (b->cached) return false;  // freed already
  if (reusing(stream) && b->span < arena_.granularity() && cache_.bytes() + b->span <= kKeptBytes &&
      b->state.load() == BufferState::kResident && b->ready.stream == 0 &&
      b->copied_out.stream == 0) {
    if (b->indexed) {
      index_.remove(address);
      b->indexed = false;
    }
    live_requested_ -= b->bytes;
    ++counters_.frees;
    cache_.put(b, order_.id_of(*stream), cache_interval_);
    return true;
  }
  live_.erase(it);
  if (b->indexed) index_.remove(address);
  live_requested_ -= b->bytes;
  ++counters_.frees;
  if (OpSink* sink = recording_sink()) sink->freed({b->serial, b->address, b->bytes, b->library}, stream);
  if (Replayer* replay = replay_.load(std::memory_order_acquire)) {
    std::vector<Replayer::Due> due;
    replay->on_free(b->bytes, due);
    run_due(due);
    judge_iteration();
  }
  // The memory is reusable after the free in its stream's order; cudaFree (no stream) orders after
  // every stream that used the buffer and the legacy stream.
  pool::TagSet tags;
  if (stream) {
    const uint32_t id = order_.id_of(*stream);
    tags.add(order_.mark(id));
    // Under a budget idle memory may have to be unmapped soon: keep one fence in flight per stream
    // so that frees settle as the device gets past them (one event query per free, one record
    // whenever the previous fence has passed).
    if (config_.device_budget) order_.fence_ahead(id);
  } else {
    // Untracked (Note [Tracking without a budget]): every stream seen.
    const uint64_t legacy = StreamOrder::bit_of(order_.id_of(nullptr));
    const uint64_t streams = tracking() ? b->streams.load() | legacy : ~uint64_t{0};
    for (uint32_t id : order_.ids_in(streams)) tags.add(order_.mark(id));
  }
  // Copies of vcudnn's own may still be in flight on it: a copy back writing into it, or a copy
  // out reading it (also after an access cancelled that eviction). No unmap before they end.
  tags.add(b->ready);
  tags.add(b->copied_out);
  // A fence behind each of vcudnn's copies now (a query when one is there), so that they settle by
  // the time this memory is wanted: the copy streams may see nothing else queued for long.
  order_.settled(b->ready);
  order_.settled(b->copied_out);
  switch (b->state.load()) {
    case BufferState::kEvicting:
      stop_evicting(b);
      residency_.drop_host_copy(b);
      break;
    case BufferState::kEvicted:
      evicted_requested_ -= b->bytes;
      residency_.drop_host_copy(b);  // its granules are unmapped already
      break;
    case BufferState::kResident:
      break;
  }
  if (b->placed_pool) {
    // Note [Copies back in pieces]: bytes a buffer away on the host comes back onto get a fence of
    // their own at this free, so that the copy back of their piece waits for it alone.
    if (b->placed_pool->release(b->placed_slot, b, tags) && stream) order_.fence(order_.id_of(*stream));
  } else {
    arena_.free(address, tags);
  }
  recycle(b);
  return true;
}

bool MemoryManager::owns(uint64_t address) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  return it != live_.end() && !it->second->cached;
}

// Note [Reuse without a budget]
// Once accesses are no longer tracked (Note [Tracking without a budget]), a small buffer (below one
// granule) freed on a stream is kept whole (ReuseCache) and given to the next allocation of the same
// span on the same stream: its address stays in live_, marked `cached`, and the arena still counts
// it as used. A training loop repeats its sizes, so after a step most small allocations are such
// hits, served by a table probe instead of the arena's best fit over ordered maps (the host cost
// per call that made mobilenet's steps slower than PyTorch's alone: README). The same stream needs
// no event: the new owner's work queues behind the free. What is kept must cost the program little
// memory:
//  - at most kKeptBytes (64 MiB) are kept; beyond, frees take the arena's path. Large buffers are
//    never kept: replayed PyTorch sequences (vcudnn_bench_arena_host) mapped up to 22% more when
//    they were (exact sizes cannot serve one another), 0-3% with small ones only;
//  - an allocation the card cannot hold gets every kept buffer back in the arena first, and so does
//    trim_to() and the device running out;
//  - a synchronisation of the program returns the buffers kept a whole interval without reuse (as
//    the arena's own idle memory goes: end_interval);
//  - a destroyed stream's buffers go back at once (its id may be given to a new stream);
//  - cudaMemGetInfo counts kept memory as free, as it counts the arena's idle memory.
// A buffer goes back to the arena freed behind a mark taken then on its stream: later than its free,
// so also after it. Frees without a stream (cudaFree), and anything during a capture, take the
// arena's path as before.
void MemoryManager::uncache(Buffer* b, uint32_t stream_id) {
  pool::TagSet tags;
  tags.add(order_.mark(stream_id));
  live_.erase(b->address);
  arena_.free(b->address, tags);
  recycle(b);
}

void MemoryManager::flush_cache() {
  if (cache_.empty()) return;
  ++counters_.cache_flushes;
  cache_.drain([this](Buffer* b, uint32_t id) { uncache(b, id); });
}

void MemoryManager::stream_destroyed(Stream stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cache_.empty()) {
      const uint32_t id = order_.id_of(stream);
      cache_.drain_stream(id, [this](Buffer* b, uint32_t sid) { uncache(b, sid); });
    }
  }
  order_.retire(stream);
}

void MemoryManager::synchronized(const StreamOrder::Snapshot& done) {
  std::unique_lock<std::mutex> lock(mu_);
  order_.settle(done);
  reap();
  if (counters_.allocations != allocations_at_sync_) {  // an interval without allocations reused nothing
    allocations_at_sync_ = counters_.allocations;
    ++cache_interval_;
    if (cache_interval_ >= 2)
      cache_.drain_before(cache_interval_ - 1, [this](Buffer* b, uint32_t id) { uncache(b, id); });
  }
  const uint64_t n = arena_.end_interval([this](const pool::FreeTag& t) { return order_.settled(t); }, kKeptFreeChunks);
  counters_.released_bytes += n * arena_.granularity();
}

uint64_t MemoryManager::trim_to(uint64_t keep_bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  reap();
  flush_cache();
  const uint64_t g = arena_.granularity();
  const uint64_t keep = g ? keep_bytes / g : 0;
  const uint64_t idle = arena_.idle_bytes() / std::max<uint64_t>(g, 1);
  const uint64_t n =
      idle > keep ? arena_.trim(idle - keep, [this](const pool::FreeTag& t) { return order_.settled(t); }) : 0;
  const uint64_t mapped_idle = arena_.idle_bytes() / std::max<uint64_t>(g, 1);
  arena_.release_free_chunks(keep > mapped_idle ? keep - mapped_idle : 0);
  counters_.released_bytes += n * g;
  return n * g;
}

bool MemoryManager::device_out_of_memory(const char* api) {
  std::unique_lock<std::mutex> lock(mu_);
  reap();
  flush_cache();
  const uint64_t held = arena_.idle_bytes() + arena_.free_chunk_bytes();
  if (held == 0) return false;
  wait_for_idle();
  const uint64_t n = arena_.trim(UINT64_MAX, [this](const pool::FreeTag& t) { return order_.settled(t); });
  arena_.release_free_chunks();
  counters_.released_bytes += n * arena_.granularity();
  ++counters_.oom_retries;
  VCUDNN_LOG_DEBUG("offload: {} ran out of device memory; vcudnn gave back {} it held unused, and the call is retried",
                   api, mib(held));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Room

// Note [Room beside the pools]
// The arena's budget is the device budget less what the static placement's pools hold
// (sync_budgets()). A pool's free blocks count there until shrink_pools() gives them back, which
// with_room() did only inside its rounds, after refusing outright any need above the arena's
// budget as more than the budget, ever. After a re-plan the earlier plan's pool, retired, can hold
// blocks that no buffer owns any more: on the simulated device, the recorded VGG-16 b64 iteration at
// 65 % of its peak, its plan installed again after the third iteration, kept 30 free blocks (1142
// MiB) beside the new pool's 2778 MiB of a 4072 MiB budget, and the fault-in of a placed buffer whose
// slot missed 392 MiB of blocks was refused: 42 calls failed with out of memory (2026-11-28; trace_sim
// had let their kernels run). The pools' free blocks now go back before such a need is refused.
template <typename Attempt>
bool MemoryManager::with_room(uint64_t need, Attempt&& attempt) {
  if (attempt()) return true;
  const uint64_t g = arena_.granularity();
  if (g == 0) return false;
  // Note [Room beside the pools]: the pools' free blocks go back before a need is refused.
  if (need > arena_.budget_bytes() / g) shrink_pools(need - arena_.budget_bytes() / g);
  if (need > arena_.budget_bytes() / g) return false;  // more than the budget or the card, ever
  const auto t0 = std::chrono::steady_clock::now();
  struct Timer {  // the time spent making room, for the exit line
    std::chrono::steady_clock::time_point t0;
    uint64_t& ns;
    ~Timer() {
      ns += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  } timer{t0, counters_.room_ns};
  ++counters_.room_calls;
  for (int round = 0; round < kMaxRoomRounds; ++round) {
    if (reap() > 0 || trim(need) > 0 || shrink_pools(need) > 0) {
      if (attempt()) return true;
      continue;
    }
    if (!evicting_.empty()) {  // the oldest eviction in flight gives its memory back soonest
      host_waits_.add(HostWait::k_eviction);
      order_.wait_host(evicting_.front()->copied_out);
      continue;
    }
    if (wait_for_idle()) continue;
    if (!start_evictions(need > free_granules() ? need - free_granules() : need)) break;
  }
  return attempt();
}

// Evictions whose copies have finished are unmapped. Returns how many.
uint64_t MemoryManager::reap() {
  if (placed_ || !retired_.empty()) reap_pools();
  uint64_t n = 0;
  for (size_t i = 0; i < evicting_.size();) {
    Buffer* b = evicting_[i];
    if (!residency_.finish_eviction(b)) {
      if (b->state.load() != BufferState::kEvicting) {
        stop_evicting(b);  // the unmap failed: resident again
        continue;
      }
      ++i;
      continue;
    }
    evicting_granules_ -= b->span / arena_.granularity();
    evicting_.erase(evicting_.begin() + static_cast<long>(i));
    evicted_requested_ += b->bytes;
    ++n;
  }
  return n;
}

void MemoryManager::stop_evicting(Buffer* b) {
  const auto it = std::find(evicting_.begin(), evicting_.end(), b);
  if (it == evicting_.end()) return;
  evicting_.erase(it);
  evicting_granules_ -= b->span / arena_.granularity();
}

// Unmaps idle memory whose frees are done. Returns the granules unmapped.
uint64_t MemoryManager::trim(uint64_t granules) {
  const uint64_t n = arena_.trim(granules, [this](const pool::FreeTag& t) { return order_.settled(t); });
  counters_.trimmed_bytes += n * arena_.granularity();
  return n;
}

// Waits until the frees that hold back idle memory are done. false when there is none.
bool MemoryManager::wait_for_idle() {
  if (arena_.idle_bytes() == 0) return false;
  const pool::TagSet tags = arena_.idle_tags();
  if (tags.empty()) return false;  // idle and settled: trim() took what it could
  host_waits_.add(HostWait::k_reclaim);
  for (const pool::FreeTag& t : tags.tags()) order_.wait_host(t);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Replay of an offload plan (Note [Replaying an offload plan])

void MemoryManager::install_replay(ReplayScript script) {
  // Note [A static placement]: the pool reserves its ranges now; its memory comes as slots need it.
  std::unique_ptr<pool::PlacedPool> pool;
  std::unordered_map<uint64_t, uint32_t> through;
  const ReplayPlacement& placement = script.placement;
  if (config_.device_budget && !placement.cuts.empty() && placement.granule == arena_.granularity()) {
    std::vector<pool::PlacedPool::Slot> slots;
    slots.reserve(placement.slots.size());
    for (const ReplaySlot& slot : placement.slots) {
      std::vector<pool::PlacedPool::Segment> segments;
      for (const ReplaySegment& s : slot.segments) segments.push_back({s.offset, s.granules});
      slots.push_back({slot.offset, slot.granules, slot.kept, std::move(segments)});
    }
    for (const ReplayThroughSlot& t : placement.through) {  // Note [Across the iteration's end]
      std::vector<pool::PlacedPool::Segment> segments;
      for (const ReplaySegment& s : t.slot.segments) segments.push_back({s.offset, s.granules});
      through[t.serial] = static_cast<uint32_t>(slots.size());
      slots.push_back({t.slot.offset, t.slot.granules, 0, std::move(segments), true});
    }
    pool = std::make_unique<pool::PlacedPool>(physical_, arena_.granularity(), placement.cuts, std::move(slots));
    if (!pool->ok()) {
      VCUDNN_LOG_WARN(
          "offload: the static placement's address range could not be reserved; the arena serves every buffer");
      pool.reset();
      through.clear();
    }
  }
  auto replay = std::make_unique<Replayer>(std::move(script));
  std::lock_guard<std::mutex> lock(mu_);
  if (placed_) retired_.push_back(std::move(placed_));  // its buffers live on; it goes once drained
  placed_ = std::move(pool);
  through_slots_ = std::move(through);
  if (installs_++ > 0) ++counters_.replans;
  judged_iterations_ = 0;
  waits_taken_iterations_ = 0;
  reported_iterations_ = 0;
  replan_wanted_.store(0, std::memory_order_relaxed);
  for (const auto& [addr, b] : live_) replay->bind_persistent(b);
  if (replay_owner_) replaced_.push_back(std::move(replay_owner_));  // hooks may still hold it
  replay_owner_ = std::move(replay);
  replay_.store(replay_owner_.get(), std::memory_order_release);
}

void MemoryManager::set_replanner(std::function<void(uint64_t)> replanner) {
  std::lock_guard<std::mutex> lock(mu_);
  replanner_ = std::move(replanner);
}

// With mu_ held, after each memory event the script follows: at the end of a followed iteration,
// the on-demand evictions and fault-ins since the previous end are the help the plan needed. The
// first iteration after an install is not judged (it still pays for evictions made before the
// plan); a later one that needed help asks for a re-plan.
void MemoryManager::judge_iteration() {
  const Replayer* replay = replay_.load(std::memory_order_acquire);
  if (!replay) return;
  const uint64_t done = replay->iterations_done();
  if (done != waits_taken_iterations_) {
    waits_taken_iterations_ = done;
    take_copy_waits();
  }
  if (config_.log_iterations && done != reported_iterations_) {
    reported_iterations_ = done;
    report_due_.store(true, std::memory_order_relaxed);
  }
  if (!replanner_) return;
  if (done == judged_iterations_) return;
  const uint64_t help = residency_.stats().started - counters_.planned_offloads + counters_.fault_ins;
  if (judged_iterations_ > 0 && help > help_at_judge_) replan_wanted_.store(help - help_at_judge_);
  judged_iterations_ = done;
  help_at_judge_ = help;
}

void MemoryManager::maybe_replan() {
  std::function<void(uint64_t)> replanner;
  uint64_t helped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    helped = replan_wanted_.exchange(0);
    if (helped == 0 || !replanner_) return;
    replanner = replanner_;
  }
  replanner(helped);  // plans (a few ms) and installs the new script, which takes mu_
}

// Note [What an iteration cost]
// With VCUDNN_LOG_ITERATIONS=on, each iteration the plan followed to its end gets one info line:
// the host's time from the previous end (the whole step as the host saw it, the program's own work
// included), the copies moved and why (planned, on demand, faults), what made the host or a stream
// wait, and the host time of vcudnn's parts: serving allocations and frees, the access checks, making
// room, and the driver's virtual-memory calls (which overlap the first two). A steady iteration should
// show no on-demand evictions, no fault-ins, and few driver calls; the first line is the baseline.
// Note [Timing the waits for vcudnn's copies], with mu_ held, once an iteration: what the device
// waited for, and the plan's copies back it waited for move earlier (Replayer::late).
void MemoryManager::take_copy_waits() {
  for (const Residency::CopyTime& t : residency_.take_copy_times()) {
    ++counters_.back_copies_timed;
    counters_.back_copy_bytes += t.bytes;
    counters_.back_copy_ns += static_cast<uint64_t>(std::max(0.0, t.copy_ms) * 1e6);
    counters_.back_held_ns += static_cast<uint64_t>(std::max(0.0, t.held_ms) * 1e6);
  }
  Replayer* replay = replay_.load(std::memory_order_acquire);
  for (const StreamOrder::WaitSample& w : order_.take_waits()) {
    const bool late = w.waited_ms > kLateCopyMs;
    const auto ns = static_cast<uint64_t>(w.waited_ms * 1e6);
    if ((w.cookie & kWaitForCopyBack) != 0) {
      ++counters_.back_waits_timed;
      if (!late) continue;
      ++counters_.back_waits_late;
      counters_.back_wait_ns += ns;
      const auto action = static_cast<uint32_t>(w.cookie);  // the prefetch's action + 1; 0: none
      if (action != 0 && replay) replay->late(action - 1);
      if (config_.log_iterations && late_backs_.size() < 16) late_backs_.emplace_back(action, w.waited_ms);
    } else if ((w.cookie & kWaitForCopyOut) != 0) {
      ++counters_.out_waits_timed;
      if (!late) continue;
      ++counters_.out_waits_late;
      counters_.out_wait_ns += ns;
    }
  }
}

void MemoryManager::report_iteration() {
  if (!report_due_.exchange(false, std::memory_order_relaxed)) return;
  IterationMark now{stats(), physical_.totals(), 0, monotonic_ns()};
  std::string late_backs;  // which planned copies back the device stood for (the script's actions)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [action, waited] : late_backs_)
      late_backs += fmt::format("{}{}: {:.2f} ms", late_backs.empty() ? " (" : ", ",
                                action ? fmt::format("action {}", action - 1) : std::string("unplanned"), waited);
    if (!late_backs.empty()) late_backs += ")";
    late_backs_.clear();
  }
  if (const std::optional<ReplayStats> r = replay_stats()) now.late = r->late_prefetches;
  std::lock_guard<std::mutex> lock(report_mu_);
  if (report_mark_) {
    const ManagerStats& a = report_mark_->stats;
    const ManagerStats& b = now.stats;
    // Counters of one script start again at a re-plan: a smaller value is this script's own.
    const auto d = [](uint64_t before, uint64_t after) { return after >= before ? after - before : after; };
    const auto ms = [&](uint64_t before, uint64_t after) { return static_cast<double>(d(before, after)) / 1e6; };
    const uint64_t planned = d(a.planned_offloads, b.planned_offloads);
    const uint64_t started = d(a.evictions_started, b.evictions_started);
    VCUDNN_LOG_INFO(
        "offload: iteration {}: {:.2f} ms on the host; out {} ({}; on demand {}), back {} ({}; prefetched {}, late "
        "{}, fault-ins {}); host waits {}, stream waits {}; the device stood {:.2f} ms for {} of {} timed copies "
        "back{} "
        "and {:.2f} ms for {} of {} copies out; {} copies back timed: {:.1f} GB/s, {:.2f} ms waiting for the memory's "
        "holders; {} allocations ({} placed, {} fallbacks) and {} frees in {:.2f} ms; "
        "{} access checks in {:.2f} ms; room {} in {:.2f} ms; driver {} calls in {:.2f} ms; {} mapped anew, {} "
        "trimmed",
        ++reports_, ms(report_mark_->ns, now.ns), started, mib(d(a.bytes_evicted, b.bytes_evicted)),
        started >= planned ? started - planned : 0, d(a.restores, b.restores),
        mib(d(a.bytes_restored, b.bytes_restored)), d(a.prefetches, b.prefetches), d(report_mark_->late, now.late),
        d(a.fault_ins, b.fault_ins), d(a.host_waits, b.host_waits), d(a.stream_waits, b.stream_waits),
        ms(a.back_wait_ns, b.back_wait_ns), d(a.back_waits_late, b.back_waits_late),
        d(a.back_waits_timed, b.back_waits_timed), late_backs, ms(a.out_wait_ns, b.out_wait_ns),
        d(a.out_waits_late, b.out_waits_late), d(a.out_waits_timed, b.out_waits_timed),
        d(a.back_copies_timed, b.back_copies_timed),
        d(a.back_copy_ns, b.back_copy_ns) ? static_cast<double>(d(a.back_copy_bytes, b.back_copy_bytes)) /
                                                static_cast<double>(d(a.back_copy_ns, b.back_copy_ns))
                                          : 0.0,
        ms(a.back_held_ns, b.back_held_ns), d(a.allocations, b.allocations), d(a.placed_served, b.placed_served),
        d(a.placed_fallbacks, b.placed_fallbacks), d(a.frees, b.frees), ms(a.serve_ns, b.serve_ns),
        d(a.tracked_calls, b.tracked_calls), ms(a.track_ns, b.track_ns), d(a.room_calls, b.room_calls),
        ms(a.room_ns, b.room_ns), d(report_mark_->driver.calls, now.driver.calls),
        ms(report_mark_->driver.ns, now.driver.ns), mib(d(a.fresh_bytes, b.fresh_bytes)),
        mib(d(a.trimmed_bytes, b.trimmed_bytes)));
  }
  report_mark_ = now;
}

std::optional<ReplayStats> MemoryManager::replay_stats() const {
  const Replayer* replay = replay_.load(std::memory_order_acquire);
  return replay ? std::optional<ReplayStats>(replay->stats()) : std::nullopt;
}

// The plan's copies, with mu_ held. A buffer freed since it was named, or one that cannot move now
// (pinned, in use, a graph being captured), is counted as missed; on-demand eviction covers it.
void MemoryManager::run_due(const std::vector<Replayer::Due>& due) {
  for (const Replayer::Due& d : due) {
    Buffer* b = d.buffer;
    if (!is_live(b) || b->serial != d.serial || eviction_paused() || capturing()) {
      ++counters_.replay_missed;
      VCUDNN_LOG_DEBUG("offload: action {} missed: the buffer is gone or eviction is paused", d.action);
      continue;
    }
    if (d.kind == ReplayAction::kOffload) {
      // A buffer whose copy back the host has not yet seen end (restoring) may leave: copies out
      // queue after every copy back queued before them (Residency::start_eviction). Buffers alive
      // through the iteration come back at its end and leave again soon after their first uses in
      // the next (Note [Across the iteration's end]); on the H100, with the host ahead of the
      // device, refusing them kept them in pool bytes others were placed on.
      const bool can = b->large && !b->library && !b->scratch && !b->pinned.load() &&
                       b->state.load() == BufferState::kResident && b->in_use.load() == 0;
      if (can && begin_evictions({b}) == 1) {
        ++counters_.planned_offloads;
      } else {
        ++counters_.replay_missed;
        VCUDNN_LOG_DEBUG(
            "offload: action {} (out, serial {}, {}) missed: state {} restoring {} in use {} pinned {} placed {}",
            d.action, b->serial, mib(b->bytes), static_cast<int>(b->state.load()), b->restoring.load(),
            b->in_use.load(), b->pinned.load(), b->placed_pool != nullptr);
      }
      continue;
    }
    if (b->state.load() == BufferState::kResident) continue;  // never left, or back already
    if (restore_locked(b, std::nullopt, false) == RestoreResult::kOk) {
      ++counters_.prefetches;
      if (b->restoring.load()) b->prefetch_action = static_cast<int32_t>(d.action);
    } else {
      ++counters_.replay_missed;
      VCUDNN_LOG_DEBUG("offload: action {} (back, serial {}, {}) missed: state {}", d.action, b->serial, mib(b->bytes),
                       static_cast<int>(b->state.load()));
    }
  }
}

uint64_t MemoryManager::unevictable_bytes() const {
  uint64_t n = 0;
  for (const auto& [addr, b] : live_) {
    if (!b->large || b->library || b->scratch || b->pinned.load()) n += b->span;
  }
  return n;
}

// Starts evicting least-recently-used buffers (the policy's choice) worth `granules`. false when
// none could start.
bool MemoryManager::start_evictions(uint64_t granules) {
  if (!config_.device_budget || eviction_paused()) return false;
  const uint64_t g = arena_.granularity();
  std::vector<EvictionCandidate> candidates;
  for (const auto& [addr, b] : live_) {
    // A placed buffer's memory is the pool's: evicting it makes no room in the arena.
    if (b->large && !b->library && !b->scratch && !b->pinned.load() && b->state.load() == BufferState::kResident &&
        b->in_use.load() == 0 && !b->placed_pool)
      candidates.push_back({b, b->last_use.load(), b->span});
  }
  // A little more than asked: fewer rounds.
  const uint64_t slack = std::max<uint64_t>(1, *config_.device_budget / g / 50);
  Replayer* replay = replay_.load(std::memory_order_acquire);
  const uint64_t want = (granules + slack) * g;
  return begin_evictions(replay && replay->synced() ? replay->choose(std::move(candidates), want)
                                                    : policy_->choose(std::move(candidates), want)) > 0;
}

size_t MemoryManager::begin_evictions(const std::vector<Buffer*>& victims) {
  const uint64_t g = arena_.granularity();
  // Mark first, then look for calls in progress (Note [Never unmap under a queued access]).
  for (Buffer* b : victims) b->state.store(BufferState::kEvicting, std::memory_order_seq_cst);
  std::vector<Buffer*> go;
  for (Buffer* b : victims) {
    if (b->in_use.load(std::memory_order_seq_cst) > 0)
      b->state.store(BufferState::kResident);
    else
      go.push_back(b);
  }
  const std::vector<Buffer*> started = residency_.start_eviction(go);
  if (started.size() < go.size() && host_.stats().held_bytes > 0)
    VCUDNN_WARN_LIMITED(
        "offload: the host budget is exhausted ({} pinned, {} in use): {} buffers stay on the device; "
        "raise VCUDNN_HOST_BUDGET",
        mib(host_.stats().held_bytes), mib(host_.stats().in_use_bytes), go.size() - started.size());
  for (Buffer* b : started) {
    evicting_.push_back(b);
    evicting_granules_ += b->span / g;
  }
  return started.size();
}

// Under a budget, keeps room for the largest allocation seen (at least 1/16 of the budget, at most
// 1/4) free or on its way (evictions in flight, idle memory), so that allocations and fault-ins
// find their room without waiting for a copy.
void MemoryManager::evict_ahead() {
  if (!config_.device_budget || eviction_paused()) return;
  // A plan being followed keeps its own room (Note [Replaying an offload plan]).
  if (const Replayer* replay = replay_.load(std::memory_order_acquire); replay && replay->synced()) return;
  reap();
  const uint64_t g = arena_.granularity();
  const uint64_t budget = *config_.device_budget / g;
  const uint64_t low = std::clamp<uint64_t>(largest_granules_, std::max<uint64_t>(1, budget / 16), budget / 4);
  const uint64_t coming = free_granules() + evicting_granules_ + arena_.idle_bytes() / g;
  if (coming < low) start_evictions(2 * low - coming);
}

// ---------------------------------------------------------------------------------------------
// Restore

RestoreResult MemoryManager::restore_locked(Buffer* b, StreamRef stream, bool fault) {
  switch (b->state.load()) {
    case BufferState::kResident:
      return RestoreResult::kNotEvicted;
    case BufferState::kEvicting:
      if (b->handed_over && b->placed_pool) {  // Note [Back before the copy out ended]
        pool::TagSet waits;
        std::vector<pool::TagSet> by_piece;  // Note [Copies back in pieces]
        if (b->placed_pool->reclaim(b->placed_slot, b, &waits, &by_piece, residency_.copy_piece()) ==
            pool::PlacedPool::Result::kOk) {
          stop_evicting(b);
          if (!residency_.resume_back(b, stream ? std::optional<Stream>(*stream) : std::nullopt, std::move(waits),
                                      &by_piece))
            return RestoreResult::kFailed;
          b->handed_over = false;
          ++counters_.resumed;
          if (fault) ++counters_.fault_ins;
          return RestoreResult::kOk;
        }
      }
      if (b->handed_over) {  // its pool bytes hold a later buffer now: the copy out must end first
        host_waits_.add(HostWait::k_eviction);
        order_.wait_host(b->copied_out);
        reap();
        if (b->state.load() != BufferState::kEvicted) return RestoreResult::kFailed;
        break;
      }
      stop_evicting(b);
      residency_.cancel_eviction(b);
      return RestoreResult::kOk;
    case BufferState::kEvicted:
      break;
  }
  if (adopt_placed(b) || b->placed_pool) return restore_placed(b, stream, fault);
  const auto attempt = [&] { return residency_.restore(b, stream ? std::optional<Stream>(*stream) : std::nullopt); };
  if (!with_room(b->span / arena_.granularity(), attempt)) return RestoreResult::kNoRoom;
  evicted_requested_ -= b->bytes;
  if (fault) ++counters_.fault_ins;
  if (placed_) note_physical();
  evict_ahead();
  return RestoreResult::kOk;
}

// Note [Back before the copy out ended]
// Under a static placement a moved buffer's pool bytes may go to a later buffer while its copy out
// still runs (the later buffer's stream waits for that copy: a hand-over). When the plan brings it
// back before that copy has ended (the link was busy: at 60 % on ResNet-50 b64 the copies out run
// late), the host used to wait for the copy out, unmap the range and map it again: one host wait
// an iteration, 20-35 ms of host time a step at 60 %. Its range is still mapped, so it takes its
// bytes back as soon as the later buffers gave them back (their frees' tags), and the copy back
// is queued after those frees and after its own copy out, all on the device. While a later buffer
// still holds some of its bytes (the program strayed), the host waits as before.

// ---------------------------------------------------------------------------------------------
// A static placement (Note [A static placement] in planner/placement.h)

uint64_t MemoryManager::pool_held() const {
  uint64_t n = placed_ ? placed_->held_bytes() : 0;
  for (const auto& p : retired_) n += p->held_bytes();
  return n;
}

void MemoryManager::sync_budgets() {
  if (!config_.device_budget) return;
  const uint64_t held = pool_held();
  arena_.set_budget(*config_.device_budget > held ? *config_.device_budget - held : 0);
}

bool MemoryManager::physical_fits(uint64_t bytes) {
  const uint64_t budget = config_.device_budget.value_or(0);
  if (arena_.mapped_bytes() + arena_.free_chunk_bytes() + pool_held() + bytes <= budget) return true;
  if (arena_.free_chunk_bytes() == 0) return false;
  arena_.release_free_chunks();
  return arena_.mapped_bytes() + pool_held() + bytes <= budget;
}

bool MemoryManager::make_physical_room(uint64_t bytes) {
  return with_room(granules_for(bytes), [&] { return physical_fits(bytes); });
}

// Note [Room for a slot's blocks]
// Making room may give back the pool's free blocks (shrink_pools), and among them blocks of the
// very slot that asked: it then needs more than it made room for, and creating them went over the
// budget (by 10 granules on the simulated device: the recorded ResNet-50 iteration at 80 % with
// 1/1024 of the budget as room; at 50 % before the pieces of Note [Buffers in pieces] too; likely
// also what made a transformer on the H100 map 874 MiB under a budget of 873 at 70 % of its peak,
// not rerun there). So what is missing is asked again after each round of room, until it fits as it is.
bool MemoryManager::room_for_slot(const pool::PlacedPool& p, uint32_t slot) {
  for (int round = 0; round < 4; ++round) {
    const uint64_t missing = p.missing_bytes(slot);
    if (missing == 0 || physical_fits(missing)) return true;
    if (!make_physical_room(missing)) return false;
  }
  const uint64_t missing = p.missing_bytes(slot);
  return missing == 0 || physical_fits(missing);
}

uint64_t MemoryManager::shrink_pools(uint64_t granules) {
  if (!placed_ && retired_.empty()) return 0;
  const uint64_t g = arena_.granularity();
  const auto settled = [this](const pool::FreeTag& t) { return order_.settled(t); };
  const uint64_t want = granules * g;
  uint64_t got = 0;
  for (auto& r : retired_) got += got < want ? r->shrink(want - got, settled) : 0;
  if (placed_ && got < want) got += placed_->shrink(want - got, settled);
  if (got) {
    counters_.pool_shrunk += got;
    sync_budgets();
  }
  return got / g;
}

void MemoryManager::note_physical() { peak_physical_ = std::max(peak_physical_, arena_.mapped_bytes() + pool_held()); }

void MemoryManager::reap_pools() {
  const auto settled = [this](const pool::FreeTag& t) { return order_.settled(t); };
  bool changed = placed_ && placed_->reap(settled) > 0;
  for (auto it = retired_.begin(); it != retired_.end();) {
    (*it)->reap(settled);
    if ((*it)->drained(settled)) {
      it = retired_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  if (changed) sync_budgets();
}

// The allocation the script's placement gives slot `slot`: its range, onto pool bytes no live buffer
// holds (or one being copied out hands over), the new owner's stream ordered after whoever held
// them. nullopt when the slot is busy (the program strayed: a buffer lives longer than recorded) or
// its blocks find no room: the arena serves it then, as without a placement.
std::optional<uint64_t> MemoryManager::allocate_placed(uint32_t slot, uint64_t bytes, StreamRef stream, Origin origin,
                                                       Replayer* replay) {
  pool::PlacedPool& p = *placed_;
  if (!p.placed(slot) || p.span(slot) != arena_.span_of(bytes)) return std::nullopt;
  const uint64_t missing = p.missing_bytes(slot);
  if (missing && !room_for_slot(p, slot)) {
    ++counters_.placed_fallbacks;
    VCUDNN_LOG_DEBUG("offload: slot {} ({}) falls back to the arena: no room for its missing {}", slot, mib(bytes),
                     mib(missing));
    return std::nullopt;
  }
  Buffer* b = new_buffer();
  pool::TagSet waits;
  std::vector<pool::PlacedPool::HandOver> over;
  const auto may_hand_over = [](const void* owner) {
    const Buffer* x = static_cast<const Buffer*>(owner);
    return x->state.load() == BufferState::kEvicting && x->copied_out.stream != 0;
  };
  const pool::PlacedPool::Result r = p.take(slot, b, &waits, may_hand_over, &over);
  if (missing) {
    sync_budgets();
    note_physical();
  }
  if (r != pool::PlacedPool::Result::kOk) {
    recycle(b);
    ++counters_.placed_fallbacks;
    if (log::enabled(LogLevel::kDebug)) {
      std::string held;
      for (const void* o : p.holders(slot, nullptr)) {
        const Buffer* x = static_cast<const Buffer*>(o);
        held += fmt::format(" serial {} ({}, state {})", x->serial, mib(x->bytes), static_cast<int>(x->state.load()));
      }
      VCUDNN_LOG_DEBUG("offload: slot {} ({}) falls back to the arena: the pool answered {}; held by{}", slot,
                       mib(bytes), static_cast<int>(r), held);
    }
    return std::nullopt;
  }
  for (const pool::PlacedPool::HandOver& h : over) {
    Buffer* x = const_cast<Buffer*>(static_cast<const Buffer*>(h.owner));
    waits.add(copied_up_to(*x, h.reach));  // the new owner writes once the copy has read the bytes
    x->handed_over = true;
  }
  order_new_owner(waits, stream);
  b->placed_pool = &p;
  b->placed_slot = slot;
  b->kept = p.kept_bytes(slot);  // Note [Moving part of a buffer]
  if (!publish(b, p.address(slot), p.span(slot), bytes, origin, stream)) {
    p.release(slot, b, {});
    recycle(b);
    ++counters_.placed_fallbacks;
    return std::nullopt;
  }
  ++counters_.reused;
  ++counters_.placed_served;
  replay->bind(b);
  return b->address;
}

// Note [Across the iteration's end] (planner/offload_plan.h): a buffer alive through the iteration
// that the placement places lives in the arena until the plan first takes it away. Coming back, its
// pool slot takes it at its own address (PlacedPool::adopt): from then on it is a placed buffer, and
// the arena keeps its range, unmapped, reserved for it for good (also once the program frees it:
// such buffers live as long as the program, and the pool unmaps the range when it goes). A buffer an
// earlier script's pool took moves to the current one's slot the same way, while it is away (its
// range unmapped), so that the retired pool can drain; until then the new layout does not count its
// bytes (on the simulated device the iteration after a re-plan faulted 3 buffers in, ResNet-50 b64
// at 80 %, and the ones after it none).
bool MemoryManager::adopt_placed(Buffer* b) {
  if (!placed_ || through_slots_.empty() || b->kept || b->placed_pool == placed_.get()) return false;
  const auto it = through_slots_.find(b->serial);
  if (it == through_slots_.end()) return false;
  pool::PlacedPool& p = *placed_;
  if (!p.external(it->second) || p.span(it->second) != b->span) return false;
  if (b->placed_pool ? !b->placed_pool->external(b->placed_slot) || b->placed_pool->is_mapped(b->placed_slot)
                     : !arena_.is_evicted(b->address))
    return false;
  if (!p.adopt(it->second, b, b->address)) return false;
  if (b->placed_pool) b->placed_pool->release(b->placed_slot, b, {});
  b->placed_pool = &p;
  b->placed_slot = it->second;
  ++counters_.placed_adopted;
  VCUDNN_LOG_DEBUG("offload: serial {} ({}) adopted into slot {}", b->serial, mib(b->bytes), it->second);
  return true;
}

// A placed buffer back: onto its pool bytes when no one holds them, else onto an extent of its own.
RestoreResult MemoryManager::restore_placed(Buffer* b, StreamRef stream, bool fault) {
  pool::PlacedPool& p = *b->placed_pool;
  pool::TagSet waits;
  std::vector<pool::TagSet> by_piece;  // Note [Copies back in pieces]
  const uint64_t piece = residency_.copy_piece();
  if (p.missing_bytes(b->placed_slot) && !room_for_slot(p, b->placed_slot)) return RestoreResult::kNoRoom;
  pool::PlacedPool::Result r = p.restore(b->placed_slot, b, &waits, &by_piece, piece);
  sync_budgets();
  const uint64_t moving_span = b->span - b->kept;  // what an extent of its own would map
  if (r == pool::PlacedPool::Result::kBusy && !physical_fits(moving_span)) {
    // Its pool bytes hold buffers placed in its absence that are still alive (the program strayed
    // from the recorded iteration): they leave for the host (the host waits for their copies,
    // counted), and it comes back onto its own bytes.
    std::vector<Buffer*> holders;
    for (const void* o : p.holders(b->placed_slot, b)) {
      Buffer* h = const_cast<Buffer*>(static_cast<const Buffer*>(o));
      if (h->state.load() == BufferState::kResident && !h->pinned.load() && h->in_use.load() == 0) holders.push_back(h);
    }
    begin_evictions(holders);
    for (Buffer* h : holders) {
      if (h->state.load() != BufferState::kEvicting) continue;
      host_waits_.add(HostWait::k_eviction);
      order_.wait_host(h->copied_out);
    }
    reap();
    waits.clear();
    by_piece.clear();
    r = p.restore(b->placed_slot, b, &waits, &by_piece, piece);
  }
  if (r == pool::PlacedPool::Result::kBusy) {
    if (!make_physical_room(moving_span)) return RestoreResult::kNoRoom;
    const bool mapped = p.restore_detached(b->placed_slot);
    sync_budgets();
    if (!mapped) return RestoreResult::kNoRoom;
  } else if (r != pool::PlacedPool::Result::kOk) {
    return RestoreResult::kFailed;
  }
  note_physical();
  if (!residency_.copy_back(b, stream ? std::optional<Stream>(*stream) : std::nullopt, waits, &by_piece)) {
    sync_budgets();
    return RestoreResult::kFailed;
  }
  b->handed_over = false;
  evicted_requested_ -= b->bytes;
  if (fault) ++counters_.fault_ins;
  return RestoreResult::kOk;
}

// A buffer restored for one stream: an access from another (or an unknown) stream is ordered
// after the copy back.
void MemoryManager::settle_restore(Buffer* b, StreamRef stream) {
  // A planned copy back is late if its use stands still for it on the device: timed there, the
  // host's view (the host runs ahead) says nothing (Note [Timing the waits for vcudnn's copies]).
  const uint64_t cookie = kWaitForCopyBack | static_cast<uint32_t>(b->prefetch_action + 1);
  b->prefetch_action = -1;
  if (order_.settled(b->ready)) {
    b->restoring.store(false);
    return;
  }
  if (stream && order_.order(*stream, b->ready, cookie)) return;
  host_waits_.add(HostWait::k_unknown_stream);
  order_.wait_host(b->ready);
  b->restoring.store(false);
}

// ---------------------------------------------------------------------------------------------
// Access tracking

bool MemoryManager::touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api) {
  if (!tracking()) return true;
  const TrackTimer timer(*this);
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t lo = index_.prefilter_min();
  const uint64_t hi = index_.prefilter_max();
  pool::HitList hits;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t w = words[i];
    if (w < lo || w >= hi) continue;
    const auto hit = index_.find(w);
    if (!hit) continue;
    if (!hits.contains(hit->id)) hits.push_back(*hit);
  }
  return hits.empty() || on_hits(hits, mode, stream, api);
}

bool MemoryManager::touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream,
                                 const char* api) {
  if (!tracking()) return true;
  const TrackTimer timer(*this);
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const pool::HitList hits = pool::scan_params(index_, layout, args);
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

bool MemoryManager::touch_block(const void* data, size_t bytes, StreamRef stream, const char* api) {
  if (!tracking()) return true;
  const TrackTimer timer(*this);
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const pool::HitList hits = pool::scan_words(index_, data, bytes);
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

bool MemoryManager::touch_everything(StreamRef stream, const char* api) {
  if (!tracking()) return true;
  const TrackTimer timer(*this);
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  pool::HitList hits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hits.reserve(live_.size());
    for (const auto& [addr, b] : live_) hits.push_back({reinterpret_cast<uint64_t>(b), addr, 0});
  }
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

// Note [Tracking without a budget]
// Accesses are tracked for three readers: eviction (which buffer, ordered after which streams' work,
// not while a call holds it), the recorder (the first iteration's calls and their buffers) and the
// access log (VCUDNN_TRACE). Without a device budget nothing is ever evicted (vcudnnEvictBuffer is
// refused too), so once the recorder is finished (its iteration taken, timed and written) and the
// access log is full or not wanted, tracking stops for good: every touch returns at once, a
// launch costs its hook a call scope and a layout lookup, and new buffers stay out of the pointer
// index (a map update less per allocation and free). The one reader left of the streams a
// buffer was used on is cudaFree (no stream): it then orders after every stream vcudnn has seen, as
// the real cudaFree waits for the whole device. The exit line says when tracking stopped.
void MemoryManager::stop_tracking_if_done() {
  if (config_.device_budget || (config_.access_log && !log_.full())) return;
  const OpSink* sink = sink_.load(std::memory_order_acquire);
  if (!sink || !sink->finished()) return;  // no recorder attached yet, or still recording
  if (tracking_.exchange(false, std::memory_order_relaxed)) {
    VCUDNN_LOG_INFO(
        "offload: no device budget and the first iteration is recorded: accesses are no longer tracked "
        "(nothing is evicted without a budget), after {} tracked calls",
        tracked_calls_.load(std::memory_order_relaxed));
  }
}

bool MemoryManager::on_hits(const pool::HitList& hits, Access mode, StreamRef stream, const char* api) {
  TouchScope scope;  // the hook's CallScope when it has one: the holds last until its work is queued
  if (OpSink* sink = sink_.load(std::memory_order_acquire)) sink->poll();
  if (!config_.device_budget) stop_tracking_if_done();
  if (Replayer* replay = replay_.load(std::memory_order_acquire)) {
    std::vector<Replayer::Due> due;
    replay->on_use(due);
    if (!due.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      run_due(due);
    }
  }
  const uint64_t tick = next_tick();
  tracked_hits_.fetch_add(hits.size(), std::memory_order_relaxed);
  // An access whose stream is unknown is counted on the legacy stream (cudaFree orders after it).
  const uint64_t bit = StreamOrder::bit_of(order_.id_of(stream ? *stream : nullptr));
  bool slow = false;
  for (const pool::Hit& h : hits) {
    Buffer* b = reinterpret_cast<Buffer*>(h.id);
    hold(b->in_use);  // before the state is read (Note [Never unmap under a queued access])
    b->last_use.store(tick, std::memory_order_relaxed);
    if ((b->streams.load(std::memory_order_relaxed) & bit) == 0) b->streams.fetch_or(bit, std::memory_order_relaxed);
  }
  for (const pool::Hit& h : hits) {
    const Buffer* b = reinterpret_cast<const Buffer*>(h.id);
    slow = slow || b->state.load(std::memory_order_seq_cst) != BufferState::kResident ||
           b->restoring.load(std::memory_order_relaxed);
  }
  const bool capturing = this->capturing();
  if (capturing) pin_for_graph(hits);     // Note [CUDA graphs under a budget]
  if (OpSink* sink = recording_sink()) {  // the first iteration only
    try {
      std::vector<BufferUse> uses;
      uses.reserve(hits.size());
      for (const pool::Hit& h : hits) {
        const Buffer* b = reinterpret_cast<const Buffer*>(h.id);
        uses.push_back({{b->serial, b->address, b->bytes, b->library}, static_cast<uint8_t>(mode)});
      }
      sink->used(api, stream, uses.data(), uses.size());
    } catch (...) {  // out of host memory: the trace misses this call's buffers
    }
  }
  if (config_.access_log && !log_.full()) {
    const uint64_t call = tracked_calls_.load(std::memory_order_relaxed);
    uint64_t serials[64];
    for (size_t i = 0; i < hits.size(); i += 64) {
      const size_t n = std::min<size_t>(hits.size() - i, 64);
      for (size_t k = 0; k < n; ++k) serials[k] = reinterpret_cast<const Buffer*>(hits[i + k].id)->serial;
      log_.add(call, serials, n, mode);
    }
  }
  if (!slow) return true;

  std::unique_lock<std::mutex> lock(mu_);
  for (const pool::Hit& h : hits) {
    Buffer* b = reinterpret_cast<Buffer*>(h.id);
    if (!is_live(b)) continue;  // freed meanwhile
    const RestoreResult r = restore_locked(b, stream, true);
    if (r != RestoreResult::kOk && r != RestoreResult::kNotEvicted) {
      uint64_t needed = 0;
      for (const pool::Hit& x : hits) needed += reinterpret_cast<const Buffer*>(x.id)->span;
      VCUDNN_WARN_LIMITED(
          "offload: {} needs {} buffers of {} in all on the device at once, which the device budget of {} "
          "cannot hold next to what cannot be evicted ({}); the call fails with an out-of-memory status",
          api, hits.size(), mib(needed), config_.device_budget ? mib(*config_.device_budget) : "none",
          mib(unevictable_bytes()));
      return false;
    }
    if (!b->restoring.load()) continue;
    if (capturing) {  // the capturing stream cannot wait on a copy queued outside its capture
      host_waits_.add(HostWait::k_graph);
      order_.wait_host(b->ready);
      b->restoring.store(false);
    } else {
      settle_restore(b, stream);
    }
  }
  if (OpSink* sink = recording_sink()) sink->waited();  // Note [GPU time without the waits for memory]
  return true;
}

void MemoryManager::pin(const uint64_t* words, size_t n, const char* api) {
  std::vector<Buffer*> found;
  for (size_t i = 0; i < n; ++i) {
    if (const auto hit = index_.find(words[i])) found.push_back(reinterpret_cast<Buffer*>(hit->id));
  }
  if (found.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  for (Buffer* b : found) {
    if (!is_live(b) || b->pinned.exchange(true)) continue;
    ++counters_.pinned_buffers;
    VCUDNN_LOG_DEBUG("offload: {} keeps a pointer into the buffer at {:#x} ({}); it is never evicted", api, b->address,
                     mib(b->bytes));
    if (b->state.load() == BufferState::kResident) continue;
    restore_locked(b, std::nullopt, true);
    if (b->restoring.load()) {
      host_waits_.add(HostWait::k_pin);  // the library may use the pointer on any stream, any time
      order_.wait_host(b->ready);
      b->restoring.store(false);
    }
  }
}

void MemoryManager::remember(const void* owner, const uint64_t* words, size_t n) {
  std::lock_guard<std::mutex> lock(remembered_mu_);
  remembered_[owner].assign(words, words + n);
}

void MemoryManager::forget(const void* owner) {
  std::lock_guard<std::mutex> lock(remembered_mu_);
  remembered_.erase(owner);
}

bool MemoryManager::touch_remembered(const void* owner, StreamRef stream, const char* api) {
  if (!tracking()) return true;
  std::vector<uint64_t> words;
  {
    std::lock_guard<std::mutex> lock(remembered_mu_);
    const auto it = remembered_.find(owner);
    if (it == remembered_.end()) return true;
    words = it->second;
  }
  return touch(words.data(), words.size(), Access::kUnknown, stream, api);
}

// Note [CUDA graphs under a budget]
// A graph replays the kernels, copies and library calls captured into it with the pointers they had
// then, without any hook running. So every buffer a hooked call touches while a capture is in
// progress is pinned: those are the buffers the graph will use, and they stay on the device for as
// long as they live (graph_pinned in the exit line). Everything else may still be evicted, during
// the capture too: the live bytes may exceed the budget, so bringing everything back for a capture
// cannot work. A buffer the capture touches while it is evicted comes back then, and the host waits
// for the copy (host_waits "graph"): the capturing stream cannot wait on an event recorded outside
// its capture, and a capture happens once per graph. When the capture begins, every stream gets a
// fence covering what was queued on it so far: work queued on a stream once it is capturing is
// recorded into the graph, not run, and no event can be recorded there, so an eviction that must
// follow earlier work on that stream waits on this fence. Memory the framework allocates on the
// capturing stream with cudaMallocAsync is CUDA's own (graph memory nodes: memory_hooks.cpp); the
// caching allocator's segments (cudaMalloc) are vcudnn's like any other. A graph whose work vcudnn
// did not see (nodes added one by one, cuDNN's own graph population without a capture) turns
// eviction off for the rest of the process, as there is no telling what it uses.
// restore_all_locked: every evicted buffer back and settled (that last case); returns how many.
uint64_t MemoryManager::restore_all_locked() {
  uint64_t restored = 0;
  for (const auto& [addr, b] : live_) {
    if (b->state.load() == BufferState::kResident && !b->restoring.load()) continue;
    if (b->state.load() != BufferState::kResident && restore_locked(b, std::nullopt, false) != RestoreResult::kOk)
      continue;
    ++restored;
    if (b->restoring.load()) {
      host_waits_.add(HostWait::k_graph);  // a graph may use it on any stream, any time
      order_.wait_host(b->ready);
      b->restoring.store(false);
    }
  }
  return restored;
}

void MemoryManager::capture_begins(const char* api) {
  const bool first = !graphs_seen_.exchange(true);
  order_.fence_all();  // before the capture starts: afterwards nothing can be recorded on its stream
  captures_.fetch_add(1);
  if (first)
    VCUDNN_LOG_INFO(
        "offload: {}: a CUDA graph is being captured: the buffers its work uses stay on the device while they live "
        "(an evicted one comes back when the capture touches it); other buffers may still be evicted",
        api);
}

void MemoryManager::capture_ends(const char* api) {
  uint32_t n = captures_.load();
  while (n > 0 && !captures_.compare_exchange_weak(n, n - 1)) {
  }
  std::unique_lock<std::mutex> lock(mu_);
  VCUDNN_LOG_INFO("offload: {}: capture ended; {} buffers ({}) are kept on the device for CUDA graphs so far{}", api,
                  counters_.graph_pinned_buffers, mib(counters_.graph_pinned_bytes),
                  captures_.load() ? ", another capture is in progress" : "");
}

void MemoryManager::graph_launched(const char* api) {
  if (!graphs_seen_.load()) opaque_graph(api);  // never captured under vcudnn: built some other way
}

void MemoryManager::opaque_graph(const char* api) {
  if (opaque_graphs_.exchange(true)) return;
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t restored = restore_all_locked();
  VCUDNN_LOG_WARN(
      "offload: {}: a CUDA graph whose work vcudnn did not see captured is used, so eviction is off from now on ({} "
      "evicted buffers brought back); memory stays owned",
      api, restored);
}

void MemoryManager::pin_for_graph(const pool::HitList& hits) {
  std::unique_lock<std::mutex> lock(mu_);
  for (const pool::Hit& h : hits) {
    Buffer* b = reinterpret_cast<Buffer*>(h.id);
    if (!is_live(b) || b->pinned.exchange(true)) continue;
    ++counters_.graph_pinned_buffers;
    counters_.graph_pinned_bytes += b->bytes;
  }
}

void MemoryManager::pin_remembered(const void* owner, const char* api) {
  std::vector<uint64_t> words;
  {
    std::lock_guard<std::mutex> lock(remembered_mu_);
    const auto it = remembered_.find(owner);
    if (it == remembered_.end()) return;
    words = it->second;
  }
  pin(words.data(), words.size(), api);
}

void MemoryManager::prepare_query(uint64_t word, const char* api) {
  const auto hit = index_.find(word);
  if (!hit) return;
  Buffer* b = reinterpret_cast<Buffer*>(hit->id);
  if (b->state.load() != BufferState::kEvicted) return;  // mapped: the driver can answer
  std::unique_lock<std::mutex> lock(mu_);
  if (!is_live(b)) return;
  b->last_use.store(next_tick());
  // The copy back is queued; the access that follows the query orders its stream after it.
  if (restore_locked(b, std::nullopt, true) == RestoreResult::kNoRoom)
    VCUDNN_WARN_LIMITED(
        "offload: {} asks about a pointer into an evicted buffer of {}, which the device budget of {} cannot hold "
        "next to what cannot be evicted ({}, of which {} kept for CUDA graphs); the driver answers for unmapped "
        "memory (CUDA_ERROR_INVALID_VALUE). Raise VCUDNN_DEVICE_BUDGET.",
        api, mib(b->bytes), config_.device_budget ? mib(*config_.device_budget) : "none", mib(unevictable_bytes()),
        mib(counters_.graph_pinned_bytes));
}

void MemoryManager::count_foreign(const char* api, uint64_t bytes) {
  foreign_.fetch_add(1, std::memory_order_relaxed);
  VCUDNN_LOG_DEBUG("offload: {} of {} bytes passed through (not served by vcudnn)", api, bytes);
}

// ---------------------------------------------------------------------------------------------
// Explicit moves

EvictResult MemoryManager::evict(uint64_t address) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  if (it == live_.end()) return EvictResult::kUnknown;
  Buffer* b = it->second;
  if (!b->large) return EvictResult::kTooSmall;
  if (!config_.device_budget) return EvictResult::kNotAllowed;  // Note [Tracking without a budget]
  if (b->library || b->scratch || b->pinned.load() || eviction_paused()) return EvictResult::kNotAllowed;
  if (b->state.load() == BufferState::kEvicted) return EvictResult::kAlreadyEvicted;
  if (b->state.load() == BufferState::kResident) {
    b->state.store(BufferState::kEvicting, std::memory_order_seq_cst);
    if (b->in_use.load(std::memory_order_seq_cst) > 0) {
      b->state.store(BufferState::kResident);
      return EvictResult::kFailed;  // in use by a call in progress
    }
    const uint64_t before = residency_.stats().no_host_memory;
    if (residency_.start_eviction({b}).empty())
      return residency_.stats().no_host_memory > before ? EvictResult::kNoHostMemory : EvictResult::kFailed;
    evicting_.push_back(b);
    evicting_granules_ += b->span / arena_.granularity();
  }
  host_waits_.add(HostWait::k_eviction);
  order_.wait_host(b->copied_out);
  reap();
  return b->state.load() == BufferState::kEvicted ? EvictResult::kOk : EvictResult::kFailed;
}

RestoreResult MemoryManager::restore(uint64_t address, StreamRef stream) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  if (it == live_.end()) return RestoreResult::kUnknown;
  Buffer* b = it->second;
  b->last_use.store(next_tick());
  const RestoreResult r = restore_locked(b, stream, false);
  if (r == RestoreResult::kOk && !stream && b->restoring.load()) settle_restore(b, stream);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Statistics

std::pair<uint64_t, uint64_t> MemoryManager::budget_info() const {
  const uint64_t cap = arena_.budget_bytes();
  const uint64_t used = arena_.mapped_bytes() - std::min(arena_.mapped_bytes(), arena_.idle_bytes());
  const uint64_t free = used >= cap ? 0 : cap - used;
  uint64_t live = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = live_requested_;
  }
  // Evicted buffers are live but hold no device memory: with them the program's own count of its
  // bytes (PyTorch asserts free + its bytes <= total) may pass the budget; total grows to match.
  return {free, std::max(config_.device_budget.value_or(cap), free + live)};
}

std::pair<uint64_t, uint64_t> MemoryManager::memory_info(uint64_t device_free, uint64_t device_total) const {
  uint64_t cached = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cached = cache_.bytes();
  }
  const uint64_t ours = arena_.idle_bytes() + arena_.free_chunk_bytes() + cached;
  return {std::min(device_total, device_free + ours), device_total};
}

ManagerStats MemoryManager::stats() const {
  ManagerStats s;
  Residency::Stats r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = counters_;
    s.live = live_requested_;
    s.cached = cache_.bytes();
    r = residency_.stats();
  }
  const pool::VmmArena::Stats a = arena_.stats();
  const pool::HostPool::Stats h = host_.stats();
  const StreamOrder::Stats o = order_.stats();
  s.budget = config_.device_budget.value_or(0);
  s.mapped = a.mapped_bytes;
  s.peak_mapped = a.peak_mapped_bytes;
  s.peak_held = a.peak_held_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.pool_held = pool_held();
    s.mapped += s.pool_held;
    s.peak_mapped = std::max(s.peak_mapped, peak_physical_);
    s.peak_held = std::max(s.peak_held, peak_physical_);
    if (placed_) {
      const pool::PlacedPool::Stats& ps = placed_->stats();
      s.pool_blocks = ps.blocks_created;
      s.pool_mappings = ps.mappings;
      s.pool_detached = ps.detached;
      s.pool_handovers = ps.handovers;
    }
  }
  s.idle = a.idle_bytes + s.cached;
  s.evicted_now = a.evicted_bytes;
  s.fragmentation = a.fragmentation;
  s.host_budget = config_.device_budget ? config_.host_budget : 0;
  s.host_reserved = h.held_bytes;
  s.evictions = r.evictions;
  s.evictions_started = r.started;
  s.evictions_cancelled = r.cancelled;
  s.restores = r.restores;
  s.restores_in_pieces = r.restores_in_pieces;
  s.bytes_evicted = r.bytes_evicted;
  s.bytes_restored = r.bytes_restored;
  s.serve_calls = serve_calls_.load();
  s.serve_ns = serve_ns_.load();
  s.tracked_calls = tracked_calls_.load();
  s.track_ns = track_ns_.load();
  s.tracked_hits = tracked_hits_.load();
  s.foreign_allocations = foreign_.load();
  s.host_waits = host_waits_.total();
  s.stream_waits = o.stream_waits;
  s.fences = o.fences;
  return s;
}

std::string MemoryManager::summary() const {
  const ManagerStats s = stats();
  return fmt::format(
      "allocations={} frees={} reused={} fresh={} failed={} evictions={} (started={} cancelled={}) restores={} "
      "fault_ins={} evicted={} restored={} trimmed={} released={} served={} in {:.1f} ms ({:.2f} us each) "
      "kept_hits={} kept_flushes={} "
      "oom_retries={} room={} in {:.1f} ms host_waits={} "
      "stream_waits={} fences={} device_stood: back={}/{} in {:.1f} ms out={}/{} in {:.1f} ms "
      "peak_mapped={} peak_held={} budget={} live={} idle={} fragmentation={:.3f} policy={} tracked_calls={} "
      "tracked_hits={}{} "
      "pinned={} graph_pinned={} ({}) foreign={}{}{}",
      s.allocations, s.frees, s.reused, mib(s.fresh_bytes), s.failed_allocations, s.evictions, s.evictions_started,
      s.evictions_cancelled, s.restores, s.fault_ins, mib(s.bytes_evicted), mib(s.bytes_restored), mib(s.trimmed_bytes),
      mib(s.released_bytes), s.serve_calls, s.serve_ns / 1e6, s.serve_calls ? s.serve_ns / 1e3 / s.serve_calls : 0.0,
      s.cache_hits, s.cache_flushes, s.oom_retries, s.room_calls, s.room_ns / 1e6, host_waits_.text(), s.stream_waits,
      s.fences, s.back_waits_late, s.back_waits_timed, s.back_wait_ns / 1e6, s.out_waits_late, s.out_waits_timed,
      s.out_wait_ns / 1e6, mib(s.peak_mapped), mib(s.peak_held), s.budget ? mib(s.budget) : "none", mib(s.live),
      mib(s.idle), s.fragmentation, policy_->name(), s.tracked_calls, s.tracked_hits,
      tracking() ? "" : " (then untracked: no budget)", s.pinned_buffers, s.graph_pinned_buffers,
      mib(s.graph_pinned_bytes), s.foreign_allocations, replay_summary(s) + placed_summary(s), driver_costs());
}

std::string MemoryManager::placed_summary(const ManagerStats& s) const {
  if (!s.placed_served && !s.placed_fallbacks && !s.pool_held) return "";
  return fmt::format(
      " placement: served={} fallbacks={} adopted={} pool={} blocks={} mappings={} detached={} handovers={} resumed={} "
      "back_in_pieces={} shrunk={}",
      s.placed_served, s.placed_fallbacks, s.placed_adopted, mib(s.pool_held), s.pool_blocks, s.pool_mappings,
      s.pool_detached, s.pool_handovers, s.resumed, s.restores_in_pieces, mib(s.pool_shrunk));
}

std::string MemoryManager::driver_costs() const {
  const std::string costs = physical_.costs();
  return costs.empty() ? "" : " driver: " + costs;
}

std::string MemoryManager::replay_summary(const ManagerStats& s) const {
  const std::optional<ReplayStats> r = replay_stats();
  if (!r) return "";
  return fmt::format(
             " replay: iterations={} syncs={} mismatches={} skipped_steps={} extra_steps={} offloads={} prefetches={} "
             "late={} moved_earlier={} missed={} replans={}",
             r->iterations, r->syncs, r->mismatches, r->skipped_steps, r->extra_steps, s.planned_offloads, s.prefetches,
             r->late_prefetches, r->moved_earlier, s.replay_missed, s.replans) +
         (r->first_mismatch.empty() ? "" : " (first stray: " + r->first_mismatch + ")");
}

}  // namespace vcudnn::memory
