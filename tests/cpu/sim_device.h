// SimDevice: a simulated GPU for the memory runtime's CPU tests. Its memory is real host memory
// (granules are byte arrays mapped at virtual addresses), and its streams are queues of work that
// run only when the test lets the device run (run_some / run_all) or when the host waits on an
// event, so the device lags the host by as much as a test likes. It checks the rules a real GPU
// would punish, and records a violation in `errors`:
//  - a kernel or copy touching unmapped memory;
//  - an unmap while queued work still touches that memory (cuMemUnmap does not wait);
//  - a kernel reading bytes other than the last ones the program wrote there (lost or stale data);
//  - more granules mapped than the limit.
// Work on one stream runs in order; a wait on an event holds its stream until the event's record
// has run. Thread-safe (one mutex): the stress tests call it from several threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pool/host_pool.h"
#include "pool/vmm_arena.h"
#include "runtime/memory/device.h"

namespace vcudnn::test {

class SimDevice final : public pool::PhysicalBackend, public pool::HostBackend, public memory::Device {
 public:
  static constexpr uint64_t kBase = 0x7f0000000000ull;

  SimDevice(uint64_t granularity, uint64_t limit_granules, uint32_t seed = 1)
      : g_(granularity), limit_(limit_granules), rng_(seed) {}

  // A user stream; not 1 or 2, which are cudaStreamLegacy and cudaStreamPerThread.
  static memory::Stream stream(uintptr_t n) { return reinterpret_cast<memory::Stream>(0x1000 + n); }

