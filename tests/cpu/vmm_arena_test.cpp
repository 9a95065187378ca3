// VmmArena against a fake physical backend that checks the CUDA VMM rules itself (no double map
// of a VA, no unmap of an unmapped VA, no release of a mapped chunk, every chunk released exactly
// once, at most `limit` granules mapped): small buffers in slabs, reuse of freed (idle) memory
// across sizes, free tags, trim, the physical budget, evict/restore at the same addresses,
// fragmentation, a random workload, PyTorch allocation traces replayed, and parse_budget.
#include "pool/vmm_arena.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/cpu/alloc_trace.h"

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
    ++map_calls;
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
    if (extent_of.count(va)) {
      error("unmap of one granule of an extent");  // cuMemUnmap refuses part of a mapping
      return false;
    }
    chunks_[it->second].mapped = false;
    mapped.erase(it);
    return true;
  }
  Handle create_extent(uint64_t granules) override {
    if (fail_create || granules < 2) return 0;
    const Handle h = next_++;
    chunks_[h] = Chunk{};
    extent_size_[h] = granules;
    return h;
  }
  bool map_extent(uint64_t va, Handle h, uint64_t granules) override {
    ++map_calls;
    if (fail_map_after == 0) return false;
    if (fail_map_after > 0) --fail_map_after;
    if (extent_size_[h] != granules) error("extent mapped with another size");
    if (va < kBase || va + granules * g_ > kBase + reserved_ || (va - kBase) % g_ != 0) error("map outside the range");
    const auto it = chunks_.find(h);
    if (it == chunks_.end() || it->second.released || it->second.mapped) error("map of a dead or mapped extent");
    if (it != chunks_.end()) it->second.mapped = true;
    for (uint64_t i = 0; i < granules; ++i) {
      if (mapped.count(va + i * g_) != 0) error("double map of a VA");
      mapped[va + i * g_] = h;
      extent_of[va + i * g_] = {va, granules};
    }
    ++extents_mapped;
    if (mapped.size() > limit_) error("more granules mapped than the limit");
    return true;
  }
  bool map_alias(uint64_t, Handle, uint64_t) override {
    error("the arena maps no extent twice");
    return false;
  }
  bool unmap_extent(uint64_t va, uint64_t granules) override {
    const auto e = extent_of.find(va);
    if (e == extent_of.end() || e->second.first != va || e->second.second != granules) {
      error("unmap_extent of something not a whole extent");
      return false;
    }
    const Handle h = mapped.at(va);
    chunks_[h].mapped = false;
    for (uint64_t i = 0; i < granules; ++i) {
      mapped.erase(va + i * g_);
      extent_of.erase(va + i * g_);
    }
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

  std::map<uint64_t, Handle> mapped;                            // va -> chunk
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> extent_of;  // va -> (extent's first va, granules)
  uint64_t extents_mapped = 0;
  uint64_t map_calls = 0;
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
  std::map<Handle, uint64_t> extent_size_;
};

// Destroys the arena, then checks everything the fake saw.
void finish(std::optional<VmmArena>& arena, FakePhysical& fake) {
  arena.reset();
  fake.check_end();
  CHECK(fake.mapped.empty());
  CHECK(fake.errors == std::vector<std::string>{});
}

TagSet tags(std::initializer_list<FreeTag> list) {
  TagSet t;
  for (const FreeTag& f : list) t.add(f);
  return t;
}

bool all_settled(const FreeTag&) { return true; }

}  // namespace

TEST_CASE("small buffers are carved from a slab, and an empty slab stays mapped, idle, until trimmed", "[arena]") {
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
  CHECK(arena->stats().slabs == 1);
  CHECK(arena->stats().chunks_created == 1);

  CHECK(arena->free(a->address));
  CHECK(arena->free(c->address));
  CHECK(arena->stats().idle_bytes == 0);
  CHECK(arena->free(b->address));
  CHECK_FALSE(arena->free(b->address));  // double free
  CHECK(fake.mapped.size() == 1);        // idle, still mapped: reused without a map
  CHECK(arena->stats().idle_bytes == kG);
  CHECK(arena->stats().slabs == 0);

  CHECK(arena->trim(UINT64_MAX, all_settled) == 1);
  CHECK(fake.mapped.empty());
  CHECK(arena->stats().mapped_bytes == 0);
  CHECK(arena->stats().chunks_free == 1);
  const auto d = arena->allocate(512, Lifetime::kLong);
  REQUIRE(d);
  CHECK(d->address == kBase);
  CHECK(arena->stats().chunks_created == 1);  // the free chunk, mapped again
  CHECK(arena->stats().chunks_free == 0);
  finish(arena, fake);
}

