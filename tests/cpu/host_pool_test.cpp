// HostPool against a fake pinned-memory backend that counts allocations and checks the rules itself
// (no free of an unknown or already freed slab, every slab freed exactly once by the destructor):
// reserve() rounds to slabs and stops at the budget, acquire() never calls the backend, blocks are
// aligned, inside a slab and never overlap (a random workload checked against a model), release
// coalesces, failures are counted, a backend failure in reserve() leaves a usable pool.
#include "pool/host_pool.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace vcudnn::pool;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kAlign = 2 * kMiB;
// Fake slabs lie 1 TiB apart, page-aligned but not 2 MiB-aligned: block offsets are relative to
// the slab.
constexpr uintptr_t kBase = 0x100000000000ull + 4096;
constexpr uintptr_t kStride = 1ull << 40;

class FakeHost final : public HostBackend {
 public:
  void* allocate_pinned(uint64_t bytes) override {
    ++calls;
    if (throw_next) throw std::runtime_error("fake");
    if (fail_after == 0) return nullptr;
    if (fail_after > 0) --fail_after;
    const uintptr_t address = kBase + kStride * next_++;
    slabs[address] = bytes;
    ++allocations;
    return reinterpret_cast<void*>(address);
  }
  void free_pinned(void* ptr) override {
    const auto it = slabs.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == slabs.end()) {
      errors.push_back(freed_.count(reinterpret_cast<uintptr_t>(ptr)) ? "double free" : "free of an unknown slab");
      return;
    }
    freed_[it->first] = it->second;
    slabs.erase(it);
  }

  // The slab holding [address, address + bytes), if any.
  std::optional<std::pair<uintptr_t, uint64_t>> slab_of(uintptr_t address, uint64_t bytes) const {
    auto it = slabs.upper_bound(address);
    if (it == slabs.begin()) return std::nullopt;
    --it;
    if (address + bytes > it->first + it->second) return std::nullopt;
    return *it;
  }

  std::map<uintptr_t, uint64_t> slabs;  // live: address -> bytes
  std::vector<std::string> errors;
  uint64_t calls = 0;        // allocate_pinned() calls, failed ones included
  uint64_t allocations = 0;  // successful ones
  int fail_after = -1;       // >= 0: that many allocations succeed, then all fail
  bool throw_next = false;

 private:
  uint64_t next_ = 0;
  std::map<uintptr_t, uint64_t> freed_;
};

// Destroys the pool, then checks that every slab was freed exactly once.
void finish(std::optional<HostPool>& pool, FakeHost& fake) {
  pool.reset();
  CHECK(fake.slabs.empty());
  CHECK(fake.errors == std::vector<std::string>{});
}

uintptr_t addr(const HostBlock& block) { return reinterpret_cast<uintptr_t>(block.ptr); }

}  // namespace

TEST_CASE("reserve rounds up to slabs and stops at the budget", "[hostpool]") {
  FakeHost fake;
  std::optional<HostPool> pool(std::in_place, fake, 1000 * kMiB, 256 * kMiB);  // room for 3 slabs
  REQUIRE(pool->ok());
  CHECK(pool->stats().budget == 1000 * kMiB);
  CHECK(pool->stats().slab_bytes == 256 * kMiB);
  CHECK(pool->stats().slabs == 0);
  CHECK(fake.calls == 0);  // nothing allocated before reserve()

  CHECK(pool->reserve(1));
  CHECK(pool->stats().slabs == 1);
  CHECK(pool->stats().held_bytes == 256 * kMiB);
  CHECK(pool->reserve(256 * kMiB));  // already held
  CHECK(fake.calls == 1);
  CHECK(pool->reserve(256 * kMiB + 1));
  CHECK(pool->stats().slabs == 2);
  CHECK(fake.calls == 2);
  CHECK(pool->reserve(100ull << 30));  // capped at the budget: 3 slabs, not 4
  CHECK(pool->stats().slabs == 3);
  CHECK(pool->stats().held_bytes == 768 * kMiB);
  CHECK(fake.calls == 3);
  CHECK(pool->reserve(UINT64_MAX));  // overflow of the rounding: the budget
  CHECK(fake.calls == 3);
  for (const auto& [address, bytes] : fake.slabs) CHECK(bytes == 256 * kMiB);
  CHECK(pool->stats().largest_free_block == 256 * kMiB);
  finish(pool, fake);
}

