// Static placement (planner/placement.h, Note [A static placement]): hand-made iterations whose
// layouts are known, the invariants on random ones, and the shipped ResNet-50 iteration.
#include "planner/placement.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "tests/common/test_util.h"
#include "tests/cpu/trace_builder.h"

using namespace vcudnn;

namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGranule = 2 * kMiB;
using M = AccessMode;

const PlacedBuffer* placed(const Placement& p, size_t life) {
  for (const PlacedBuffer& b : p.buffers)
    if (b.life == life) return &b;
  return nullptr;
}

bool share_bytes(const PlacedBuffer& a, const PlacedBuffer& b) {
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// The life (index into Lifetimes::buffers) of trace buffer `buffer`.
size_t life_of(const Lifetimes& l, uint32_t buffer) {
  for (size_t i = 0; i < l.buffers.size(); ++i)
    if (l.buffers[i].buffer == buffer) return i;
  FAIL("buffer " << buffer << " has no life");
  return 0;
}

// The recorded VGG-16 iteration (batch 64, H100, 2026-11-24), planned as the runtime plans it with a
// static placement: buffers a later iteration can name, moving in part, at the trace's link.
struct Vgg16 {
  Trace t;
  Lifetimes l;
  OffloadOptions options;
  LinkModel link;
};
const Vgg16& vgg16() {
  static const Vgg16 v = [] {
    auto read = read_trace(test::source_dir() + "/tests/data/vgg16_b64_trace.json");
    REQUIRE(read.ok());
    Vgg16 out{read.value(), {}, {}, {}};
    out.l = lifetimes(out.t);
    out.options.replayable_only = true;
    out.options.partial_moves = true;
    out.link = {out.t.link->device_to_host, out.t.link->host_to_device, out.t.link->both};
    return out;
  }();
  return v;
}

}  // namespace

TEST_CASE("placement: buffers never on the device together share pool bytes, and a moved buffer's bytes serve others",
          "[placement]") {
  const test::Chain c = test::chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  const Trace& t = c.b.t;
  const Lifetimes l = lifetimes(t);
  const SpanModel m = span_model(t, l);
  const Placement none = place_buffers(t, l, m, {}, kGranule);
  INFO(check_placement(m, {}, none));
  CHECK(check_placement(m, {}, none).empty());
  // Every map and pre-activation is placed; the weight (1 MiB, below a granule) is not.
  CHECK(none.buffers.size() == c.maps.size() + c.pre.size());
  CHECK(placed(none, life_of(l, c.weight)) == nullptr);
  // A chain keeps every map for the backward pass: nothing can share, so the pool is the peak.
  CHECK(none.pool_bytes == none.resident_peak);
  CHECK(none.total() == none.pool_bytes + none.other_peak);
  CHECK(none.remap_calls == 0);
  CHECK(none.blocks == 1);

  // A plan that moves the first map over the forward pass: the later maps take its bytes while it
  // is away, and the pool is smaller by about what moved.
  const std::vector<uint64_t> sim = simulate(m, {});
  const uint64_t peak = *std::max_element(sim.begin(), sim.end());
  auto plan = plan_offload(t, l, peak - 8 * kMiB, OffloadPolicy::kVcudnn);
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->moves.empty());
  const Placement moved = place_buffers(t, l, m, plan->moves, kGranule);
  INFO(check_placement(m, plan->moves, moved));
  CHECK(check_placement(m, plan->moves, moved).empty());
  CHECK(moved.pool_bytes < none.pool_bytes);
  CHECK(moved.total() <= plan->peak_bytes + kGranule);  // the layout adds at most what the pool rounds
  const PlacedBuffer* away = placed(moved, plan->moves[0].life);
  REQUIRE(away != nullptr);
  CHECK(away->moved);
  bool shared = false;
  for (const PlacedBuffer& b : moved.buffers) shared = shared || (b.life != away->life && share_bytes(b, *away));
  CHECK(shared);
  CHECK(moved.remap_calls == 3 * plan->moves.size());  // each moved map is one block here
}