TEST_CASE("freed memory is reused by requests of other sizes without mapping", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 64 * kG, 64 * kG);
  const auto a = arena->allocate(10 * kG, Lifetime::kShort);
  REQUIRE(a);
  CHECK(a->address == kBase + 54 * kG);  // fresh short-lived memory at the high end
  CHECK(arena->free(a->address));
  CHECK(arena->stats().idle_bytes == 10 * kG);
  const auto b = arena->allocate(6 * kG - 100, Lifetime::kShort);  // best fit: inside a's memory
  const auto c = arena->allocate(4 * kG, Lifetime::kLong);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(b->address == kBase + 58 * kG);
  CHECK(c->address == kBase + 54 * kG);
  CHECK(arena->stats().fresh_granules == 10);
  CHECK(arena->stats().chunks_created == 10);
  CHECK(arena->stats().idle_bytes == 0);
  const auto d = arena->allocate(kG, Lifetime::kShort);  // nothing idle: a fresh granule
  REQUIRE(d);
  CHECK(d->address == kBase + 53 * kG);
  CHECK(arena->stats().fresh_granules == 11);
  CHECK(arena->stats().mapped_bytes == 11 * kG);
  CHECK(arena->stats().peak_mapped_bytes == 11 * kG);
  CHECK(arena->free(d->address));
  CHECK(arena->trim(UINT64_MAX, all_settled) == 1);
  CHECK(arena->stats().peak_mapped_bytes == 11 * kG);
  arena->reset_peak();
  CHECK(arena->stats().peak_mapped_bytes == 10 * kG);
  finish(arena, fake);
}

TEST_CASE("an idle run too small for a request grows into the unmapped space beside it", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 32 * kG);
  const auto a = arena->allocate(3 * kG, Lifetime::kShort);
  const auto b = arena->allocate(2 * kG, Lifetime::kShort);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->address == kBase + 29 * kG);
  CHECK(b->address == kBase + 27 * kG);
  CHECK(arena->free(b->address));
  const auto c = arena->allocate(5 * kG, Lifetime::kShort);  // b's 2 idle granules + 3 fresh below them
  REQUIRE(c);
  CHECK(c->address == kBase + 24 * kG);
  CHECK(arena->stats().fresh_granules == 8);
  CHECK(arena->stats().mapped_bytes == 8 * kG);
  const auto l = arena->allocate(kG, Lifetime::kLong);  // long-lived fresh memory: the low end
  REQUIRE(l);
  CHECK(l->address == kBase);
  finish(arena, fake);
}

TEST_CASE("free tags come back from the allocation that reuses the memory and hold back trim", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 32 * kG);
  const auto a = arena->allocate(2 * kG, Lifetime::kShort);
  REQUIRE(a);
  CHECK(arena->free(a->address, tags({{1, 5}, {2, 3}, {1, 4}})));
  TagSet waits;
  const auto b = arena->allocate(2 * kG, Lifetime::kShort, &waits);
  REQUIRE(b);
  CHECK(b->address == a->address);
  CHECK(waits.tags() == std::vector<FreeTag>{{1, 5}, {2, 3}});
  TagSet none;
  const auto fresh = arena->allocate(kG, Lifetime::kShort, &none);
  REQUIRE(fresh);
  CHECK(none.empty());

  // Two neighbours freed with different tags: one idle run carrying both.
  CHECK(arena->free(b->address, tags({{1, 9}})));
  CHECK(arena->free(fresh->address, tags({{3, 2}})));
  CHECK(arena->idle_tags().tags().size() == 2);
  CHECK(arena->trim(UINT64_MAX, [](const FreeTag& t) { return t.stream == 1; }) == 0);  // stream 3 not settled
  CHECK(arena->idle_tags().tags() == std::vector<FreeTag>{{3, 2}});                     // stream 1's dropped
  CHECK(arena->stats().mapped_bytes == 3 * kG);
  CHECK(arena->trim(2, all_settled) == 2);  // a part of the run
  CHECK(arena->stats().mapped_bytes == kG);
  CHECK(arena->stats().idle_bytes == kG);
  CHECK(arena->trim(UINT64_MAX, all_settled) == 1);

  // Small buffers: the slab carries the tags of every free inside it.
  const auto s1 = arena->allocate(1000, Lifetime::kLong);
  const auto s2 = arena->allocate(1000, Lifetime::kLong);
  REQUIRE(s1);
  REQUIRE(s2);
  CHECK(arena->free(s1->address, tags({{4, 1}})));
  TagSet small_waits;
  const auto s3 = arena->allocate(500, Lifetime::kLong, &small_waits);
  REQUIRE(s3);
  CHECK(s3->address == s1->address);
  CHECK(small_waits.tags() == std::vector<FreeTag>{{4, 1}});
  finish(arena, fake);
}

