// WorkspacePool against a fake backend that logs every call and checks its handles: reuse on
// the same stream and across streams (with exactly the device-side wait it needs), the capacity
// caps after every step of a random workload, failures of the backend, stale leases, threads.
#include "pool/workspace_pool.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace vcudnn::pool;

namespace {

constexpr uint64_t kMiB = 1 << 20;

StreamHandle stream_n(uintptr_t n) { return reinterpret_cast<StreamHandle>(0x5000 + 0x10 * n); }

// Records every call; hands out distinct fake pointers and events, never reused, and counts any
// misuse (freeing an unknown pointer, using or destroying a dead event). Thread-safe.
class FakeBackend final : public PoolBackend {
 public:
  enum class Kind { kAllocate, kRelease, kCreateEvent, kDestroyEvent, kRecord, kWait };
  struct Call {
    Kind kind;
    void* ptr = nullptr;
    uint64_t bytes = 0;
    StreamHandle stream = nullptr;
    EventHandle event = nullptr;
  };
  struct Allocation {
    uint64_t bytes = 0;
    int releases = 0;
  };

  // Failure injection: the next N allocate() calls fail; events / records / waits fail while set.
  int fail_allocs = 0;
  bool fail_create_event = false;
  bool fail_record = false;
  bool fail_wait = false;

  void* allocate(uint64_t bytes, StreamHandle stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_allocs > 0) {
      --fail_allocs;
      calls_.push_back({Kind::kAllocate, nullptr, bytes, stream, nullptr});
      return nullptr;
    }
    void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(++next_ptr_) << 32);
    calls_.push_back({Kind::kAllocate, ptr, bytes, stream, nullptr});
    allocations_[ptr] = {bytes, 0};
    live_[ptr] = bytes;
    return ptr;
  }
  void release(void* ptr, StreamHandle stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({Kind::kRelease, ptr, 0, stream, nullptr});
    if (live_.erase(ptr) == 0) ++misuse_;
    auto it = allocations_.find(ptr);
    if (it != allocations_.end()) ++it->second.releases;
  }
  EventHandle create_event() override {
    std::lock_guard<std::mutex> lock(mu_);
    EventHandle event = nullptr;
    if (!fail_create_event) {
      event = reinterpret_cast<EventHandle>(static_cast<uintptr_t>(0xe0000 + 0x10 * ++next_event_));
      live_events_.insert(event);
    }
    calls_.push_back({Kind::kCreateEvent, nullptr, 0, nullptr, event});
    return event;
  }
  void destroy_event(EventHandle event) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({Kind::kDestroyEvent, nullptr, 0, nullptr, event});
    if (live_events_.erase(event) == 0) ++misuse_;
  }
  bool record(EventHandle event, StreamHandle stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({Kind::kRecord, nullptr, 0, stream, event});
    if (live_events_.count(event) == 0) ++misuse_;
    return !fail_record;
  }
  bool wait(StreamHandle stream, EventHandle event) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({Kind::kWait, nullptr, 0, stream, event});
    if (live_events_.count(event) == 0) ++misuse_;
    return !fail_wait;
  }

  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<Call> calls_since(size_t from) const {
    std::lock_guard<std::mutex> lock(mu_);
    return {calls_.begin() + static_cast<ptrdiff_t>(std::min(from, calls_.size())), calls_.end()};
  }
  size_t call_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.size();
  }
  size_t count(Kind kind) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(
        std::count_if(calls_.begin(), calls_.end(), [&](const Call& c) { return c.kind == kind; }));
  }
  std::map<void*, uint64_t> live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  uint64_t live_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t sum = 0;
    for (const auto& [ptr, bytes] : live_) sum += bytes;
    return sum;
  }
  std::map<void*, Allocation> allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }
  size_t live_events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_events_.size();
  }
  int misuse() const {
    std::lock_guard<std::mutex> lock(mu_);
    return misuse_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Call> calls_;
  std::map<void*, Allocation> allocations_;  // every pointer ever handed out
  std::map<void*, uint64_t> live_;
  std::set<EventHandle> live_events_;
  uintptr_t next_ptr_ = 0;
  uintptr_t next_event_ = 0;
  int misuse_ = 0;
};

using Kind = FakeBackend::Kind;

size_t count_in(const std::vector<FakeBackend::Call>& calls, Kind kind) {
  return static_cast<size_t>(std::count_if(calls.begin(), calls.end(), [&](const auto& c) { return c.kind == kind; }));
}

