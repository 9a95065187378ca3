// MemoryManager against a simulated device whose memory is real host memory: granules are byte
// arrays mapped at virtual addresses, and a copy from or to an unmapped address is an error. So
// the tests check the bytes themselves across evictions and restores, not only the bookkeeping:
// least-recently-used eviction, the budget never exceeded, fault-in on access, buffers that must
// never be evicted (small, library, pinned, in use by a call in progress), the impossible budget,
// stream-ordered reuse of freed buffers, and the statistics.
#include "runtime/memory_manager.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace vcudnn;
using namespace vcudnn::memory;

namespace {

constexpr uint64_t kG = 2ull << 20;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBase = 0x7f0000000000ull;

cudaStream_t stream_n(uintptr_t n) { return reinterpret_cast<cudaStream_t>(n); }

class World final : public pool::PhysicalBackend, public pool::HostBackend, public Device {
 public:
  explicit World(uint64_t limit_granules) : limit_(limit_granules) {}

  // PhysicalBackend
  uint64_t granularity() override { return kG; }
  bool reserve(uint64_t, uint64_t* base) override {
    *base = kBase;
    return true;
  }
  void unreserve(uint64_t, uint64_t) override {}
  Handle create_chunk() override {
    chunks_[next_] = std::vector<uint8_t>(kG, 0xEE);
    return next_++;
  }
  void release_chunk(Handle h) override { chunks_.erase(h); }
  bool map(uint64_t va, Handle h) override {
    if (mapped_.count(va)) errors.push_back("double map");
    mapped_[va] = h;
    std::fill(chunks_[h].begin(), chunks_[h].end(), 0xEE);  // fresh physical memory holds garbage
    if (mapped_.size() > limit_) errors.push_back("budget exceeded: " + std::to_string(mapped_.size()));
    return true;
  }
  bool unmap(uint64_t va) override {
    if (!mapped_.erase(va)) errors.push_back("unmap of an unmapped VA");
    return true;
  }

  // HostBackend
  void* allocate_pinned(uint64_t bytes) override {
    host_.push_back(std::make_unique<uint8_t[]>(bytes));
    return host_.back().get();
  }
  void free_pinned(void*) override {}

  // Device
  bool synchronize() override {
    ++syncs;
    return true;
  }
  bool copy_to_host(void* host, uint64_t device, uint64_t bytes) override {
    return copy(static_cast<uint8_t*>(host), device, bytes, true);
  }
  bool copy_to_device(uint64_t device, const void* host, uint64_t bytes) override {
    return copy(const_cast<uint8_t*>(static_cast<const uint8_t*>(host)), device, bytes, false);
  }
  bool finish_transfers() override { return true; }
  bool order_after_transfers(cudaStream_t consumer) override {
    waits.push_back({consumer, nullptr});
    return true;
  }
  bool order_after(cudaStream_t waiter, cudaStream_t producer) override {
    waits.push_back({waiter, producer});
    return true;
  }

  // What a kernel would do: write/read bytes at device addresses (mapped only).
  void fill(uint64_t va, uint64_t bytes, uint32_t seed) {
    std::vector<uint8_t> data = pattern(bytes, seed);
    copy(data.data(), va, bytes, false);
  }
  bool holds(uint64_t va, uint64_t bytes, uint32_t seed) {
    std::vector<uint8_t> data(bytes);
    return copy(data.data(), va, bytes, true) && data == pattern(bytes, seed);
  }
  uint64_t mapped_granules() const { return mapped_.size(); }

  std::vector<std::string> errors;
  int syncs = 0;
  std::vector<std::pair<cudaStream_t, cudaStream_t>> waits;

 private:
  static std::vector<uint8_t> pattern(uint64_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(bytes);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }
  bool copy(uint8_t* host, uint64_t va, uint64_t bytes, bool to_host) {
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t at = va + done;
      const uint64_t granule = (at - kBase) / kG * kG + kBase;
      const auto it = mapped_.find(granule);
      if (it == mapped_.end()) {
        errors.push_back("access to unmapped memory");
        return false;
      }
      const uint64_t n = std::min(bytes - done, granule + kG - at);
      uint8_t* dev = chunks_[it->second].data() + (at - granule);
      if (to_host)
        std::memcpy(host + done, dev, n);
      else
        std::memcpy(dev, host + done, n);
      done += n;
    }
    return true;
  }