TEST_CASE("the end of a synchronisation interval unmaps memory idle through two intervals", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 64 * kG, 64 * kG);
  REQUIRE(arena->allocate(1000, Lifetime::kLong));  // a slab: the small allocations below go into it
  const auto a = arena->allocate(8 * kG, Lifetime::kShort);
  const auto c = arena->allocate(2 * kG, Lifetime::kShort);  // keeps a's and b's idle runs apart
  const auto b = arena->allocate(4 * kG, Lifetime::kShort);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  const auto not_stream1 = [](const FreeTag& t) { return t.stream != 1; };
  const auto another_interval = [&](const auto& settled, uint64_t keep = 0) {
    REQUIRE(arena->allocate(1000, Lifetime::kLong));  // an interval counts only if the program allocated
    return arena->end_interval(settled, keep);
  };
  CHECK(arena->free(a->address));                                // idle since interval 0
  CHECK(arena->end_interval(all_settled, 0) == 0);               // interval 0 ends: a was freed in it
  CHECK(arena->end_interval(all_settled, 0) == 0);               // nothing allocated since: no interval ended
  CHECK(arena->free(b->address, tags({{1, 7}})));                // idle since interval 1, its free not settled yet
  const auto reuse = arena->allocate(5 * kG, Lifetime::kShort);  // part of a's memory (best fit)
  REQUIRE(reuse);
  CHECK(reuse->address >= a->address);
  CHECK(arena->stats().idle_bytes == 7 * kG);
  // Interval 1 ends: what is left of a was idle through it, but through one interval only.
  CHECK(arena->end_interval(not_stream1, 0) == 0);
  // Interval 2 ends: the rest of a (idle since 0) goes; b (idle since 1) stays.
  CHECK(another_interval(not_stream1) == 3);
  CHECK(arena->stats().idle_bytes == 4 * kG);
  // Interval 3 ends: b is stale now, but its free is not settled: it stays until it is.
  CHECK(another_interval(not_stream1) == 0);
  CHECK(another_interval(all_settled) == 4);
  CHECK(arena->stats().idle_bytes == 0);
  CHECK(arena->stats().mapped_bytes == 8 * kG);  // reuse, c and a slab
  // Unmapped chunks are released once an interval passes without a mapping using them: a's 3
  // went at the end of interval 3, b's 4 were unmapped in the interval just ended.
  CHECK(arena->stats().chunks_free == 4);
  CHECK(another_interval(all_settled, 1) == 0);
  CHECK(arena->stats().chunks_free == 1);
  finish(arena, fake);
}

TEST_CASE("the physical budget caps mapped granules, idle ones included", "[arena]") {
  FakePhysical fake(4);
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 4 * kG + kG / 2);  // 4 granules
  std::vector<Allocation> bufs;
  for (int i = 0; i < 4; ++i) {
    const auto a = arena->allocate(kG, i % 2 ? Lifetime::kShort : Lifetime::kLong);
    REQUIRE(a);
    bufs.push_back(*a);
  }
  CHECK_FALSE(arena->allocate(kG, Lifetime::kLong));
  CHECK_FALSE(arena->allocate(100, Lifetime::kShort));  // a slab needs a granule
  CHECK_FALSE(arena->allocate(5 * kG, Lifetime::kShort));
  CHECK(arena->stats().failures == 3);
  CHECK(arena->free(bufs[2].address));
  CHECK(arena->stats().mapped_bytes == 4 * kG);  // idle memory still counts
  const auto a = arena->allocate(100, Lifetime::kShort);
  const auto b = arena->allocate(200, Lifetime::kLong);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->address / kG == bufs[2].address / kG);  // the slab took the idle granule
  CHECK(b->address / kG == a->address / kG);
  CHECK_FALSE(arena->allocate(kG, Lifetime::kShort));
  CHECK(arena->free(a->address));
  CHECK(arena->free(b->address));
  const auto c = arena->allocate(kG, Lifetime::kShort);  // the empty slab's granule, idle again
  REQUIRE(c);
  CHECK(c->address == bufs[2].address);
  CHECK(arena->stats().chunks_created == 4);
  CHECK(arena->stats().peak_mapped_bytes == 4 * kG);
  finish(arena, fake);
}

