// PlacedPool (pool/placed_pool.h) on the simulated device: slots that share pool bytes show the same
// bytes through their own ranges, a slot is refused while another buffer holds its bytes, evicted
// slots come back onto their bytes or onto an extent of their own, and a steady loop maps nothing.
#include "pool/placed_pool.h"

#include <catch2/catch.hpp>

#include "tests/cpu/sim_device.h"

using namespace vcudnn;
using pool::PlacedPool;

namespace {

constexpr uint64_t kG = 4096;  // the simulated granule
const memory::Stream kS = test::SimDevice::stream(1);

bool never(const void*) { return false; }

PlacedPool::Slot slot(uint64_t offset, uint64_t granules, uint64_t kept = 0,
                      std::vector<PlacedPool::Segment> segments = {}) {
  return {offset, granules, kept, std::move(segments)};
}

// Pool of 6 granules, blocks [0,2) [2,6); slot 0 at 0..4 (its range shows both blocks, its address
// the first), slot 1 at 0..2, slot 2 at 4..6 (its range shows block [2,6), its address 2 granules in).
PlacedPool make(test::SimDevice& dev) {
  return PlacedPool(dev, kG, {0, 2, 6}, {slot(0, 4), slot(0, 2), slot(4, 2), slot(0, 0)});
}

}  // namespace

