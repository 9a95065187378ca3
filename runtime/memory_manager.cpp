// MemoryManager (see header), CallScope, and the eviction-safety protocol.
//
// Note [Never unmap under a queued access]
// A hook runs touch() and then its real call, which queues work reading the buffer. An eviction
// on another thread must not unmap the buffer in between. Each thread has a slot holding the
// global tick at which its outermost CallScope began (0: none). An eviction first marks its
// victims evicted, then reads every slot and each victim's last use, and keeps only victims last
// used before the oldest active scope. A hook stores its slot tick and the buffer's last use
// before it reads the evicted flag. All of these are sequentially consistent, so either the hook
// sees the mark (and waits on mu_ to restore the buffer) or the eviction sees the hook's tick and
// spares the buffer. Work queued by scopes that have ended is finished by the device-wide
// synchronisation that precedes the copies.
#include "runtime/memory_manager.h"

#include <algorithm>
#include <cinttypes>
#include <limits>

#include "pool/align.h"
#include "runtime/log.h"
#include "runtime/no_destroy.h"

namespace vcudnn::memory {
namespace {

struct ThreadSlot {
  std::atomic<uint64_t> tick{0};
  int depth = 0;
};

struct SlotRegistry {
  std::mutex mu;
  std::vector<ThreadSlot*> slots;  // never freed: a thread's slot outlives it (a few bytes)
};

SlotRegistry& registry() {
  static NoDestroy<SlotRegistry> r;
  return r.get();
}

ThreadSlot& my_slot() {
  thread_local ThreadSlot* slot = [] {
    auto* s = new ThreadSlot();
    SlotRegistry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.slots.push_back(s);
    return s;
  }();
  return *slot;
}

// The oldest tick of a scope in progress on any thread; UINT64_MAX when none.
uint64_t oldest_active_tick() {
  SlotRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  for (const ThreadSlot* s : r.slots) {
    const uint64_t t = s->tick.load(std::memory_order_seq_cst);
    if (t != 0) oldest = std::min(oldest, t);
  }
  return oldest;
}

std::atomic<uint64_t> g_tick{1};

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// A scope that holds the slot for the duration of one touch when the hook opened none.
class TouchScope {
 public:
  TouchScope() : slot_(my_slot()) {
    if (slot_.depth++ == 0) slot_.tick.store(g_tick.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  }
  ~TouchScope() {
    if (--slot_.depth == 0) slot_.tick.store(0, std::memory_order_seq_cst);
  }
  TouchScope(const TouchScope&) = delete;
  TouchScope& operator=(const TouchScope&) = delete;

 private:
  ThreadSlot& slot_;
};

}  // namespace

CallScope::CallScope() {
  if (!active()) return;
  ThreadSlot& slot = my_slot();
  if (slot.depth++ == 0) slot.tick.store(g_tick.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  armed_ = true;
}

CallScope::~CallScope() {
  if (!armed_) return;
  ThreadSlot& slot = my_slot();
  if (--slot.depth == 0) slot.tick.store(0, std::memory_order_seq_cst);
}

MemoryManager::MemoryManager(pool::PhysicalBackend& physical, pool::HostBackend& host, Device& device,
                             const ManagerConfig& config)
    : config_(config),
      device_(device),
      arena_(physical,
             config.reserve_bytes ? config.reserve_bytes : 4 * config.device_total + config.host_budget,
             config.device_budget.value_or(config.device_total)),
      host_(host, config.device_budget ? config.host_budget : 0, config.host_slab_bytes) {
  if (config_.device_budget && arena_.ok()) {
    // Pinned memory up front: cudaHostAlloc is slow and synchronising, never on the hot path.
    host_.reserve(config_.host_budget);
    host_reserved_ = true;
  }
}

MemoryManager::~MemoryManager() = default;

uint64_t MemoryManager::span_of(uint64_t bytes) const {
  const uint64_t g = arena_.granularity();
  uint64_t span = pool::round_up(bytes, 512).value_or(bytes);
  if (g != 0 && span >= g) span = pool::round_up(span, g).value_or(span);
  return span;
}

uint64_t MemoryManager::free_granules() const {
  const uint64_t g = arena_.granularity();
  if (g == 0) return 0;
  const uint64_t cap = arena_.budget_bytes();
  const uint64_t mapped = arena_.mapped_bytes();
  return mapped >= cap ? 0 : (cap - mapped) / g;
}

MemoryManager::Buffer* MemoryManager::new_buffer() {
  if (!spare_.empty()) {
    Buffer* b = spare_.back();
    spare_.pop_back();
    return b;
  }
  return &storage_.emplace_back();
}

// ---------------------------------------------------------------------------------------------
// Allocation

MemoryManager::Buffer* MemoryManager::take_cached(uint64_t span, StreamRef stream) {
  auto [first, last] = cache_.equal_range(span);
  auto pick = last;
  for (auto it = first; it != last; ++it) {
    const Buffer* b = it->second;
    if (!b->stream || (stream && *b->stream == *stream)) {  // no ordering needed
      pick = it;
      break;
    }
    if (stream && pick == last) pick = it;  // another stream: usable after an event wait
  }
  if (pick == last) return nullptr;
  Buffer* b = pick->second;
  if (b->stream && !(stream && *b->stream == *stream)) {
    if (!device_.order_after(*stream, *b->stream)) return nullptr;
  }
  cache_.erase(pick);
  cached_bytes_ -= b->span;
  b->cached = false;
  b->stream.reset();
  return b;
}

std::optional<uint64_t> MemoryManager::allocate(uint64_t bytes, StreamRef stream, Origin origin) {
  if (bytes == 0) return uint64_t{0};
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t span = span_of(bytes);
  Buffer* b = take_cached(span, stream);
  if (b) {
    ++counters_.cache_hits;
  } else {
    const uint64_t g = arena_.granularity();
    const uint64_t needed = g ? (span + g - 1) / g + (span < g ? 1 : 0) : 0;
    const pool::Lifetime lifetime = stream ? pool::Lifetime::kShort : pool::Lifetime::kLong;
    std::optional<pool::Allocation> a = arena_.allocate(bytes, lifetime);
    // Out of room: freed buffers kept for reuse go first, then least-recently-used live ones.
    for (int attempt = 0; !a && attempt < 3; ++attempt) {
      const uint64_t protect = std::min(oldest_active_tick(), g_tick.load());
      if (!make_room(needed << attempt, protect) && attempt > 0) break;
      a = arena_.allocate(bytes, lifetime);
    }
    if (!a) {
      ++counters_.failed_allocations;
      uint64_t unevictable = 0;
      for (const auto& [addr, buf] : live_) {
        if (!buf->large || buf->library || buf->pinned.load()) unevictable += buf->span;
      }
      VCUDNN_WARN_LIMITED(
          "offload: an allocation of {} ({}) does not fit: the device budget is {}, {} mapped, of which {} "
          "cannot be evicted (buffers below one granule, library and pinned buffers){}; cudaErrorMemoryAllocation",
          bytes, mib(bytes), config_.device_budget ? mib(*config_.device_budget) : "none (the card)",
          mib(arena_.mapped_bytes()), mib(unevictable),
          graphs_seen_.load() ? "; eviction is off since a CUDA graph was captured" : "");
      return std::nullopt;
    }
    b = new_buffer();
    b->address = a->address;
    b->span = a->bytes;
    b->large = g != 0 && a->bytes >= g;
  }
  b->bytes = bytes;
  b->serial = ++serial_;
  b->library = origin == Origin::kLibrary;
  b->pinned.store(false);
  b->evicted.store(false);
  b->last_use.store(g_tick.fetch_add(1));
  b->host.clear();
  if (!index_.add(b->address, b->span, reinterpret_cast<uint64_t>(b))) {
    // Cannot happen (the arena never hands out overlapping ranges); refuse rather than guess.
    VCUDNN_LOG_ERROR("offload: internal error: buffer at {:#x} overlaps a tracked one", b->address);
    release_to_arena(b);
    ++counters_.failed_allocations;
    return std::nullopt;
  }
  live_.emplace(b->address, b);
  live_requested_ += bytes;
  ++counters_.allocations;
  return b->address;
}

void MemoryManager::release_to_arena(Buffer* b) {
  arena_.free(b->address);
  for (const pool::HostBlock& h : b->host) host_.release(h.ptr);
  b->host.clear();
  b->cached = false;
  b->stream.reset();
  spare_.push_back(b);
}

bool MemoryManager::free(uint64_t address, StreamRef stream) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  if (it == live_.end()) return false;
  Buffer* b = it->second;
  live_.erase(it);
  index_.remove(address);
  live_requested_ -= b->bytes;
  ++counters_.frees;
  if (!stream) device_.synchronize();  // cudaFree waits for the device: so must reuse
  if (b->evicted.load()) {
    b->evicted.store(false);
    evicted_count_.fetch_sub(1);
    evicted_requested_ -= b->bytes;
    release_to_arena(b);  // its granules are unmapped already; the host copy is dropped
    return true;
  }
  b->cached = true;
  b->stream = stream;
  cache_.emplace(b->span, b);
  cached_bytes_ += b->span;
  return true;
}

bool MemoryManager::owns(uint64_t address) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(address) != 0;
}

// ---------------------------------------------------------------------------------------------
// Room under the budget

bool MemoryManager::drop_cache() {
  if (cache_.empty()) return false;
  device_.synchronize();  // no queued kernel may still use a freed buffer when it is unmapped
  for (auto& [span, b] : cache_) release_to_arena(b);
  cache_.clear();
  cached_bytes_ = 0;
  return true;
}

bool MemoryManager::make_room(uint64_t granules, uint64_t protect) {
  if (free_granules() >= granules) return true;
  drop_cache();
  if (free_granules() >= granules) return true;
  if (!config_.device_budget || graphs_seen_.load()) return false;
  const uint64_t g = arena_.granularity();
  // Evict a little more than asked: every eviction round waits for the device.
  const uint64_t slack = std::max<uint64_t>(1, *config_.device_budget / g / 50);
  const uint64_t want = granules - free_granules() + slack;
  std::vector<Buffer*> candidates;
  for (const auto& [addr, b] : live_) {
    if (b->large && !b->library && !b->pinned.load() && !b->evicted.load() && b->last_use.load() < protect)
      candidates.push_back(b);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Buffer* a, const Buffer* b) { return a->last_use.load() < b->last_use.load(); });
  std::vector<Buffer*> victims;
  uint64_t got = 0;
  for (Buffer* b : candidates) {
    if (got >= want) break;
    victims.push_back(b);
    got += b->span / g;
  }
  if (victims.empty()) return false;
  evict_locked(victims);
  return free_granules() >= granules;
}