TEST_CASE("evict keeps the address, restore maps again at the same addresses", "[arena]") {
  FakePhysical fake(4);
  std::optional<VmmArena> arena(std::in_place, fake, 32 * kG, 4 * kG);
  const auto a = arena->allocate(2 * kG, Lifetime::kShort);
  const auto b = arena->allocate(2 * kG - 4096, Lifetime::kLong);
  REQUIRE(a);
  REQUIRE(b);
  CHECK_FALSE(arena->allocate(4096, Lifetime::kLong));  // b's granules are its own
  CHECK(arena->stats().mapped_bytes == 4 * kG);

  CHECK(arena->evict(a->address));
  CHECK(arena->is_evicted(a->address));
  CHECK_FALSE(arena->evict(a->address));  // already evicted
  CHECK(arena->stats().mapped_bytes == 2 * kG);
  CHECK(arena->stats().evicted_bytes == 2 * kG);
  CHECK(arena->stats().chunks_free == 2);
  CHECK(fake.mapped.count(a->address) == 0);
  CHECK(fake.mapped.count(a->address + kG) == 0);

  // Its VA stays taken: a new buffer goes elsewhere, on the free chunks.
  const auto c = arena->allocate(2 * kG, Lifetime::kShort);
  REQUIRE(c);
  CHECK(c->address + c->bytes == a->address);
  CHECK(arena->stats().chunks_created == 4);

  CHECK_FALSE(arena->restore(a->address));  // budget full
  CHECK(arena->is_evicted(a->address));
  CHECK(arena->free(c->address));
  CHECK_FALSE(arena->restore(a->address));  // c's memory is idle, still mapped
  CHECK(arena->trim(UINT64_MAX, all_settled) == 2);
  CHECK(arena->restore(a->address));
  CHECK_FALSE(arena->is_evicted(a->address));
  CHECK_FALSE(arena->restore(a->address));  // not evicted
  CHECK(fake.mapped.count(a->address) == 1);
  CHECK(fake.mapped.count(a->address + kG) == 1);
  CHECK(arena->stats().evicted_bytes == 0);
  CHECK(arena->stats().chunks_created == 4);

  // An evicted buffer can be freed (its memory is unmapped, not idle); small buffers cannot be evicted.
  CHECK(arena->evict(b->address));
  CHECK(arena->free(b->address));
  CHECK(arena->stats().evicted_bytes == 0);
  CHECK(arena->stats().idle_bytes == 0);
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
  CHECK(arena->trim(UINT64_MAX, all_settled) == 3);
  arena->release_free_chunks(1);
  CHECK(arena->stats().chunks_free == 1);
  arena->release_free_chunks();
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
  CHECK(s.mapped_bytes == kG);  // the slab's granule, idle
  CHECK(s.live_bytes == 0);
  CHECK(s.fragmentation == 1.0);
  CHECK(arena->trim(UINT64_MAX, all_settled) == 1);
  s = arena->stats();
  CHECK(s.mapped_bytes == 0);
  CHECK(s.fragmentation == 0);
  CHECK(s.peak_mapped_bytes == 3 * kG);
  finish(arena, fake);
}