// Note [Bytes held until the copy out ends]: a layout that hands a moved buffer's bytes over while
// its copy out runs makes the new owner's call wait for that copy, and the timeline says so; the
// layout plan_placed() keeps is the one with the shorter timeline.
TEST_CASE(
    "placement: a call given a moved buffer's bytes waits for its copy out, plan_placed weighs that, and a "
    "layout around copies out avoids it",
    "[placement]") {
  const test::Chain c = test::chain({8 * kMiB, 16 * kMiB, 24 * kMiB, 32 * kMiB, 40 * kMiB});
  const Trace& t = c.b.t;
  const Lifetimes l = lifetimes(t);
  const SpanModel m = span_model(t, l);
  const std::vector<uint64_t> sim = simulate(m, {});
  const uint64_t peak = *std::max_element(sim.begin(), sim.end());
  const LinkModel slow{0.8, 0.8, 1.6};  // GB/s: 8 MiB takes ~10 ms, calls 1 ms each
  constexpr double kCallMs = 1.0;
  auto plan = plan_offload(t, l, peak - 8 * kMiB, OffloadPolicy::kVcudnn, {}, slow, kCallMs);
  REQUIRE(plan.ok());
  const Placement moved = place_buffers(t, l, m, plan->moves, kGranule);
  REQUIRE(check_placement(m, plan->moves, moved).empty());
  const std::vector<Handover> h = handovers(plan->moves, moved);
  REQUIRE_FALSE(h.empty());  // the later maps take the first one's bytes as it leaves
  for (const Handover& x : h) {
    const OffloadMove& mv = plan->moves[x.move];
    CHECK(mv.first_absent() <= x.call);
    CHECK(x.call <= mv.last_absent());
  }
  const PlanTimeline plain = time_plan(t, m, plan.value(), slow, kCallMs);
  const PlanTimeline placed_time = time_placed(t, m, plan.value(), moved, slow, kCallMs);
  CHECK(placed_time.room_ms > plain.room_ms);
  CHECK(placed_time.step_ms > plain.step_ms);
  for (const Handover& x : h) {
    for (const TimedCopy& copy : placed_time.copies_out)
      if (copy.move == x.move) CHECK(placed_time.call_start_ms[x.call] >= copy.end_ms);
  }

  // plan_placed() for the same budget: its step is its layout's timeline, and with bytes held until
  // copied no call waits for a hand-over.
  auto best = plan_placed(t, l, peak - 8 * kMiB + kGranule, {}, slow, kCallMs);
  REQUIRE(best.ok());
  const PlanTimeline chosen = time_placed(t, m, best->plan, best->placement, slow, kCallMs);
  CHECK(chosen.step_ms == Approx(best->step_ms));
  CHECK(best->step_ms <= placed_time.step_ms);
  if (best->held) {
    const PlanTimeline without = time_plan(t, m, best->plan, slow, kCallMs);
    CHECK(chosen.room_ms == Approx(without.room_ms));
  }

  // Note [Laying out around copies out]: given the calls during which each copy out still reads its
  // buffer's bytes, and room for it, the layout puts no buffer there that arrives then: no call
  // waits for a hand-over beyond what the plan alone waits for room.
  const CopyWindows windows = copy_windows(m, plan.value(), plain);
  size_t copying = 0;
  for (const OffloadMove& mv : plan->moves) {
    for (const auto& [first, last] : windows[mv.life].whole) {
      CHECK(first == mv.first_absent());
      CHECK(last <= mv.last_absent());
      ++copying;
    }
  }
  REQUIRE(copying > 0);
  const Placement around = place_buffers(t, l, m, plan->moves, kGranule, 0, &windows, peak + 64 * kMiB);
  REQUIRE(check_placement(m, plan->moves, around).empty());
  for (const Handover& x : handovers(plan->moves, around)) {
    for (const auto& [first, last] : windows[plan->moves[x.move].life].whole) CHECK((x.call < first || x.call > last));
  }
  const PlanTimeline timed = time_placed(t, m, plan.value(), around, slow, kCallMs);
  CHECK(timed.room_ms == Approx(plain.room_ms));
  CHECK(timed.step_ms == Approx(plain.step_ms));
  // Without room beyond the most placed bytes at once, it still lays out every buffer correctly.
  const Placement no_room = place_buffers(t, l, m, plan->moves, kGranule, 0, &windows);
  CHECK(check_placement(m, plan->moves, no_room).empty());
}