TEST_CASE("placed pool: slots sharing pool bytes show the same bytes, each through its own range", "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool p = make(dev);
  REQUIRE(p.ok());
  CHECK_FALSE(p.placed(3));
  CHECK(p.missing_bytes(0) == 6 * kG);  // both blocks
  int a = 0, b = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  CHECK(p.held_bytes() == 6 * kG);
  CHECK(p.missing_bytes(2) == 0);
  CHECK(waits.empty());
  CHECK(p.slot_at(p.address(0)) == 0);
  CHECK(p.slot_at(p.address(2)) == 2);
  CHECK(p.address(2) % kG == 0);
  CHECK(p.slot_at(p.address(0) + kG) == -1);
  // Its range shows both blocks whole (the driver maps whole allocations only).
  CHECK(dev.mapped_granules() == 6);
  CHECK(p.stats().mappings == 2);
  // Slot 1 shares slot 0's first two granules: refused while `a` holds them.
  CHECK(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kBusy);
  CHECK(p.stats().busy == 1);
  // Slot 2 shares nothing with slot 0.
  int c = 0;
  REQUIRE(p.take(2, &c, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.write(kS, p.address(0), 2 * kG, 7);
  p.release(0, &a, [] {
    pool::TagSet t;
    t.add({3, 11});
    return t;
  }());
  waits.clear();
  REQUIRE(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kOk);
  REQUIRE(waits.tags().size() == 1);  // ordered after `a`'s free
  CHECK(waits.tags()[0] == pool::FreeTag{3, 11});
  // The same physical granules through both ranges: what was written through slot 0 is there.
  dev.check(kS, p.address(1), 2 * kG, 7);
  dev.write(kS, p.address(1), kG, 9);
  dev.check(kS, p.address(0), kG, 9);
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
  CHECK(dev.mapped_granules() == 6);  // physical: slot 1's range maps granules slot 0's does too
}

TEST_CASE(
    "placed pool: a buffer being copied out hands its bytes over, and an evicted slot comes back onto its "
    "bytes or onto an extent of its own",
    "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool p = make(dev);
  int a = 0, b = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.write(kS, p.address(0), 4 * kG, 5);
  // `a` is being copied out: the caller lets `b` take its bytes.
  REQUIRE(p.take(
              1, &b, &waits, [&](const void* o) { return o == &a; }, &over) == PlacedPool::Result::kOk);
  REQUIRE(over.size() == 1);
  CHECK(over[0].owner == &a);
  CHECK(over[0].reach == 2 * kG);  // its first two granules
  dev.run_all();
  // The copy out has finished: `a`'s range goes; the granules `b` took stay `b`'s.
  pool::TagSet out;
  out.add({4, 1});
  REQUIRE(p.evict(0, &a, out));
  CHECK_FALSE(p.is_mapped(0));
  const uint64_t mappings = p.stats().mappings;
  // Back while `b` holds part of its bytes: refused, then onto an extent of its own.
  CHECK(p.restore(0, &a, &waits) == PlacedPool::Result::kBusy);
  REQUIRE(p.restore_detached(0));
  CHECK(p.is_mapped(0));
  CHECK(p.held_bytes() == 10 * kG);
  CHECK(p.stats().detached == 1);
  // Freed: the extent goes once its work is settled.
  pool::TagSet freed;
  freed.add({1, 20});
  p.release(0, &a, freed);
  CHECK(p.reap([](const pool::FreeTag&) { return false; }) == 0);
  CHECK(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kBusy);  // until then
  CHECK(p.reap([](const pool::FreeTag&) { return true; }) == 4 * kG);
  CHECK(p.held_bytes() == 6 * kG);
  // `b` freed: slot 0 takes its pool bytes again, mapping its range anew (the detached one went).
  p.release(1, &b, freed);
  waits.clear();
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  CHECK(p.stats().mappings == mappings + 1 + 2);  // the extent, then the two pieces
  // Evicted and back onto its own bytes when no one holds them: ordered after its copy out.
  REQUIRE(p.evict(0, &a, out));
  waits.clear();
  REQUIRE(p.restore(0, &a, &waits) == PlacedPool::Result::kOk);
  CHECK(p.is_mapped(0));
  REQUIRE_FALSE(waits.empty());
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
}

// Note [Back before the copy out ended]: a slot still mapped takes back the bytes it handed over
// once their holder gave them back, ordered after that free, with no driver call.
TEST_CASE("placed pool: a slot still mapped takes its handed-over bytes back without mapping", "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool p = make(dev);
  int a = 0, b = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  REQUIRE(p.take(
              1, &b, &waits, [&](const void* o) { return o == &a; }, &over) == PlacedPool::Result::kOk);
  const uint64_t mappings = p.stats().mappings;
  CHECK(p.reclaim(0, &a, &waits) == PlacedPool::Result::kBusy);  // `b` holds part of them
  pool::TagSet freed;
  freed.add({1, 30});
  p.release(1, &b, freed);
  waits.clear();
  REQUIRE(p.reclaim(0, &a, &waits) == PlacedPool::Result::kOk);
  REQUIRE(waits.tags().size() == 1);
  CHECK(waits.tags()[0] == pool::FreeTag{1, 30});
  CHECK(p.stats().mappings == mappings);
  CHECK(p.holders(0, &a).empty());
  // `b` cannot take them again while `a` holds them; an evicted slot has nothing to reclaim.
  CHECK(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kBusy);
  REQUIRE(p.evict(0, &a, freed));
  CHECK(p.reclaim(0, &a, &waits) == PlacedPool::Result::kFailed);
}

TEST_CASE("placed pool: a steady loop of the same slots maps nothing after the first round", "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool p = make(dev);
  int a = 0, b = 0, c = 0;
  uint64_t after_first = 0;
  for (int round = 0; round < 5; ++round) {
    pool::TagSet waits, tags;
    tags.add({1, static_cast<uint64_t>(round + 1)});
    std::vector<PlacedPool::HandOver> over;
    REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
    REQUIRE(p.take(2, &c, &waits, never, &over) == PlacedPool::Result::kOk);
    p.release(0, &a, tags);
    REQUIRE(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kOk);
    p.release(1, &b, tags);
    p.release(2, &c, tags);
    if (round == 0) after_first = dev.maps;
  }
  CHECK(dev.maps == after_first);
  CHECK(p.stats().blocks_created == 2);
  CHECK(p.stats().unmappings == 0);
}

// Note [Moving part of a buffer]: a slot that keeps its first granules leaves with its moving part
// only: the kept part stays mapped and its own, its moving part's granules serve another slot in its
// absence, and it comes back onto them (or onto an extent of that part's size) with every byte.
TEST_CASE("placed pool: a slot that keeps part of itself leaves and comes back with its moving part only",
          "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  // Pool of 6 granules, blocks [0,2) [2,4) [4,6); slot 0 at 0..4 keeping 2, slot 1 at 2..4, slot 2 at 0..2.
  PlacedPool p(dev, kG, {0, 2, 4, 6}, {slot(0, 4, 2), slot(2, 2), slot(0, 2)});
  REQUIRE(p.ok());
  CHECK(p.kept_bytes(0) == 2 * kG);
  CHECK(p.kept_bytes(1) == 0);
  int a = 0, b = 0, c = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.write(kS, p.address(0), 2 * kG, 3);           // the kept part
  dev.write(kS, p.address(0) + 2 * kG, 2 * kG, 4);  // the moving part
  dev.run_all();
  // Out: only the moving part's range is unmapped, only its granules are free.
  pool::TagSet out;
  out.add({4, 1});
  const uint64_t unmappings = p.stats().unmappings;
  REQUIRE(p.evict(0, &a, out));
  CHECK(p.stats().unmappings == unmappings + 1);
  CHECK_FALSE(p.is_mapped(0));
  dev.check(kS, p.address(0), 2 * kG, 3);  // still mapped, still its bytes
  CHECK(p.holders(0, &a).empty());
  // The kept part's granules are still `a`'s: slot 2 cannot take them; slot 1 takes the moving part's.
  CHECK(p.take(2, &c, &waits, never, &over) == PlacedPool::Result::kBusy);
  waits.clear();
  REQUIRE(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kOk);
  REQUIRE(waits.tags().size() == 1);  // after the copy out
  dev.write(kS, p.address(1), 2 * kG, 9);
  CHECK(p.restore(0, &a, &waits) == PlacedPool::Result::kBusy);
  CHECK(p.holders(0, &a) == std::vector<const void*>{&b});
  // Back onto an extent of the moving part's size while `b` holds its bytes.
  REQUIRE(p.restore_detached(0));
  CHECK(p.held_bytes() == 6 * kG);  // blocks [0,2) and [2,4), and the extent
  CHECK(p.is_mapped(0));
  dev.write(kS, p.address(0) + 2 * kG, 2 * kG, 5);
  dev.check(kS, p.address(0), 2 * kG, 3);
  dev.check(kS, p.address(1), 2 * kG, 9);
  // Out again, then back onto its own pool bytes once `b` freed them.
  dev.run_all();
  REQUIRE(p.evict(0, &a, out));
  CHECK(p.held_bytes() == 4 * kG);
  pool::TagSet freed;
  freed.add({1, 7});
  p.release(1, &b, freed);
  waits.clear();
  REQUIRE(p.restore(0, &a, &waits) == PlacedPool::Result::kOk);
  CHECK_FALSE(waits.empty());
  dev.check(kS, p.address(0), 2 * kG, 3);
  // Freed: every granule, the kept ones too, serves others.
  p.release(0, &a, freed);
  REQUIRE(p.take(2, &c, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
}

TEST_CASE("placed pool: a kept part without a block boundary where the moving part begins moves whole",
          "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool p(dev, kG, {0, 4}, {slot(0, 4, 2)});
  REQUIRE(p.ok());
  CHECK(p.kept_bytes(0) == 0);
}

// Note [Buffers in pieces]: a slot whose granules lie in two parts of the pool shows them one after
// the other in its range; each part is the pool's bytes that other slots there see, and with a kept
// part only the moving piece leaves.
TEST_CASE("placed pool: a slot in pieces shows them in its order, and its moving piece alone leaves", "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  // Blocks [0,2) [2,4) [4,6); slot 0: pool [4,6) then [0,2), keeping its first 2 granules; slot 1 at
  // [0,2); slot 2 at [4,6); slot 3 in pieces whose joint is no block boundary: not placed.
  PlacedPool p(dev, kG, {0, 2, 4, 6},
               {slot(4, 4, 2, {{4, 2}, {0, 2}}), slot(0, 2), slot(4, 2), slot(0, 3, 0, {{0, 1}, {4, 2}})});
  REQUIRE(p.ok());
  CHECK(p.placed(0));
  CHECK_FALSE(p.placed(3));
  CHECK(p.kept_bytes(0) == 2 * kG);
  int a = 0, b = 0, c = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  CHECK(p.held_bytes() == 4 * kG);  // its two blocks, not [2,4)
  for (uint32_t k = 0; k < 4; ++k) dev.write(kS, p.address(0) + k * kG, kG, 10 + k);
  dev.run_all();
  // Out: its moving piece (pool [0,2)) only; slot 1 takes those bytes and sees what it left there.
  pool::TagSet out;
  out.add({4, 1});
  REQUIRE(p.evict(0, &a, out));
  dev.check(kS, p.address(0), kG, 10);                                      // the kept piece is still mapped
  CHECK(p.take(2, &c, &waits, never, &over) == PlacedPool::Result::kBusy);  // kept: still `a`'s
  REQUIRE(p.take(1, &b, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.check(kS, p.address(1), kG, 12);
  dev.check(kS, p.address(1) + kG, kG, 13);
  dev.write(kS, p.address(1), 2 * kG, 20);
  dev.run_all();
  pool::TagSet freed;
  freed.add({1, 5});
  p.release(1, &b, freed);
  waits.clear();
  REQUIRE(p.restore(0, &a, &waits) == PlacedPool::Result::kOk);
  dev.check(kS, p.address(0) + kG, kG, 11);
  dev.check(kS, p.address(0) + 2 * kG, 2 * kG, 20);  // the pool's bytes, as slot 1 left them
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
}

TEST_CASE("placed pool: a hand-over says how far into the moving part, in its range's order, the new buffer reaches",
          "[placed_pool]") {
  // Blocks [0,2) [2,4); slot 1 at [2,4), slot 2 at [0,2); slot 0 all four granules, either in pool
  // order or its second block first. Note [Copies out in pieces]: the new buffer waits for the
  // copy out to have read that far.
  for (const bool reversed : {false, true}) {
    CAPTURE(reversed);
    test::SimDevice dev(kG, 100);
    PlacedPool p(dev, kG, {0, 2, 4}, {reversed ? slot(2, 4, 0, {{2, 2}, {0, 2}}) : slot(0, 4), slot(2, 2), slot(0, 2)});
    REQUIRE(p.placed(0));
    int a = 0, b = 0, c = 0;
    pool::TagSet waits;
    std::vector<PlacedPool::HandOver> over;
    REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
    CHECK(over.empty());
    const auto copying = [&](const void* o) { return o == &a; };
    REQUIRE(p.take(1, &b, &waits, copying, &over) == PlacedPool::Result::kOk);
    REQUIRE(over.size() == 1);
    CHECK(over[0].owner == &a);
    CHECK(over[0].reach == (reversed ? 2 : 4) * kG);
    over.clear();
    REQUIRE(p.take(2, &c, &waits, copying, &over) == PlacedPool::Result::kOk);
    REQUIRE(over.size() == 1);
    CHECK(over[0].reach == (reversed ? 4 : 2) * kG);
    CHECK(p.stats().handovers == 2);
  }
}

// Note [Across the iteration's end] (planner/offload_plan.h): a buffer alive through the iteration
// keeps the address the program holds, so its slot's range is its own (external): adopted while the
// buffer is away, then evicted and restored like any placed slot, sharing pool bytes with others.
TEST_CASE("placed pool: an external slot takes a buffer at its own address and shares pool bytes", "[placed_pool]") {
  test::SimDevice dev(kG, 100);
  PlacedPool::Slot outside = slot(2, 4);
  outside.external = true;
  PlacedPool::Slot straddling = slot(0, 4);  // not whole blocks: not placed
  straddling.external = true;
  PlacedPool p(dev, kG, {0, 2, 6}, {slot(0, 4), outside, straddling});
  REQUIRE(p.ok());
  CHECK(p.external(1));
  CHECK_FALSE(p.placed(2));
  int a = 0, x = 0, y = 0;
  pool::TagSet waits;
  std::vector<PlacedPool::HandOver> over;
  CHECK(p.take(1, &x, &waits, never, &over) == PlacedPool::Result::kFailed);  // only adopted
  uint64_t va = 0;
  REQUIRE(dev.reserve(4 * kG, &va));  // the buffer's own range, as the arena holds it
  CHECK_FALSE(p.adopt(0, &x, va));    // not external
  REQUIRE(p.adopt(1, &x, va));
  CHECK_FALSE(p.adopt(1, &y, va));  // has its buffer
  CHECK(p.address(1) == va);
  CHECK(p.slot_at(va) == 1);
  REQUIRE(p.restore(1, &x, &waits) == PlacedPool::Result::kOk);
  dev.write(kS, va, 4 * kG, 5);
  dev.check(kS, va, 4 * kG, 5);
  dev.run_all();  // its copy out has read it
  // Away again: slot 0 takes the pool bytes it shares (block [2,6)) in its absence.
  REQUIRE(p.evict(1, &x, {}));
  REQUIRE(p.take(0, &a, &waits, never, &over) == PlacedPool::Result::kOk);
  dev.write(kS, p.address(0), 4 * kG, 8);
  // Back while slot 0 holds them: refused; after its free, onto the same bytes, ordered after it.
  CHECK(p.restore(1, &x, &waits) == PlacedPool::Result::kBusy);
  p.release(0, &a, [] {
    pool::TagSet t;
    t.add({4, 2});
    return t;
  }());
  waits.clear();
  REQUIRE(p.restore(1, &x, &waits) == PlacedPool::Result::kOk);
  REQUIRE(waits.tags().size() == 1);
  CHECK(waits.tags()[0] == pool::FreeTag{4, 2});
  dev.write(kS, va, 4 * kG, 6);
  dev.check(kS, p.address(0) + 2 * kG, 2 * kG, 6);  // the same physical granules
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
}