// Extents: a fresh stretch of extent_min granules or more is one mapping, which CUDA unmaps only
// whole. The arena must never unmap part of one (the fake refuses it), keep what a live buffer
// holds, and still give back what is idle.
TEST_CASE("extents: one mapping for a large fresh stretch, unmapped only whole", "[arena]") {
  FakePhysical fake;
  std::optional<VmmArena> arena(std::in_place, fake, 64 * kG, 64 * kG, 4);
  REQUIRE(arena->ok());
  SECTION("reuse in part, trim and evict only what can go whole") {
    const auto big = arena->allocate(10 * kG, Lifetime::kShort);
    REQUIRE(big);
    CHECK(fake.extents_mapped == 1);
    CHECK(fake.map_calls == 1);
    CHECK(fake.mapped.size() == 10);
    CHECK(arena->stats().extents == 1);
    REQUIRE(arena->free(big->address));
    const auto part = arena->allocate(3 * kG, Lifetime::kShort);  // best fit: inside the idle extent
    REQUIRE(part);
    CHECK(part->fresh == 0);
    CHECK(fake.map_calls == 1);
    CHECK(arena->trim(UINT64_MAX, all_settled) == 0);  // a live buffer holds part of the extent
    CHECK(fake.mapped.size() == 10);
    CHECK_FALSE(arena->evict(part->address));  // the extent reaches beyond it: nothing unmapped
    CHECK_FALSE(arena->is_evicted(part->address));
    CHECK(fake.mapped.size() == 10);
    REQUIRE(arena->free(part->address));
    CHECK(arena->trim(1, all_settled) == 10);  // one granule asked: the extent goes whole
    CHECK(fake.mapped.empty());
    CHECK(arena->stats().extents == 0);
    CHECK(arena->stats().mapped_bytes == 0);
  }
  SECTION("a buffer that holds its whole extent is evicted, and restored granule by granule") {
    const auto big = arena->allocate(6 * kG, Lifetime::kLong);
    REQUIRE(big);
    REQUIRE(arena->evict(big->address));
    CHECK(fake.mapped.empty());
    REQUIRE(arena->restore(big->address));
    CHECK(fake.mapped.size() == 6);
    CHECK(fake.extent_of.empty());
    CHECK(fake.map_calls == 7);
    REQUIRE(arena->free(big->address));
    CHECK(arena->trim(UINT64_MAX, all_settled) == 6);
  }
  SECTION("an idle extent stale in part: unmapped whole, its recent part mapped again") {
    const auto probe = arena->allocate(12 * kG, Lifetime::kShort);
    REQUIRE(probe);
    REQUIRE(arena->free(probe->address));
    for (int interval = 0; interval < 3; ++interval) {
      const auto step = arena->allocate(2 * kG, Lifetime::kShort);  // the loop reuses 2 granules
      REQUIRE(step);
      CHECK(step->fresh == 0);
      REQUIRE(arena->free(step->address));
      arena->end_interval(all_settled, 0);
    }
    CHECK(fake.mapped.size() == 2);  // the probe's other 10 granules went back
    CHECK(arena->stats().mapped_bytes == 2 * kG);
    const auto again = arena->allocate(2 * kG, Lifetime::kShort);
    REQUIRE(again);
    CHECK(again->fresh == 0);
    REQUIRE(arena->free(again->address));
  }
  SECTION("a failed extent leaves nothing mapped") {
    fake.fail_create = true;
    CHECK_FALSE(arena->allocate(8 * kG, Lifetime::kShort));
    CHECK(fake.mapped.empty());
    fake.fail_create = false;
    fake.fail_map_after = 0;
    CHECK_FALSE(arena->allocate(8 * kG, Lifetime::kShort));
    CHECK(fake.mapped.empty());
    CHECK(arena->stats().mapped_bytes == 0);
    fake.fail_map_after = -1;
  }
  finish(arena, fake);
}

TEST_CASE("exact extents (under a budget): no buffer takes part of an extent, evict and restore whole", "[arena]") {
  FakePhysical fake;
  VmmArena arena(fake, 64 * kG, 32 * kG, 2, /*exact_extents=*/true);
  REQUIRE(arena.ok());
  const auto a = arena.allocate(4 * kG, Lifetime::kShort);
  REQUIRE(a);
  CHECK(fake.extents_mapped == 1);
  REQUIRE(arena.free(a->address));
  // 3 granules: the idle run of 4 is one extent, which the window would cut: mapped fresh instead.
  const auto b = arena.allocate(3 * kG, Lifetime::kShort);
  REQUIRE(b);
  CHECK(b->fresh == 3);
  CHECK(fake.extents_mapped == 2);
  // A small buffer's slab does not cut it either.
  const auto small = arena.allocate(4096, Lifetime::kShort);
  REQUIRE(small);
  // The same size as the idle extent: reused whole, nothing mapped.
  const auto c = arena.allocate(4 * kG, Lifetime::kShort);
  REQUIRE(c);
  CHECK(c->fresh == 0);
  CHECK(c->address == a->address);
  // Evicted whole (one unmap), restored as one new extent (one map, no granule maps).
  const uint64_t maps = fake.map_calls, extents = fake.extents_mapped;
  REQUIRE(arena.evict(b->address));
  CHECK(arena.is_evicted(b->address));
  CHECK(arena.stats().evicted_bytes == 3 * kG);
  REQUIRE(arena.restore(b->address));
  CHECK_FALSE(arena.is_evicted(b->address));
  CHECK(fake.extents_mapped == extents + 1);
  CHECK(fake.map_calls == maps + 1);
  CHECK(arena.stats().evicted_bytes == 0);
  REQUIRE(arena.evict(c->address));  // the reused extent too
  REQUIRE(arena.restore(c->address));
  for (const auto* x : {&b, &c, &small}) REQUIRE(arena.free((*x)->address));
  CHECK(arena.trim(UINT64_MAX, all_settled) > 0);
  CHECK(fake.errors.empty());
}