// A gradient left to the next iteration: placed with the previous instance's life, so that it wraps
// around the iteration's end, and nothing alive in the wrapped part shares its bytes.
TEST_CASE("placement: a buffer the iteration leaves to the next is on the device until its previous instance's free",
          "[placement]") {
  test::TraceBuilder b;
  const uint32_t old_grad = b.buffer(10 * kMiB);
  const uint32_t early = b.buffer(10 * kMiB);  // alive while the old gradient is
  const uint32_t late = b.buffer(10 * kMiB);   // only between the old one's free and the new one's allocation
  const uint32_t grad = b.buffer(10 * kMiB);
  const uint64_t first = b.add(CallKind::kAlloc, static_cast<int32_t>(early));
  b.add(CallKind::kLaunch, -1, {{early, M::kWrite}, {old_grad, M::kRead}});
  b.add(CallKind::kFree, static_cast<int32_t>(old_grad));
  b.add(CallKind::kFree, static_cast<int32_t>(early));
  b.add(CallKind::kAlloc, static_cast<int32_t>(late));
  b.add(CallKind::kLaunch, -1, {{late, M::kWrite}});
  b.add(CallKind::kFree, static_cast<int32_t>(late));
  b.add(CallKind::kAlloc, static_cast<int32_t>(grad));
  b.add(CallKind::kLaunch, -1, {{grad, M::kWrite}});
  b.done(first);
  const Lifetimes l = lifetimes(b.t);
  const SpanModel m = span_model(b.t, l);
  const Placement p = place_buffers(b.t, l, m, {}, kGranule);
  INFO(check_placement(m, {}, p));
  CHECK(check_placement(m, {}, p).empty());
  const PlacedBuffer* g = placed(p, life_of(l, grad));
  REQUIRE(g != nullptr);
  CHECK(g->partner == life_of(l, old_grad));
  REQUIRE(g->resident.size() == 2);
  CHECK(g->resident.front().first == 0);
  CHECK(g->resident.back().second == m.seqs.size() - 1);
  CHECK(placed(p, life_of(l, old_grad)) == nullptr);  // it is the new one's previous instance
  const PlacedBuffer* e = placed(p, life_of(l, early));
  const PlacedBuffer* x = placed(p, life_of(l, late));
  REQUIRE(e != nullptr);
  REQUIRE(x != nullptr);
  CHECK_FALSE(share_bytes(*e, *g));
  // 10 MiB each: the gradient (both instances), and `early`; `late` is on the device with neither,
  // so it takes the bytes of one of them.
  CHECK(p.pool_bytes == 20 * kMiB);
  CHECK((share_bytes(*e, *x) || share_bytes(*g, *x)));
}

TEST_CASE("placement: the check finds two buffers on the device together sharing bytes", "[placement]") {
  const test::Chain c = test::chain({8 * kMiB, 16 * kMiB, 24 * kMiB});
  const Lifetimes l = lifetimes(c.b.t);
  const SpanModel m = span_model(c.b.t, l);
  Placement p = place_buffers(c.b.t, l, m, {}, kGranule);
  REQUIRE(check_placement(m, {}, p).empty());
  REQUIRE(p.buffers.size() >= 2);
  p.buffers[1].offset = p.buffers[0].offset;  // every map lives through the forward pass's end
  p.buffers[1].segments.clear();              // all of it at `offset`
  std::sort(p.buffers.begin(), p.buffers.end(), [](const PlacedBuffer& a, const PlacedBuffer& b) {
    return std::pair(a.offset, a.life) < std::pair(b.offset, b.life);
  });
  CHECK_THAT(check_placement(m, {}, p), Catch::Contains("share pool bytes"));
  Placement misaligned = place_buffers(c.b.t, l, m, {}, kGranule);
  misaligned.buffers[0].offset += 512;
  misaligned.buffers[0].segments.clear();
  CHECK_THAT(check_placement(m, {}, misaligned), Catch::Contains("granule-aligned"));
  // Note [Buffers in pieces]: pieces must cover the buffer in order.
  Placement gap = place_buffers(c.b.t, l, m, {}, kGranule);
  const uint64_t bytes = gap.buffers[0].bytes;
  gap.buffers[0].segments = {{0, gap.buffers[0].offset, bytes / 2}, {bytes / 2 + kGranule, 0, bytes / 2 - kGranule}};
  CHECK_THAT(check_placement(m, {}, gap), Catch::Contains("do not cover it in order"));
}

