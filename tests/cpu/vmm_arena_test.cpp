// VmmArena against a fake physical backend that checks the CUDA VMM rules itself (no double map
// of a VA, no unmap of an unmapped VA, no release of a mapped chunk, every chunk released exactly
// once, at most `limit` granules mapped): sub-allocation of small buffers, long/short placement,
// the physical budget, evict/restore at the same addresses, fragmentation, a random workload, and
// parse_budget.
#include "pool/vmm_arena.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace vcudnn::pool;

namespace {

constexpr uint64_t kG = 2ull << 20;  // 2 MiB, as on the H100
constexpr uint64_t kBase = 0x7f0000000000ull;

class FakePhysical final : public PhysicalBackend {
 public:
  explicit FakePhysical(uint64_t limit_granules = UINT64_MAX, uint64_t granularity = kG)
      : limit_(limit_granules), g_(granularity) {}

  uint64_t granularity() override { return g_; }
  bool reserve(uint64_t bytes, uint64_t* base) override {
    if (reserved_ != 0) error("second reserve");
    if (bytes == 0 || bytes % g_ != 0) error("reserve of a size not a multiple of the granularity");
    if (fail_reserve) return false;
    reserved_ = bytes;
    *base = kBase;
    return true;
  }
  void unreserve(uint64_t base, uint64_t bytes) override {
    if (base != kBase || bytes != reserved_ || unreserved_) error("bad unreserve");
    if (!mapped.empty()) error("unreserve while mapped");
    unreserved_ = true;
  }
  Handle create_chunk() override {
    if (fail_create) return 0;
    const Handle h = next_++;
    chunks_[h] = Chunk{};
    return h;
  }
  void release_chunk(Handle h) override {
    const auto it = chunks_.find(h);
    if (it == chunks_.end()) return error("release of an unknown chunk");
    if (it->second.released) return error("double release");
    if (it->second.mapped) error("release of a mapped chunk");
    it->second.released = true;
  }
  bool map(uint64_t va, Handle h) override {
    if (fail_map_after == 0) return false;
    if (fail_map_after > 0) --fail_map_after;
    if (va < kBase || va >= kBase + reserved_ || (va - kBase) % g_ != 0) error("map outside the range");
    if (mapped.count(va) != 0) error("double map of a VA");
    const auto it = chunks_.find(h);
    if (it == chunks_.end() || it->second.released) error("map of a dead chunk");
    if (it != chunks_.end() && it->second.mapped) error("chunk mapped twice");
    if (it != chunks_.end()) it->second.mapped = true;
    mapped[va] = h;
    if (mapped.size() > limit_) error("more granules mapped than the limit");
    return true;
  }
  bool unmap(uint64_t va) override {
    const auto it = mapped.find(va);
    if (it == mapped.end()) {
      error("unmap of an unmapped VA");
      return false;
    }
    chunks_[it->second].mapped = false;
    mapped.erase(it);
    return true;
  }

  // At the end (arena destroyed): every chunk released once, the range unreserved.
  void check_end() {
    for (const auto& [h, chunk] : chunks_) {
      if (!chunk.released) error("chunk never released");
    }
    if (reserved_ != 0 && !unreserved_) error("range never unreserved");
  }
  uint64_t created() const { return chunks_.size(); }
  uint64_t released() const {
    return static_cast<uint64_t>(
        std::count_if(chunks_.begin(), chunks_.end(), [](const auto& c) { return c.second.released; }));
  }

  std::map<uint64_t, Handle> mapped;  // va -> chunk
  std::vector<std::string> errors;
  bool fail_reserve = false;
  bool fail_create = false;
  int fail_map_after = -1;  // >= 0: that many map() calls succeed, then all fail

 private:
  struct Chunk {
    bool mapped = false;
    bool released = false;
  };
  void error(const std::string& what) { errors.push_back(what); }

  uint64_t limit_;
  uint64_t g_;
  uint64_t reserved_ = 0;
  bool unreserved_ = false;
  Handle next_ = 1;
  std::map<Handle, Chunk> chunks_;
};

// Destroys the arena, then checks everything the fake saw.
void finish(std::optional<VmmArena>& arena, FakePhysical& fake) {
  arena.reset();
  fake.check_end();
  CHECK(fake.mapped.empty());
  CHECK(fake.errors == std::vector<std::string>{});
}

}  // namespace