TEST_CASE("exact extents: a request takes whole idle extents wherever they lie in an idle run", "[arena]") {
  FakePhysical fake;
  VmmArena arena(fake, 64 * kG, 32 * kG, 2, /*exact_extents=*/true);
  REQUIRE(arena.ok());
  // Short-lived buffers go high: a (4 granules) at the top, b (8) below it, c (6) below b.
  const auto a = arena.allocate(4 * kG, Lifetime::kShort);
  const auto b = arena.allocate(8 * kG, Lifetime::kShort);
  const auto c = arena.allocate(6 * kG, Lifetime::kShort);
  REQUIRE((a && b && c));
  REQUIRE(b->address + 8 * kG == a->address);
  REQUIRE(c->address + 6 * kG == b->address);
  for (const auto* x : {&a, &b, &c}) REQUIRE(arena.free((*x)->address));
  CHECK(arena.stats().idle_bytes == 18 * kG);  // one idle run of three extents: [c 6][b 8][a 4]
  const uint64_t maps = fake.map_calls;
  // 8 granules: not at the run's top (that would cut a and b), but b's extent below it.
  const auto b2 = arena.allocate(8 * kG, Lifetime::kShort);
  REQUIRE(b2);
  CHECK(b2->fresh == 0);
  CHECK(b2->address == b->address);
  // 6 granules from the low end of what is left ([c 6] and [a 4] apart): c's extent.
  const auto c2 = arena.allocate(6 * kG, Lifetime::kLong);
  REQUIRE(c2);
  CHECK(c2->fresh == 0);
  CHECK(c2->address == c->address);
  // 10 granules: a and b together would do, but b is taken: mapped fresh.
  const auto d = arena.allocate(10 * kG, Lifetime::kShort);
  REQUIRE(d);
  CHECK(d->fresh == 10);
  CHECK(fake.map_calls == maps + 1);
  // Each of them is still evicted and restored whole.
  for (const auto* x : {&b2, &c2, &d}) {
    REQUIRE(arena.evict((*x)->address));
    REQUIRE(arena.restore((*x)->address));
    REQUIRE(arena.free((*x)->address));
  }
  CHECK(arena.trim(UINT64_MAX, all_settled) > 0);
  CHECK(fake.errors.empty());
}