bool MemoryManager::evict_locked(const std::vector<Buffer*>& candidates) {
  // Mark first, then look for scopes in progress (Note [Never unmap under a queued access]).
  for (Buffer* b : candidates) b->evicted.store(true, std::memory_order_seq_cst);
  const uint64_t oldest = oldest_active_tick();
  std::vector<Buffer*> victims;
  for (Buffer* b : candidates) {
    if (b->last_use.load(std::memory_order_seq_cst) >= oldest) {
      b->evicted.store(false);
      continue;
    }
    // Host blocks: a slab bounds one block, so large buffers take several.
    const uint64_t piece = host_.stats().slab_bytes;
    bool ok = piece != 0;
    for (uint64_t off = 0; ok && off < b->bytes; off += piece) {
      const auto block = host_.acquire(std::min(piece, b->bytes - off));
      if (block) b->host.push_back(*block);
      ok = block.has_value();
    }
    if (!ok) {
      for (const pool::HostBlock& h : b->host) host_.release(h.ptr);
      b->host.clear();
      b->evicted.store(false);
      VCUDNN_WARN_LIMITED(
          "offload: the host budget is exhausted ({} pinned, {} in use): {} stays on the device; raise "
          "VCUDNN_HOST_BUDGET",
          mib(host_.stats().held_bytes), mib(host_.stats().in_use_bytes), mib(b->bytes));
      continue;
    }
    victims.push_back(b);
  }
  for (Buffer* b : candidates) {
    if (std::find(victims.begin(), victims.end(), b) == victims.end()) b->evicted.store(false);
  }
  if (victims.empty()) return false;
  ++counters_.eviction_rounds;
  bool ok = device_.synchronize();
  for (Buffer* b : victims) {
    uint64_t off = 0;
    for (const pool::HostBlock& h : b->host) {
      const uint64_t n = std::min(h.bytes, b->bytes - off);
      ok = ok && device_.copy_to_host(h.ptr, b->address + off, n);
      off += n;
    }
  }
  ok = ok && device_.finish_transfers();
  bool all = true;
  for (Buffer* b : victims) {
    if (!ok || !arena_.evict(b->address)) {
      // The copy or the unmap failed: the buffer stays on the device, valid.
      for (const pool::HostBlock& h : b->host) host_.release(h.ptr);
      b->host.clear();
      if (arena_.is_evicted(b->address)) arena_.restore(b->address);
      b->evicted.store(false);
      all = false;
      continue;
    }
    evicted_count_.fetch_add(1);
    evicted_requested_ += b->bytes;
    ++counters_.evictions;
    counters_.bytes_evicted += b->bytes;
  }
  if (!all) VCUDNN_WARN_LIMITED("offload: an eviction failed (copy or unmap); the buffers stay on the device");
  for (auto& [buf, st] : pending_) buf->pending.store(false);
  pending_.clear();  // the synchronisation finished every restore copy too
  return all;
}