TEST_CASE("small buffers share a granule, unmapped only when the last one is freed", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 16 * kG, 16 * kG);
  REQUIRE(arena->ok());
  const auto a = arena->allocate(1000, Lifetime::kLong);
  const auto b = arena->allocate(3000, Lifetime::kLong);
  const auto c = arena->allocate(5000, Lifetime::kLong);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->address == kBase);
  CHECK(a->bytes == 1024);
  CHECK(b->address == kBase + 1024);
  CHECK(b->bytes == 3072);
  CHECK(c->address == kBase + 4096);
  CHECK(arena->stats().mapped_bytes == kG);
  CHECK(arena->stats().chunks_created == 1);
  CHECK(fake.mapped.size() == 1);

  CHECK(arena->free(a->address));
  CHECK(arena->free(c->address));
  CHECK(fake.mapped.size() == 1);
  CHECK(arena->stats().mapped_bytes == kG);
  CHECK(arena->free(b->address));
  CHECK(fake.mapped.empty());
  CHECK(arena->stats().mapped_bytes == 0);
  CHECK(arena->stats().chunks_free == 1);
  CHECK_FALSE(arena->free(b->address));  // double free

  // The freed hole is reused first (first fit from the low end), on the cached chunk.
  const auto d = arena->allocate(512, Lifetime::kLong);
  REQUIRE(d);
  CHECK(d->address == kBase);
  CHECK(arena->stats().chunks_created == 1);
  CHECK(arena->stats().chunks_free == 0);
  finish(arena, fake);
}

TEST_CASE("long and short buffers land at opposite ends", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 64 * kG, 64 * kG);
  std::vector<Allocation> longs, shorts;
  const uint64_t sizes[] = {1000, 3 * kG, 70000, kG, 5, 2 * kG + 1};
  for (uint64_t size : sizes) {
    const auto l = arena->allocate(size, Lifetime::kLong);
    const auto s = arena->allocate(size, Lifetime::kShort);
    REQUIRE(l);
    REQUIRE(s);
    longs.push_back(*l);
    shorts.push_back(*s);
  }
  CHECK(longs.front().address == kBase);
  CHECK(shorts.front().address + shorts.front().bytes == kBase + 64 * kG);
  // Free some short ones and allocate more long ones: the long ones still stay below every short one.
  CHECK(arena->free(shorts[1].address));
  CHECK(arena->free(shorts[3].address));
  shorts.erase(shorts.begin() + 3);
  shorts.erase(shorts.begin() + 1);
  for (uint64_t size : {kG, uint64_t{4000}}) {
    const auto l = arena->allocate(size, Lifetime::kLong);
    REQUIRE(l);
    longs.push_back(*l);
  }
  uint64_t long_end = 0;
  uint64_t short_start = UINT64_MAX;
  for (const auto& l : longs) long_end = std::max(long_end, l.address + l.bytes);
  for (const auto& s : shorts) short_start = std::min(short_start, s.address);
  CHECK(long_end <= short_start);
  // Large buffers are granule-aligned.
  for (const auto& a : longs) {
    if (a.bytes >= kG) CHECK((a.address - kBase) % kG == 0);
  }
  finish(arena, fake);
}