TEST_CASE("random workload keeps every invariant", "[arena]") {
  constexpr uint64_t kBudget = 48;
  constexpr uint64_t kRange = 256;
  const uint64_t extent_min = GENERATE(0, 3, 2);
  const bool exact = extent_min == 2;  // under a budget: exact extents (Note [Extents under a budget])
  INFO("extents of " << extent_min << " granules or more" << (exact ? ", exact" : ""));
  FakePhysical fake(kBudget);
  std::optional<VmmArena> arena(std::in_place, fake, kRange * kG, kBudget * kG, extent_min, exact);
  struct Live {
    uint64_t bytes = 0;
    uint64_t requested = 0;
    bool evicted = false;
  };
  std::map<uint64_t, Live> live;
  // Tags of frees into each granule not yet handed to a new owner: an allocation must report them.
  std::map<uint64_t, TagSet> pending;
  std::mt19937_64 rng(12345);
  uint64_t failures = 0, successes = 0, evictions = 0, restores = 0, trimmed = 0, reused_with_waits = 0;
  const auto pick = [&]() {
    auto it = live.begin();
    std::advance(it, static_cast<long>(rng() % live.size()));
    return it;
  };
  const auto granules = [](uint64_t address, uint64_t bytes) {
    std::vector<uint64_t> g;
    for (uint64_t i = (address - kBase) / kG; i <= (address + bytes - 1 - kBase) / kG; ++i) g.push_back(i);
    return g;
  };
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 40 || live.empty()) {
      const uint64_t size = rng() % 2 ? 1 + rng() % (kG - 1) : kG + rng() % (4 * kG);
      const Lifetime lifetime = rng() % 2 ? Lifetime::kLong : Lifetime::kShort;
      TagSet waits;
      const auto a = arena->allocate(size, lifetime, &waits);
      if (!a) {
        ++failures;
        continue;
      }
      ++successes;
      REQUIRE(a->bytes >= size);
      REQUIRE(live.count(a->address) == 0);
      live[a->address] = Live{a->bytes, size, false};
      reused_with_waits += !waits.empty();
      for (uint64_t g : granules(a->address, a->bytes)) {
        for (const FreeTag& t : pending[g].tags()) {
          const auto& w = waits.tags();
          INFO("granule " << g << " tag " << t.stream << ":" << t.seq);
          REQUIRE(std::any_of(w.begin(), w.end(),
                              [&](const FreeTag& x) { return x.stream == t.stream && x.seq >= t.seq; }));
        }
        if (a->bytes >= kG) pending.erase(g);
      }
    } else if (op < 70) {
      const auto it = pick();
      const FreeTag tag{static_cast<uint32_t>(1 + rng() % 3), static_cast<uint64_t>(step)};
      if (!it->second.evicted)
        for (uint64_t g : granules(it->first, it->second.bytes)) pending[g].add(tag);
      REQUIRE(arena->free(it->first, tags({tag})));
      live.erase(it);
    } else if (op < 82) {
      const auto it = pick();
      // An extent that reaches beyond the buffer cannot be unmapped for it.
      bool crosses = false;
      for (uint64_t a = it->first; a < it->first + it->second.bytes; a += kG) {
        const auto e = fake.extent_of.find(a);
        if (e != fake.extent_of.end())
          crosses |=
              e->second.first < it->first || e->second.first + e->second.second * kG > it->first + it->second.bytes;
      }
      const bool can = it->second.bytes >= kG && !it->second.evicted && !crosses;
      REQUIRE(arena->evict(it->first) == can);
      if (can) ++evictions;
      it->second.evicted = it->second.evicted || can;
    } else if (op < 94) {
      const auto it = pick();
      const bool fits = arena->stats().mapped_bytes + it->second.bytes <= kBudget * kG;
      const bool can = it->second.evicted && fits;
      REQUIRE(arena->restore(it->first) == can);
      if (can) ++restores;
      if (can) it->second.evicted = false;
    } else {
      const uint32_t settled_stream = static_cast<uint32_t>(1 + rng() % 3);
      const auto settled = [&](const FreeTag& t) { return t.stream != settled_stream; };
      trimmed += arena->trim(rng() % 16, settled);
      for (auto& [g, t] : pending) t.prune(settled);  // settled tags need no wait from anyone
    }

    const auto s = arena->stats();
    REQUIRE(s.mapped_bytes <= kBudget * kG);
    REQUIRE(s.mapped_bytes == fake.mapped.size() * kG);
    REQUIRE(s.failures == failures);
    REQUIRE(s.allocations == successes);
    uint64_t end = kBase, requested = 0, resident_large = 0;
    std::set<uint64_t> slab_granules;
    for (const auto& [address, buf] : live) {
      REQUIRE(address >= end);  // no overlap, inside the range
      end = address + buf.bytes;
      requested += buf.requested;
      REQUIRE(arena->is_evicted(address) == buf.evicted);
      // Resident buffers are backed by mapped granules; evicted ones by none.
      for (uint64_t g : granules(address, buf.bytes)) {
        REQUIRE(fake.mapped.count(kBase + g * kG) == (buf.evicted ? 0u : 1u));
        if (buf.bytes < kG) slab_granules.insert(g);
      }
      if (buf.bytes >= kG && !buf.evicted) resident_large += buf.bytes;
    }
    REQUIRE(end <= kBase + kRange * kG);
    REQUIRE(s.live_bytes == requested);
    // Mapped memory is resident large buffers, slabs, and idle runs; nothing else.
    REQUIRE(s.slabs == slab_granules.size());
    REQUIRE(s.mapped_bytes == resident_large + s.slabs * kG + s.idle_bytes);
    for (auto it = pending.begin(); it != pending.end();) {  // trimmed granules hold nothing
      it = fake.mapped.count(kBase + it->first * kG) ? std::next(it) : pending.erase(it);
    }
    REQUIRE(fake.errors.empty());
  }
  // The workload exercised every path.
  CHECK(failures > 0);
  // (Fewer evictions with extents: a buffer that shares one with others is not evicted.)
  CHECK(evictions > (extent_min ? 20 : 50));
  CHECK(restores > (extent_min ? 2 : 10));
  if (extent_min) CHECK(arena->stats().extents_created > 50);
  CHECK(trimmed > 20);
  CHECK(reused_with_waits > 100);
  CHECK(arena->stats().chunks_created <= kBudget);
  for (const auto& [address, buf] : live) REQUIRE(arena->free(address));
  CHECK(arena->stats().mapped_bytes == arena->stats().idle_bytes);
  arena->trim(UINT64_MAX, all_settled);
  CHECK(arena->stats().mapped_bytes == 0);
  finish(arena, fake);
}