  uint64_t limit_;
  Handle next_ = 1;
  std::map<Handle, std::vector<uint8_t>> chunks_;
  std::map<uint64_t, Handle> mapped_;
  std::vector<std::unique_ptr<uint8_t[]>> host_;
};

ManagerConfig config(std::optional<uint64_t> budget) {
  ManagerConfig c;
  c.device_budget = budget;
  c.device_total = 64 * kMiB;
  c.host_budget = 64 * kMiB;
  c.host_slab_bytes = 8 * kMiB;
  c.reserve_bytes = 1024 * kMiB;
  return c;
}

bool touch1(MemoryManager& m, uint64_t address, StreamRef stream = std::nullopt) {
  return m.touch(&address, 1, Access::kRead, stream, "test");
}

// CallScope arms only while ownership is on.
struct Active {
  Active() { detail::g_active.store(true); }
  ~Active() { detail::g_active.store(false); }
};

}  // namespace

TEST_CASE("memory manager: without a budget, buffers are served, tracked and reused", "[memory]") {
  World w(UINT64_MAX);
  MemoryManager m(w, w, w, config(std::nullopt));
  REQUIRE(m.ok());
  const auto a = m.allocate(3 * kMiB, stream_n(1), Origin::kFramework);
  const auto b = m.allocate(1000, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a % kG == 0);
  CHECK(*b % 512 == 0);
  CHECK(m.owns(*a));
  CHECK(m.allocate(0, std::nullopt, Origin::kFramework) == uint64_t{0});

  // An interior pointer is an access of its buffer; a foreign pointer is nothing.
  const uint64_t words[] = {*a + 12345, 0x1234, *b};
  CHECK(m.touch(words, 3, Access::kRead, stream_n(1), "test"));
  CHECK(m.stats().tracked_hits == 2);

  // Freed on stream 1, the same size comes back at the same address without mapping.
  CHECK(m.free(*a, stream_n(1)));
  CHECK_FALSE(m.owns(*a));
  CHECK_FALSE(m.free(*a, stream_n(1)));  // double free: not ours any more
  const uint64_t mapped = w.mapped_granules();
  const auto again = m.allocate(3 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(again);
  CHECK(*again == *a);
  CHECK(w.mapped_granules() == mapped);
  CHECK(w.waits.empty());  // same stream: no ordering needed
  // On another stream, reuse waits for the freeing stream.
  CHECK(m.free(*again, stream_n(1)));
  CHECK(m.stats().live == 1000);  // freed buffers kept for reuse are not live
  CHECK(m.stats().cached == 4 * kMiB);  // its span: whole granules
  const auto other = m.allocate(3 * kMiB, stream_n(2), Origin::kFramework);
  REQUIRE(other);
  CHECK(*other == *a);
  REQUIRE(w.waits.size() == 1);
  CHECK(w.waits[0] == std::make_pair(stream_n(2), stream_n(1)));

  const ManagerStats s = m.stats();
  CHECK(s.allocations == 4);
  CHECK(s.frees == 2);
  CHECK(s.cache_hits == 2);
  CHECK(s.evictions == 0);
  CHECK(s.budget == 0);
  CHECK(m.summary().find("allocations=4") != std::string::npos);
  // No budget: eviction is possible by hand, never on demand.
  CHECK(w.errors.empty());
}

TEST_CASE("memory manager: over the budget, the least recently used buffer goes to the host and comes back intact",
          "[memory]") {
  World w(8);  // the fake itself fails the test if more than 8 granules are ever mapped
  MemoryManager m(w, w, w, config(8 * kG));
  REQUIRE(m.ok());
  std::vector<uint64_t> bufs;
  for (uint32_t i = 0; i < 4; ++i) {
    const auto a = m.allocate(4 * kMiB - 100 * i, stream_n(1), Origin::kFramework);  // odd sizes
    REQUIRE(a);
    w.fill(*a, 4 * kMiB - 100 * i, i);
    bufs.push_back(*a);
  }
  CHECK(w.mapped_granules() == 8);
  REQUIRE(touch1(m, bufs[0]));  // buffer 0 is now the most recent; buffer 1 the least

  const auto e = m.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(e);
  const ManagerStats s = m.stats();
  CHECK(s.evictions >= 1);
  CHECK(s.evicted_now >= 4 * kMiB - 100);
  CHECK(s.peak_mapped <= 8 * kG);
  CHECK(w.syncs >= 1);  // eviction waited for the device first
  // Buffer 1 went; buffer 0 (just used) did not.
  CHECK(w.holds(bufs[0], 4 * kMiB, 0));
  CHECK(m.evict(bufs[1]) == EvictResult::kAlreadyEvicted);

  // An access brings it back first, bytes intact, at the same address.
  REQUIRE(touch1(m, bufs[1], stream_n(3)));
  CHECK(w.holds(bufs[1], 4 * kMiB - 100, 1));
  CHECK(m.stats().fault_ins == 1);
  CHECK(m.stats().restores == 1);
  CHECK(w.waits.back() == std::make_pair(stream_n(3), static_cast<cudaStream_t>(nullptr)));  // waits on the copy
  CHECK(w.errors.empty());
}

TEST_CASE("memory manager: explicit evict and restore round trip, and free of an evicted buffer", "[memory]") {
  World w(16);
  MemoryManager m(w, w, w, config(16 * kG));
  const auto big = m.allocate(20 * kMiB + 7, std::nullopt, Origin::kFramework);  // 3 host slabs of 8 MiB
  const auto small = m.allocate(4096, std::nullopt, Origin::kFramework);
  REQUIRE(big);
  REQUIRE(small);
  w.fill(*big, 20 * kMiB + 7, 42);
  CHECK(m.evict(*small) == EvictResult::kTooSmall);
  CHECK(m.evict(0x1000) == EvictResult::kUnknown);
  REQUIRE(m.evict(*big) == EvictResult::kOk);
  CHECK(m.stats().bytes_evicted == 20 * kMiB + 7);
  CHECK(m.restore(*big, std::nullopt) == RestoreResult::kOk);
  CHECK(w.holds(*big, 20 * kMiB + 7, 42));
  CHECK(m.restore(*big, std::nullopt) == RestoreResult::kNotEvicted);
  REQUIRE(m.evict(*big) == EvictResult::kOk);
  CHECK(m.free(*big, std::nullopt));  // drops the host copy
  CHECK(m.stats().evicted_now == 0);
  CHECK(m.stats().live == 4096);
  CHECK(w.errors.empty());
}

TEST_CASE("memory manager: an allocation the budget cannot hold fails cleanly", "[memory]") {
  World w(4);
  MemoryManager m(w, w, w, config(4 * kG));
  CHECK_FALSE(m.allocate(10 * kMiB, stream_n(1), Origin::kFramework));
  CHECK(m.stats().failed_allocations == 1);
  // Small buffers share granules and are never evicted: filling the budget with them leaves
  // nothing to evict for a large one.
  std::vector<uint64_t> small;
  for (int i = 0; i < 4 * 2 * 16; ++i) {
    const auto a = m.allocate(kMiB / 8 - 512, stream_n(1), Origin::kFramework);
    if (!a) break;
    small.push_back(*a);
  }
  CHECK(small.size() >= 60);
  CHECK_FALSE(m.allocate(4 * kMiB, stream_n(1), Origin::kFramework));
  // Freeing them makes room again (the freed buffers kept for reuse are dropped under pressure).
  for (uint64_t a : small) CHECK(m.free(a, stream_n(1)));
  CHECK(m.allocate(4 * kMiB, stream_n(1), Origin::kFramework));
  CHECK(w.errors.empty());
}

TEST_CASE("memory manager: library, pinned and in-use buffers are never evicted", "[memory]") {
  World w(4);
  MemoryManager m(w, w, w, config(4 * kG));
  const auto lib = m.allocate(4 * kMiB, std::nullopt, Origin::kLibrary);
  const auto pinned = m.allocate(4 * kMiB, std::nullopt, Origin::kFramework);
  REQUIRE(lib);
  REQUIRE(pinned);
  m.pin(&*pinned, 1, "cublasSetWorkspace_v2");
  CHECK(m.stats().pinned_buffers == 1);
  CHECK(m.evict(*lib) == EvictResult::kNotAllowed);
  CHECK(m.evict(*pinned) == EvictResult::kNotAllowed);
  CHECK_FALSE(m.allocate(4 * kMiB, std::nullopt, Origin::kFramework));  // nothing may go

  // In use: a buffer touched inside a call scope in progress is spared even when it is the
  // least recently used one.
  World w2(4);
  MemoryManager m2(w2, w2, w2, config(4 * kG));
  const auto a = m2.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  const auto b = m2.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(b);
  {
    Active on;
    CallScope scope;
    REQUIRE(touch1(m2, *a));
    REQUIRE(touch1(m2, *b));
    // An allocation inside the call (a library allocating for itself) cannot evict a or b.
    CHECK_FALSE(m2.allocate(4 * kMiB, std::nullopt, Origin::kLibrary));
    CHECK(m2.stats().evictions == 0);
  }
  // After the call, a (the older) can go.
  CHECK(m2.allocate(4 * kMiB, std::nullopt, Origin::kFramework));
  CHECK(m2.stats().evictions >= 1);
  CHECK(w.errors.empty());
  CHECK(w2.errors.empty());
}

TEST_CASE("memory manager: a call needing more than the budget at once fails without corrupting anything",
          "[memory]") {
  World w(4);
  MemoryManager m(w, w, w, config(4 * kG));
  const auto a = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  w.fill(*a, 6 * kMiB, 7);
  REQUIRE(m.evict(*a) == EvictResult::kOk);
  const auto b = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(b);
  w.fill(*b, 6 * kMiB, 8);
  const uint64_t both[] = {*a, *b};
  CHECK_FALSE(m.touch(both, 2, Access::kRead, stream_n(1), "a kernel needing 12 MiB"));
  // Both are still intact, one of them on the host.
  REQUIRE(touch1(m, *a));
  CHECK(w.holds(*a, 6 * kMiB, 7));
  REQUIRE(touch1(m, *b));
  CHECK(w.holds(*b, 6 * kMiB, 8));
  CHECK(w.errors.empty());
}

TEST_CASE("memory manager: a random workload never exceeds the budget and never loses a byte", "[memory]") {
  World w(12);
  ManagerConfig c = config(12 * kG);
  c.host_budget = 512 * kMiB;  // room for everything evicted, so every failure would be a bug
  MemoryManager m(w, w, w, c);
  std::mt19937 rng(1234);
  struct Live {
    uint64_t address, bytes;
    uint32_t seed;
  };
  std::vector<Live> live;
  uint32_t seed = 100;
  for (int step = 0; step < 400; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 || live.empty()) {
      const uint64_t bytes = rng() % 3 == 0 ? 512 + rng() % (64 * 1024) : 2 * kMiB + rng() % (4 * kMiB);
      const auto a = m.allocate(bytes, stream_n(1 + rng() % 2), Origin::kFramework);
      if (!a) continue;
      REQUIRE(touch1(m, *a));
      w.fill(*a, bytes, seed);
      live.push_back({*a, bytes, seed++});
    } else if (op < 6) {
      const size_t i = rng() % live.size();
      REQUIRE(m.free(live[i].address, stream_n(1)));
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      const Live& l = live[rng() % live.size()];
      INFO("step " << step << " " << m.summary());
      REQUIRE(touch1(m, l.address, stream_n(1)));
      REQUIRE(w.holds(l.address, l.bytes, l.seed));
    }
    REQUIRE(w.errors.empty());
  }
  for (const Live& l : live) {
    REQUIRE(touch1(m, l.address));
    CHECK(w.holds(l.address, l.bytes, l.seed));
  }
  const ManagerStats s = m.stats();
  CHECK(s.evictions > 0);
  CHECK(s.fault_ins > 0);
  CHECK(s.peak_mapped <= 12 * kG);
  CHECK(w.errors.empty());
}
