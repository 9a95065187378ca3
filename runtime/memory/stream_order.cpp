// StreamOrder (stream_order.h).
#include "runtime/memory/stream_order.h"

#include <algorithm>

namespace vcudnn::memory {
namespace {

Stream normalised(Stream s) { return s == cudaStreamLegacy ? nullptr : s; }
bool is_per_thread(Stream s) { return s == cudaStreamPerThread; }

// Bumped by every new StreamOrder and every retire(): a thread's cached id is valid only for the
// generation it was cached in (a new instance may reuse a dead one's address).
std::atomic<uint64_t> g_generation{1};

}  // namespace

StreamOrder::StreamOrder(Device& device) : device_(device) { g_generation.fetch_add(1, std::memory_order_acq_rel); }

StreamOrder::~StreamOrder() {
  for (Event e : all_events_) device_.destroy_event(e);
}

uint32_t StreamOrder::id_of(Stream stream) {
  struct Cached {
    const StreamOrder* owner = nullptr;
    Stream stream = nullptr;
    uint64_t generation = 0;
    uint32_t id = 0;
  };
  thread_local Cached cache;
  stream = normalised(stream);
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (cache.owner == this && cache.stream == stream && cache.generation == generation) return cache.id;
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t id = register_locked(stream);
  cache = Cached{this, stream, generation, id};
  return id;
}

uint32_t StreamOrder::register_locked(Stream stream) {
  if (const auto it = ids_.find(stream); it != ids_.end()) return it->second;
  State& st = states_.emplace_back();
  st.handle = stream;
  st.per_thread = is_per_thread(stream);
  const auto id = static_cast<uint32_t>(states_.size());
  ids_.emplace(stream, id);
  ++stats_.streams;
  return id;
}

std::vector<uint32_t> StreamOrder::ids_in(uint64_t mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> ids;
  for (uint32_t id = 1; id <= states_.size(); ++id) {
    if (mask & bit_of(id)) ids.push_back(id);
  }
  return ids;
}

pool::FreeTag StreamOrder::mark(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > states_.size()) return {};
  State& st = state(id);
  // A destroyed stream queues nothing more: its last mark, fenced by retire(), covers all its work
  // (a new mark could never be fenced, and memory freed behind it would never settle).
  return {id, st.retired ? st.marks : ++st.marks};
}

void StreamOrder::poll(State& st) {
  while (!st.fences.empty()) {
    const EventState s = device_.query(st.fences.front().event);
    if (s == EventState::kPending) return;
    // A failed query (the context is broken) cannot be waited out: treat the fence as passed.
    if (s == EventState::kFailed) ++stats_.failures;
    st.done = std::max(st.done, st.fences.front().seq);
    drop_fence(st);
  }
}

void StreamOrder::drop_fence(State& st) {
  const Event e = st.fences.front().event;
  const bool timed = st.fences.front().timed;
  st.fences.pop_front();
  if (!timed) {
    free_events_.push_back(e);
  } else if (const auto it = probe_refs_.find(e); it != probe_refs_.end() && it->second > 0) {
    orphans_.push_back(e);
  } else {
    free_timed_.push_back(e);
  }
}

Event StreamOrder::take_event(bool timed) {
  std::vector<Event>& spare = timed ? free_timed_ : free_events_;
  if (!spare.empty()) {
    const Event e = spare.back();
    spare.pop_back();
    return e;
  }
  const Event e = timed ? device_.create_timed_event() : device_.create_event();
  if (e) all_events_.push_back(e);
  return e;
}