// The PyTorch allocation traces of tests/data, replayed: a buffer per allocation, idle memory
// trimmed only when an allocation would not fit on the card. The mapped peak must stay near the
// peak of the live buffers (cudaMallocAsync's own pool reserved 1.08-1.21x the live peak in the
// same runs), and the second half of each run (steady-state iterations) must map nothing new.
TEST_CASE("PyTorch allocation traces replayed: mapped peak near the live peak, nothing mapped in steady state",
          "[arena][trace]") {
  constexpr uint64_t kCard = 80ull << 30;
  const uint64_t extent_min = GENERATE(0, 16);  // 16: as vcudnn runs without a budget
  for (const char* name : {"resnet18", "resnet50", "transformer", "mobilenet_v3_small_benchmark"}) {
    const vcudnn::test::AllocTrace trace = vcudnn::test::read_alloc_trace(name);
    INFO(name << ", extents of " << extent_min << " granules or more");
    REQUIRE(trace.allocations > 2000);
    FakePhysical fake(kCard / kG);
    std::optional<VmmArena> arena(std::in_place, fake, 4 * kCard, kCard, extent_min);
    std::map<uint64_t, Allocation> by_id;
    uint64_t live = 0, live_peak = 0, fresh_at_half = 0, trims = 0;
    for (size_t i = 0; i < trace.events.size(); ++i) {
      const auto& e = trace.events[i];
      if (i == trace.events.size() / 2) fresh_at_half = arena->stats().fresh_granules;
      if (!e.allocate) {
        const auto it = by_id.find(e.id);
        REQUIRE(it != by_id.end());
        REQUIRE(arena->free(it->second.address));
        live -= it->second.bytes;
        by_id.erase(it);
        continue;
      }
      const Lifetime lifetime = e.stream_ordered ? Lifetime::kShort : Lifetime::kLong;
      auto a = arena->allocate(e.bytes, lifetime);
      if (!a) {
        ++trims;
        arena->trim(UINT64_MAX, all_settled);
        a = arena->allocate(e.bytes, lifetime);
      }
      REQUIRE(a);
      by_id[e.id] = *a;
      live += a->bytes;
      live_peak = std::max(live_peak, live);
    }
    const auto s = arena->stats();
    const double ratio = double(s.peak_mapped_bytes) / double(live_peak);
    WARN(name << " (extents of " << extent_min << "+): peak mapped " << s.peak_mapped_bytes / double(1 << 30)
              << " GiB, live peak " << live_peak / double(1 << 30) << " GiB (x" << ratio << "), torch reserved "
              << trace.torch_max_reserved / double(1 << 30) << " GiB; fresh granules " << s.fresh_granules
              << ", in the second half " << s.fresh_granules - fresh_at_half << "; trims " << trims << "; extents "
              << s.extents_created << ", backend map calls " << fake.map_calls);
    CHECK(ratio <= 1.03);
    CHECK(double(s.peak_mapped_bytes) <= 1.15 * double(trace.torch_max_reserved));  // issue 9's bound
    CHECK(s.fresh_granules - fresh_at_half == 0);
    CHECK(fake.errors.empty());
    for (const auto& [id, a] : by_id) arena->free(a.address);
    finish(arena, fake);
  }
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
  // Spaces around, and between the number and its unit, as every byte count (parse_byte_count).
  CHECK(parse_budget(" 1G", kTotal) == 1ull << 30);
  CHECK(parse_budget("1G ", kTotal) == 1ull << 30);
  CHECK(parse_budget("64 M", kTotal) == 64ull << 20);

  for (const char* bad : {"",     "-1",     "-5%",  "abc", "12X",   "G", "1.5G", "0",         "0%",
                          "0.0%", "100.5%", "101%", "1e3", "1 G B", "%", "5.%",  "16777216T", "18446744073709551616",
                          "1GG",  "60%%"}) {
    INFO(bad);
    CHECK_FALSE(parse_budget(bad, kTotal));
  }
  CHECK_FALSE(parse_budget("50%", 0));
}