// ---------------------------------------------------------------------------------------------
// Restore

RestoreResult MemoryManager::restore_locked(Buffer* b, StreamRef stream, uint64_t protect, bool fault) {
  if (!b->evicted.load()) return RestoreResult::kNotEvicted;
  const uint64_t g = arena_.granularity();
  if (!make_room(b->span / g, protect)) return RestoreResult::kNoRoom;
  if (!arena_.restore(b->address)) return RestoreResult::kFailed;
  bool ok = true;
  uint64_t off = 0;
  for (const pool::HostBlock& h : b->host) {
    const uint64_t n = std::min(h.bytes, b->bytes - off);
    ok = ok && device_.copy_to_device(b->address + off, h.ptr, n);
    off += n;
  }
  if (!ok) {
    // The bytes are still on the host: unmap again and keep the buffer evicted.
    device_.finish_transfers();
    arena_.evict(b->address);
    return RestoreResult::kFailed;
  }
  // The host blocks can go at once: the next copy into them queues behind on the transfer stream.
  for (const pool::HostBlock& h : b->host) host_.release(h.ptr);
  b->host.clear();
  if (stream) {
    device_.order_after_transfers(*stream);
    pending_.emplace(b, *stream);
    b->pending.store(true);
  } else {
    device_.finish_transfers();
  }
  b->evicted.store(false);
  evicted_count_.fetch_sub(1);
  evicted_requested_ -= b->bytes;
  ++counters_.restores;
  counters_.bytes_restored += b->bytes;
  if (fault) ++counters_.fault_ins;
  return RestoreResult::kOk;
}

