// MemoryManager on a simulated GPU (sim_device.h) whose streams run only when the test lets them,
// so the device lags the host as a real one does, and whose memory is real bytes: the tests check
// the bytes every kernel reads, that nothing is unmapped under queued work, and that the budget
// holds. Covered: reuse across sizes and streams (ordered by events), least-recently-used eviction
// and fault-in without host synchronisation, buffers that must never be evicted, impossible
// budgets, host waits counted by cause, a multi-threaded stress test, and PyTorch allocation traces
// replayed through the manager.
#include "runtime/memory_manager.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/memory/call_scope.h"
#include "tests/cpu/alloc_trace.h"
#include "tests/cpu/manager_fixture.h"
#include "tests/cpu/sim_device.h"

using namespace vcudnn;
using namespace vcudnn::memory;
using vcudnn::test::SimDevice;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kG = 2 * kMiB;  // as on the H100

Stream stream_n(uintptr_t n) { return SimDevice::stream(n); }

ManagerConfig config(std::optional<uint64_t> budget, uint64_t granularity = kG) {
  return test::manager_config(budget, granularity);
}

// What a hook does: report the pointer, then queue the kernel (inside one call scope).
struct Program {
  MemoryManager& m;
  SimDevice& dev;
  bool write(uint64_t va, uint64_t bytes, uint32_t seed, Stream s) {
    CallScope scope;
    if (!m.touch(&va, 1, Access::kWrite, s, "kernel")) return false;
    dev.write(s, va, bytes, seed);
    return true;
  }
  bool check(uint64_t va, uint64_t bytes, uint32_t seed, Stream s) {
    CallScope scope;
    if (!m.touch(&va, 1, Access::kRead, s, "kernel")) return false;
    dev.check(s, va, bytes, seed);
    return true;
  }
};

#define CHECK_MSG_ERRORS(dev)    \
  do {                           \
    INFO((dev).first_errors());  \
    CHECK((dev).errors.empty()); \
  } while (0)

// CallScope arms only while ownership is on.
using Active = test::MemoryActive;

}  // namespace

namespace {
int g_call_ends = 0;
void count_call_end(void* arg) { g_call_ends += *static_cast<int*>(arg); }
}  // namespace

// The recorder times a call with an event recorded once its hook's real call has queued its work.
TEST_CASE("call scope: at_call_end runs once, when the outermost CallScope ends, never for a bare touch",
          "[memory]") {
  int one = 1;
  g_call_ends = 0;
  {
    Active active;
    CHECK_FALSE(at_call_end(count_call_end, &one));  // no hook's call open
    {
      TouchScope touch;  // a touch outside a hook's call
      CHECK_FALSE(at_call_end(count_call_end, &one));
    }
    CHECK(g_call_ends == 0);
    {
      CallScope outer;
      {
        CallScope inner;  // cuBLAS calling its own exported functions
        TouchScope touch;
        CHECK(at_call_end(count_call_end, &one));
        CHECK_FALSE(at_call_end(count_call_end, &one));  // one per call
      }
      CHECK(g_call_ends == 0);  // the real call has not returned yet
    }
    CHECK(g_call_ends == 1);
    {
      CallScope again;
      CHECK(at_call_end(count_call_end, &one));  // free again for the next call
    }
    CHECK(g_call_ends == 2);
  }
  CallScope unarmed;  // ownership off: the scope does nothing
  CHECK_FALSE(at_call_end(count_call_end, &one));
}