// The earliest fence in flight that covers `seq`, else a new one covering everything queued so far.
// (A later fence also covers it, but whoever waits on it waits for all the work queued before it:
// the copies queued behind a buffer's own copy, on the H100 up to 12 ms of them. Note [Exact
// fences for vcudnn's copies].)
const StreamOrder::Fence* StreamOrder::ensure_fence(State& st, uint64_t seq) {
  if (!st.fences.empty() && st.fences.back().seq >= seq) {
    const auto it =
        std::lower_bound(st.fences.begin(), st.fences.end(), seq, [](const Fence& f, uint64_t s) { return f.seq < s; });
    return &*it;
  }
  if (st.retired) return nullptr;  // retire() fenced every mark it had; none can be newer
  const Event e = take_event(st.timed);
  // Per-thread default streams are fenced through the legacy stream (see the header).
  if (!e || !device_.record(e, st.per_thread ? nullptr : st.handle)) {
    if (e) (st.timed ? free_timed_ : free_events_).push_back(e);
    ++stats_.failures;
    return nullptr;
  }
  ++stats_.fences;
  st.fences.push_back({e, st.marks, st.timed});
  st.fenced = st.marks;
  return &st.fences.back();
}

bool StreamOrder::settled(const pool::FreeTag& tag) {
  if (tag.stream == 0) return true;  // no point in any stream (a buffer never moved): no lock
  std::lock_guard<std::mutex> lock(mu_);
  if (tag.stream > states_.size()) return true;
  State& st = state(tag.stream);
  if (tag.seq <= st.done) return true;
  poll(st);
  if (tag.seq <= st.done) return true;
  ensure_fence(st, tag.seq);
  return false;
}

void StreamOrder::fence_ahead(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > states_.size()) return;
  State& st = state(id);
  poll(st);
  if (st.fences.empty() && st.marks > st.done) ensure_fence(st, st.marks);
}

void StreamOrder::fence(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > states_.size()) return;
  State& st = state(id);
  poll(st);
  if (st.marks > st.done) ensure_fence(st, st.marks);
}

void StreamOrder::fence_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (State& st : states_) {
    poll(st);
    if (st.marks > st.done) ensure_fence(st, st.marks);
  }
}

// Note [Evicting while a stream is captured]
// An eviction's copy must start after everything queued so far on the streams that used the buffer.
// On a stream being captured, work queued since the capture began is recorded into the graph, not
// run, and no event can be recorded there; the work it will run is what was queued before, which
// the latest fence recorded on it covers (fence_all() records one as every capture begins). The
// buffers the captured work uses are pinned and never evicted (Note [CUDA graphs under a budget]),
// so waiting on that fence is enough. (The gap: a stream that joins a capture after work queued on
// it since fence_all() that no fence covered. PyTorch forks its side streams from the capturing
// stream inside the capture.)
bool StreamOrder::order_after_queued(Stream waiter, uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > states_.size()) return true;
  State& st = state(id);
  if (same_stream(waiter, st)) return true;
  poll(st);
  uint64_t seq = ++st.marks;  // a point after everything queued so far (mark())
  if (device_.capturing(st.per_thread ? nullptr : st.handle)) {
    seq = st.fenced;
    if (seq <= st.done) return true;
  }
  const Fence* f = ensure_fence(st, seq);
  if (!f || !device_.wait(waiter, f->event)) {
    ++stats_.failures;
    return false;
  }
  ++stats_.stream_waits;
  return true;
}

bool StreamOrder::same_stream(Stream waiter, const State& st) const {
  return !st.per_thread && !is_per_thread(waiter) && normalised(waiter) == st.handle;
}

bool StreamOrder::order(Stream waiter, const pool::FreeTag& tag, uint64_t cookie) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tag.stream == 0 || tag.stream > states_.size()) return true;
  State& st = state(tag.stream);
  if (same_stream(waiter, st)) return true;
  poll(st);
  if (tag.seq <= st.done) return true;
  const Fence* f = ensure_fence(st, tag.seq);
  if (!f) {
    ++stats_.failures;
    return false;
  }
  // Note [Timing the waits for vcudnn's copies]
  Event probe = nullptr;
  if (f->timed && cookie != 0) {
    if (probes_.size() >= kMostProbes) read_probes(false);
    if (probes_.size() < kMostProbes) probe = take_event(true);
    if (probe && !device_.record(probe, waiter)) {
      free_timed_.push_back(probe);
      probe = nullptr;
    }
    if (!probe) ++stats_.untimed_waits;
  }
  if (!device_.wait(waiter, f->event)) {
    if (probe) free_timed_.push_back(probe);  // recorded, never read: a later record replaces it
    ++stats_.failures;
    return false;
  }
  if (probe) {
    probes_.push_back({probe, f->event, tag.stream, cookie});
    ++probe_refs_[f->event];
    ++stats_.timed_waits;
  }
  ++stats_.stream_waits;
  return true;
}