TEST_CASE("the physical budget caps mapped granules; chunks are reused", "[arena]") {
  FakePhysical fake(4);
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 4 * kG + kG / 2);  // 4 granules
  std::vector<Allocation> bufs;
  for (int i = 0; i < 4; ++i) {
    const auto a = arena->allocate(kG, i % 2 ? Lifetime::kShort : Lifetime::kLong);
    REQUIRE(a);
    bufs.push_back(*a);
  }
  CHECK_FALSE(arena->allocate(kG, Lifetime::kLong));
  CHECK_FALSE(arena->allocate(100, Lifetime::kShort));  // no mapped granule has room
  CHECK(arena->stats().failures == 2);
  CHECK(arena->stats().allocations == 4);
  CHECK(fake.mapped.size() == 4);
  CHECK(arena->free(bufs[2].address));
  const auto a = arena->allocate(100, Lifetime::kShort);
  REQUIRE(a);
  const auto b = arena->allocate(200, Lifetime::kLong);  // budget full: shares the granule `a` mapped
  REQUIRE(b);
  CHECK(b->address / kG == a->address / kG);
  CHECK(arena->stats().chunks_created == 4);
  CHECK(arena->stats().mapped_bytes == 4 * kG);
  CHECK(arena->stats().peak_mapped_bytes == 4 * kG);
  CHECK_FALSE(arena->allocate(kG, Lifetime::kShort));
  CHECK(arena->stats().failures == 3);
  finish(arena, fake);
}

TEST_CASE("evict keeps the address, restore maps again at the same addresses", "[arena]") {
  FakePhysical fake(4);
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 4 * kG);
  const auto a = arena->allocate(2 * kG, Lifetime::kShort);
  const auto b = arena->allocate(2 * kG - 4096, Lifetime::kLong);
  const auto small = arena->allocate(4096, Lifetime::kLong);
  REQUIRE(a);
  REQUIRE(b);
  CHECK_FALSE(small);  // b's granules are its own
  CHECK(arena->stats().mapped_bytes == 4 * kG);

  CHECK(arena->evict(a->address));
  CHECK(arena->is_evicted(a->address));
  CHECK_FALSE(arena->evict(a->address));  // already evicted
  CHECK(arena->stats().mapped_bytes == 2 * kG);
  CHECK(arena->stats().evicted_bytes == 2 * kG);
  CHECK(arena->stats().chunks_free == 2);
  CHECK(fake.mapped.count(a->address) == 0);
  CHECK(fake.mapped.count(a->address + kG) == 0);

  // Its VA stays taken: a new buffer goes elsewhere, on the cached chunks.
  const auto c = arena->allocate(2 * kG, Lifetime::kShort);
  REQUIRE(c);
  CHECK(c->address + c->bytes <= a->address);
  CHECK(arena->stats().chunks_created == 4);

  CHECK_FALSE(arena->restore(a->address));  // budget full
  CHECK(arena->is_evicted(a->address));
  CHECK(arena->stats().mapped_bytes == 4 * kG);
  CHECK(arena->free(c->address));
  CHECK(arena->restore(a->address));
  CHECK_FALSE(arena->is_evicted(a->address));
  CHECK_FALSE(arena->restore(a->address));  // not evicted
  CHECK(fake.mapped.count(a->address) == 1);
  CHECK(fake.mapped.count(a->address + kG) == 1);
  CHECK(arena->stats().evicted_bytes == 0);
  CHECK(arena->stats().chunks_created == 4);

  // An evicted buffer can be freed; small buffers cannot be evicted.
  CHECK(arena->evict(b->address));
  CHECK(arena->free(b->address));
  CHECK(arena->stats().evicted_bytes == 0);
  const auto s = arena->allocate(100, Lifetime::kLong);
  REQUIRE(s);
  CHECK_FALSE(arena->evict(s->address));
  CHECK_FALSE(arena->restore(s->address));
  finish(arena, fake);
}

TEST_CASE("unknown addresses are refused without harm", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 8 * kG, 8 * kG);
  const auto a = arena->allocate(3 * kG, Lifetime::kLong);
  REQUIRE(a);
  for (uint64_t bad : {uint64_t{0}, uint64_t{123}, a->address + 512, a->address + kG, kBase + 8 * kG, UINT64_MAX}) {
    CHECK_FALSE(arena->free(bad));
    CHECK_FALSE(arena->evict(bad));
    CHECK_FALSE(arena->restore(bad));
    CHECK_FALSE(arena->is_evicted(bad));
  }
  CHECK(arena->stats().mapped_bytes == 3 * kG);
  CHECK(arena->free(a->address));
  CHECK_FALSE(arena->evict(a->address));
  CHECK(arena->allocate(0, Lifetime::kLong)->address == 0);
  CHECK_FALSE(arena->allocate(UINT64_MAX, Lifetime::kLong));
  CHECK_FALSE(arena->allocate(9 * kG, Lifetime::kLong));  // larger than the range
  finish(arena, fake);

  FakePhysical refusing;
  refusing.fail_reserve = true;
  std::optional<VmmArena> dead(std::in_place, refusing, 8 * kG, 8 * kG);
  CHECK_FALSE(dead->ok());
  CHECK_FALSE(dead->allocate(100, Lifetime::kLong));
  CHECK_FALSE(dead->free(kBase));
  CHECK(dead->stats().failures == 1);
  dead.reset();
  CHECK(refusing.errors.empty());
}