TEST_CASE("placement: invariants on random iterations and budgets", "[placement]") {
  std::mt19937 rng(11);
  size_t kept_parts = 0;  // moves that keep part of their buffer, laid out
  for (int round = 0; round < 40; ++round) {
    std::vector<uint64_t> maps;
    const int n = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) maps.push_back((1 + rng() % 40) * kMiB + (rng() % 3) * 4096);
    const test::Chain c = test::chain(maps);
    const Lifetimes l = lifetimes(c.b.t);
    const SpanModel m = span_model(c.b.t, l);
    const uint64_t least = offload_bound(m).least_bytes;
    const std::vector<uint64_t> none = simulate(m, {});
    const uint64_t peak = *std::max_element(none.begin(), none.end());
    for (int k = 0; k < 5; ++k) {
      const uint64_t budget = least + (peak - least) * static_cast<uint64_t>(k) / 4;
      auto plan = plan_offload(c.b.t, l, budget, OffloadPolicy::kVcudnn);
      REQUIRE(plan.ok());
      const Placement p = place_buffers(c.b.t, l, m, plan->moves, kGranule);
      INFO("round " << round << " budget " << budget);
      CHECK(check_placement(m, plan->moves, p).empty());
      CHECK(p.pool_bytes >= p.resident_peak);
      CHECK(p.other_peak <= peak);
      CHECK(p.total() >= plan->peak_bytes);  // no layout holds less than the plan's peak
      for (const bool partial : {false, true}) {
        OffloadOptions options;
        options.partial_moves = partial;
        const SpanModel pm = span_model(c.b.t, l, options);
        // Note [Moving part of a buffer]: a plan that keeps part of its buffers lays out too.
        auto in_part = plan_offload(c.b.t, l, budget, OffloadPolicy::kVcudnn, options);
        REQUIRE(in_part.ok());
        for (const OffloadMove& mv : in_part->moves) kept_parts += mv.offset ? 1 : 0;
        CHECK(check_placement(pm, in_part->moves, place_buffers(c.b.t, l, pm, in_part->moves, kGranule)).empty());
        auto placed_plan = plan_placed(c.b.t, l, budget, options);
        INFO("partial " << partial);
        if (placed_plan) {
          CHECK(placed_plan->placement.total() <= budget);
          CHECK(placed_plan->plan_budget <= budget);
          CHECK(check_placement(pm, placed_plan->plan.moves, placed_plan->placement).empty());
          CHECK(check_plan(pm, placed_plan->plan).empty());
        } else {
          CHECK_THAT(placed_plan.error().message, Catch::Contains("no static placement fits"));
        }
      }
    }
  }
  CHECK(kept_parts > 0);
}