TEST_CASE("memory manager: without a budget, memory is served, tracked and reused across sizes and streams",
          "[memory]") {
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  REQUIRE(m.ok());
  const auto a = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
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

  // Freed on stream 1, its memory serves a smaller request on stream 1 at once: no mapping, no wait.
  CHECK(m.free(*a, stream_n(1)));
  CHECK_FALSE(m.owns(*a));
  CHECK_FALSE(m.free(*a, stream_n(1)));  // double free: not ours any more
  CHECK(m.stats().idle == 6 * kMiB);
  const uint64_t mapped = dev.mapped_granules();
  const auto smaller = m.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(smaller);
  CHECK(*smaller >= *a);
  CHECK(*smaller < *a + 6 * kMiB);
  CHECK(dev.mapped_granules() == mapped);
  CHECK(dev.stream_waits == 0);
  CHECK(dev.queued() == 0);  // and no event either

  // Reused on another stream: that stream waits (on the device) for the free on stream 1.
  CHECK(m.free(*smaller, stream_n(1)));
  const auto other = m.allocate(4 * kMiB, stream_n(2), Origin::kFramework);
  REQUIRE(other);
  CHECK(*other == *smaller);
  CHECK(dev.stream_waits == 1);
  CHECK(dev.host_waits == 0);

  // cudaMalloc (usable on every stream at once) reusing memory freed on a stream: the host waits
  // for that free, counted.
  CHECK(m.free(*other, stream_n(2)));
  const auto sync = m.allocate(4 * kMiB, std::nullopt, Origin::kFramework);
  REQUIRE(sync);
  CHECK(m.host_waits().get(HostWait::k_sync_allocation) >= 1);

  const ManagerStats s = m.stats();
  CHECK(s.allocations == 5);
  CHECK(s.frees == 3);
  CHECK(s.reused == 3);
  CHECK(s.fresh_bytes == 6 * kMiB + kG);  // a's granules and one slab
  CHECK(s.evictions == 0);
  CHECK(s.budget == 0);
  CHECK(m.summary().find("allocations=5") != std::string::npos);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

TEST_CASE("memory manager: cudaMemGetInfo counts idle memory as free", "[memory]") {
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  const auto a = m.allocate(10 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  CHECK(m.memory_info(100 * kMiB, 1000 * kMiB) == std::make_pair(100 * kMiB, 1000 * kMiB));
  CHECK(m.free(*a, stream_n(1)));
  CHECK(m.memory_info(100 * kMiB, 1000 * kMiB) == std::make_pair(110 * kMiB, 1000 * kMiB));

  SimDevice dev2(kG, 8);
  MemoryManager budgeted(dev2, dev2, dev2, config(8 * kG));
  const auto b = budgeted.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(b);
  CHECK(budgeted.budget_info() == std::make_pair(10 * kMiB, 16 * kMiB));
  CHECK(budgeted.free(*b, stream_n(1)));
  CHECK(budgeted.budget_info() == std::make_pair(16 * kMiB, 16 * kMiB));

  // Live bytes beyond the budget (evicted buffers): PyTorch's cudaMallocAsync backend asserts
  // free + its own bytes <= total, so the total grows with them.
  std::vector<uint64_t> live;
  for (int i = 0; i < 3; ++i) {
    const auto c = budgeted.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
    REQUIRE(c);
    live.push_back(*c);
  }
  const auto [free, total] = budgeted.budget_info();
  CHECK(budgeted.stats().evicted_now > 0);
  CHECK(free + 18 * kMiB <= total);
  CHECK(total > 16 * kMiB);
  for (uint64_t c : live) CHECK(budgeted.free(c, stream_n(1)));
  CHECK(budgeted.budget_info().second == 16 * kMiB);
}

TEST_CASE(
    "memory manager: over the budget, the least recently used buffer goes to the host and comes back intact, "
    "ordered by events",
    "[memory]") {
  Active on;
  SimDevice dev(kG, 8);  // the device itself fails the test if more than 8 granules are ever mapped
  MemoryManager m(dev, dev, dev, config(8 * kG));
  Program p{m, dev};
  REQUIRE(m.ok());
  std::vector<uint64_t> bufs;
  for (uint32_t i = 0; i < 4; ++i) {
    const uint64_t bytes = 4 * kMiB - 100 * i;  // odd sizes
    const auto a = m.allocate(bytes, stream_n(1), Origin::kFramework);
    REQUIRE(a);
    REQUIRE(p.write(*a, bytes, i, stream_n(1)));
    bufs.push_back(*a);
  }
  CHECK(dev.mapped_granules() == 8);
  // Buffer 0 is now the most recently used; buffer 1 the least. Nothing has run on the device yet:
  // the eviction copy must wait for the queued writes.
  REQUIRE(p.check(bufs[0], 4 * kMiB, 0, stream_n(1)));
  const auto e = m.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(e);
  CHECK(m.stats().evictions >= 1);
  CHECK(m.stats().evicted_now >= 4 * kMiB - 100);
  CHECK(m.host_waits().get(HostWait::k_eviction) >= 1);  // the allocation needed the copy's memory now
  CHECK(dev.stream_waits >= 1);                          // the copy waited for stream 1 on the device
  CHECK(m.evict(bufs[1]) == EvictResult::kAlreadyEvicted);
  REQUIRE(p.write(*e, 4 * kMiB, 9, stream_n(1)));

  // An access from stream 3 brings it back first, at the same address; stream 3 waits for the
  // copy back on the device, the host does not.
  dev.run_all();
  const uint64_t waits_before = m.host_waits().total();
  REQUIRE(p.check(bufs[1], 4 * kMiB - 100, 1, stream_n(3)));
  CHECK(m.host_waits().total() == waits_before);
  CHECK(m.stats().fault_ins == 1);
  CHECK(m.stats().restores == 1);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
  CHECK(m.stats().peak_mapped <= 8 * kG);
}

TEST_CASE("memory manager: evictions start ahead of need, so a device that keeps up never makes the host wait",
          "[memory]") {
  Active on;
  constexpr uint64_t kBudget = 64;
  constexpr uint64_t kSmallG = 64 * 1024;  // small granules keep the byte checks cheap
  constexpr uint64_t kWeights = 24 * kSmallG;
  constexpr uint64_t kAct = 4 * kSmallG;
  SimDevice dev(kSmallG, kBudget);
  MemoryManager m(dev, dev, dev, config(kBudget * kSmallG, kSmallG));
  Program p{m, dev};
  // A "training loop": weights of 24 granules read at every step, 12 activations of 4 granules a
  // step (72 granules in all, the budget is 64), read back in reverse and freed. The device finishes
  // what was queued before each host step, as a GPU that keeps up with the host would. An
  // eviction started only when an allocation needs the room would make the host wait for its copy.
  const auto weights = m.allocate(kWeights, stream_n(1), Origin::kFramework);
  REQUIRE(weights);
  REQUIRE(p.write(*weights, kWeights, 77, stream_n(1)));
  for (int it = 0; it < 8; ++it) {
    std::vector<uint64_t> acts;
    for (uint32_t i = 0; i < 12; ++i) {
      dev.run_all();
      const auto a = m.allocate(kAct, stream_n(1), Origin::kFramework);
      REQUIRE(a);
      REQUIRE(p.check(*weights, kWeights, 77, stream_n(1)));
      REQUIRE(p.write(*a, kAct, 1000 * it + i, stream_n(1)));
      acts.push_back(*a);
    }
    for (uint32_t i = 12; i-- > 0;) {
      dev.run_all();
      REQUIRE(p.check(acts[i], kAct, 1000 * it + i, stream_n(1)));
      REQUIRE(m.free(acts[i], stream_n(1)));
    }
  }
  dev.run_all();
  INFO(m.summary());
  CHECK(m.stats().evictions > 0);
  CHECK(m.stats().fault_ins > 0);
  CHECK(m.host_waits().total() == 0);
  CHECK(dev.host_waits == 0);
  CHECK_MSG_ERRORS(dev);
  CHECK(dev.peak_mapped_granules() <= kBudget);
}

// The Residency mechanism alone on the simulated device: 64 granules, 64 MiB of pinned host memory.
struct ResidencyRig {
  SimDevice dev{kG, 64};
  pool::VmmArena arena{dev, 64 * kG, 64 * kG, 2, /*exact_extents=*/true};
  pool::HostPool host{dev, 64 * kMiB, 8 * kMiB};
  StreamOrder order{dev};
  Residency residency{arena, host, dev, order};
};

TEST_CASE("residency: a copy back runs on its own stream, never behind copies out still waiting", "[memory]") {
  ResidencyRig rig;
  auto& [dev, arena, host, order, residency] = rig;
  REQUIRE(host.reserve(64 * kMiB));
  const Stream s = test::SimDevice::stream(1);
  const auto buffer = [&](Buffer& b) {
    const auto a = arena.allocate(4 * kG, pool::Lifetime::kShort);
    REQUIRE(a);
    b.address = a->address, b.bytes = 4 * kG, b.span = a->bytes, b.large = true;
    b.streams.store(StreamOrder::bit_of(order.id_of(s)));
  };
  // y: written, copied out and unmapped.
  Buffer y, x;
  buffer(y);
  dev.write(s, y.address, y.bytes, 11);
  y.state.store(BufferState::kEvicting);  // as the manager marks its victims
  REQUIRE(residency.start_eviction({&y}).size() == 1);
  CHECK_FALSE(order.settled(y.copied_out));  // fenced now
  dev.run_all();
  REQUIRE(residency.finish_eviction(&y));
  // x: a kernel writing it is queued and has not run; its copy out waits for it on the device.
  buffer(x);
  dev.write(s, x.address, x.bytes, 22);
  x.state.store(BufferState::kEvicting);
  REQUIRE(residency.start_eviction({&x}).size() == 1);
  // y comes back meanwhile: its copy runs at once on the in stream, ahead of x's copy out.
  REQUIRE(residency.restore(&y, std::nullopt));
  CHECK(dev.run_stream(dev.in_stream()) > 0);
  CHECK(order.settled(y.ready));
  CHECK_FALSE(order.settled(x.copied_out));  // fenced now
  dev.check(s, y.address, y.bytes, 11);
  dev.run_all();
  CHECK(order.settled(x.copied_out));
  REQUIRE(residency.finish_eviction(&x));
  CHECK_MSG_ERRORS(dev);
}

// Note [Exact fences for vcudnn's copies]: a stream ordered after one copy out waits for that copy,
// not for the copies queued behind it.
TEST_CASE("residency: waiting for one copy out does not wait for the copies queued after it", "[memory]") {
  ResidencyRig rig;
  auto& [dev, arena, host, order, residency] = rig;
  REQUIRE(host.reserve(64 * kMiB));
  const Stream s = test::SimDevice::stream(1), w = test::SimDevice::stream(2);
  const Stream out = dev.out_stream();
  Buffer x, y;
  for (Buffer* b : {&x, &y}) {
    const auto a = arena.allocate(4 * kG, pool::Lifetime::kShort);
    REQUIRE(a);
    b->address = a->address, b->bytes = 4 * kG, b->span = a->bytes, b->large = true;
    b->streams.store(StreamOrder::bit_of(order.id_of(s)));
    dev.write(s, b->address, b->bytes, 5);
  }
  x.state.store(BufferState::kEvicting);
  REQUIRE(residency.start_eviction({&x}).size() == 1);
  const size_t x_ops = dev.queued(out);  // x's copy and what orders it
  y.state.store(BufferState::kEvicting);
  REQUIRE(residency.start_eviction({&y}).size() == 1);
  REQUIRE(dev.queued(out) > x_ops);
  // Another stream (a buffer placed over x's bytes) is ordered after x's copy alone.
  REQUIRE(order.order(w, x.copied_out));
  dev.write(w, x.address, kG, 9);
  dev.run_stream(s);
  CHECK(dev.run_stream(out, static_cast<int>(x_ops)) == static_cast<int>(x_ops));
  CHECK(dev.queued(out) > 0);  // y's copy has not run
  dev.run_stream(w);
  CHECK(dev.queued(w) == 0);  // the wait passed with x's copy done
  dev.run_all();
  CHECK(order.settled(y.copied_out));
  CHECK_MSG_ERRORS(dev);
}

// Note [Copies out in pieces]: a placed buffer's copy out is fenced piece by piece, and a buffer given
// its first bytes waits for the pieces holding them alone; one given later bytes waits for theirs.
TEST_CASE("residency: a placed buffer's copy out goes in pieces, each waited for alone", "[memory]") {
  ResidencyRig rig;
  auto& [dev, arena, host, order, residency] = rig;
  REQUIRE(host.reserve(64 * kMiB));
  residency.set_copy_piece(2 * kG);
  const Stream s = stream_n(1), first = stream_n(2), later = stream_n(3);
  const Stream out = dev.out_stream();
  pool::PlacedPool placed(dev, kG, {0, 4}, {{0, 4, 0, {}}});
  REQUIRE(placed.ok());
  Buffer x;
  pool::TagSet waits;
  REQUIRE(placed.take(
              0, &x, &waits, [](const void*) { return false; }, nullptr) == pool::PlacedPool::Result::kOk);
  x.address = placed.address(0), x.bytes = 4 * kG, x.span = 4 * kG, x.large = true;
  x.placed_pool = &placed;
  x.streams.store(StreamOrder::bit_of(order.id_of(s)));
  dev.write(s, x.address, x.bytes, 5);
  x.state.store(BufferState::kEvicting);
  REQUIRE(residency.start_eviction({&x}).size() == 1);
  REQUIRE(x.copied_pieces.size() == 2);
  CHECK(x.piece_bytes == 2 * kG);
  CHECK(x.copied_pieces.back() == x.copied_out);
  CHECK(copied_up_to(x, kG) == x.copied_pieces[0]);
  CHECK(copied_up_to(x, 2 * kG) == x.copied_pieces[0]);
  CHECK(copied_up_to(x, 2 * kG + 1) == x.copied_pieces[1]);
  // New owners of its first granule and of its third, each ordered after what it takes alone.
  REQUIRE(order.order(first, copied_up_to(x, kG)));
  dev.write(first, x.address, kG, 9);
  REQUIRE(order.order(later, copied_up_to(x, 3 * kG)));
  dev.write(later, x.address + 2 * kG, kG, 9);
  dev.run_stream(s);
  while (dev.queued(first) && dev.run_stream(out, 1)) dev.run_stream(first);
  CHECK(dev.queued(first) == 0);
  CHECK(dev.queued(out) > 0);  // the second piece is still to be copied
  dev.run_stream(later);
  CHECK(dev.queued(later) > 0);  // it waits for the second piece
  dev.run_all();
  // The host copy holds what x held, whatever the new owners wrote since.
  uint64_t off = 0;
  for (const pool::HostBlock& h : x.host) {
    const uint64_t n = std::min(h.bytes, x.bytes - off);
    dev.copy_to_device(x.address + off, h.ptr, n);
    off += n;
  }
  REQUIRE(order.order(s, order.mark(order.id_of(dev.in_stream()))));
  dev.check(s, x.address, x.bytes, 5);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

// Note [Copies back in pieces]: a placed buffer comes back onto pool bytes that two buffers held
// while it was away. Its copy back goes in pieces, each after the holders of its own bytes alone,
// first the piece whose holder was freed first: the device copies that piece while the other
// holder is still at work. The same whether it comes back from the evicted state or before the
// host has seen its copy out end (its range still mapped: Note [Back before the copy out ended]).
TEST_CASE("residency: a placed buffer's copy back goes in pieces, each after its own bytes' holders", "[memory]") {
  const bool resumed = GENERATE(false, true);
  INFO((resumed ? "back before the host saw its copy out end" : "back from the evicted state"));
  ResidencyRig rig;
  auto& [dev, arena, host, order, residency] = rig;
  REQUIRE(host.reserve(64 * kMiB));
  residency.set_copy_piece(2 * kG);
  const Stream s = stream_n(1), look = stream_n(2);
  const uint32_t sid = order.id_of(s);
  const Stream in = dev.in_stream();
  // x on pool granules 0-3; while it is away h1 holds 0-1 (its first piece), h2 holds 2-3 (its second).
  pool::PlacedPool placed(dev, kG, {0, 2, 4}, {{0, 4, 0, {}}, {0, 2, 0, {}}, {2, 2, 0, {}}});
  REQUIRE(placed.ok());
  const auto refuse = [](const void*) { return false; };
  const auto hand_over = [](const void*) { return true; };  // x, being copied out
  using R = pool::PlacedPool::Result;
  Buffer x, h1, h2;
  pool::TagSet waits;
  REQUIRE(placed.take(0, &x, &waits, refuse, nullptr) == R::kOk);
  x.address = placed.address(0), x.bytes = 4 * kG, x.span = 4 * kG, x.large = true;
  x.placed_pool = &placed;
  x.placed_slot = 0;
  x.streams.store(StreamOrder::bit_of(sid));
  dev.write(s, x.address, 2 * kG, 5);  // its pieces
  dev.write(s, x.address + 2 * kG, 2 * kG, 6);
  x.state.store(BufferState::kEvicting);
  REQUIRE(residency.start_eviction({&x}).size() == 1);
  dev.run_all();  // its copy out has run
  if (!resumed) {
    REQUIRE(residency.finish_eviction(&x));
    REQUIRE_FALSE(placed.is_mapped(0));
  }
  // h2 writes and is freed, then h1; the device has run neither. Each free of x's bytes says so,
  // and is fenced alone (as the manager does).
  const auto hold = [&](Buffer& h, uint32_t slot, uint32_t seed) {
    std::vector<pool::PlacedPool::HandOver> over;
    REQUIRE(placed.take(slot, &h, &waits, hand_over, &over) == R::kOk);
    CHECK(over.size() == (resumed ? 1u : 0u));
    dev.write(s, placed.address(slot), placed.span(slot), seed);
    pool::TagSet freed;
    freed.add(order.mark(sid));
    CHECK(placed.release(slot, &h, freed));
    order.fence(sid);
  };
  hold(h2, 2, 7);
  hold(h1, 1, 8);
  std::vector<pool::TagSet> by_piece;
  waits.clear();
  if (resumed) {
    REQUIRE(placed.reclaim(0, &x, &waits, &by_piece, 2 * kG) == R::kOk);
    REQUIRE(by_piece.size() == 2);
    REQUIRE(residency.resume_back(&x, std::nullopt, waits, &by_piece));
  } else {
    REQUIRE(placed.restore(0, &x, &waits, &by_piece, 2 * kG) == R::kOk);
    REQUIRE(by_piece.size() == 2);
    REQUIRE(residency.copy_back(&x, std::nullopt, waits, &by_piece));
  }
  CHECK(residency.stats().restores_in_pieces == 1);
  // The device has run h2's work (its write and its fence), not h1's.
  REQUIRE(dev.run_stream(s, 2) == 2);
  dev.run_stream(in);
  CHECK(dev.queued(in) > 0);                       // the first piece waits for h1
  dev.check(look, x.address + 2 * kG, 2 * kG, 6);  // the second is back
  dev.run_stream(look);
  CHECK(dev.queued(look) == 0);
  dev.run_all();
  REQUIRE(order.order(look, x.ready));
  dev.check(look, x.address, 2 * kG, 5);
  dev.check(look, x.address + 2 * kG, 2 * kG, 6);
  dev.run_all();
  // Once x is back its bytes are its own again: a free of another buffer's bytes is not fenced for it.
  Buffer y;
  REQUIRE(placed.release(0, &x, {}) == false);
  REQUIRE(placed.take(1, &y, &waits, refuse, nullptr) == R::kOk);
  CHECK_FALSE(placed.release(1, &y, {}));
  CHECK_MSG_ERRORS(dev);
}

// Note [Timing the waits for vcudnn's copies]: how long a stream stood still for a copy is read
// from the device's clock; the host's view (copy not done when the wait was queued) says nothing.
TEST_CASE("residency: a wait for a copy is timed on the device", "[memory]") {
  ResidencyRig rig;
  auto& [dev, arena, host, order, residency] = rig;
  REQUIRE(host.reserve(64 * kMiB));
  const Stream s = test::SimDevice::stream(1), w = test::SimDevice::stream(2);
  const Stream out = dev.out_stream();
  const auto evict = [&](Buffer& b) {
    const auto a = arena.allocate(4 * kG, pool::Lifetime::kShort);
    REQUIRE(a);
    b.address = a->address, b.bytes = 4 * kG, b.span = a->bytes, b.large = true;
    b.streams.store(StreamOrder::bit_of(order.id_of(s)));
    dev.write(s, b.address, b.bytes, 5);
    b.state.store(BufferState::kEvicting);
    REQUIRE(residency.start_eviction({&b}).size() == 1);
  };
  // x: the waiter gets to its wait first and stands still while s and the copy run.
  Buffer x;
  evict(x);
  REQUIRE(order.order(w, x.copied_out, 5));
  CHECK(order.take_waits().empty());  // nothing has run
  CHECK(dev.run_stream(w) == 1);      // the probe; the wait holds
  const int ran = dev.run_stream(s) + dev.run_stream(out);
  REQUIRE(ran >= 2);
  dev.run_all();
  std::vector<StreamOrder::WaitSample> waits = order.take_waits();
  REQUIRE(waits.size() == 1);
  CHECK(waits[0].cookie == 5);
  CHECK(waits[0].stream == order.id_of(out));
  CHECK(waits[0].waited_ms == Approx(ran));  // one simulated millisecond an operation
  CHECK(order.take_waits().empty());         // taken once
  // y: the copy has run on the device before the waiter, busy with a kernel, gets there, though the
  // host saw it pending when it queued the wait: waited 0.
  Buffer y;
  evict(y);
  dev.write(w, x.address, kG, 1);  // x is no one's now: the kernel only keeps w busy
  REQUIRE(order.order(w, y.copied_out, 6));
  // Untimed: no cookie, or the tag of a stream whose waits are not timed.
  const Stream v = test::SimDevice::stream(3);
  REQUIRE(order.order(v, y.copied_out));
  dev.write(s, y.address, kG, 7);
  REQUIRE(order.order(v, order.mark(order.id_of(s)), 8));
  dev.run_stream(s);
  dev.run_stream(out);
  dev.run_all();
  waits = order.take_waits();
  REQUIRE(waits.size() == 1);
  CHECK(waits[0].cookie == 6);
  CHECK(waits[0].waited_ms == 0);
  CHECK(order.stats().timed_waits == 2);
  CHECK_MSG_ERRORS(dev);
}

TEST_CASE("stream order: timed waits nobody takes keep only the newest samples", "[memory]") {
  SimDevice dev(kG, 4);
  StreamOrder order{dev};
  const uint32_t out = order.id_of(dev.out_stream());
  order.time_waits_on(out);
  const Stream w = test::SimDevice::stream(1);
  const size_t n = 2 * StreamOrder::kMostProbes + 10;
  for (size_t k = 0; k < n; ++k) {
    REQUIRE(order.order(w, order.mark(out), k + 1));
    if (k % 64 == 63) dev.run_all();
  }
  dev.run_all();
  CHECK(order.stats().timed_waits == n);  // the device kept up: probes were read as they ran
  const std::vector<StreamOrder::WaitSample> waits = order.take_waits();
  REQUIRE(waits.size() == StreamOrder::kMostProbes);
  CHECK(waits.back().cookie == n);  // the newest kept
  CHECK(order.take_waits().empty());
  CHECK_MSG_ERRORS(dev);
}

// Note [Timing the waits for vcudnn's copies]: a planned copy back is late when its use stands for it
// on the device, whatever the host saw. A plan by hand: A (4 granules) out after its first use, back
// before its second; the device runs the use first (late: the prefetch moves earlier), or the copy
// first (on time, though the host saw it pending either way).
TEST_CASE(
    "memory manager: a planned copy back is late when the device stands for it, not when the host sees it "
    "pending",
    "[memory][replay]") {
  for (const bool use_first : {true, false}) {
    INFO((use_first ? "the use reaches its wait first" : "the copy back runs first"));
    Active on;
    SimDevice dev(kG, 16);
    MemoryManager m(dev, dev, dev, config(16 * kG));
    ReplayScript script;
    script.events = 7;  // A1 use(A) A2 use(B) F2 use(A) F1
    script.steps = {{true, 4 * kG, 0}, {true, kG, 2}, {false, kG, 4}, {false, 4 * kG, 6}};
    script.alloc_uses = {{1, 5}, {3}};
    script.anchor = 1;
    script.targets = {{false, 0, 0, 4 * kG}};
    script.actions = {{2, ReplayAction::kOffload, 0, 2}, {4, ReplayAction::kPrefetch, 0, 3}};
    m.install_replay(script);
    Program p{m, dev};
    const Stream s = stream_n(1);
    const auto a = m.allocate(4 * kG, s, Origin::kFramework);
    REQUIRE(a);
    REQUIRE(p.write(*a, 4 * kG, 1, s));
    const auto b = m.allocate(kG, s, Origin::kFramework);  // A's copy out is due here
    REQUIRE(b);
    REQUIRE(p.write(*b, kG, 2, s));
    dev.run_all();
    m.synchronized(m.stream_marks(std::nullopt));  // A's copy out is done: A is off the device
    REQUIRE(m.free(*b, s));                        // A's copy back is due here
    REQUIRE(m.stats().prefetches == 1);
    REQUIRE(p.check(*a, 4 * kG, 1, s));  // the host sees the copy back pending: s waits for it
    if (use_first) dev.run_stream(s);    // up to the wait, before the copy back runs
    dev.run_stream(dev.in_stream());
    dev.run_all();
    REQUIRE(m.free(*a, s));  // the iteration ends: its timed waits are read
    const ManagerStats st = m.stats();
    const std::optional<ReplayStats> r = m.replay_stats();
    REQUIRE(r);
    CHECK(r->iterations == 1);
    CHECK(st.back_waits_timed == 1);
    CHECK(st.back_waits_late == (use_first ? 1u : 0u));
    CHECK((st.back_wait_ns > 0) == use_first);
    CHECK(r->late_prefetches == (use_first ? 1u : 0u));
    CHECK(r->moved_earlier == (use_first ? 1u : 0u));  // event 4 -> 3, its earliest
    CHECK(m.host_waits().total() == 0);
    CHECK_MSG_ERRORS(dev);
  }
}

TEST_CASE("memory manager: explicit evict and restore round trip, and free of an evicted buffer", "[memory]") {
  Active on;
  SimDevice dev(kG, 16);
  MemoryManager m(dev, dev, dev, config(16 * kG));
  Program p{m, dev};
  const auto big = m.allocate(20 * kMiB + 7, std::nullopt, Origin::kFramework);  // 3 host slabs of 8 MiB
  const auto small = m.allocate(4096, std::nullopt, Origin::kFramework);
  REQUIRE(big);
  REQUIRE(small);
  REQUIRE(p.write(*big, 20 * kMiB + 7, 42, stream_n(1)));
  CHECK(m.evict(*small) == EvictResult::kTooSmall);
  CHECK(m.evict(0x1000) == EvictResult::kUnknown);
  REQUIRE(m.evict(*big) == EvictResult::kOk);  // waits for the copy (an explicit request)
  CHECK(m.stats().bytes_evicted == 20 * kMiB + 7);
  CHECK(m.restore(*big, stream_n(1)) == RestoreResult::kOk);
  REQUIRE(p.check(*big, 20 * kMiB + 7, 42, stream_n(1)));
  CHECK(m.restore(*big, stream_n(1)) == RestoreResult::kNotEvicted);
  REQUIRE(m.evict(*big) == EvictResult::kOk);
  CHECK(m.free(*big, std::nullopt));  // drops the host copy
  CHECK(m.stats().evicted_now == 0);
  CHECK(m.stats().live == 4096);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

TEST_CASE("memory manager: an allocation the budget cannot hold fails cleanly", "[memory]") {
  SimDevice dev(kG, 4);
  MemoryManager m(dev, dev, dev, config(4 * kG));
  CHECK_FALSE(m.allocate(10 * kMiB, stream_n(1), Origin::kFramework));
  CHECK(m.stats().failed_allocations == 1);
  // Small buffers are never evicted: filling the budget with them leaves nothing to evict for a
  // large one.
  std::vector<uint64_t> small;
  for (int i = 0; i < 4 * 2 * 16; ++i) {
    const auto a = m.allocate(kMiB / 8 - 512, stream_n(1), Origin::kFramework);
    if (!a) break;
    small.push_back(*a);
  }
  CHECK(small.size() >= 60);
  CHECK_FALSE(m.allocate(4 * kMiB, stream_n(1), Origin::kFramework));
  // Freeing them makes room again: the idle slabs are trimmed once their frees are done.
  for (uint64_t a : small) CHECK(m.free(a, stream_n(1)));
  CHECK(m.allocate(4 * kMiB, stream_n(1), Origin::kFramework));
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

TEST_CASE("memory manager: library, pinned and in-use buffers are never evicted", "[memory]") {
  Active on;
  SimDevice dev(kG, 4);
  MemoryManager m(dev, dev, dev, config(4 * kG));
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
  SimDevice dev2(kG, 4);
  MemoryManager m2(dev2, dev2, dev2, config(4 * kG));
  const auto a = m2.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  const auto b = m2.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(b);
  {
    CallScope scope;
    REQUIRE(m2.touch(&*a, 1, Access::kRead, stream_n(1), "kernel"));
    REQUIRE(m2.touch(&*b, 1, Access::kRead, stream_n(1), "kernel"));
    // An allocation inside the call (a library allocating for itself) cannot evict a or b.
    const uint64_t started = m2.stats().evictions_started;
    CHECK_FALSE(m2.allocate(4 * kMiB, std::nullopt, Origin::kLibrary));
    CHECK(m2.stats().evictions_started == started);
  }
  // After the call, a (the older) can go.
  CHECK(m2.allocate(4 * kMiB, std::nullopt, Origin::kFramework));
  CHECK(m2.stats().evictions >= 1);

  // vcudnn's workspace for one call (Note [Workspace that lives for one call]): never evicted, even
  // as the least recently used buffer; the framework's buffer goes instead.
  SimDevice dev3(kG, 4);
  MemoryManager m3(dev3, dev3, dev3, config(4 * kG));
  const auto scratch = m3.allocate(4 * kMiB, stream_n(1), Origin::kScratch);
  const auto later = m3.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(scratch);
  REQUIRE(later);
  CHECK(m3.evict(*scratch) == EvictResult::kNotAllowed);
  CHECK(m3.allocate(4 * kMiB, stream_n(1), Origin::kFramework));
  CHECK(m3.stats().evictions_started >= 1);
  CHECK(m3.evict(*later) == EvictResult::kAlreadyEvicted);  // it went: the scratch buffer may not
  dev.run_all();
  dev2.run_all();
  dev3.run_all();
  CHECK_MSG_ERRORS(dev);
  CHECK_MSG_ERRORS(dev2);
}

TEST_CASE("memory manager: a call needing more than the budget at once fails without corrupting anything", "[memory]") {
  Active on;
  SimDevice dev(kG, 4);
  MemoryManager m(dev, dev, dev, config(4 * kG));
  Program p{m, dev};
  const auto a = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(p.write(*a, 6 * kMiB, 7, stream_n(1)));
  REQUIRE(m.evict(*a) == EvictResult::kOk);
  const auto b = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(b);
  REQUIRE(p.write(*b, 6 * kMiB, 8, stream_n(1)));
  const uint64_t both[] = {*a, *b};
  {
    CallScope scope;
    CHECK_FALSE(m.touch(both, 2, Access::kRead, stream_n(1), "a kernel needing 12 MiB"));
  }
  // Both are still intact, one of them on the host.
  REQUIRE(p.check(*a, 6 * kMiB, 7, stream_n(1)));
  REQUIRE(p.check(*b, 6 * kMiB, 8, stream_n(1)));
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

TEST_CASE("memory manager: a random workload never exceeds the budget and never loses a byte", "[memory]") {
  Active on;
  constexpr uint64_t kSmallG = 64 * 1024;  // small granules keep the byte checks cheap
  SimDevice dev(kSmallG, 48, 99);
  ManagerConfig c = config(48 * kSmallG, kSmallG);
  c.host_budget = 512 * kMiB;
  MemoryManager m(dev, dev, dev, c);
  Program p{m, dev};
  std::mt19937 rng(1234);
  struct Live {
    uint64_t address, bytes;
    uint32_t seed;
    Stream stream;
  };
  std::vector<Live> live;
  uint32_t seed = 100;
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    // At most 100 live buffers: each evicted one takes a 2 MiB host block, and the host budget
    // (256 blocks) must hold them all, so that every failure would be a bug.
    if (live.empty() || (op < 4 && live.size() < 100)) {
      const uint64_t bytes = rng() % 4 == 0 ? 512 + rng() % 2048 : kSmallG + rng() % (6 * kSmallG);
      const Stream s = stream_n(1 + rng() % 2);
      const auto a = m.allocate(bytes, s, Origin::kFramework);
      if (!a) continue;
      REQUIRE(p.write(*a, bytes, seed, s));
      live.push_back({*a, bytes, seed++, s});
    } else if (op < 6) {
      const size_t i = rng() % live.size();
      REQUIRE(m.free(live[i].address, live[i].stream));
      live.erase(live.begin() + static_cast<long>(i));
    } else if (op < 9) {
      const Live& l = live[rng() % live.size()];
      INFO("step " << step << " " << m.summary());
      REQUIRE(p.check(l.address, l.bytes, l.seed, l.stream));
    } else {
      dev.run_some(static_cast<int>(rng() % 40));
    }
    INFO(dev.first_errors());
    REQUIRE(dev.errors_copy().empty());
  }
  for (const Live& l : live) REQUIRE(p.check(l.address, l.bytes, l.seed, l.stream));
  dev.run_all();
  const ManagerStats s = m.stats();
  INFO(m.summary());
  CHECK(s.evictions > 0);
  CHECK(s.fault_ins > 0);
  CHECK(s.evictions_cancelled > 0);
  CHECK(s.peak_mapped <= 48 * kSmallG);
  CHECK_MSG_ERRORS(dev);
}

// Threads stand in for PyTorch's forward and backward threads (and a second stream's user): each
// allocates on its own stream, writes, reads back, frees, and evicts by hand now and then, while a
// device thread runs the queued work. Every read is checked by the simulated device when it runs.
TEST_CASE("memory manager: threads allocating, touching, freeing and evicting concurrently keep every byte",
          "[memory][stress]") {
  Active on;
  constexpr uint64_t kSmallG = 64 * 1024;
  constexpr uint64_t kBudget = 96;
  SimDevice dev(kSmallG, kBudget, 7);
  ManagerConfig c = config(kBudget * kSmallG, kSmallG);
  MemoryManager m(dev, dev, dev, c);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<int> failed_allocations{0};
  std::thread device_thread([&] {
    while (!stop.load()) {
      if (dev.run_some(16) == 0) std::this_thread::yield();
    }
  });
  const auto worker = [&](uint32_t t) {
    std::mt19937 rng(100 + t);
    Program p{m, dev};
    const Stream s = stream_n(1 + t);
    struct Live {
      uint64_t address, bytes;
      uint32_t seed;
    };
    std::vector<Live> live;
    uint32_t seed = 1000 * (t + 1);
    for (int step = 0; step < 1500; ++step) {
      const int op = static_cast<int>(rng() % 12);
      // At most 8 live buffers a thread (40 granules at most; 4 threads need more than the 96 of
      // the budget, while what 4 calls in progress hold always fits).
      if (live.empty() || (op < 4 && live.size() < 8)) {
        const uint64_t bytes = rng() % 4 == 0 ? 512 + rng() % 2048 : kSmallG + rng() % (4 * kSmallG);
        const auto a = m.allocate(bytes, s, Origin::kFramework);
        if (!a) {
          ++failed_allocations;
          continue;
        }
        if (!p.write(*a, bytes, seed, s)) ++failures;
        live.push_back({*a, bytes, seed++});
      } else if (op < 7) {
        const size_t i = rng() % live.size();
        if (!m.free(live[i].address, s)) ++failures;
        live.erase(live.begin() + static_cast<long>(i));
      } else if (op < 11) {
        const Live& l = live[rng() % live.size()];
        if (!p.check(l.address, l.bytes, l.seed, s)) ++failures;
      } else {
        const Live& l = live[rng() % live.size()];
        m.evict(l.address);  // any answer is fine; the bytes must survive
      }
    }
    for (const Live& l : live) {
      if (!p.check(l.address, l.bytes, l.seed, s)) ++failures;
      m.free(l.address, s);
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  stop.store(true);
  device_thread.join();
  dev.run_all();
  const ManagerStats s = m.stats();
  INFO(m.summary());
  CHECK(failures.load() == 0);
  CHECK_MSG_ERRORS(dev);
  CHECK(s.evictions > 0);
  CHECK(s.fault_ins > 0);
  CHECK(s.stream_waits > 0);  // memory moved between the threads' streams
  CHECK(dev.peak_mapped_granules() <= kBudget);
  CHECK(s.live == 0);
}

namespace {
// A recorder stand-in: recording until the test says it is finished.
struct FinishingSink final : OpSink {
  bool done = false;
  bool recording() const noexcept override { return !done; }
  void allocated(const BufferRef&, std::optional<cudaStream_t>) noexcept override {}
  void freed(const BufferRef&, std::optional<cudaStream_t>) noexcept override {}
  void used(const char*, std::optional<cudaStream_t>, const BufferUse*, size_t n) noexcept override { uses += n; }
  bool finished() const noexcept override { return done; }
  size_t uses = 0;
};
}  // namespace

// The recorded PyTorch allocation sequences (tests/data/alloc_*.trace) through the manager: the
// mapped peak stays within 8% of the live peak in requested bytes and below what cudaMallocAsync's
// pool reserved in the same runs (which was 8-21% above the live peak), the second half of the run
// maps nothing new, and without a budget no host wait and no event is needed.
// Untracked (the recorder finished after the first allocation), small buffers are kept for reuse on
// their stream (Note [Reuse without a budget]): the same bounds hold, and most small allocations of
// the second half are served by kept buffers.
TEST_CASE("memory manager: PyTorch allocation traces replayed without a budget", "[memory][trace]") {
  for (const bool track : {true, false})
  for (const char* name : {"resnet18", "resnet50", "transformer"}) {
    INFO(name << (track ? " tracked" : " untracked"));
    const vcudnn::test::AllocTrace trace = vcudnn::test::read_alloc_trace(name);
    REQUIRE(trace.allocations > 2000);
    Active active;
    SimDevice dev(kG, UINT64_MAX);
    ManagerConfig c = config(std::nullopt);
    c.device_total = 80ull << 30;
    c.reserve_bytes = 4 * c.device_total;
    MemoryManager m(dev, dev, dev, c);
    FinishingSink finished;
    finished.done = true;
    std::map<uint64_t, uint64_t> address_of;
    uint64_t live = 0, live_peak = 0, fresh_half = 0, small_half = 0, hits_half = 0;
    std::map<uint64_t, uint64_t> size_of;
    for (size_t i = 0; i < trace.events.size(); ++i) {
      const auto& e = trace.events[i];
      if (i == trace.events.size() / 2) {
        fresh_half = m.stats().fresh_bytes;
        hits_half = m.stats().cache_hits;
      }
      const StreamRef s = e.stream_ordered ? StreamRef(stream_n(1 + e.stream)) : std::nullopt;
      if (e.allocate) {
        const auto a = m.allocate(e.bytes, s, Origin::kFramework);
        REQUIRE(a);
        if (!track && m.tracking()) {  // the first access after the recorder finished stops tracking
          m.set_sink(&finished);
          const CallScope scope;
          m.touch(&*a, 1, Access::kWrite, s, "kernel");
          REQUIRE_FALSE(m.tracking());
        }
        if (i >= trace.events.size() / 2 && e.bytes < kG - 512 && e.stream_ordered) ++small_half;
        address_of[e.id] = *a;
        size_of[e.id] = e.bytes;
        live += e.bytes;
        live_peak = std::max(live_peak, live);
      } else {
        REQUIRE(m.free(address_of.at(e.id), s));
        live -= size_of.at(e.id);
      }
    }
    const ManagerStats st = m.stats();
    const double ratio = double(st.peak_mapped) / double(live_peak);
    WARN(name << ": peak mapped " << st.peak_mapped / double(1 << 30) << " GiB, live peak "
              << live_peak / double(1 << 30) << " GiB (x" << ratio << "); torch reserved "
              << trace.torch_max_reserved / double(1 << 30) << " GiB ("
              << double(st.peak_mapped) / double(trace.torch_max_reserved) << "x); " << m.summary());
    CHECK(ratio < 1.08);  // the live peak counts requested bytes; a buffer takes whole granules or 512 B steps
    CHECK(st.peak_mapped <= trace.torch_max_reserved);
    CHECK(st.fresh_bytes == fresh_half);
    CHECK(st.host_waits == 0);
    CHECK(st.fences == 0);
    if (track) {
      CHECK(st.cache_hits == 0);
    } else {
      WARN(name << ": " << st.cache_hits - hits_half << " of " << small_half
                << " small allocations of the second half served by kept buffers");
      CHECK(st.cache_hits - hits_half > small_half / 2);
    }
    CHECK_MSG_ERRORS(dev);
  }
}

// An access cancels an eviction whose copy out is still in flight; the buffer is then freed and
// its memory trimmed for a new allocation while that copy has not run yet. The copy still reads
// the memory: it must not be unmapped before the copy ends (found on the GPU: "unspecified launch
// failure" under a 60% budget).
TEST_CASE("memory manager: memory freed while a cancelled eviction's copy is in flight is not unmapped under it",
          "[memory]") {
  Active on;
  SimDevice dev(kG, 8);
  MemoryManager m(dev, dev, dev, config(8 * kG));
  Program p{m, dev};
  std::vector<uint64_t> bufs;
  // Fill the budget: evict_ahead() starts copying the least recently used buffers out.
  while (m.stats().evictions_started == 0) {
    const auto a = m.allocate(2 * kMiB, stream_n(1), Origin::kFramework);
    REQUIRE(a);
    REQUIRE(p.write(*a, 2 * kMiB, static_cast<uint32_t>(bufs.size()), stream_n(1)));
    bufs.push_back(*a);
    REQUIRE(bufs.size() < 16);
  }
  CHECK(dev.host_waits == 0);
  // The oldest buffer is being evicted: touch it (cancels), free it, run the compute stream only.
  REQUIRE(p.check(bufs[0], 2 * kMiB, 0, stream_n(1)));
  CHECK(m.stats().evictions_cancelled >= 1);
  REQUIRE(m.free(bufs[0], stream_n(1)));
  dev.run_stream(stream_n(1));
  REQUIRE(m.free(bufs.back(), stream_n(1)));  // its fence covers the first free too
  dev.run_stream(stream_n(1));
  // A large allocation now needs room: the freed memory must wait for the copy out, not be trimmed.
  const auto big = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(big);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}

// The GPU suite's "streams" client on the simulated device: 4 threads, each on its own stream,
// build a chain of buffers, each written by a kernel that reads the one before (one call touching
// both), 4x the budget in all, never freeing; the device runs concurrently.
TEST_CASE("memory manager: chains on four streams over 4x the budget keep every byte", "[memory][stress]") {
  Active on;
  constexpr uint64_t kSmallG = 64 * 1024;
  constexpr uint64_t kBudget = 48;
  SimDevice dev(kSmallG, kBudget, 11);
  ManagerConfig c = config(kBudget * kSmallG, kSmallG);
  c.host_budget = 1024 * kMiB;  // every evicted buffer takes a 2 MiB host block: room for all of them
  MemoryManager m(dev, dev, dev, c);
  std::atomic<bool> stop{false};
  std::thread device_thread([&] {
    while (!stop.load()) {
      if (dev.run_some(8) == 0) std::this_thread::yield();
    }
  });
  std::atomic<int> failures{0};
  std::string first_failure;
  std::mutex failure_mu;
  const auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(failure_mu);
    if (failures++ == 0) first_failure = what;
  };
  const auto chain = [&](uint32_t t) {
    std::mt19937 rng(500 + t);
    const Stream s = stream_n(1 + t);
    uint64_t prev = 0, prev_bytes = 0;
    uint32_t prev_seed = 0;
    for (int i = 0; i < 60; ++i) {
      const uint64_t bytes = kSmallG + rng() % (4 * kSmallG);
      const auto a = m.allocate(bytes, s, Origin::kFramework);
      if (!a) {
        fail("allocation failed at step " + std::to_string(i) + ": " + m.summary());
        return;
      }
      const uint32_t seed = 1000 * (t + 1) + static_cast<uint32_t>(i);
      CallScope scope;
      const uint64_t words[] = {prev, *a};
      if (!m.touch(words + (prev ? 0 : 1), prev ? 2 : 1, Access::kUnknown, s, "derive")) {
        fail("touch failed at step " + std::to_string(i) + ": " + m.summary());
        return;
      }
      if (prev) dev.check(s, prev, prev_bytes, prev_seed);
      dev.write(s, *a, bytes, seed);
      prev = *a;
      prev_bytes = bytes;
      prev_seed = seed;
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(chain, t);
  for (auto& t : threads) t.join();
  stop.store(true);
  device_thread.join();
  dev.run_all();
  INFO(first_failure);
  INFO(m.summary());
  CHECK(failures.load() == 0);
  CHECK_MSG_ERRORS(dev);
  CHECK(m.stats().evictions > 0);
}

// cudnn.benchmark's search under cudaMallocAsync: PyTorch probes the free memory by allocating
// it (cudaMemGetInfo's answer, which counts vcudnn's idle memory as free), frees it, and after the
// search empties its cache (cudaDeviceSynchronize, then cudaMemPoolTrimTo(pool, 0)). The probe is
// one extent; the trim gives back every settled idle byte and free chunk, and nothing in flight.
TEST_CASE("memory manager: cudaMemPoolTrimTo gives back settled idle memory, without waiting", "[memory]") {
  Active on;
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  Program p{m, dev};
  const uint64_t card = 512 * kMiB;
  const auto [free_before, total] = m.memory_info(card, card);
  CHECK(free_before == card);
  const auto probe = m.allocate(400 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(probe);
  REQUIRE(m.free(*probe, stream_n(1)));
  CHECK(m.memory_info(card - 400 * kMiB, card).first == card);  // idle counts as free
  const auto kept = m.allocate(8 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(kept);
  CHECK(m.stats().fresh_bytes == 400 * kMiB);  // carved from the idle probe
  // Work queued on the probe's memory is not done: nothing of it may go yet.
  REQUIRE(p.write(*kept, 8 * kMiB, 1, stream_n(1)));
  REQUIRE(m.free(*kept, stream_n(1)));
  CHECK(m.trim_to(0) == 0);
  CHECK(m.stats().mapped == 400 * kMiB);
  // The program waits for the device (cudaDeviceSynchronize), then trims.
  const auto marks = m.stream_marks(std::nullopt);
  dev.run_all();
  m.synchronized(marks);
  CHECK(m.trim_to(0) == 400 * kMiB);
  CHECK(m.stats().mapped == 0);
  CHECK(dev.mapped_granules() == 0);
  CHECK(m.stats().released_bytes >= 400 * kMiB);
  // trim_to(keep) keeps about that much.
  const auto again = m.allocate(100 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(again);
  REQUIRE(m.free(*again, stream_n(1)));
  const auto marks2 = m.stream_marks(std::nullopt);
  dev.run_all();
  m.synchronized(marks2);
  CHECK(m.trim_to(40 * kMiB) > 0);
  CHECK(m.stats().idle <= 40 * kMiB + 32 * kMiB);  // an extent goes whole
  CHECK(m.host_waits().total() == 0);
  INFO(m.summary());
  CHECK_MSG_ERRORS(dev);
}

// cudnn.benchmark's search frees workspaces of up to the whole card once; a training loop then
// reuses the same memory at every step. At the program's synchronisations, memory idle for a whole
// interval goes back to the device; memory the loop reuses stays.
TEST_CASE("memory manager: at synchronisations, memory unused for a whole interval goes back to the device",
          "[memory]") {
  Active on;
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  Program p{m, dev};
  const auto sync = [&] {
    for (int twice = 0; twice < 2; ++twice) {  // as a timing loop does: before and after each step
      const auto marks = m.stream_marks(stream_n(1));
      dev.run_all();  // the program waits for stream 1
      m.synchronized(marks);
    }
  };
  const auto search = m.allocate(200 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(search);
  REQUIRE(m.free(*search, stream_n(1)));
  for (int step = 0; step < 4; ++step) {
    std::vector<uint64_t> acts;
    for (uint32_t i = 0; i < 8; ++i) {
      const auto a = m.allocate(6 * kMiB, stream_n(1), Origin::kFramework);
      REQUIRE(a);
      REQUIRE(p.write(*a, 6 * kMiB, i, stream_n(1)));
      acts.push_back(*a);
    }
    for (uint64_t a : acts) REQUIRE(m.free(a, stream_n(1)));
    sync();
  }
  INFO(m.summary());
  // The search's 200 MiB (less what the steps took from it) went back at the second
  // synchronisation; the steps' 48 MiB stay mapped, reused at every step.
  CHECK(m.stats().mapped <= 64 * kMiB);
  CHECK(m.stats().mapped >= 48 * kMiB);
  CHECK(m.stats().released_bytes >= 150 * kMiB);
  CHECK(m.stats().fresh_bytes <= 200 * kMiB + 2 * kG);  // the steps never map anew
  CHECK(m.host_waits().total() == 0);
  CHECK_MSG_ERRORS(dev);
}

// Note [CUDA graphs under a budget]: what a capture touches stays; the rest is evicted as before,
// during the capture too (its live bytes may exceed the budget).
TEST_CASE("memory manager: buffers a CUDA graph capture uses stay on the device, eviction goes on for the rest",
          "[memory][graph]") {
  Active on;
  SimDevice dev(kG, 8);
  MemoryManager m(dev, dev, dev, config(8 * kG));  // 16 MiB
  Program p{m, dev};
  const Stream s = stream_n(1);
  std::vector<uint64_t> bufs;  // a b c d, 4 MiB each: the budget is full
  for (uint32_t i = 0; i < 4; ++i) {
    const auto x = m.allocate(4 * kMiB, s, Origin::kFramework);
    REQUIRE(x);
    REQUIRE(p.write(*x, 4 * kMiB, 1 + i, s));
    bufs.push_back(*x);
  }
  const uint64_t a = bufs[0], b = bufs[1];
  REQUIRE(m.evict(b) == EvictResult::kOk);
  CHECK(m.stats().evicted_now > 0);

  m.capture_begins("cudaStreamBeginCapture");  // the hook runs before the capture starts
  dev.begin_capture(s);
  CHECK(m.capturing());
  CHECK_FALSE(m.eviction_paused());
  CHECK(m.stats().evicted_now > 0);     // nothing comes back for the capture as such
  REQUIRE(p.check(a, 4 * kMiB, 1, s));  // captured: a is the graph's
  const uint64_t graph_waits = m.host_waits().get(HostWait::k_graph);
  REQUIRE(p.check(b, 4 * kMiB, 2, s));  // b comes back when the capture touches it: c or d makes room
  CHECK(m.host_waits().get(HostWait::k_graph) == graph_waits + 1);  // the host waited for the copy
  // The capture allocates more than the budget holds: what it does not use is evicted meanwhile.
  const auto e = m.allocate(4 * kMiB, s, Origin::kFramework);
  REQUIRE(e);
  REQUIRE(p.write(*e, 4 * kMiB, 5, s));
  CHECK(m.stats().peak_mapped <= 8 * kG);
  CHECK(m.evict(a) == EvictResult::kNotAllowed);  // the graph's, from the capture on
  m.capture_ends("cudaStreamEndCapture");
  dev.end_capture(s);
  CHECK_FALSE(m.capturing());
  CHECK(m.stats().graph_pinned_buffers == 3);  // a, b, e
  CHECK(m.stats().graph_pinned_bytes == 12 * kMiB);
  CHECK(m.evict(b) == EvictResult::kNotAllowed);
  CHECK(m.evict(*e) == EvictResult::kNotAllowed);

  // After it: the 4 MiB left for everything else; c and d take turns, the graph's three never move.
  const uint64_t fault_ins = m.stats().fault_ins;
  for (int round = 0; round < 2; ++round) {
    REQUIRE(p.check(bufs[2], 4 * kMiB, 3, s));
    REQUIRE(p.check(bufs[3], 4 * kMiB, 4, s));
  }
  CHECK(m.stats().fault_ins >= fault_ins + 3);
  REQUIRE(p.check(a, 4 * kMiB, 1, s));
  REQUIRE(p.check(b, 4 * kMiB, 2, s));
  REQUIRE(p.check(*e, 4 * kMiB, 5, s));
  CHECK(m.stats().peak_mapped <= 8 * kG);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);

  // A graph launched before any capture was seen was built some other way: eviction stops.
  SimDevice dev2(kG, 8);
  MemoryManager m2(dev2, dev2, dev2, config(8 * kG));
  const auto x = m2.allocate(4 * kMiB, s, Origin::kFramework);
  REQUIRE(x);
  m2.graph_launched("cudaGraphLaunch");
  CHECK(m2.eviction_paused());
  CHECK(m2.evict(*x) == EvictResult::kNotAllowed);
  dev2.run_all();
}

TEST_CASE("memory manager: a pointer query maps an evicted buffer again, the access after it reads the bytes",
          "[memory]") {
  Active on;
  SimDevice dev(kG, 8);
  MemoryManager m(dev, dev, dev, config(8 * kG));
  Program p{m, dev};
  const Stream s = stream_n(2);
  const auto a = m.allocate(6 * kMiB, s, Origin::kFramework);
  REQUIRE(a);
  REQUIRE(p.write(*a, 6 * kMiB, 5, s));
  REQUIRE(m.evict(*a) == EvictResult::kOk);
  const uint64_t restores = m.stats().restores;
  m.prepare_query(*a + 4096, "cuPointerGetAttribute");
  CHECK(m.stats().evicted_now == 0);
  CHECK(m.stats().restores == restores + 1);
  m.prepare_query(*a, "cuPointerGetAttribute");      // resident: nothing to do
  m.prepare_query(0x1000, "cuPointerGetAttribute");  // not vcudnn's
  CHECK(m.stats().restores == restores + 1);
  REQUIRE(p.check(*a, 6 * kMiB, 5, s));  // ordered after the copy back
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
}


// Note [Tracking without a budget]: the recorder's iteration taken, nothing reads accesses any more.
TEST_CASE("memory manager: without a budget tracking stops once the recorder is finished and cudaFree still orders",
          "[memory]") {
  Active active;
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  Program p{m, dev};
  FinishingSink sink;
  m.set_sink(&sink);
  const auto a = m.allocate(8 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(p.write(*a, 8 * kMiB, 1, stream_n(1)));
  CHECK(m.tracking());
  CHECK(sink.uses == 1);
  sink.done = true;
  REQUIRE(p.write(*a, 8 * kMiB, 2, stream_n(1)));  // this touch still counts; it turns tracking off
  CHECK_FALSE(m.tracking());
  const uint64_t calls = m.stats().tracked_calls;
  CHECK(calls == 2);
  REQUIRE(p.check(*a, 8 * kMiB, 2, stream_n(1)));
  CHECK(m.stats().tracked_calls == calls);
  CHECK(sink.uses == 1);
  CHECK(m.summary().find("(then untracked: no budget)") != std::string::npos);
  CHECK(m.evict(*a) == EvictResult::kNotAllowed);  // nothing is evicted without a budget

  // Stream 2 reads `a` (its touch is not tracked any more), then the program frees it with cudaFree
  // and allocates on stream 1: stream 1 must not write that memory before stream 2's read has run.
  dev.run_stream(stream_n(1));
  REQUIRE(p.check(*a, 8 * kMiB, 2, stream_n(2)));
  REQUIRE(m.free(*a, std::nullopt));
  const auto b = m.allocate(8 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(b);
  CHECK(*b == *a);
  REQUIRE(p.write(*b, 8 * kMiB, 3, stream_n(1)));
  dev.run_stream(nullptr);      // the legacy stream's fences pass
  dev.run_stream(stream_n(1));  // held by its wait for stream 2
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
  CHECK(m.host_waits().total() == 0);
  // Serving memory is timed for the exit line: two allocations and a free.
  CHECK(m.stats().serve_calls == 3);
  CHECK(m.stats().serve_ns > 0);
  CHECK(m.summary().find("served=3 in ") != std::string::npos);
  // Buffers allocated since tracking stopped stay out of the pointer index: freed all the same.
  const auto c = m.allocate(3 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(c);
  CHECK(m.owns(*c));
  CHECK(m.free(*c, stream_n(1)));
  CHECK(m.free(*b, stream_n(1)));
  CHECK(m.stats().live == 0);
}

TEST_CASE("memory manager: tracking goes on under a budget or while the access log is wanted", "[memory]") {
  Active active;
  for (const bool budget : {true, false}) {
    INFO((budget ? "budget" : "access log"));
    SimDevice dev(kG, UINT64_MAX);
    ManagerConfig c = config(budget ? std::optional<uint64_t>(64 * kG) : std::nullopt);
    c.access_log = !budget;
    MemoryManager m(dev, dev, dev, c);
    Program p{m, dev};
    FinishingSink sink;
    sink.done = true;
    m.set_sink(&sink);
    const auto a = m.allocate(8 * kMiB, stream_n(1), Origin::kFramework);
    REQUIRE(a);
    for (uint32_t i = 0; i < 3; ++i) REQUIRE(p.write(*a, 8 * kMiB, i, stream_n(1)));
    CHECK(m.tracking());
    CHECK(m.stats().tracked_calls == 3);
    CHECK(m.access_log().size() == (budget ? 0u : 3u));
    dev.run_all();
    CHECK_MSG_ERRORS(dev);
  }
}

// A buffer used on a stream that is destroyed before the buffer is freed: the free orders after
// that stream's last work (fenced when it was destroyed), and the memory settles.
TEST_CASE("memory manager: memory freed after its stream was destroyed settles", "[memory]") {
  Active active;
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  Program p{m, dev};
  const auto a = m.allocate(8 * kMiB, stream_n(3), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(p.write(*a, 8 * kMiB, 1, stream_n(3)));
  m.stream_destroyed(stream_n(3));
  REQUIRE(m.free(*a, std::nullopt));
  uint64_t trimmed = 0;
  for (int i = 0; i < 3 && trimmed == 0; ++i) {  // the first asks put fences behind the marks
    dev.run_all();
    trimmed = m.trim_to(0);
  }
  CHECK(trimmed == 8 * kMiB);
  CHECK(m.stats().mapped == 0);
  CHECK_MSG_ERRORS(dev);
}

// Note [Reuse without a budget]: a small buffer freed on a stream, once untracked, goes whole to that
// stream's next allocation of its span; never to another stream's; back to the arena when memory is
// trimmed, when its stream is destroyed, or when a synchronisation interval passed without its reuse.
TEST_CASE("memory manager: without a budget small buffers freed on a stream are kept for its next allocations",
          "[memory]") {
  Active active;
  SimDevice dev(kG, UINT64_MAX);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  Program p{m, dev};
  FinishingSink sink;
  m.set_sink(&sink);
  const auto big = m.allocate(8 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(big);
  const auto early = m.allocate(100000, stream_n(1), Origin::kFramework);  // freed while tracked
  REQUIRE(early);
  REQUIRE(m.free(*early, stream_n(1)));
  CHECK(m.stats().cached == 0);
  sink.done = true;
  REQUIRE(p.write(*big, 8 * kMiB, 1, stream_n(1)));  // tracking stops
  REQUIRE_FALSE(m.tracking());

  const auto a = m.allocate(100000, stream_n(1), Origin::kFramework);
  REQUIRE(a);
  REQUIRE(p.write(*a, 100000, 2, stream_n(1)));
  REQUIRE(p.check(*a, 100000, 2, stream_n(1)));  // queued, not run: the device lags
  REQUIRE(m.free(*a, stream_n(1)));
  CHECK(m.stats().cached == 100352);  // 196 x 512
  CHECK_FALSE(m.owns(*a));
  CHECK_FALSE(m.free(*a, stream_n(1)));  // freed already
  const auto [free_bytes, total] = m.memory_info(0, 80ull << 30);
  CHECK(free_bytes >= 100352);  // kept memory counts as free, as idle memory does
  (void)total;

  const auto other = m.allocate(100000, stream_n(2), Origin::kFramework);
  REQUIRE(other);
  CHECK(*other != *a);  // another stream's work is not ordered after the free
  const auto b = m.allocate(99900, stream_n(1), Origin::kFramework);  // the same span
  REQUIRE(b);
  CHECK(*b == *a);
  CHECK(m.owns(*b));
  CHECK(m.stats().cache_hits == 1);
  REQUIRE(p.write(*b, 99900, 3, stream_n(1)));  // after the queued check in stream order
  REQUIRE(p.check(*b, 99900, 3, stream_n(1)));
  dev.run_all();
  CHECK_MSG_ERRORS(dev);

  // Large buffers take the arena's path.
  REQUIRE(m.free(*big, stream_n(1)));
  CHECK(m.stats().cached == 0);

  // A trim takes every kept buffer back first.
  REQUIRE(m.free(*b, stream_n(1)));
  CHECK(m.stats().cached == 100352);
  m.trim_to(0);
  CHECK(m.stats().cached == 0);
  CHECK(m.stats().cache_flushes == 1);

  // A destroyed stream's kept buffers go back at once: its id may be given to another stream.
  const auto c = m.allocate(4096, stream_n(3), Origin::kFramework);
  REQUIRE(c);
  REQUIRE(m.free(*c, stream_n(3)));
  CHECK(m.stats().cached == 4096);
  m.stream_destroyed(stream_n(3));
  CHECK(m.stats().cached == 0);

  // Kept a whole synchronisation interval without reuse: back to the arena at its end.
  const auto d = m.allocate(8192, stream_n(1), Origin::kFramework);
  REQUIRE(d);
  REQUIRE(m.free(*d, stream_n(1)));
  m.synchronized(m.stream_marks(std::nullopt));  // the interval that kept it ends
  CHECK(m.stats().cached == 8192);
  const auto e = m.allocate(16384, stream_n(1), Origin::kFramework);  // the next interval allocates
  REQUIRE(e);
  m.synchronized(m.stream_marks(std::nullopt));
  CHECK(m.stats().cached == 0);
  REQUIRE(m.free(*e, stream_n(1)));
  REQUIRE(m.free(*other, stream_n(2)));
  CHECK(m.stats().live == 0);
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
  CHECK(m.host_waits().total() == 0);
}

// An allocation the card cannot hold gets the kept buffers back in the arena first.
TEST_CASE("memory manager: kept buffers go back to the arena when the card is full", "[memory]") {
  Active active;
  SimDevice dev(kG, UINT64_MAX);
  ManagerConfig c = config(std::nullopt);
  c.device_total = 4 * kG;
  MemoryManager m(dev, dev, dev, c);
  Program p{m, dev};
  FinishingSink sink;
  sink.done = true;
  m.set_sink(&sink);
  std::vector<uint64_t> small;
  for (int i = 0; i < 4; ++i) {  // one slab each: the card's four granules
    const auto a = m.allocate(3 * kMiB / 2, stream_n(1), Origin::kFramework);
    REQUIRE(a);
    REQUIRE(p.write(*a, 3 * kMiB / 2, 10 + i, stream_n(1)));
    small.push_back(*a);
  }
  REQUIRE_FALSE(m.tracking());
  for (uint64_t a : small) REQUIRE(m.free(a, stream_n(1)));
  CHECK(m.stats().cached == 6 * kMiB);
  const auto big = m.allocate(4 * kMiB, stream_n(1), Origin::kFramework);
  REQUIRE(big);
  CHECK(m.stats().cache_flushes == 1);
  CHECK(m.stats().cached == 0);
  CHECK(m.stats().failed_allocations == 0);
  REQUIRE(p.write(*big, 4 * kMiB, 20, stream_n(1)));
  REQUIRE(p.check(*big, 4 * kMiB, 20, stream_n(1)));
  dev.run_all();
  CHECK_MSG_ERRORS(dev);
  CHECK(m.stats().peak_mapped <= 4 * kG);
}

// Note [Reuse without a budget] under threads: four threads, each on its stream, allocate (mostly
// small buffers, which come back from the kept ones), write, check and free, while one of them
// trims now and then and another thread ends synchronisation intervals (both take kept buffers
// back to the arena, whose memory the other streams then reuse after waiting for its free). Every
// byte read is the one written (handing a kept buffer to another stream fails this).
TEST_CASE("memory manager: threads reusing kept buffers while others trim and synchronise keep every byte",
          "[memory][stress]") {
  Active on;
  SimDevice dev(kG, UINT64_MAX, 11);
  MemoryManager m(dev, dev, dev, config(std::nullopt));
  FinishingSink sink;
  sink.done = true;
  m.set_sink(&sink);
  {
    Program p{m, dev};
    const auto first = m.allocate(4096, stream_n(1), Origin::kFramework);
    REQUIRE(first);
    REQUIRE(p.write(*first, 4096, 1, stream_n(1)));  // tracking stops
    REQUIRE(m.free(*first, stream_n(1)));
  }
  REQUIRE_FALSE(m.tracking());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread device_thread([&] {
    while (!stop.load()) {
      if (dev.run_some(16) == 0) std::this_thread::yield();
    }
  });
  std::thread housekeeping([&] {
    for (int i = 0; !stop.load(); ++i) {
      const StreamOrder::Snapshot marks = m.stream_marks(std::nullopt);  // a cudaDeviceSynchronize
      dev.run_all();
      m.synchronized(marks);
      std::this_thread::yield();
    }
  });
  const auto worker = [&](uint32_t t) {
    std::mt19937 rng(300 + t);
    const Stream s = stream_n(1 + t);
    struct Live {
      uint64_t address, bytes;
      uint32_t seed;
    };
    std::vector<Live> live;
    uint32_t seed = 1000 * (t + 1);
    constexpr uint64_t kSizes[] = {512, 4096, 100000, 700 * 1024};
    for (int step = 0; step < 1000; ++step) {
      if (t == 0 && step % 100 == 50) m.trim_to(0);  // while the others' buffers are kept
      const int op = static_cast<int>(rng() % 10);
      if (live.empty() || (op < 4 && live.size() < 12)) {
        const uint64_t bytes = rng() % 8 == 0 ? 3 * kMiB : kSizes[rng() % 4];
        const auto a = m.allocate(bytes, s, Origin::kFramework);
        if (!a) {
          ++failures;
          continue;
        }
        dev.write(s, *a, bytes, seed);  // untracked: a launch reports nothing
        live.push_back({*a, bytes, seed++});
      } else if (op < 8) {
        const size_t i = rng() % live.size();
        dev.check(s, live[i].address, live[i].bytes, live[i].seed);
        if (!m.free(live[i].address, s)) ++failures;
        live.erase(live.begin() + static_cast<long>(i));
      } else {
        const Live& l = live[rng() % live.size()];
        dev.check(s, l.address, l.bytes, l.seed);
      }
    }
    for (const Live& l : live) {
      dev.check(s, l.address, l.bytes, l.seed);
      m.free(l.address, s);
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  stop.store(true);
  housekeeping.join();
  device_thread.join();
  dev.run_all();
  const ManagerStats s = m.stats();
  INFO(m.summary());
  CHECK(failures.load() == 0);
  CHECK_MSG_ERRORS(dev);
  CHECK(s.cache_hits > 300);
  CHECK(s.cache_flushes > 0);
  CHECK(s.live == 0);
  CHECK(s.host_waits == 0);
}