TEST_CASE("backend failures leave the arena as it was", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 16 * kG, 16 * kG);
  fake.fail_create = true;
  CHECK_FALSE(arena->allocate(100, Lifetime::kLong));
  fake.fail_create = false;
  fake.fail_map_after = 2;  // the third granule fails
  CHECK_FALSE(arena->allocate(3 * kG, Lifetime::kLong));
  CHECK(fake.mapped.empty());
  CHECK(arena->stats().mapped_bytes == 0);
  CHECK(arena->stats().chunks_free == 3);
  fake.fail_map_after = -1;
  const auto a = arena->allocate(3 * kG, Lifetime::kLong);
  REQUIRE(a);
  CHECK(a->address == kBase);  // the failed attempt left no VA taken
  CHECK(arena->stats().chunks_created == 3);
  CHECK(arena->stats().failures == 2);
  CHECK(arena->free(a->address));
  arena->trim();
  CHECK(arena->stats().chunks_free == 0);
  CHECK(fake.released() == 3);
  finish(arena, fake);
}

TEST_CASE("fragmentation on a hand-computed case", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 16 * kG, 16 * kG);
  CHECK(arena->stats().fragmentation == 0);
  const auto small = arena->allocate(1000, Lifetime::kLong);   // 1 granule mapped for 1000 B
  const auto big = arena->allocate(kG + 1, Lifetime::kShort);  // 2 granules for kG + 1 B
  REQUIRE(small);
  REQUIRE(big);
  auto s = arena->stats();
  CHECK(s.mapped_bytes == 3 * kG);
  CHECK(s.live_bytes == kG + 1001);
  CHECK(s.fragmentation == Approx(1.0 - double(kG + 1001) / double(3 * kG)));
  CHECK(arena->evict(big->address));
  s = arena->stats();
  CHECK(s.mapped_bytes == kG);
  CHECK(s.live_bytes == kG + 1001);  // evicted buffers are still live
  CHECK(s.evicted_bytes == 2 * kG);
  CHECK(s.fragmentation == Approx(1.0 - 1000.0 / double(kG)));
  CHECK(arena->free(small->address));
  CHECK(arena->free(big->address));
  s = arena->stats();
  CHECK(s.mapped_bytes == 0);
  CHECK(s.live_bytes == 0);
  CHECK(s.fragmentation == 0);
  CHECK(s.peak_mapped_bytes == 3 * kG);
  finish(arena, fake);
}