TEST_CASE("slab size rounds up to 2 MiB, and a zero slab or a budget below one slab holds nothing", "[hostpool]") {
  FakeHost f;
  std::optional<HostPool> odd(std::in_place, f, 64 * kMiB, 3 * kMiB);
  CHECK(odd->stats().slab_bytes == 4 * kMiB);
  CHECK(odd->reserve(64 * kMiB));
  CHECK(odd->stats().slabs == 16);
  for (const auto& [address, bytes] : f.slabs) CHECK(bytes == 4 * kMiB);
  finish(odd, f);

  std::optional<HostPool> zero(std::in_place, f, 64 * kMiB, 0);
  CHECK_FALSE(zero->ok());
  CHECK_FALSE(zero->reserve(kMiB));
  CHECK_FALSE(zero->acquire(kMiB));
  finish(zero, f);

  std::optional<HostPool> small(std::in_place, f, 100 * kMiB, 256 * kMiB);
  CHECK(small->reserve(kMiB));
  CHECK(small->stats().slabs == 0);
  CHECK_FALSE(small->acquire(kMiB));
  CHECK(f.calls == 16);
  finish(small, f);
}

TEST_CASE("acquire and release never call the backend, and blocks are aligned and inside a slab", "[hostpool]") {
  FakeHost fake;
  std::optional<HostPool> pool(std::in_place, fake, 64 * kMiB, 16 * kMiB);
  REQUIRE(pool->reserve(64 * kMiB));
  REQUIRE(fake.calls == 4);
  std::vector<HostBlock> blocks;
  for (uint64_t bytes :
       std::vector<uint64_t>{1, kAlign, kAlign + 1, 5 * kMiB, 16 * kMiB, 7 * kMiB, 3 * kMiB, 16 * kMiB}) {
    const std::optional<HostBlock> block = pool->acquire(bytes);
    REQUIRE(block);
    CHECK(block->bytes >= bytes);
    CHECK(block->bytes % kAlign == 0);
    CHECK(block->bytes - bytes < kAlign);
    const auto slab = fake.slab_of(addr(*block), block->bytes);
    REQUIRE(slab);
    CHECK((addr(*block) - slab->first) % kAlign == 0);
    blocks.push_back(*block);
  }
  CHECK_FALSE(pool->acquire(16 * kMiB));  // full enough: no slab has 16 MiB free
  for (const HostBlock& block : blocks) CHECK(pool->release(block.ptr));
  CHECK(fake.calls == 4);  // no pinned allocation on the hot path
  CHECK(pool->stats().slabs == 4);
  finish(pool, fake);
}

TEST_CASE("blocks never overlap: a random workload against a model", "[hostpool]") {
  FakeHost fake;
  constexpr uint64_t kSlab = 32 * kMiB;
  std::optional<HostPool> pool(std::in_place, fake, 4 * kSlab, kSlab);
  REQUIRE(pool->reserve(4 * kSlab));
  std::mt19937_64 rng(20240611);
  std::map<uintptr_t, uint64_t> live;  // the model: address -> block bytes
  uint64_t in_use = 0, peak = 0, acquires = 0, failures = 0, refusals_with_room = 0;
  for (int step = 0; step < 2000; ++step) {
    const bool do_acquire = live.empty() || rng() % 100 < 55;
    if (do_acquire) {
      // Mostly small, sometimes up to a slab, sometimes above one.
      const uint64_t r = rng() % 100;
      const uint64_t bytes = r < 70 ? 1 + rng() % (6 * kMiB) : r < 95 ? 1 + rng() % kSlab : kSlab + 1 + rng() % kSlab;
      const uint64_t largest_before = pool->stats().largest_free_block;
      const std::optional<HostBlock> block = pool->acquire(bytes);
      const uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
      if (!block) {
        ++failures;
        // Best fit only fails when no free range fits (or the request is above a slab).
        if (bytes <= kSlab && largest_before >= rounded) ++refusals_with_room;
      } else {
        ++acquires;
        REQUIRE(bytes <= kSlab);
        CHECK(block->bytes == rounded);
        const uintptr_t a = addr(*block);
        const auto slab = fake.slab_of(a, block->bytes);
        REQUIRE(slab);
        CHECK((a - slab->first) % kAlign == 0);
        // No overlap with the neighbours in address order.
        const auto next = live.lower_bound(a);
        if (next != live.end()) CHECK(a + block->bytes <= next->first);
        if (next != live.begin()) CHECK(std::prev(next)->first + std::prev(next)->second <= a);
        live[a] = block->bytes;
        in_use += block->bytes;
        peak = std::max(peak, in_use);
      }
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const uintptr_t a = it->first;
      in_use -= it->second;
      live.erase(it);
      CHECK(pool->release(reinterpret_cast<void*>(a)));
      if (rng() % 10 == 0) CHECK_FALSE(pool->release(reinterpret_cast<void*>(a)));  // double release
    }
    const HostPool::Stats stats = pool->stats();
    REQUIRE(stats.in_use_bytes == in_use);
    REQUIRE(stats.peak_in_use_bytes == peak);
    REQUIRE(stats.acquires == acquires);
    REQUIRE(stats.failures == failures);
    REQUIRE(stats.largest_free_block <= kSlab);
  }
  CHECK(refusals_with_room == 0);
  CHECK(acquires > 500);
  CHECK(failures > 20);
  CHECK(peak > 3 * kSlab);  // the workload did fill the pool
  CHECK(fake.calls == 4);
  for (const auto& [a, bytes] : live) CHECK(pool->release(reinterpret_cast<void*>(a)));
  CHECK(pool->stats().in_use_bytes == 0);
  // Everything coalesced back: every slab takes a slab-sized block again.
  CHECK(pool->stats().largest_free_block == kSlab);
  for (int i = 0; i < 4; ++i) CHECK(pool->acquire(kSlab));
  finish(pool, fake);
}