// Note [A static placement]: on the recorded ResNet-50 iteration (batch 64, H100) every budget from
// 90% of PyTorch's peak down to 50% fits with its static placement, each move costing a few driver
// calls, where the arena under a budget maps and unmaps ~100 extents an iteration.
TEST_CASE(
    "static placement of the shipped ResNet-50 iteration: budgets from 90% to 50% fit with a few driver calls "
    "per move",
    "[placement]") {
  auto read = read_trace(test::source_dir() + "/tests/data/resnet50_b64_trace.json");
  REQUIRE(read.ok());
  const Trace& t = read.value();
  const Lifetimes l = lifetimes(t);
  OffloadOptions options;
  options.replayable_only = true;  // as the runtime plans
  options.partial_moves = true;
  const SpanModel m = span_model(t, l, options);
  const LinkModel link{t.link->device_to_host, t.link->host_to_device, t.link->both};
  constexpr uint64_t kPeak = 5830299796ull;  // PyTorch's max_memory_allocated (trace_sim_test.cpp)
  for (const int percent : {90, 80, 70, 60, 50}) {
    const uint64_t budget = kPeak * static_cast<uint64_t>(percent) / 100;
    auto r = plan_placed(t, l, budget, options, link, 0.005);
    INFO(percent << "%: " << (r ? "" : r.error().message));
    REQUIRE(r.ok());
    const PlacedPlan& p = r.value();
    INFO("plan for " << p.plan_budget << ", pool " << p.placement.pool_bytes << " (resident peak "
                     << p.placement.resident_peak << "), other " << p.placement.other_peak << ", remap calls "
                     << p.placement.remap_calls);
    CHECK(check_placement(m, p.plan.moves, p.placement).empty());
    CHECK(p.placement.total() <= budget);
    // The layout wastes little: within 20% of the most placed bytes on the device at once (2.4% at
    // 90%, 13% at 50% with prefetches as early as the budget allows; 0.4% and 19% when they went as
    // late as the link allows).
    CHECK(static_cast<double>(p.placement.pool_bytes) <= 1.2 * static_cast<double>(p.placement.resident_peak));
    // Each move's range is cut into blocks at the ends of the pieces of buffers laid out in pieces
    // over its bytes (Note [Buffers in pieces]): up to ~16 blocks a move here (50 %). On the H100
    // (fp32, 60 % and 90 %) the steady state made no driver call: a moved buffer comes back onto
    // its range before the host has seen its copy out end (Note [Back before the copy out ended]).
    CHECK(p.placement.remap_calls <= 3 * 20 * p.plan.moves.size());
    // Note [Choosing how a placement holds bytes]: the step stated is the layout's timeline, hand-overs
    // included, and no longer than the other way of holding bytes would give (checked in the next test).
    const PlanTimeline time = time_placed(t, m, p.plan, p.placement, link, 0.005);
    CHECK(time.step_ms == Approx(p.step_ms));
    CHECK(time.room_ms == Approx(p.handover_ms));
    INFO("step " << p.step_ms << " ms, of which waiting for copies out " << p.handover_ms << " ms; held " << p.held
                 << "; compute " << time.compute_ms << " ms");
    if (percent == 90) {
      // The plan for a target a few % under the budget: what the layout costs in bytes moved.
      CHECK(static_cast<double>(p.plan_budget) >= 0.97 * static_cast<double>(budget));
      CHECK(p.placement.remap_calls <= 80);
      CHECK(p.step_ms <= 1.25 * time.compute_ms);
    }
  }
}