// ---------------------------------------------------------------------------------------------
// Access tracking

bool MemoryManager::touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api) {
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t lo = index_.prefilter_min();
  const uint64_t hi = index_.prefilter_max();
  std::vector<pool::Hit> hits;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t w = words[i];
    if (w < lo || w >= hi) continue;
    const auto hit = index_.find(w);
    if (!hit) continue;
    if (std::none_of(hits.begin(), hits.end(), [&](const pool::Hit& h) { return h.id == hit->id; }))
      hits.push_back(*hit);
  }
  return hits.empty() || on_hits(hits, mode, stream, api);
}

bool MemoryManager::touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream,
                                 const char* api) {
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const std::vector<pool::Hit> hits = pool::scan_params(index_, layout, args);
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

bool MemoryManager::touch_block(const void* data, size_t bytes, StreamRef stream, const char* api) {
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  const std::vector<pool::Hit> hits = pool::scan_words(index_, data, bytes);
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

bool MemoryManager::on_hits(const std::vector<pool::Hit>& hits, Access mode, StreamRef stream, const char* api) {
  TouchScope scope;  // a no-op inside the hook's CallScope
  const uint64_t tick = g_tick.fetch_add(1, std::memory_order_seq_cst);
  tracked_hits_.fetch_add(hits.size(), std::memory_order_relaxed);
  bool slow = false;
  for (const pool::Hit& h : hits) {
    Buffer* b = reinterpret_cast<Buffer*>(h.id);
    b->last_use.store(tick, std::memory_order_seq_cst);
  }
  for (const pool::Hit& h : hits) {
    const Buffer* b = reinterpret_cast<const Buffer*>(h.id);
    slow = slow || b->evicted.load(std::memory_order_seq_cst) || b->pending.load(std::memory_order_relaxed);
  }
  log_accesses(hits, mode);
  if (!slow) return true;

  std::unique_lock<std::mutex> lock(mu_);
  bool ok = true;
  for (const pool::Hit& h : hits) {
    Buffer* b = reinterpret_cast<Buffer*>(h.id);
    if (live_.count(b->address) == 0 || live_.at(b->address) != b) continue;  // freed meanwhile
    if (b->evicted.load()) {
      const RestoreResult r = restore_locked(b, stream, std::min(tick, oldest_active_tick()), true);
      if (r != RestoreResult::kOk && r != RestoreResult::kNotEvicted) {
        uint64_t needed = 0;
        for (const pool::Hit& x : hits) needed += reinterpret_cast<const Buffer*>(x.id)->span;
        VCUDNN_WARN_LIMITED(
            "offload: {} needs {} buffers of {} in all on the device at once, which the device budget of {} "
            "cannot hold next to what cannot be evicted; the call fails with an out-of-memory status",
            api, hits.size(), mib(needed), config_.device_budget ? mib(*config_.device_budget) : "none");
        ok = false;
        break;
      }
    } else if (b->pending.load()) {
      // Restored for another stream: this access must not run before that copy finished.
      const auto p = pending_.find(b);
      if (p != pending_.end() && !(stream && *stream == p->second)) {
        device_.finish_transfers();
        for (auto& [buf, s] : pending_) buf->pending.store(false);
        pending_.clear();
      }
    }
  }
  return ok;
}

bool MemoryManager::touch_everything(StreamRef stream, const char* api) {
  tracked_calls_.fetch_add(1, std::memory_order_relaxed);
  std::vector<pool::Hit> hits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hits.reserve(live_.size());
    for (const auto& [addr, b] : live_) hits.push_back({reinterpret_cast<uint64_t>(b), addr, 0});
  }
  return hits.empty() || on_hits(hits, Access::kUnknown, stream, api);
}

void MemoryManager::log_accesses(const std::vector<pool::Hit>& hits, Access mode) {
  if (log_full_.load(std::memory_order_relaxed)) return;  // no lock on the hot path once full
  std::lock_guard<std::mutex> lock(log_mu_);
  if (log_.size() >= kAccessLogCap) {
    log_full_.store(true, std::memory_order_relaxed);
    return;
  }
  const uint64_t call = tracked_calls_.load(std::memory_order_relaxed);
  for (const pool::Hit& h : hits) {
    if (log_.size() >= kAccessLogCap) break;
    log_.push_back({call, reinterpret_cast<const Buffer*>(h.id)->serial, mode});
  }
}

std::vector<MemoryManager::AccessRecord> MemoryManager::access_log() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return log_;
}