TEST_CASE("release coalesces free ranges within a slab", "[hostpool]") {
  FakeHost fake;
  std::optional<HostPool> pool(std::in_place, fake, 8 * kMiB, 8 * kMiB);  // one slab, 4 blocks of 2 MiB
  REQUIRE(pool->reserve(1));
  std::vector<HostBlock> b;
  for (int i = 0; i < 4; ++i) {
    const auto block = pool->acquire(kAlign);
    REQUIRE(block);
    b.push_back(*block);
  }
  CHECK(addr(b[0]) == kBase);
  CHECK(addr(b[3]) == kBase + 3 * kAlign);
  CHECK_FALSE(pool->acquire(1));
  CHECK(pool->stats().largest_free_block == 0);
  CHECK(pool->release(b[1].ptr));  // no free neighbour
  CHECK(pool->release(b[3].ptr));  // no free neighbour
  CHECK(pool->stats().largest_free_block == kAlign);
  CHECK_FALSE(pool->acquire(2 * kAlign));
  CHECK(pool->release(b[0].ptr));  // merges with the range after it
  CHECK(pool->stats().largest_free_block == 2 * kAlign);
  CHECK(pool->release(b[2].ptr));  // merges with both sides
  CHECK(pool->stats().largest_free_block == 8 * kMiB);
  const auto whole = pool->acquire(8 * kMiB);
  REQUIRE(whole);
  CHECK(addr(*whole) == kBase);
  CHECK(pool->release(whole->ptr));

  // And merging with only the range before it.
  const auto x = pool->acquire(4 * kMiB);
  const auto y = pool->acquire(4 * kMiB);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(pool->release(x->ptr));
  CHECK(pool->release(y->ptr));  // merges with x's range, before it
  CHECK(pool->stats().largest_free_block == 8 * kMiB);
  CHECK(fake.calls == 1);
  finish(pool, fake);
}

TEST_CASE("over-slab requests, an empty pool and bad releases fail and count", "[hostpool]") {
  FakeHost fake;
  std::optional<HostPool> pool(std::in_place, fake, 64 * kMiB, 16 * kMiB);
  CHECK_FALSE(pool->acquire(1));  // nothing reserved: no slab appears on the hot path
  CHECK(fake.calls == 0);
  CHECK(pool->stats().failures == 1);
  const auto empty = pool->acquire(0);
  REQUIRE(empty);
  CHECK(empty->ptr == nullptr);
  CHECK(empty->bytes == 0);
  CHECK(pool->stats().failures == 1);
  CHECK(pool->stats().acquires == 0);

  REQUIRE(pool->reserve(64 * kMiB));
  CHECK_FALSE(pool->acquire(16 * kMiB + 1));  // above a slab, with 64 MiB free
  CHECK_FALSE(pool->acquire(UINT64_MAX));
  CHECK(pool->stats().failures == 3);
  const auto full = pool->acquire(16 * kMiB);
  REQUIRE(full);
  CHECK(full->bytes == 16 * kMiB);
  CHECK(pool->stats().acquires == 1);
  CHECK(pool->stats().failures == 3);

  CHECK_FALSE(pool->release(nullptr));
  CHECK_FALSE(pool->release(reinterpret_cast<void*>(addr(*full) + kAlign)));  // inside a block
  CHECK(pool->release(full->ptr));
  CHECK_FALSE(pool->release(full->ptr));  // double
  CHECK(pool->stats().in_use_bytes == 0);
  CHECK(pool->stats().peak_in_use_bytes == 16 * kMiB);
  CHECK(fake.calls == 4);
  finish(pool, fake);
}