// Note [Searching for a layout that fits]: VGG-16 batch 64 (tests/data/vgg16_b64_trace.json,
// recorded on the H100 on 2026-11-24) has feature maps of 784 and 1568 MiB, which the fixed orders
// pack loosely: at the budget the runtime plans for at 90 % of PyTorch's live peak, no layout fitted.
TEST_CASE("static placement of a recorded VGG-16 iteration: a layout that fits is searched for", "[placement]") {
  const Trace& t = vgg16().t;
  const Lifetimes& l = vgg16().l;
  const OffloadOptions& options = vgg16().options;
  const SpanModel m = span_model(t, l, options);
  const LinkModel& link = vgg16().link;
  const uint64_t budget = 5527 * kMiB;  // 90 % of 6.09 GiB less 1/64 of it
  auto r = plan_placed(t, l, budget, options, link, 0.005);
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  const PlacedPlan& p = r.value();
  CHECK(check_placement(m, p.plan.moves, p.placement).empty());
  CHECK(p.placement.total() <= budget);
  // Note [Buffers in pieces]: with buffers in pieces the pool is the most placed bytes on the device
  // at once (laid out by size alone; a layout around copies out may take more of what the budget
  // leaves), and the plan (for 99 % of the target, two of its three moves in part) moves 928 MiB each
  // way, where whole buffers laid out whole needed a plan for 92 % moving 2352 MiB.
  const Placement by_size = place_buffers(t, l, m, p.plan.moves, options.granule, budget);
  CHECK(by_size.pool_bytes == by_size.resident_peak);
  CHECK(p.plan.bytes_moved <= 1000 * kMiB);
  size_t in_pieces = 0;
  for (const PlacedBuffer& b : p.placement.buffers) in_pieces += b.segments.size() > 1 && !b.kept ? 1 : 0;
  CHECK(in_pieces > 0);
  OffloadOptions whole = options;
  whole.partial_moves = false;
  auto w = plan_placed(t, l, budget, whole, link, 0.005);
  REQUIRE(w.ok());
  CHECK(w->plan.bytes_moved > p.plan.bytes_moved);
  // Note [Laying out around copies out]: the plan's buffers laid out without the copies' windows make
  // the forward pass's buffers wait for the largest copy out (13 ms in this model, 5.6 around them).
  if (!p.held) {
    const Placement tight = place_buffers(t, l, m, p.plan.moves, options.granule, budget);
    REQUIRE(tight.total() <= budget);
    const PlanTimeline tight_time = time_placed(t, m, p.plan, tight, link, 0.005);
    INFO("hand-over waits " << p.handover_ms << " ms, " << tight_time.room_ms << " laid out without the windows");
    CHECK(p.handover_ms < 0.75 * tight_time.room_ms);
    CHECK(p.step_ms < tight_time.step_ms);
    // Note [Copies out in pieces]: a buffer given the first bytes of a moved one waits for the pieces
    // of its copy out that hold them, not for the whole copy.
    std::vector<Handover> pieces = handovers(p.plan.moves, p.placement), whole_copies = pieces;
    size_t part = 0;
    for (Handover& h : whole_copies) {
      REQUIRE(h.upto > 0);
      REQUIRE(h.upto <= p.plan.moves[h.move].bytes);
      CHECK(h.upto % kCopyPiece == std::min(h.upto, p.plan.moves[h.move].bytes) % kCopyPiece);
      part += h.upto < p.plan.moves[h.move].bytes ? 1 : 0;
      h.upto = 0;
    }
    CHECK(part > 0);
    std::vector<bool> pooled(p.plan.moves.size(), true);
    const PlanTimeline by_piece = time_plan(t, m, p.plan, link, 0.005, pieces, pooled);
    const PlanTimeline by_copy = time_plan(t, m, p.plan, link, 0.005, whole_copies, pooled);
    INFO("hand-over waits " << by_piece.room_ms << " ms by piece, " << by_copy.room_ms << " for whole copies");
    CHECK(by_piece.room_ms < by_copy.room_ms);
    CHECK(by_piece.step_ms < by_copy.step_ms);
  } else {
    FAIL_CHECK("the plan now holds its bytes until copied: update this test");
  }
  // The search is seeded: the same iteration gets the same layout.
  auto again = plan_placed(t, l, budget, options, link, 0.005);
  REQUIRE(again.ok());
  REQUIRE(again->placement.buffers.size() == p.placement.buffers.size());
  for (size_t k = 0; k < p.placement.buffers.size(); ++k)
    CHECK(again->placement.buffers[k].offset == p.placement.buffers[k].offset);
}