void MemoryManager::pin(const uint64_t* words, size_t n, const char* api) {
  std::vector<Buffer*> found;
  for (size_t i = 0; i < n; ++i) {
    if (const auto hit = index_.find(words[i])) found.push_back(reinterpret_cast<Buffer*>(hit->id));
  }
  if (found.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  for (Buffer* b : found) {
    if (b->pinned.exchange(true)) continue;
    ++counters_.pinned_buffers;
    VCUDNN_LOG_DEBUG("offload: {} keeps a pointer into the buffer at {:#x} ({}); it is never evicted", api, b->address,
                     mib(b->bytes));
    if (b->evicted.load()) restore_locked(b, std::nullopt, std::min(g_tick.load(), oldest_active_tick()), true);
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
  std::vector<uint64_t> words;
  {
    std::lock_guard<std::mutex> lock(remembered_mu_);
    const auto it = remembered_.find(owner);
    if (it == remembered_.end()) return true;
    words = it->second;
  }
  return touch(words.data(), words.size(), Access::kUnknown, stream, api);
}

void MemoryManager::note_graph_use(const char* api) {
  if (graphs_seen_.exchange(true)) return;
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t restored = 0;
  for (const auto& [addr, b] : live_) {
    if (b->evicted.load() &&
        restore_locked(b, std::nullopt, std::min(g_tick.load(), oldest_active_tick()), false) == RestoreResult::kOk)
      ++restored;
  }
  VCUDNN_LOG_WARN(
      "offload: {} seen: CUDA graphs replay accesses vcudnn cannot see, so eviction is off from now on ({} evicted "
      "buffers brought back); memory stays owned",
      api, restored);
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
  if (b->library || b->pinned.load() || graphs_seen_.load()) return EvictResult::kNotAllowed;
  if (b->evicted.load()) return EvictResult::kAlreadyEvicted;
  const uint64_t before = counters_.evictions;
  evict_locked({b});
  if (counters_.evictions > before) return EvictResult::kOk;
  return b->host.empty() && host_.stats().largest_free_block < std::min(b->bytes, host_.stats().slab_bytes)
             ? EvictResult::kNoHostMemory
             : EvictResult::kFailed;
}

RestoreResult MemoryManager::restore(uint64_t address, StreamRef stream) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto it = live_.find(address);
  if (it == live_.end()) return RestoreResult::kUnknown;
  Buffer* b = it->second;
  const uint64_t tick = g_tick.fetch_add(1);
  b->last_use.store(tick);
  return restore_locked(b, stream, std::min(tick, oldest_active_tick()), false);
}

// ---------------------------------------------------------------------------------------------
// Statistics

std::pair<uint64_t, uint64_t> MemoryManager::budget_info() const {
  const uint64_t cap = arena_.budget_bytes();
  const uint64_t mapped = arena_.mapped_bytes();
  return {mapped >= cap ? 0 : cap - mapped, cap};
}

ManagerStats MemoryManager::stats() const {
  ManagerStats s;
  uint64_t evicted_requested = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = counters_;
    s.cached = cached_bytes_;
    s.live = live_requested_;
    evicted_requested = evicted_requested_;
  }
  const pool::VmmArena::Stats a = arena_.stats();
  const pool::HostPool::Stats h = host_.stats();
  s.budget = config_.device_budget.value_or(0);
  s.mapped = a.mapped_bytes;
  s.peak_mapped = a.peak_mapped_bytes;
  // Not the arena's live bytes: those count freed buffers kept for reuse, at their first size.
  s.evicted_now = a.evicted_bytes;
  if (a.mapped_bytes > 0) {
    const double resident = static_cast<double>(s.live - std::min(s.live, evicted_requested));
    s.fragmentation = std::clamp(1.0 - resident / static_cast<double>(a.mapped_bytes), 0.0, 1.0);
  }
  s.host_budget = config_.device_budget ? config_.host_budget : 0;
  s.host_reserved = h.held_bytes;
  s.tracked_calls = tracked_calls_.load();
  s.tracked_hits = tracked_hits_.load();
  s.foreign_allocations = foreign_.load();
  return s;
}

std::string MemoryManager::summary() const {
  const ManagerStats s = stats();
  return fmt::format(
      "allocations={} frees={} cache_hits={} failed={} evictions={} restores={} fault_ins={} evicted={} "
      "restored={} eviction_rounds={} peak_mapped={} budget={} live={} cached={} fragmentation={:.3f} "
      "tracked_calls={} tracked_hits={} pinned={} foreign={}",
      s.allocations, s.frees, s.cache_hits, s.failed_allocations, s.evictions, s.restores, s.fault_ins,
      mib(s.bytes_evicted), mib(s.bytes_restored), s.eviction_rounds, mib(s.peak_mapped),
      s.budget ? mib(s.budget) : "none", mib(s.live), mib(s.cached), s.fragmentation, s.tracked_calls, s.tracked_hits,
      s.pinned_buffers, s.foreign_allocations);
}

}  // namespace vcudnn::memory