void StreamOrder::time_waits_on(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > states_.size()) return;
  State& st = state(id);
  st.timed = true;  // fences already in flight stay untimed, and are never probed
}

std::vector<StreamOrder::WaitSample> StreamOrder::take_waits() {
  std::lock_guard<std::mutex> lock(mu_);
  read_probes(true);
  std::vector<WaitSample> out;
  out.swap(samples_);
  return out;
}

// With mu_ held: the probes whose probe and fence have both run become samples (the newest
// kMostProbes kept for take_waits(), so that nobody taking them costs only what they hold).
// `all`: every probe is looked at; else only the oldest ones, up to the first still pending (cheap
// when the device is far behind).
void StreamOrder::read_probes(bool all) {
  std::vector<WaitSample>& out = samples_;
  std::deque<Probe> pending;
  for (size_t k = 0; k < probes_.size(); ++k) {
    const Probe& p = probes_[k];
    const EventState a = device_.query(p.probe);
    const EventState b = device_.query(p.fence);
    if (a == EventState::kPending || b == EventState::kPending) {
      if (!all) {
        pending.insert(pending.end(), probes_.begin() + static_cast<std::ptrdiff_t>(k), probes_.end());
        break;
      }
      pending.push_back(p);
      continue;
    }
    if (a == EventState::kDone && b == EventState::kDone) {
      if (const std::optional<float> ms = device_.elapsed_ms(p.probe, p.fence))
        out.push_back({p.stream, p.cookie, std::max(0.0, static_cast<double>(*ms))});
    } else {
      ++stats_.failures;
    }
    free_timed_.push_back(p.probe);
    if (--probe_refs_[p.fence] == 0) {
      probe_refs_.erase(p.fence);
      if (const auto it = std::find(orphans_.begin(), orphans_.end(), p.fence); it != orphans_.end()) {
        orphans_.erase(it);
        free_timed_.push_back(p.fence);
      }
    }
  }
  probes_.swap(pending);
  if (out.size() > kMostProbes) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(kMostProbes));
}

bool StreamOrder::wait_host(const pool::FreeTag& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tag.stream == 0 || tag.stream > states_.size()) return true;
  State& st = state(tag.stream);
  poll(st);
  if (tag.seq <= st.done) return true;
  const Fence* f = ensure_fence(st, tag.seq);
  if (!f) return false;
  ++stats_.host_waits;
  if (!device_.host_wait(f->event)) ++stats_.failures;
  poll(st);
  return true;
}

StreamOrder::Snapshot StreamOrder::snapshot(std::optional<Stream> stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot snap;
  if (stream) {
    if (const auto it = ids_.find(normalised(*stream)); it != ids_.end())
      snap.emplace_back(it->second, states_[it->second - 1].marks);
    return snap;
  }
  for (uint32_t id = 1; id <= states_.size(); ++id) snap.emplace_back(id, states_[id - 1].marks);
  return snap;
}

void StreamOrder::settle(const Snapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, marks] : snapshot) {
    State& st = state(id);
    st.done = std::max(st.done, marks);
    // Fences covered by the wait have completed: their events are free again.
    while (!st.fences.empty() && st.fences.front().seq <= st.done) drop_fence(st);
  }
}

void StreamOrder::retire(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = ids_.find(normalised(stream));
  if (it == ids_.end()) return;
  State& st = state(it->second);
  poll(st);
  // If this fence cannot be recorded the stream's last marks never settle: memory freed on it stays
  // idle (still reusable by its own order's successors through order()) rather than risk a race.
  if (st.marks > st.done) ensure_fence(st, st.marks);
  st.retired = true;
  ids_.erase(it);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

StreamOrder::Stats StreamOrder::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace vcudnn::memory