// After the pool is gone: every pointer released exactly once, every event destroyed.
void check_all_returned(const FakeBackend& fake) {
  CHECK(fake.live().empty());
  CHECK(fake.live_events() == 0);
  CHECK(fake.misuse() == 0);
  for (const auto& [ptr, a] : fake.allocations()) CHECK(a.releases == 1);
}

// The event last recorded in `calls` (nullptr if none).
EventHandle last_recorded(const std::vector<FakeBackend::Call>& calls) {
  for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
    if (it->kind == Kind::kRecord) return it->event;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("pool: same-stream reuse needs no wait", "[pool]") {
  FakeBackend fake;
  {
    WorkspacePool pool(fake, 64 * kMiB, 16 * kMiB);
    const StreamHandle s = stream_n(1);
    auto a = pool.acquire(s, 1);
    REQUIRE(a);
    CHECK(a->bytes == kMiB);  // rounded up to the granularity
    CHECK(fake.calls().at(0).bytes == kMiB);
    CHECK(fake.calls().at(0).stream == s);
    pool.release(*a, s);
    const auto released = fake.calls();
    REQUIRE(count_in(released, Kind::kRecord) == 1);
    CHECK(released.back().stream == s);

    auto b = pool.acquire(s, kMiB / 2);
    REQUIRE(b);
    CHECK(b->ptr == a->ptr);
    CHECK(b->id != a->id);
    CHECK(fake.count(Kind::kAllocate) == 1);
    CHECK(fake.count(Kind::kWait) == 0);
    const PoolStats st = pool.stats();
    CHECK(st.acquires == 2);
    CHECK(st.reused == 1);
    CHECK(st.cross_stream_waits == 0);
    CHECK(st.allocations == 1);
    CHECK(st.in_use == kMiB);
    // A second release re-records the same event: one event per block.
    pool.release(*b, s);
    CHECK(fake.count(Kind::kCreateEvent) == 1);
    CHECK(fake.count(Kind::kRecord) == 2);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: cross-stream reuse waits once on the block's event, then the stream owns it", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  void* ptr = nullptr;
  {
    WorkspacePool pool(fake, 64 * kMiB, 16 * kMiB);
    auto a = pool.acquire(s1, 3 * kMiB);
    REQUIRE(a);
    ptr = a->ptr;
    pool.release(*a, s1);
    const EventHandle event = last_recorded(fake.calls());
    REQUIRE(event != nullptr);

    const size_t mark = fake.call_count();
    auto b = pool.acquire(s2, 2 * kMiB);
    REQUIRE(b);
    CHECK(b->ptr == ptr);
    CHECK(b->bytes == 3 * kMiB);
    const auto calls = fake.calls_since(mark);
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].kind == Kind::kWait);
    CHECK(calls[0].stream == s2);
    CHECK(calls[0].event == event);
    CHECK(pool.stats().cross_stream_waits == 1);
    CHECK(pool.stats().reused == 1);

    // While s2 holds it, s1 gets a new block.
    auto c = pool.acquire(s1, 2 * kMiB);
    REQUIRE(c);
    CHECK(c->ptr != ptr);
    pool.release(*c, s1);

    // Back from s2, s2 reuses it with no further wait; s1 keeps its own block.
    pool.release(*b, s2);
    CHECK(last_recorded(fake.calls()) == event);
    CHECK(fake.calls().back().stream == s2);
    auto d = pool.acquire(s2, 3 * kMiB);
    REQUIRE(d);
    CHECK(d->ptr == ptr);
    CHECK(fake.count(Kind::kWait) == 1);
    pool.release(*d, s2);
    CHECK(pool.stats().peak_stream_reserved == 3 * kMiB);
  }
  // The destructor frees it stream-ordered on its owner, s2.
  bool seen = false;
  for (const auto& c : fake.calls()) {
    if (c.kind == Kind::kRelease && c.ptr == ptr) {
      CHECK(c.stream == s2);
      seen = true;
    }
  }
  CHECK(seen);
  check_all_returned(fake);
}