// Note [Copies out with room to spare]: the layout is made for copies out slower than measured, so
// that a link a little slower while the GPU computes leaves its hand-overs waiting less, and the step
// it predicts is still at the measured rate.
TEST_CASE("static placement: laid out for copies out at kCopyOutRate of the measured link", "[placement]") {
  const Trace& t = vgg16().t;
  const Lifetimes& l = vgg16().l;
  const OffloadOptions& options = vgg16().options;
  const SpanModel m = span_model(t, l, options);
  const LinkModel& link = vgg16().link;
  LinkModel slower = link, faster = link;
  slower.device_to_host_gbps *= kCopyOutRate;
  slower.both_gbps *= kCopyOutRate;
  faster.device_to_host_gbps /= kCopyOutRate;
  faster.both_gbps /= kCopyOutRate;
  const uint64_t budget = static_cast<uint64_t>(0.9 * 6542329306.0);  // 90 % of PyTorch's live peak on the H100
  auto p = plan_placed(t, l, budget, options, link, 0.005);
  // What the layout was before: made for the measured rate (plan_placed() takes kCopyOutRate of it).
  auto before = plan_placed(t, l, budget, options, faster, 0.005);
  REQUIRE(p.ok());
  REQUIRE(before.ok());
  const PlanTimeline at_rate = time_placed(t, m, p->plan, p->placement, link, 0.005);
  CHECK(p->step_ms == Approx(at_rate.step_ms));
  CHECK(p->handover_ms == Approx(at_rate.room_ms));
  const PlanTimeline slow = time_placed(t, m, p->plan, p->placement, slower, 0.005);
  const PlanTimeline slow_before = time_placed(t, m, before->plan, before->placement, slower, 0.005);
  const PlanTimeline fast_before = time_placed(t, m, before->plan, before->placement, link, 0.005);
  INFO("waits for copies out at the measured rate " << at_rate.room_ms << " ms (" << fast_before.room_ms
                                                       << " before), at " << kCopyOutRate << " of it " << slow.room_ms
                                                       << " (" << slow_before.room_ms << " before)");
  // 1.73 against 2.41 ms on this trace (2026-11-25), and the same at the measured rate.
  CHECK(slow.room_ms < slow_before.room_ms - 0.3);
  CHECK(at_rate.step_ms <= fast_before.step_ms + 0.01);
}

TEST_CASE("vcudnn plan --placement: the plan a static placement needs, the pool and the driver calls",
          "[placement][cli]") {
  const std::string cli = test::exe_dir() + "/vcudnn";
  const test::TempDir tmp;
  const std::string json = tmp.file("plan.json");
  const auto r =
      test::run_process({cli, "plan", "--budget", "80%", "--policy", "vcudnn", "--placement", "--json", json}, {});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("static placement: the vcudnn plan for"));
  CHECK_THAT(r.out, Catch::Contains(": fits; per iteration"));
  const auto j = nlohmann::json::parse(test::read_file(json));
  const auto& p = j.at("placement");
  CHECK(p.at("total").get<uint64_t>() <= j.at("budget").get<uint64_t>());
  CHECK(p.at("pool_bytes").get<uint64_t>() >= p.at("resident_peak").get<uint64_t>());
  CHECK(p.at("total").get<uint64_t>() == p.at("pool_bytes").get<uint64_t>() + p.at("other_peak").get<uint64_t>());
  CHECK(p.at("remap_calls").get<uint64_t>() > 0);
  // Below what any plan needs: refused, as the plan is.
  const auto low = test::run_process({cli, "plan", "--budget", "5%", "--policy", "vcudnn", "--placement"}, {});
  CHECK(low.exit_code == 3);
  CHECK_THAT(low.out, Catch::Contains("static placement: a device budget of"));
  // Note [Across the iteration's end], on the recorded VGG-16 iteration.
  const auto vgg =
      test::run_process({cli, "plan", test::source_dir() + "/tests/data/vgg16_b64_trace.json", "--budget", "5888000000",
                         "--policy", "vcudnn", "--placement", "--across-end", "--json", json},
                        {});
  INFO(vgg.out << vgg.err);
  CHECK(vgg.exit_code == 0);
  CHECK_THAT(vgg.out, Catch::Contains("moves across the iteration's end"));
  CHECK(nlohmann::json::parse(test::read_file(json)).at("placement").at("moves_across_end").get<uint64_t>() > 0);
  // At the benchmark's 70 % no plan without such moves fits (exit code 3, as for any refused plan); the
  // default placement takes them, and its lower bound, which counts them, is what the benchmark reports.
  const auto vgg70 = test::run_process({cli, "plan", test::source_dir() + "/tests/data/vgg16_b64_trace.json",
                                        "--budget", "4579630514", "--policy", "vcudnn", "--placement", "--json", json},
                                       {});
  INFO(vgg70.out << vgg70.err);
  CHECK(vgg70.exit_code == 3);
  CHECK_THAT(vgg70.out + vgg70.err, Catch::Contains("is below the least any offload plan"));
  const nlohmann::json placed70 = nlohmann::json::parse(test::read_file(json)).at("placement");
  CHECK(placed70.at("moves_across_end").get<uint64_t>() > 0);
  const double bound = placed70.at("lower_bound_ms").get<double>();
  CHECK(bound > 0);
  CHECK(bound <= placed70.at("step_ms").get<double>());
}

