// NCCL's collectives as accesses on the simulated device (runtime/collectives.h): inside a group a
// collective's buffers are reported at the group's outermost end, where NCCL queues its work, so a
// buffer moved away between the call and the end is back, with its bytes, when the work runs.
#include "runtime/collectives.h"

#include <catch2/catch.hpp>

#include "runtime/memory/call_scope.h"
#include "runtime/memory_manager.h"
#include "tests/cpu/manager_fixture.h"
#include "tests/cpu/sim_device.h"

using namespace vcudnn;
using namespace vcudnn::memory;
using vcudnn::test::SimDevice;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kG = 2 * kMiB;

// The test's manager in place of the process's.
class ToManager : public collectives::Reporter {
 public:
  explicit ToManager(MemoryManager& m) : m_(m) {}
  bool touch(const collectives::Buffers& b, StreamRef stream, const char* api) const override {
    ++touches;
    return m_.touch(b.words, b.n, Access::kUnknown, stream, api);
  }
  void pin(const collectives::Buffers& b, const char* api) const override { m_.pin(b.words, b.n, api); }
  mutable int touches = 0;

 private:
  MemoryManager& m_;
};

// A card of `granules` under a budget of as many, with ownership on and the reporter to its manager.
struct Card {
  test::MemoryActive on;
  SimDevice dev;
  MemoryManager m;
  ToManager to{m};
  explicit Card(uint64_t granules) : dev(kG, granules), m(dev, dev, dev, test::manager_config(granules * kG, kG)) {}
  uint64_t buffer() {  // 4 MiB on no stream, or 0
    return m.allocate(4 * kMiB, std::nullopt, Origin::kFramework).value_or(0);
  }
};

collectives::Buffers one(uint64_t a) {
  collectives::Buffers b;
  b.words[b.n++] = a;
  return b;
}

}  // namespace

TEST_CASE("collectives: inside a group the buffers come back at its end, where NCCL queues the work",
          "[memory][nccl]") {
  test::MemoryActive on;
  SimDevice dev(kG, 4);
  MemoryManager m(dev, dev, dev, test::manager_config(3 * kG, kG));  // the bucket or the other buffer
  const ToManager to(m);
  const Stream compute = SimDevice::stream(1), nccl = SimDevice::stream(2);
  const auto bucket = m.allocate(4 * kMiB, compute, Origin::kFramework);
  REQUIRE(bucket);
  {
    CallScope scope;
    REQUIRE(m.touch(&*bucket, 1, Access::kWrite, compute, "kernel"));
    dev.write(compute, *bucket, 4 * kMiB, 11);
  }
  REQUIRE(m.evict(*bucket) == EvictResult::kOk);

  collectives::group_started();
  {
    CallScope scope;  // the collective call's own: its work is not queued yet
    REQUIRE(collectives::collective(one(*bucket), nccl, "ncclAllReduce", to));
  }
  CHECK(to.touches == 0);
  CHECK(collectives::waiting() == 1);
  CHECK(m.evict(*bucket) == EvictResult::kAlreadyEvicted);  // nothing brought it back at the call
  // Room taken by another buffer until the end: the bucket must come back over it.
  const auto other = m.allocate(4 * kMiB, compute, Origin::kFramework);
  REQUIRE(other);
  {
    CallScope scope;
    REQUIRE(m.touch(&*other, 1, Access::kWrite, compute, "kernel"));
    dev.write(compute, *other, 4 * kMiB, 12);
  }
  {
    CallScope scope;  // ncclGroupEnd's: NCCL queues the collective's kernel inside it
    REQUIRE(collectives::group_ending(to));
    CHECK(to.touches == 1);
    dev.check(nccl, *bucket, 4 * kMiB, 11);  // the collective's kernel reads what was written
  }
  CHECK(collectives::open_groups() == 0);
  CHECK(collectives::waiting() == 0);
  CHECK(m.stats().restores >= 1);
  dev.run_all();
  INFO(dev.first_errors());
  CHECK(dev.errors.empty());
}

TEST_CASE("collectives: only the outermost end of nested groups reports, outside a group at once", "[memory][nccl]") {
  Card card(8);
  auto& [on, dev, m, to] = card;
  const auto a = card.buffer(), b = card.buffer();
  REQUIRE(a);
  REQUIRE(b);
  const Stream nccl = SimDevice::stream(2);

  const uint64_t reported = collectives::reported(), at_ends = collectives::reported_at_group_ends();
  CHECK(collectives::collective(one(a), nccl, "ncclSend", to));
  CHECK(to.touches == 1);  // no group: reported with the call

  collectives::group_started();
  collectives::group_started();
  CHECK(collectives::collective(one(a), nccl, "ncclSend", to));
  CHECK(collectives::group_ending(to));  // inner end: NCCL queues nothing yet
  CHECK(collectives::collective(one(b), nccl, "ncclRecv", to));
  CHECK(to.touches == 1);
  CHECK(collectives::waiting() == 2);
  CHECK(collectives::group_ending(to));
  CHECK(to.touches == 3);
  CHECK(collectives::open_groups() == 0);
  CHECK(collectives::reported() == reported + 3);  // the exit line's counts
  CHECK(collectives::reported_at_group_ends() == at_ends + 2);

  // An end without a start changes nothing (NCCL answers it with an error).
  CHECK(collectives::group_ending(to));
  CHECK(collectives::open_groups() == 0);
  CHECK(to.touches == 3);
  dev.run_all();
  CHECK(dev.errors.empty());
}

TEST_CASE("collectives: work a nonblocking communicator may queue later pins its buffers", "[memory][nccl]") {
  Card card(8);
  auto& [on, dev, m, to] = card;
  const auto a = card.buffer(), b = card.buffer(), c = card.buffer();
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  const Stream nccl = SimDevice::stream(2);

  collectives::group_started();
  REQUIRE(collectives::collective(one(a), nccl, "ncclAllReduce", to));
  REQUIRE(collectives::group_ending(to));
  collectives::queued_later(nullptr, "ncclGroupEnd", to);  // the group's end returned ncclInProgress
  CHECK(m.stats().pinned_buffers == 1);
  CHECK(m.evict(a) == EvictResult::kNotAllowed);

  const collectives::Buffers alone = one(b);
  REQUIRE(collectives::collective(alone, nccl, "ncclAllReduce", to));
  collectives::queued_later(&alone, "ncclAllReduce", to);  // a call outside a group did
  CHECK(m.stats().pinned_buffers == 2);
  CHECK(m.evict(b) == EvictResult::kNotAllowed);
  CHECK(m.evict(c) == EvictResult::kOk);  // untouched by NCCL: still free to move
  dev.run_all();
  CHECK(dev.errors.empty());
}