TEST_CASE("pool: reuse picks the smallest block that fits, on this stream and across", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2), s3 = stream_n(3);
  {
    WorkspacePool pool(fake, 64 * kMiB, 16 * kMiB);
    std::vector<Lease> leases;
    for (uint64_t mib : {4, 1, 2}) {
      auto lease = pool.acquire(s1, mib * kMiB);
      REQUIRE(lease);
      leases.push_back(*lease);
    }
    for (const Lease& lease : leases) pool.release(lease, s1);
    auto a = pool.acquire(s1, kMiB + 1);  // 2 MiB fits best
    REQUIRE(a);
    CHECK(a->ptr == leases[2].ptr);
    auto b = pool.acquire(s2, kMiB / 2);  // from s1: the 1 MiB block
    REQUIRE(b);
    CHECK(b->ptr == leases[1].ptr);
    auto c = pool.acquire(s3, 3 * kMiB);  // only the 4 MiB block is left
    REQUIRE(c);
    CHECK(c->ptr == leases[0].ptr);
    CHECK(fake.count(Kind::kAllocate) == 3);
    CHECK(pool.stats().cross_stream_waits == 2);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: growth on a stream frees its smaller free block first", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  {
    WorkspacePool pool(fake, 64 * kMiB, 4 * kMiB);
    auto other = pool.acquire(s2, 1 * kMiB);  // another stream's free block: must stay
    REQUIRE(other);
    pool.release(*other, s2);
    auto small = pool.acquire(s1, 2 * kMiB);
    REQUIRE(small);
    pool.release(*small, s1);

    const size_t mark = fake.call_count();
    auto big = pool.acquire(s1, 3 * kMiB);  // 2 + 3 > 4 on s1
    REQUIRE(big);
    const auto calls = fake.calls_since(mark);
    REQUIRE(calls.size() == 3);
    CHECK(calls[0].kind == Kind::kDestroyEvent);
    CHECK(calls[1].kind == Kind::kRelease);
    CHECK(calls[1].ptr == small->ptr);
    CHECK(calls[1].stream == s1);
    CHECK(calls[2].kind == Kind::kAllocate);
    CHECK(calls[2].bytes == 3 * kMiB);
    CHECK(fake.live().count(other->ptr) == 1);
    CHECK(pool.stats().reserved == 4 * kMiB);
    CHECK(pool.stats().peak_stream_reserved == 3 * kMiB);
    CHECK(pool.stats().frees == 1);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: random workload on 3 streams keeps both caps at every step", "[pool]") {
  const uint64_t kCapacity = 12 * kMiB, kPerStream = 6 * kMiB;
  const StreamHandle streams[] = {stream_n(1), stream_n(2), stream_n(3)};
  FakeBackend fake;
  std::mt19937 rng(12345);
  uint64_t successes = 0, failures = 0, cross = 0, zero = 0;
  {
    WorkspacePool pool(fake, kCapacity, kPerStream);
    std::vector<Lease> held;
    std::map<void*, StreamHandle> owner;    // model: the stream each live block counts for
    std::map<void*, EventHandle> event_of;  // model: the event recorded at its last release
    std::set<void*> bound;                  // model: its last release recorded no event
    for (int step = 0; step < 3000; ++step) {
      const size_t mark = fake.call_count();
      const StreamHandle s = streams[rng() % 3];
      void* reused_from_other = nullptr;
      if (held.empty() || (held.size() < 6 && rng() % 2 == 0)) {
        const uint64_t bytes = rng() % 10 == 0 ? 0 : 1 + rng() % (5 * kMiB);
        auto lease = pool.acquire(s, bytes);
        if (!lease) {
          ++failures;
        } else if (bytes == 0) {
          ++zero;
          CHECK(lease->ptr == nullptr);
        } else {
          ++successes;
          CHECK(lease->bytes >= bytes);
          for (const auto& h : held) CHECK(h.ptr != lease->ptr);
          auto it = owner.find(lease->ptr);
          if (it != owner.end() && it->second != s) {
            reused_from_other = lease->ptr;
            CHECK(bound.count(lease->ptr) == 0);  // never across streams without an event
          }
          owner[lease->ptr] = s;
          held.push_back(*lease);
        }
      } else {
        const size_t i = rng() % held.size();
        const Lease lease = held[i];
        held.erase(held.begin() + static_cast<ptrdiff_t>(i));
        const bool fail_record = rng() % 10 == 0;
        fake.fail_record = fail_record;
        pool.release(lease, s);  // not always on the acquiring stream
        fake.fail_record = false;
        owner[lease.ptr] = s;
        const EventHandle e = last_recorded(fake.calls_since(mark));
        REQUIRE(e != nullptr);
        event_of[lease.ptr] = e;
        if (fail_record) {
          bound.insert(lease.ptr);
        } else {
          bound.erase(lease.ptr);
        }
      }
      // What the backend saw this step: frees on the owner, waits only for cross-stream reuse.
      const auto calls = fake.calls_since(mark);
      const FakeBackend::Call* wait = nullptr;
      for (const auto& c : calls) {
        if (c.kind == Kind::kRelease) {
          REQUIRE(owner.count(c.ptr) == 1);
          CHECK(c.stream == owner[c.ptr]);
          owner.erase(c.ptr);
          event_of.erase(c.ptr);
          bound.erase(c.ptr);
        }
        if (c.kind == Kind::kWait) wait = &c;
      }
      if (reused_from_other != nullptr) {
        ++cross;
        CHECK(count_in(calls, Kind::kWait) == 1);
        REQUIRE(wait != nullptr);
        CHECK(wait->stream == s);
        CHECK(wait->event == event_of[reused_from_other]);
      } else {
        CHECK(count_in(calls, Kind::kWait) == 0);
      }
      // Both caps, from the backend's view of live memory and the ownership model.
      std::map<StreamHandle, uint64_t> per_stream;
      for (const auto& [ptr, bytes] : fake.live()) {
        REQUIRE(owner.count(ptr) == 1);
        per_stream[owner[ptr]] += bytes;
      }
      for (const auto& [stream, bytes] : per_stream) CHECK(bytes <= kPerStream);
      const PoolStats st = pool.stats();
      CHECK(fake.live_bytes() <= kCapacity);
      CHECK(st.reserved == fake.live_bytes());
      CHECK(st.peak_stream_reserved <= kPerStream);
      CHECK(st.peak_reserved <= kCapacity);
      uint64_t in_use = 0;
      for (const auto& h : held) in_use += h.bytes;
      CHECK(st.in_use == in_use);
      CHECK(st.in_use <= st.reserved);
    }
    const PoolStats st = pool.stats();
    CHECK(st.acquires == successes + failures + zero);
    CHECK(st.failures == failures);
    CHECK(st.reused + st.allocations == successes);
    CHECK(st.cross_stream_waits == cross);
    CHECK(st.allocations - st.frees == fake.live().size());
    CHECK(st.peak_stream_reserved > 4 * kMiB);
    // The workload must exercise every path for the checks above to mean something.
    CHECK(cross > 10);
    CHECK(failures > 10);
    CHECK(st.frees > 10);
    CHECK(st.reused > st.allocations);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: a request above a capacity fails, counted, without touching the backend", "[pool]") {
  FakeBackend fake;
  const StreamHandle s = stream_n(1);
  {
    WorkspacePool pool(fake, 8 * kMiB, 4 * kMiB);
    CHECK_FALSE(pool.acquire(s, 4 * kMiB + 1));
    WorkspacePool narrow(fake, 3 * kMiB, 8 * kMiB);
    CHECK_FALSE(narrow.acquire(s, 3 * kMiB + 1));
    CHECK(fake.call_count() == 0);
    CHECK(pool.stats().failures == 1);
    CHECK(pool.stats().acquires == 1);
    CHECK(narrow.stats().failures == 1);

    // Rounding stops at the capacity instead of failing.
    WorkspacePool odd(fake, 3 * kMiB + kMiB / 2, 8 * kMiB);
    auto a = odd.acquire(s, 3 * kMiB + 1);
    REQUIRE(a);
    CHECK(a->bytes == 3 * kMiB + kMiB / 2);

    // Blocks in use leave too little room on the stream: fail, and free nothing (not even the
    // free blocks that eviction would otherwise take).
    auto x = pool.acquire(s, kMiB);
    auto b = pool.acquire(s, 3 * kMiB);
    auto c = pool.acquire(stream_n(2), kMiB);
    REQUIRE(x);
    REQUIRE(b);
    REQUIRE(c);
    pool.release(*x, s);
    pool.release(*c, stream_n(2));
    size_t mark = fake.call_count();
    CHECK_FALSE(pool.acquire(s, 2 * kMiB));  // 3 in use + 2 > 4
    CHECK(fake.calls_since(mark).empty());
    CHECK(pool.stats().failures == 2);
    // ... and on the pool as a whole.
    auto d = pool.acquire(stream_n(3), 3 * kMiB);
    REQUIRE(d);
    mark = fake.call_count();
    CHECK_FALSE(pool.acquire(stream_n(4), 3 * kMiB));  // 3 + 3 in use + 3 > 8
    CHECK(fake.calls_since(mark).empty());
    CHECK(pool.stats().failures == 3);
    CHECK(pool.stats().reserved == 8 * kMiB);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: a backend allocation failure trims, retries once, then fails cleanly", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  {
    WorkspacePool pool(fake, 64 * kMiB, 16 * kMiB);
    auto cached = pool.acquire(s2, kMiB);
    REQUIRE(cached);
    pool.release(*cached, s2);

    fake.fail_allocs = 2;
    CHECK_FALSE(pool.acquire(s1, 2 * kMiB));
    CHECK(fake.count(Kind::kAllocate) == 3);  // the first block, then two tries
    CHECK(fake.live().empty());               // the retry freed the cached block first
    PoolStats st = pool.stats();
    CHECK(st.failures == 1);
    CHECK(st.reserved == 0);
    CHECK(st.in_use == 0);
    CHECK(st.allocations == 1);
    CHECK(st.frees == 1);

    fake.fail_allocs = 1;  // the retry succeeds
    auto a = pool.acquire(s1, 2 * kMiB);
    REQUIRE(a);
    CHECK(fake.live().count(a->ptr) == 1);
    auto b = pool.acquire(s1, 2 * kMiB);  // and later ones work
    REQUIRE(b);
    CHECK(b->ptr != a->ptr);
    st = pool.stats();
    CHECK(st.failures == 1);
    CHECK(st.allocations == 3);
    CHECK(st.reserved == 4 * kMiB);
    CHECK(st.reserved == fake.live_bytes());
  }
  check_all_returned(fake);
}

TEST_CASE("pool: zero bytes gives an empty lease without the backend", "[pool]") {
  FakeBackend fake;
  WorkspacePool pool(fake, 8 * kMiB, 4 * kMiB);
  auto a = pool.acquire(stream_n(1), 0);
  REQUIRE(a);
  CHECK(a->ptr == nullptr);
  CHECK(a->bytes == 0);
  CHECK(a->id == 0);
  pool.release(*a, stream_n(1));
  CHECK(fake.call_count() == 0);
  const PoolStats st = pool.stats();
  CHECK(st.acquires == 1);
  CHECK(st.failures == 0);
  CHECK(st.in_use == 0);
}

TEST_CASE("pool: double release, stale and unknown leases are harmless", "[pool]") {
  FakeBackend fake;
  const StreamHandle s = stream_n(1);
  {
    WorkspacePool pool(fake, 8 * kMiB, 4 * kMiB);
    auto a = pool.acquire(s, kMiB);
    REQUIRE(a);
    pool.release(*a, s);
    const size_t mark = fake.call_count();
    pool.release(*a, s);  // twice
    pool.release(Lease{reinterpret_cast<void*>(0x1234), kMiB, 999}, s);
    pool.release(Lease{reinterpret_cast<void*>(0x1234), kMiB, a->id}, s);
    CHECK(fake.call_count() == mark);
    CHECK(pool.stats().in_use == 0);

    // The block goes to b; a stale copy of a must not give it back.
    auto b = pool.acquire(s, kMiB);
    REQUIRE(b);
    REQUIRE(b->ptr == a->ptr);
    pool.release(*a, s);
    CHECK(pool.stats().in_use == kMiB);
    auto c = pool.acquire(s, kMiB);
    REQUIRE(c);
    CHECK(c->ptr != b->ptr);
    pool.release(*b, s);
    pool.release(*c, s);
    CHECK(pool.stats().in_use == 0);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: two leases at once on one stream get different blocks", "[pool]") {
  FakeBackend fake;
  const StreamHandle s = stream_n(1);
  {
    WorkspacePool pool(fake, 8 * kMiB, 4 * kMiB);
    auto a = pool.acquire(s, kMiB);
    auto b = pool.acquire(s, kMiB);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->ptr != b->ptr);
    CHECK(a->id != b->id);
    CHECK(fake.count(Kind::kAllocate) == 2);
    const PoolStats st = pool.stats();
    CHECK(st.in_use == 2 * kMiB);
    CHECK(st.peak_in_use == 2 * kMiB);
    CHECK(st.reused == 0);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: trim frees the free blocks only", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  {
    WorkspacePool pool(fake, 16 * kMiB, 8 * kMiB);
    auto a = pool.acquire(s1, kMiB);
    auto b = pool.acquire(s1, 2 * kMiB);
    auto c = pool.acquire(s2, 3 * kMiB);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(c);
    pool.release(*a, s1);
    pool.release(*c, s2);
    pool.trim();
    const auto live = fake.live();
    CHECK(live.size() == 1);
    CHECK(live.count(b->ptr) == 1);
    CHECK(fake.live_events() == 0);  // a's and c's events went with them
    PoolStats st = pool.stats();
    CHECK(st.reserved == 2 * kMiB);
    CHECK(st.in_use == 2 * kMiB);
    CHECK(st.frees == 2);
    CHECK(st.peak_reserved == 6 * kMiB);
    pool.release(*b, s1);
    CHECK(fake.live().size() == 1);  // cached, until the destructor
  }
  check_all_returned(fake);
}

TEST_CASE("pool: a block released without an event is reused on its own stream only", "[pool]") {
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  for (const bool fail_create : {true, false}) {
    FakeBackend fake;
    {
      WorkspacePool pool(fake, 16 * kMiB, 8 * kMiB);
      auto a = pool.acquire(s1, kMiB);
      REQUIRE(a);
      fake.fail_create_event = fail_create;
      fake.fail_record = !fail_create;
      pool.release(*a, s1);
      fake.fail_create_event = false;
      fake.fail_record = false;

      auto b = pool.acquire(s2, kMiB);  // may not take it: nothing to wait on
      REQUIRE(b);
      CHECK(b->ptr != a->ptr);
      CHECK(fake.count(Kind::kWait) == 0);
      auto c = pool.acquire(s1, kMiB);  // same stream: fine
      REQUIRE(c);
      CHECK(c->ptr == a->ptr);
      // A successful release unbinds it: now s2 may take it, behind a wait.
      pool.release(*c, s1);
      auto d = pool.acquire(s2, kMiB);
      REQUIRE(d);
      CHECK(d->ptr == a->ptr);
      CHECK(fake.count(Kind::kWait) == 1);
      CHECK(pool.stats().cross_stream_waits == 1);
    }
    check_all_returned(fake);
  }
}

TEST_CASE("pool: a failed wait does not hand the block over", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  {
    WorkspacePool pool(fake, 16 * kMiB, 8 * kMiB);
    auto a = pool.acquire(s1, kMiB);
    REQUIRE(a);
    pool.release(*a, s1);
    fake.fail_wait = true;
    auto b = pool.acquire(s2, kMiB);
    fake.fail_wait = false;
    REQUIRE(b);
    CHECK(b->ptr != a->ptr);
    CHECK(fake.count(Kind::kWait) == 1);
    CHECK(pool.stats().cross_stream_waits == 0);
    CHECK(pool.stats().reused == 0);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: a block released on another stream counts for that stream", "[pool]") {
  FakeBackend fake;
  const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
  {
    WorkspacePool pool(fake, 16 * kMiB, 4 * kMiB);
    auto a = pool.acquire(s1, 2 * kMiB);
    REQUIRE(a);
    pool.release(*a, s2);
    CHECK(fake.calls().back().kind == Kind::kRecord);
    CHECK(fake.calls().back().stream == s2);
    auto b = pool.acquire(s2, 2 * kMiB);  // s2 owns it: no wait
    REQUIRE(b);
    CHECK(b->ptr == a->ptr);
    CHECK(fake.count(Kind::kWait) == 0);

    // s2 holds 2 MiB in use; a 3 MiB block arriving from s1 would put it at 5 > 4: freed on s2.
    auto c = pool.acquire(s1, 3 * kMiB);
    REQUIRE(c);
    pool.release(*c, s2);
    CHECK(fake.live().count(c->ptr) == 0);
    const auto calls = fake.calls();
    CHECK(calls.back().kind == Kind::kRelease);
    CHECK(calls.back().ptr == c->ptr);
    CHECK(calls.back().stream == s2);
    CHECK(pool.stats().peak_stream_reserved == 3 * kMiB);
    CHECK(pool.stats().reserved == 2 * kMiB);
    pool.release(*b, s2);
  }
  check_all_returned(fake);
}

TEST_CASE("pool: 4 threads on 4 streams share the pool consistently", "[pool]") {
  FakeBackend fake;
  std::mutex owned_mu;
  std::set<void*> owned;  // pointers some thread holds now: never two at once
  std::atomic<uint64_t> successes{0}, failures{0}, clashes{0};
  const int kIterations = 20000;
  std::atomic<int> ready{0};  // start together, so that the threads overlap
  uint64_t allocations = 0, frees = 0;
  {
    WorkspacePool pool(fake, 16 * kMiB, 8 * kMiB);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(100 + t);
        const StreamHandle s = stream_n(static_cast<uintptr_t>(t + 1));
        std::vector<Lease> mine;
        ++ready;
        while (ready.load() < 4) std::this_thread::yield();
        auto give_back = [&](size_t i) {
          {
            std::lock_guard<std::mutex> lock(owned_mu);
            owned.erase(mine[i].ptr);
          }
          // Hand it to a random stream now and then, so that blocks travel.
          pool.release(mine[i], rng() % 4 == 0 ? stream_n(rng() % 4 + 1) : s);
          mine.erase(mine.begin() + static_cast<ptrdiff_t>(i));
        };
        for (int i = 0; i < kIterations; ++i) {
          if (mine.size() < 2 && rng() % 3 != 0) {
            auto lease = pool.acquire(s, 1 + rng() % (4 * kMiB));
            if (!lease) {
              ++failures;
              continue;
            }
            ++successes;
            std::lock_guard<std::mutex> lock(owned_mu);
            if (!owned.insert(lease->ptr).second) ++clashes;
            mine.push_back(*lease);
          } else if (!mine.empty()) {
            give_back(rng() % mine.size());
          }
          if (i % 500 == 0 && t == 0) pool.trim();
        }
        while (!mine.empty()) give_back(0);
      });
    }
    for (auto& thread : threads) thread.join();
    const PoolStats st = pool.stats();
    CHECK(clashes == 0);
    CHECK(st.in_use == 0);
    CHECK(st.failures == failures);
    CHECK(st.acquires == successes + failures);
    CHECK(st.reused + st.allocations == successes);
    CHECK(st.reserved == fake.live_bytes());
    CHECK(st.reserved <= 16 * kMiB);
    CHECK(st.peak_reserved <= 16 * kMiB);
    CHECK(st.peak_stream_reserved <= 8 * kMiB);
    CHECK(st.cross_stream_waits > 0);
    CHECK(successes > 10000);
    allocations = st.allocations;
    frees = st.frees;
  }
  CHECK(fake.count(Kind::kAllocate) == allocations);
  CHECK(fake.allocations().size() == allocations);
  CHECK(fake.count(Kind::kRelease) > frees);  // the destructor freed what was cached
  check_all_returned(fake);
}