// Note [Across the iteration's end]: the recorded span begins with the optimizer step, after which
// SGD's momentum (536 MiB on VGG-16 b64) and the fc weights (after their backward use) are idle until
// the next one. Moves across the span's end take them off the device while the link has nothing else
// to carry, placed in the pool so that their absence is room.
TEST_CASE("static placement across the iteration's end: optimizer state away over the passes, back before the end",
          "[placement]") {
  const Trace& t = vgg16().t;
  const Lifetimes& l = vgg16().l;
  const OffloadOptions& options = vgg16().options;
  OffloadOptions across = options;
  across.across_end = true;
  const SpanModel m = span_model(t, l, options), ma = span_model(t, l, across);
  const size_t n = m.seqs.size();
  const LinkModel& link = vgg16().link;
  const double peak = 6542329306.0;  // PyTorch's live peak on the H100
  const uint64_t budget = static_cast<uint64_t>(0.9 * peak);
  auto within = plan_placed(t, l, budget, options, link, 0.005);
  auto p = plan_placed(t, l, budget, across, link, 0.005);
  REQUIRE(within.ok());
  REQUIRE(p.ok());
  for (const OffloadMove& mv : within->plan.moves) CHECK(mv.next_use < n);  // off by default
  INFO(check_plan(ma, p->plan));
  REQUIRE(check_plan(ma, p->plan).empty());
  REQUIRE(check_placement(ma, p->plan.moves, p->placement).empty());
  CHECK(p->placement.total() <= budget);
  uint64_t away = 0;
  for (const OffloadMove& mv : p->plan.moves) {
    if (mv.next_use != n) continue;
    const SpanModel::Life& life = ma.lives[mv.life];
    CHECK(life.through);
    CHECK(mv.out_after == life.uses.back());
    CHECK(mv.first_absent() > mv.out_after);
    CHECK(mv.prefetch_at < n);
    const PlacedBuffer* b = placed(p->placement, mv.life);
    REQUIRE(b != nullptr);
    CHECK(b->through);
    CHECK(b->resident.front().first == 0);  // on the device from the span's start
    CHECK(b->resident.back().second == n - 1);
    away += mv.bytes;
  }
  // A model that does not allow it finds such a move wrong.
  if (away) CHECK_FALSE(check_plan(m, p->plan).empty());
  // Momentum and the fc weights leave: 1018 MiB, and what stays outside the pool falls from 1185 to
  // 167 MiB; the step in the plan's model from 67.8 to 61.5 ms (compute 53.6) on this trace.
  INFO("across the end " << away / kMiB << " MiB; other " << p->placement.other_peak / kMiB << " MiB against "
                         << within->placement.other_peak / kMiB << "; step " << p->step_ms << " ms against "
                         << within->step_ms);
  CHECK(away >= 900 * kMiB);
  CHECK(p->placement.other_peak < within->placement.other_peak / 2);
  CHECK(p->step_ms < within->step_ms - 3.0);
  // The copies back across the end are part of the step: on a slow link the step waits for them.
  LinkModel slow = link;
  slow.host_to_device_gbps = 2.0;
  const PlanTimeline late = time_placed(t, ma, p->plan, p->placement, slow, 0.005);
  double last_back = 0;
  for (const TimedCopy& c : late.copies_back)
    if (p->plan.moves[c.move].next_use == n) last_back = std::max(last_back, c.end_ms);
  CHECK(last_back > late.call_end_ms[n - 1]);
  CHECK(late.step_ms >= last_back);
  // At 70 % no plan fits without them (the least is 4819.5 MiB); with them one does.
  const uint64_t deep = static_cast<uint64_t>(0.7 * peak);
  CHECK_FALSE(plan_placed(t, l, deep, options, link, 0.005).ok());
  auto d = plan_placed(t, l, deep, across, link, 0.005);
  INFO((d ? "" : d.error().message));
  REQUIRE(d.ok());
  CHECK(d->placement.total() <= deep);
  CHECK(check_placement(ma, d->plan.moves, d->placement).empty());
}