  // ---- PhysicalBackend
  uint64_t granularity() override { return g_; }
  // The first range at kBase (the arena's), later ones after it (a static placement's).
  bool reserve(uint64_t bytes, uint64_t* base) override {
    std::lock_guard<std::mutex> lock(mu_);
    *base = next_range_;
    next_range_ += (bytes + g_ - 1) / g_ * g_ + g_;
    return true;
  }
  void unreserve(uint64_t, uint64_t) override {}
  Handle create_chunk() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++creates;
    chunks_[next_chunk_];  // bytes made on first access (garbage, as fresh physical memory)
    return next_chunk_++;
  }
  void release_chunk(Handle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto extent = extents_.find(h);
    const uint64_t n = extent != extents_.end() ? extent->second : 1;
    for (uint64_t i = 0; i < n; ++i) chunks_.erase(h + i);
    if (extent != extents_.end()) extents_.erase(extent);
  }
  bool map(uint64_t va, Handle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++maps;
    if (mapped_.count(va)) error("double map");
    mapped_[va] = h;
    ++aliases_[h];
    chunks_[h].clear();  // mapped memory holds garbage until written
    check_physical_locked();
    return true;
  }
  bool unmap(uint64_t va) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++unmaps;
    if (extent_of_.count(va)) error("unmap of one granule of an extent");
    unmap_locked(va);
    return true;
  }
  // An extent is `granules` chunks of one granule each here, mapped and unmapped together.
  Handle create_extent(uint64_t granules) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++creates;
    const Handle h = next_chunk_;
    for (uint64_t i = 0; i < granules; ++i) chunks_[next_chunk_++];
    extents_[h] = granules;
    return h;
  }
  bool map_extent(uint64_t va, Handle h, uint64_t granules) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++maps;
    if (log_maps) map_log.push_back(static_cast<int64_t>(granules));
    if (extents_.count(h) == 0 || extents_[h] != granules) error("map_extent of a bad extent");
    for (uint64_t i = 0; i < granules; ++i) {
      if (mapped_.count(va + i * g_)) error("double map");
      mapped_[va + i * g_] = h + i;
      ++aliases_[h + i];
      chunks_[h + i].clear();
      extent_of_[va + i * g_] = va;
    }
    check_physical_locked();
    return true;
  }
  bool unmap_extent(uint64_t va, uint64_t granules) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++unmaps;
    if (log_maps) map_log.push_back(-static_cast<int64_t>(granules));
    for (uint64_t i = 0; i < granules; ++i) {
      const auto e = extent_of_.find(va + i * g_);
      if (e == extent_of_.end() || e->second != va) error("unmap_extent of something not a whole extent");
      if (e != extent_of_.end()) extent_of_.erase(e);
      unmap_locked(va + i * g_);
    }
    if (extent_of_.count(va + granules * g_) && extent_of_[va + granules * g_] == va)
      error("unmap_extent of part of an extent");
    return true;
  }

  // An extent, whole, at one more range: the same chunks (bytes) as every other range it is mapped
  // at. The budget counts physical memory: chunks mapped somewhere, each once.
  bool map_alias(uint64_t va, Handle h, uint64_t granules) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++maps;
    const auto extent = extents_.find(h);
    if (extent == extents_.end() || extent->second != granules) error("map_alias of part of an extent");
    for (uint64_t i = 0; i < granules; ++i) {
      if (mapped_.count(va + i * g_)) error("double map");
      mapped_[va + i * g_] = h + i;
      extent_of_[va + i * g_] = va;
      ++aliases_[h + i];
    }
    check_physical_locked();
    return true;
  }

  // ---- HostBackend
  void* allocate_pinned(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    host_.push_back(std::make_unique<uint8_t[]>(bytes));
    return host_.back().get();
  }
  void free_pinned(void*) override {}

  // ---- Device
  memory::Event create_event() override {
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t id = next_event_++;
    events_[id] = EventRec{};
    return reinterpret_cast<memory::Event>(id);
  }
  // Timed events keep the simulated clock (one tick a millisecond, one tick for each operation run)
  // at which their record ran.
  memory::Event create_timed_event() override {
    memory::Event e = create_event();
    std::lock_guard<std::mutex> lock(mu_);
    events_.at(id(e)).timed = true;
    return e;
  }
  void destroy_event(memory::Event) override {}
  std::optional<float> elapsed_ms(memory::Event from, memory::Event to) override {
    std::lock_guard<std::mutex> lock(mu_);
    const EventRec& a = events_.at(id(from));
    const EventRec& b = events_.at(id(to));
    if (!a.timed || !b.timed || a.done_generation < a.generation || b.done_generation < b.generation)
      return std::nullopt;
    return static_cast<float>(static_cast<double>(b.ran_at) - static_cast<double>(a.ran_at));
  }
  bool record(memory::Event e, memory::Stream s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_.count(s)) return false;  // CudaDevice refuses: the event would become a node of the graph
    EventRec& rec = events_.at(id(e));
    ++rec.generation;
    rec.done_generation = std::min(rec.done_generation, rec.generation - 1);
    push(s, Op{Op::kRecord, 0, 0, nullptr, id(e), rec.generation, 0});
    return true;
  }
  bool wait(memory::Stream waiter, memory::Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    const EventRec& rec = events_.at(id(e));
    if (capturing_.count(waiter)) {  // CudaDevice refuses: the wait would join the graph
      ++refused_waits;
      return false;
    }
    ++stream_waits;
    push(waiter, Op{Op::kWait, 0, 0, nullptr, id(e), rec.generation, 0});
    return true;
  }
  bool capturing(memory::Stream s) override {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_.count(s) > 0;
  }
  memory::EventState query(memory::Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    const EventRec& rec = events_.at(id(e));
    return rec.done_generation >= rec.generation ? memory::EventState::kDone : memory::EventState::kPending;
  }
  bool host_wait(memory::Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++host_waits;
    const EventRec& rec = events_.at(id(e));
    while (rec.done_generation < rec.generation) {
      if (!step_locked()) {
        error("host wait on an event that can never complete");
        return false;
      }
    }
    return true;
  }
  memory::Stream out_stream() override { return stream(kTransfer); }
  memory::Stream in_stream() override { return stream(kTransferIn); }
  bool copy_to_host(void* host, uint64_t device, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    push(stream(kTransfer), Op{Op::kToHost, device, bytes, static_cast<uint8_t*>(host), 0, 0, 0});
    return true;
  }
  bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    push(stream(kTransferIn),
         Op{Op::kToDevice, device, bytes, const_cast<uint8_t*>(static_cast<const uint8_t*>(host)), 0, 0, 0});
    return true;
  }

  // ---- What the program under test queues (its kernels), and the device's progress
  // A kernel writing a pattern of `seed` over [va, va + bytes), or checking that it is there.
  void write(memory::Stream s, uint64_t va, uint64_t bytes, uint32_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    push(s, Op{Op::kWrite, va, bytes, nullptr, 0, 0, seed});
  }
  void check(memory::Stream s, uint64_t va, uint64_t bytes, uint32_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    push(s, Op{Op::kCheck, va, bytes, nullptr, 0, 0, seed});
  }
  // Runs up to `n` queued operations, picking streams at random; returns how many ran.
  int run_some(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    int done = 0;
    while (done < n && step_locked()) ++done;
    return done;
  }
  // Runs what stream `s` can run, in order, until its head must wait (or it is empty), at most
  // `most` operations.
  int run_stream(memory::Stream s, int most = std::numeric_limits<int>::max()) {
    std::lock_guard<std::mutex> lock(mu_);
    int done = 0;
    auto& q = queues_[s];
    while (!q.empty() && done < most) {
      const Op& head = q.front();
      if (head.kind == Op::kWait && events_.at(head.event).done_generation < head.generation) break;
      const Op op = head;
      q.pop_front();
      execute(op);
      ++done;
    }
    return done;
  }
  void run_all() {
    std::lock_guard<std::mutex> lock(mu_);
    while (step_locked()) {
    }
    for (const auto& [s, q] : queues_) {
      if (!q.empty()) error("a stream is stuck on a wait that never completes");
    }
  }
  size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [s, q] : queues_) n += q.size();
    return n;
  }
  size_t queued(memory::Stream s) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = queues_.find(s);
    return it == queues_.end() ? 0 : it->second.size();
  }
  // Physical granules mapped (a chunk mapped at several ranges counts once).
  uint64_t mapped_granules() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aliases_.size();
  }
  uint64_t peak_mapped_granules() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_mapped_;
  }
  // The first errors, for a failure message.
  std::string first_errors() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) out += errors[i] + "; ";
    return out + std::to_string(errors.size()) + " errors";
  }
  std::vector<std::string> errors_copy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return errors;
  }

  // Stream capture as CudaDevice handles it: no event is recorded on a capturing stream, and a
  // capturing stream never waits on one of vcudnn's events (recorded outside the capture): both
  // calls answer false. Work queued on it still runs here (the simulation has no graphs).
  void begin_capture(memory::Stream s) {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_.insert(s);
  }
  void end_capture(memory::Stream s) {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_.erase(s);
  }

  std::vector<std::string> errors;
  // Driver calls a real device would make, one per granule or per extent (each map is also a
  // cuMemSetAccess): what mapping churn costs (Note [Extents under a budget]).
  uint64_t creates = 0;
  uint64_t maps = 0;
  uint64_t unmaps = 0;
  bool log_maps = false;
  std::vector<int64_t> map_log;  // extents mapped (+granules) and unmapped (-granules), when log_maps
  uint64_t host_waits = 0;
  uint64_t stream_waits = 0;
  uint64_t refused_waits = 0;  // by a capturing stream

  static std::vector<uint8_t> pattern(uint64_t bytes, uint32_t seed) {
    std::vector<uint8_t> v(bytes);
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (uint64_t i = 0; i < bytes; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v[i] = static_cast<uint8_t>(x);
    }
    return v;
  }

 private:
  static constexpr uintptr_t kTransfer = 0xF0F0;
  static constexpr uintptr_t kTransferIn = 0xF0F1;
  struct Op {
    enum Kind { kWrite, kCheck, kToHost, kToDevice, kRecord, kWait } kind;
    uint64_t va = 0;
    uint64_t bytes = 0;
    uint8_t* host = nullptr;
    uintptr_t event = 0;
    uint64_t generation = 0;
    uint32_t seed = 0;
    bool touches(uint64_t granule_va, uint64_t g) const {
      if (kind == kRecord || kind == kWait || bytes == 0) return false;
      return va < granule_va + g && granule_va < va + bytes;
    }
  };
  struct EventRec {
    uint64_t generation = 0;       // of the latest record
    uint64_t done_generation = 0;  // latest record that has run
    bool timed = false;
    uint64_t ran_at = 0;  // clock_ when the latest record ran
  };

  static uintptr_t id(memory::Event e) { return reinterpret_cast<uintptr_t>(e); }
  void error(const std::string& what) { errors.push_back(what); }
  void check_physical_locked() {
    if (aliases_.size() > limit_) error("budget exceeded: " + std::to_string(aliases_.size()) + " granules mapped");
    peak_mapped_ = std::max<uint64_t>(peak_mapped_, aliases_.size());
  }
  void push(memory::Stream s, Op op) { queues_[s].push_back(op); }

  // Runs one operation from a random stream whose head can run. false when none can.
  bool step_locked() {
    std::vector<memory::Stream> ready;
    for (const auto& [s, q] : queues_) {
      if (q.empty()) continue;
      const Op& head = q.front();
      if (head.kind == Op::kWait && events_.at(head.event).done_generation < head.generation) continue;
      ready.push_back(s);
    }
    if (ready.empty()) return false;
    const memory::Stream s = ready[rng_() % ready.size()];
    const Op op = queues_[s].front();
    queues_[s].pop_front();
    execute(op);
    return true;
  }

  void execute(const Op& op) {
    ++clock_;
    switch (op.kind) {
      case Op::kRecord: {
        EventRec& rec = events_.at(op.event);
        rec.done_generation = std::max(rec.done_generation, op.generation);
        rec.ran_at = clock_;
        return;
      }
      case Op::kWait:
        return;
      case Op::kWrite: {
        const std::vector<uint8_t> p = pattern(op.bytes, op.seed);
        copy(const_cast<uint8_t*>(p.data()), op.va, op.bytes, false, "kernel write");
        return;
      }
      case Op::kCheck: {
        std::vector<uint8_t> got(op.bytes);
        if (copy(got.data(), op.va, op.bytes, true, "kernel read") && got != pattern(op.bytes, op.seed))
          error("a kernel read bytes other than the last ones written at " + std::to_string(op.va - kBase));
        return;
      }
      case Op::kToHost:
        copy(op.host, op.va, op.bytes, true, "copy to host");
        return;
      case Op::kToDevice:
        copy(op.host, op.va, op.bytes, false, "copy to device");
        return;
    }
  }

  void unmap_locked(uint64_t va) {
    for (const auto& [s, q] : queues_) {
      for (const Op& op : q) {
        if (op.touches(va, g_))
          error("unmap of granule " + std::to_string((va - kBase) / g_) + " that queued work (kind " +
                std::to_string(op.kind) + " on stream " + std::to_string(reinterpret_cast<uintptr_t>(s)) +
                ") still touches");
      }
    }
    const auto it = mapped_.find(va);
    if (it == mapped_.end()) {
      error("unmap of an unmapped VA");
      return;
    }
    if (const auto a = aliases_.find(it->second); a != aliases_.end() && --a->second == 0) aliases_.erase(a);
    mapped_.erase(it);
  }

  bool copy(uint8_t* host, uint64_t va, uint64_t bytes, bool to_host, const char* what) {
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t at = va + done;
      const uint64_t granule = (at - kBase) / g_ * g_ + kBase;
      const auto it = mapped_.find(granule);
      if (it == mapped_.end()) {
        error(std::string(what) + " of unmapped memory");
        return false;
      }
      const uint64_t n = std::min(bytes - done, granule + g_ - at);
      std::vector<uint8_t>& chunk = chunks_[it->second];
      if (chunk.empty()) chunk.assign(g_, 0xEE);
      uint8_t* dev = chunk.data() + (at - granule);
      if (to_host)
        std::memcpy(host + done, dev, n);
      else
        std::memcpy(dev, host + done, n);
      done += n;
    }
    return true;
  }

  const uint64_t g_;
  const uint64_t limit_;
  mutable std::mutex mu_;
  std::mt19937 rng_;
  Handle next_chunk_ = 1;
  std::map<Handle, std::vector<uint8_t>> chunks_;
  std::map<uint64_t, Handle> mapped_;
  std::map<Handle, uint64_t> aliases_;      // chunk -> ranges it is mapped at
  std::map<Handle, uint64_t> extents_;      // first chunk -> granules
  std::map<uint64_t, uint64_t> extent_of_;  // mapped va -> its extent's first va
  uint64_t peak_mapped_ = 0;
  uint64_t next_range_ = kBase;
  std::vector<std::unique_ptr<uint8_t[]>> host_;
  uintptr_t next_event_ = 1;
  std::map<uintptr_t, EventRec> events_;
  uint64_t clock_ = 0;  // operations run
  std::map<memory::Stream, std::deque<Op>> queues_;
  std::set<memory::Stream> capturing_;
};

}  // namespace vcudnn::test