TEST_CASE("pool: Holding::kReturn gives each block back when released, on the releasing stream", "[pool]") {
  // Note [Workspace that lives for one call]
  FakeBackend fake;
  {
    WorkspacePool pool(fake, 64 * kMiB, 16 * kMiB, kMiB, WorkspacePool::Holding::kReturn);
    const StreamHandle s1 = stream_n(1), s2 = stream_n(2);
    auto a = pool.acquire(s1, 3 * kMiB);
    REQUIRE(a);
    auto b = pool.acquire(s1, 2 * kMiB);  // two at once: two blocks
    REQUIRE(b);
    CHECK(b->ptr != a->ptr);
    CHECK(pool.stats().reserved == 5 * kMiB);
    pool.release(*a, s2);  // handed to another stream for its last work: freed there
    const auto calls = fake.calls();
    REQUIRE(calls.back().kind == Kind::kRelease);
    CHECK(calls.back().ptr == a->ptr);
    CHECK(calls.back().stream == s2);
    CHECK(pool.stats().reserved == 2 * kMiB);
    CHECK(fake.live().size() == 1);
    pool.release(*b, s1);
    CHECK(fake.live().empty());
    CHECK(pool.stats().reserved == 0);
    CHECK(pool.stats().peak_reserved == 5 * kMiB);
    // Nothing kept: the next acquire allocates afresh, and needs no event and no wait.
    auto c = pool.acquire(s1, kMiB);
    REQUIRE(c);
    CHECK(pool.stats().reused == 0);
    CHECK(fake.count(Kind::kAllocate) == 3);
    CHECK(fake.count(Kind::kCreateEvent) == 0);
    CHECK(fake.count(Kind::kWait) == 0);
    pool.release(*c, s1);
    pool.release(*c, s1);  // a stale lease is harmless
    CHECK(fake.count(Kind::kRelease) == 3);
  }
  check_all_returned(fake);
}