TEST_CASE("a backend failure in reserve is reported and the pool stays usable", "[hostpool]") {
  FakeHost fake;
  fake.fail_after = 2;
  std::optional<HostPool> pool(std::in_place, fake, 64 * kMiB, 16 * kMiB);
  CHECK_FALSE(pool->reserve(64 * kMiB));
  CHECK(pool->stats().slabs == 2);
  CHECK(pool->stats().held_bytes == 32 * kMiB);
  CHECK(fake.slabs.size() == 2);
  const auto a = pool->acquire(16 * kMiB);
  const auto b = pool->acquire(16 * kMiB);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->ptr != b->ptr);
  CHECK_FALSE(pool->acquire(1));

  fake.throw_next = true;  // a throwing backend: no exception leaves reserve()
  CHECK_FALSE(pool->reserve(64 * kMiB));
  CHECK(pool->stats().slabs == 2);
  fake.throw_next = false;

  fake.fail_after = -1;  // the backend recovers: reserve() completes
  CHECK(pool->reserve(64 * kMiB));
  CHECK(pool->stats().slabs == 4);
  CHECK(fake.slabs.size() == 4);
  CHECK(pool->acquire(16 * kMiB));
  CHECK(pool->release(a->ptr));
  finish(pool, fake);  // blocks still out: their slabs are freed all the same
}

TEST_CASE("largest_free_block and best fit on a hand case", "[hostpool]") {
  FakeHost fake;
  std::optional<HostPool> pool(std::in_place, fake, 32 * kMiB, 16 * kMiB);
  CHECK(pool->stats().largest_free_block == 0);
  REQUIRE(pool->reserve(32 * kMiB));
  CHECK(pool->stats().largest_free_block == 16 * kMiB);
  const uintptr_t slab0 = kBase, slab1 = kBase + kStride;
  const auto a = pool->acquire(2 * kMiB);  // ties go to the first slab, lowest offset: [0, 2)
  const auto b = pool->acquire(4 * kMiB);  // [2, 6)
  const auto c = pool->acquire(2 * kMiB);  // [6, 8); slab 0 has [8, 16) free
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(addr(*a) == slab0);
  CHECK(addr(*b) == slab0 + 2 * kMiB);
  CHECK(addr(*c) == slab0 + 6 * kMiB);
  CHECK(pool->stats().largest_free_block == 16 * kMiB);  // slab 1
  const auto d = pool->acquire(10 * kMiB);               // best fit: slab 0's 8 MiB is too small, slab 1
  REQUIRE(d);
  CHECK(addr(*d) == slab1);
  CHECK(pool->stats().largest_free_block == 8 * kMiB);  // slab 0 [8, 16)
  CHECK(pool->release(b->ptr));                         // slab 0: [2, 6) and [8, 16)
  CHECK(pool->stats().largest_free_block == 8 * kMiB);
  // 3 MiB rounds to 4: the 4 MiB hole is the best fit, not slab 1's 6 MiB nor slab 0's 8 MiB.
  const auto e = pool->acquire(3 * kMiB);
  REQUIRE(e);
  CHECK(addr(*e) == slab0 + 2 * kMiB);
  CHECK(e->bytes == 4 * kMiB);
  const auto f = pool->acquire(5 * kMiB);  // 6 MiB: slab 1's [10, 16) fits exactly
  REQUIRE(f);
  CHECK(addr(*f) == slab1 + 10 * kMiB);
  CHECK(pool->stats().largest_free_block == 8 * kMiB);
  CHECK(pool->release(e->ptr));
  CHECK(pool->release(c->ptr));  // slab 0: [2, 16)
  CHECK(pool->stats().largest_free_block == 14 * kMiB);
  CHECK(pool->stats().in_use_bytes == 2 * kMiB + 10 * kMiB + 6 * kMiB);
  finish(pool, fake);
}