TEST_CASE("random workload keeps every invariant", "[arena]") {
  constexpr uint64_t kBudget = 48;
  constexpr uint64_t kRange = 256;
  FakePhysical fake(kBudget);
  std::optional<VmmArena> arena(std::in_place, fake, kRange * kG, kBudget * kG);
  struct Live {
    uint64_t bytes = 0;
    uint64_t requested = 0;
    bool evicted = false;
  };
  std::map<uint64_t, Live> live;
  std::mt19937_64 rng(12345);
  uint64_t expected_failures = 0;
  uint64_t successes = 0;
  uint64_t evictions = 0;
  uint64_t restores = 0;
  const auto pick = [&]() {
    auto it = live.begin();
    std::advance(it, static_cast<long>(rng() % live.size()));
    return it;
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 40 || live.empty()) {
      const uint64_t size = rng() % 2 ? 1 + rng() % (kG - 1) : kG + rng() % (4 * kG);
      const Lifetime lifetime = rng() % 2 ? Lifetime::kLong : Lifetime::kShort;
      const auto a = arena->allocate(size, lifetime);
      if (a) {
        ++successes;
        CHECK(a->bytes >= size);
        CHECK(live.count(a->address) == 0);
        live[a->address] = Live{a->bytes, size, false};
      } else {
        ++expected_failures;
      }
    } else if (op < 70) {
      const auto it = pick();
      REQUIRE(arena->free(it->first));
      live.erase(it);
    } else if (op < 85) {
      const auto it = pick();
      const bool can = it->second.bytes >= kG && !it->second.evicted;
      REQUIRE(arena->evict(it->first) == can);
      if (can) ++evictions;
      it->second.evicted = it->second.evicted || can;
    } else {
      const auto it = pick();
      const bool fits = arena->stats().mapped_bytes + it->second.bytes <= kBudget * kG;
      const bool can = it->second.evicted && fits;
      REQUIRE(arena->restore(it->first) == can);
      if (can) ++restores;
      if (can) it->second.evicted = false;
    }

    const auto s = arena->stats();
    REQUIRE(s.mapped_bytes <= kBudget * kG);
    REQUIRE(s.mapped_bytes == fake.mapped.size() * kG);
    REQUIRE(s.failures == expected_failures);
    REQUIRE(s.allocations == successes);
    uint64_t end = kBase;
    uint64_t requested = 0;
    for (const auto& [address, buf] : live) {
      REQUIRE(address >= end);  // no overlap, inside the range
      end = address + buf.bytes;
      requested += buf.requested;
      REQUIRE(arena->is_evicted(address) == buf.evicted);
      // Resident buffers are backed by mapped granules; evicted ones by none.
      for (uint64_t g = (address - kBase) / kG; g <= (end - 1 - kBase) / kG; ++g) {
        REQUIRE(fake.mapped.count(kBase + g * kG) == (buf.evicted ? 0u : 1u));
      }
    }
    REQUIRE(end <= kBase + kRange * kG);
    REQUIRE(s.live_bytes == requested);
    REQUIRE(fake.errors.empty());
  }
  // The workload exercised every path.
  CHECK(expected_failures > 0);
  CHECK(evictions > 50);
  CHECK(restores > 20);
  CHECK(arena->stats().chunks_created <= kBudget);
  for (const auto& [address, buf] : live) REQUIRE(arena->free(address));
  CHECK(arena->stats().mapped_bytes == 0);
  finish(arena, fake);
}

TEST_CASE("parse_budget", "[arena]") {
  constexpr uint64_t kTotal = 80ull << 30;
  CHECK(parse_budget("1024", kTotal) == 1024u);
  CHECK(parse_budget("512B", kTotal) == 512u);
  CHECK(parse_budget("4K", kTotal) == 4096u);
  CHECK(parse_budget("4kib", kTotal) == 4096u);
  CHECK(parse_budget("3M", kTotal) == 3ull << 20);
  CHECK(parse_budget("3MB", kTotal) == 3ull << 20);
  CHECK(parse_budget("40G", kTotal) == 40ull << 30);
  CHECK(parse_budget("40GiB", kTotal) == 40ull << 30);
  CHECK(parse_budget("2T", kTotal) == 2ull << 40);
  CHECK(parse_budget("60%", kTotal) == kTotal * 60 / 100);
  CHECK(parse_budget("62.5%", kTotal) == kTotal * 625 / 1000);
  CHECK(parse_budget("100%", kTotal) == kTotal);
  CHECK(parse_budget("0.5%", 1000) == 5u);
  CHECK(parse_budget("16777215T", kTotal) == 16777215ull << 40);

  for (const char* bad : {"",
                          "-1",
                          "-5%",
                          "abc",
                          "12X",
                          "G",
                          "1.5G",
                          "0",
                          "0%",
                          "0.0%",
                          "100.5%",
                          "101%",
                          "1e3",
                          " 1G",
                          "1G ",
                          "%",
                          "5.%",
                          "16777216T",
                          "18446744073709551616",
                          "1GG",
                          "60%%"}) {
    INFO(bad);
    CHECK_FALSE(parse_budget(bad, kTotal));
  }
  CHECK_FALSE(parse_budget("50%", 0));
}
