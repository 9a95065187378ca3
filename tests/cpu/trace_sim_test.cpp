// The recorded ResNet-50 iteration (batch 64, H100, tests/data/resnet50_b64_trace.json) replayed
// through the memory manager under budgets (trace_sim.h): vcudnn's plan against on-demand eviction.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "tests/common/test_util.h"
#include "tests/cpu/trace_sim.h"

using namespace vcudnn;

namespace {

Trace shipped_trace(const std::string& file) {
  auto r = read_trace(test::source_dir() + "/tests/data/" + file);
  REQUIRE(r);
  return r.value();
}

const Trace& resnet50() {
  static const Trace t = shipped_trace("resnet50_b64_trace.json");
  return t;
}

const Trace& vgg16_b64() {
  static const Trace t = shipped_trace("vgg16_b64_trace.json");
  return t;
}

// PyTorch's peak allocation for this model and batch on the H100 (torch.cuda.max_memory_allocated).
constexpr uint64_t kPeak = 5830299796ull;
constexpr int kIterations = 7;
constexpr int kSteady = 3;  // iterations before this one are the recording and the first replays

struct Steady {
  double maps = 0, evictions = 0, fault_ins = 0, host_waits = 0;
};

Steady steady(const test::SimResult& r) {
  Steady s;
  for (size_t i = kSteady; i < r.iterations.size(); ++i) {
    s.maps += static_cast<double>(r.iterations[i].maps);
    s.evictions += static_cast<double>(r.iterations[i].evictions);
    s.fault_ins += static_cast<double>(r.iterations[i].fault_ins);
    s.host_waits += static_cast<double>(r.iterations[i].host_waits);
  }
  const double n = static_cast<double>(r.iterations.size() - kSteady);
  return {s.maps / n, s.evictions / n, s.fault_ins / n, s.host_waits / n};
}

}  // namespace

TEST_CASE(
    "recorded ResNet-50 iteration under 80% and 60% budgets: the plan is followed with no fault-in and fewer "
    "mappings than on-demand eviction, the budget held",
    "[replay][memory]") {
  // Mappings per steady iteration measured when this test was written (the driver calls of Note
  // [Extents under a budget]; ~300 us each on the H100): 94 at 80%, 149 at 60% (before idle
  // extents were taken anywhere in a run: 160 and 182); on demand 152 and 183. Since the scaled
  // trace's link is scaled too (a copy takes as long against the calls as on the H100, not 1/64 of
  // that) and prefetches share one lane (schedule_prefetches), copies back start earlier and hold
  // room longer: 116 and 187 (on demand 154 and 198). The bounds leave ~10% before a change in the
  // arena or the plan counts as a regression.
  struct Case {
    int percent;
    double max_maps;
  };
  for (const Case c : {Case{80, 128}, Case{60, 205}}) {
    const uint64_t budget = kPeak * static_cast<uint64_t>(c.percent) / 100;
    const test::SimResult plan = test::simulate_trace(resnet50(), budget, "vcudnn", kIterations, 64, kFirstRoom, false);
    const test::SimResult lru = test::simulate_trace(resnet50(), budget, "lru", kIterations);
    const Steady p = steady(plan), l = steady(lru);
    INFO(
        fmt::format("{}%: plan: maps {:.1f} evictions {:.1f} fault_ins {:.1f} host_waits {:.1f}; on demand: maps "
                    "{:.1f} evictions {:.1f} fault_ins {:.1f}\n{}\n{}",
                    c.percent, p.maps, p.evictions, p.fault_ins, p.host_waits, l.maps, l.evictions, l.fault_ins,
                    plan.decided, plan.summary));
    CHECK_THAT(plan.decided, Catch::StartsWith("vcudnn plan from the recorded iteration"));
    CHECK(plan.errors.empty());
    CHECK(lru.errors.empty());
    CHECK(plan.peak_bytes <= budget);
    CHECK(lru.peak_bytes <= budget);
    REQUIRE(plan.replay);
    // The recorded iteration is a steady one (Note [A steady iteration]): it starts with the frees
    // of the step before (the gradients), as every later iteration does, so the plan finds the start
    // once and keeps its place from then on. (The first step, recorded before, had no such frees:
    // the plan lost its place there and found the start again every iteration.)
    CHECK(plan.replay->syncs == 1);
    CHECK(plan.replay->mismatches == 0);
    CHECK(plan.replay->iterations >= kIterations - 2);
    // Every eviction of the steady state is planned, and every copy back too.
    CHECK(p.fault_ins == 0);
    CHECK(p.evictions > 0);
    CHECK(l.fault_ins > 0);
    CHECK(p.maps <= c.max_maps);
    CHECK(p.maps < l.maps);
    CHECK(plan.replans == 0);
  }
}

TEST_CASE(
    "a plan that leaves too little room needs on-demand help in the steady state and is made again with more, "
    "until it needs none",
    "[replay][memory]") {
  const uint64_t budget = kPeak * 60 / 100;
  // 1/1024 of the budget as room: too little here (fault-ins); more room moves a few more bytes. Each
  // new plan is followed from the start of an iteration and then needs a steady one to judge: on
  // the steady iteration recorded on the H100 three re-plans (to 1/128) took until iteration 11.
  // The arena's path (no static placement): a placement needs no room of the plan's.
  const test::SimResult r = test::simulate_trace(resnet50(), budget, "vcudnn", 14, 64, 1024, false);
  INFO(r.decided << "\n" << r.summary);
  CHECK(r.errors.empty());
  CHECK(r.peak_bytes <= budget);
  CHECK(r.replans >= 1);
  CHECK(r.replans <= 7);  // 1024 -> 8 at most
  // The last iterations needed no help.
  for (size_t i = r.iterations.size() - 2; i < r.iterations.size(); ++i) {
    INFO("iteration " << i);
    CHECK(r.iterations[i].fault_ins == 0);
  }
  uint64_t early = 0;
  for (size_t i = 1; i < 4; ++i) early += r.iterations[i].fault_ins;
  CHECK(early > 0);
}

TEST_CASE(
    "recorded ResNet-50 iteration under budgets above its peak: the arena settles and maps nothing anew (at 150% and "
    "300%) or little (120%)",
    "[replay][memory]") {
  // Under any budget each large buffer takes whole extents of its own (Note [Extents under a
  // budget]); a search for such windows that gave up early (8 idle runs, 64 positions) left 35-88
  // extents mapped anew every iteration at 150-300%, never settling (vmm_arena.cpp,
  // kExactCandidates). Measured with the bounds now: 0 from the third iteration at 150% and 300%;
  // at 120% 44, 25 and 13 at iterations 4, 10 and 11.
  struct Case {
    int percent;
    double max_maps;  // mean over iterations 6-11
  };
  for (const Case c : {Case{300, 0}, Case{150, 0}, Case{120, 45}}) {
    const uint64_t budget = kPeak * static_cast<uint64_t>(c.percent) / 100;
    const test::SimResult r = test::simulate_trace(resnet50(), budget, "vcudnn", 12, 64, kFirstRoom, false);
    double maps = 0;
    std::string each;
    for (size_t i = 6; i < r.iterations.size(); ++i) {
      maps += static_cast<double>(r.iterations[i].maps);
      each += fmt::format(" {}", r.iterations[i].maps);
      CHECK(r.iterations[i].fault_ins == 0);
      CHECK(r.iterations[i].evictions == 0);
    }
    INFO(fmt::format("{}%: mappings per iteration from the 7th:{}\n{}", c.percent, each, r.summary));
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(maps / static_cast<double>(r.iterations.size() - 6) <= c.max_maps);
  }
}

// Note [A static placement]: the same iteration with the plan's static placement. After the iteration
// that first maps every slot, nothing is mapped but the moved buffers' own ranges (measured when this
// test was written: 7, 8, 15, 23 and 46 mappings an iteration at 90-50 %, against 66-92, ~110, ~155,
// ~182 and ~205 from the arena; 5, 8, 12, 24 and 40 once prefetches were placed with room to spare
// and a moved buffer's bytes could be held until its copy out ends; none since a buffer wanted back
// before the host has seen its copy out end keeps its range: Note [Back before the copy out ended]),
// no steady fault-in, every access reads what was last
// written there (byte stamps on the simulated device), and the budget holds as the device and the manager count it.
TEST_CASE(
    "recorded ResNet-50 iteration with a static placement: a few mappings an iteration at 90% to 50%, every "
    "byte kept, the budget held",
    "[replay][memory][placement]") {
  struct Case {
    int percent;
    double max_maps;
  };
  for (const Case c : {Case{90, 10}, Case{80, 12}, Case{70, 20}, Case{60, 30}, Case{50, 55}}) {
    const uint64_t budget = kPeak * static_cast<uint64_t>(c.percent) / 100;
    const test::SimResult placed = test::simulate_trace(resnet50(), budget, "vcudnn", kIterations);
    const test::SimResult arena =
        test::simulate_trace(resnet50(), budget, "vcudnn", kIterations, 64, kFirstRoom, false);
    const Steady p = steady(placed), a = steady(arena);
    INFO(fmt::format("{}%: placed maps {:.1f} fault_ins {:.1f}; arena maps {:.1f}\n{}\n{}", c.percent, p.maps,
                     p.fault_ins, a.maps, placed.decided, placed.summary));
    CHECK_THAT(placed.decided, Catch::Contains("a static placement:"));
    CHECK_THAT(placed.summary, Catch::Contains(" placement: served="));
    CHECK(placed.errors.empty());
    CHECK(placed.peak_bytes <= budget);
    CHECK(placed.held_peak <= budget);
    CHECK(p.fault_ins == 0);
    CHECK(p.maps <= c.max_maps);
    CHECK(p.maps * 4 < a.maps);
    REQUIRE(placed.replay);
    CHECK(placed.replay->mismatches == 0);
  }
}

namespace {

// The step a decided line predicts for its static placement ("predicted step X ms").
double predicted_step_ms(const std::string& decided) {
  const std::string key = "predicted step ";
  const size_t at = decided.find(key);
  REQUIRE(at != std::string::npos);
  return std::stod(decided.substr(at + key.size()));
}

}  // namespace

// Note [Moving part of a buffer]: at 88 % of PyTorch's peak the placed plan moves part of some
// buffers (their last granules; the rest stays mapped and keeps its pool bytes), its layout's step no
// longer than the same placement's with whole buffers; followed on the simulated device, with it keeping up
// or lagging, nothing faults in, the host never waits, and every granule's stamp is the last one
// written, the kept part's and the moved part's alike. (At 90 %, since Note [Laying out in the
// copies' order], the plan of whole buffers lays out with fewer waits and is kept.)
TEST_CASE("recorded ResNet-50 iteration at 88%: part of a buffer moves, and every byte is kept",
          "[replay][memory][placement]") {
  const uint64_t budget = kPeak * 88 / 100;
  const test::SimResult whole = test::simulate_trace(resnet50(), budget, "vcudnn", kIterations, 64, kFirstRoom, true, 0,
                                                     false, AcrossEnd::kNever);
  CHECK_THAT(whole.decided, !Catch::Contains(" in part: "));
  REQUIRE(whole.replay);
  for (const size_t lag : {size_t{0}, size_t{400}}) {
    const test::SimResult r =
        test::simulate_trace(resnet50(), budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag);
    const Steady s = steady(r);
    INFO(fmt::format("lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f}\n{}\n{}\nwhole: {}", lag,
                     s.host_waits, s.fault_ins, s.evictions, r.decided, r.summary, whole.decided));
    CHECK_THAT(r.decided, Catch::Contains(" in part: "));
    CHECK_THAT(r.decided, Catch::Contains("a static placement:"));
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(r.held_peak <= budget);
    CHECK(s.host_waits == 0);
    CHECK(s.fault_ins == 0);
    CHECK(s.evictions > 0);
    REQUIRE(r.replay);
    CHECK(r.replay->mismatches == 0);
    // Its layout's predicted step is no longer than with whole buffers (plan_placed() keeps the shorter;
    // before layouts went around copies out, Note [Laying out around copies out], the whole buffers'
    // plan also had to be made for a lower target and moved more bytes).
    CHECK(predicted_step_ms(r.decided) <= predicted_step_ms(whole.decided));
  }
}

// Note [Back before the copy out ended]: the plan followed with a device that lags the host by up to
// 400 operations: in the steady state the host never waits (a buffer wanted back while its copy out
// still runs takes its bytes back on the device), nothing faults in, and every access reads the bytes
// last written there. (Before, one host wait an iteration at 90 % and at 60 %.)
TEST_CASE(
    "recorded ResNet-50 iteration, a placement, a lagging device: no host wait in the steady state and every "
    "byte kept",
    "[replay][memory][placement]") {
  for (const int percent : {90, 60}) {
    for (const size_t lag : {size_t{0}, size_t{100}, size_t{400}}) {
      const uint64_t budget = kPeak * static_cast<uint64_t>(percent) / 100;
      const test::SimResult r = test::simulate_trace(resnet50(), budget, "vcudnn", 9, 64, kFirstRoom, true, lag);
      const Steady s = steady(r);
      INFO(fmt::format("{}% lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f} maps {:.1f}\n{}", percent, lag,
                       s.host_waits, s.fault_ins, s.evictions, s.maps, r.summary));
      CHECK(r.errors.empty());
      CHECK(r.peak_bytes <= budget);
      CHECK(s.host_waits == 0);
      CHECK(s.fault_ins == 0);
      CHECK(s.evictions > 0);
    }
  }
}

// Note [Searching for a layout that fits]: the recorded VGG-16 iteration (batch 64, feature maps of
// 784 and 1568 MiB) at 90 % of PyTorch's live peak on the H100 (6.09 GiB) gets a static placement,
// and the plan is followed with it: no host wait, no fault-in, every byte kept. (Before, no layout
// fitted and the arena served every buffer, with ten host waits a step on the H100.)
TEST_CASE("recorded VGG-16 iteration at 90%: a static placement, followed without host waits",
          "[replay][memory][placement]") {
  static const Trace vgg16 = [] {
    auto r = read_trace(test::source_dir() + "/tests/data/vgg16_b64_trace.json");
    REQUIRE(r);
    return r.value();
  }();
  const uint64_t budget = 5888096376ull;  // VCUDNN_DEVICE_BUDGET of the benchmark at 90 %
  for (const size_t lag : {size_t{0}, size_t{100}}) {
    const test::SimResult r = test::simulate_trace(vgg16, budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag);
    const Steady s = steady(r);
    INFO(fmt::format("lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f} maps {:.1f}\n{}\n{}", lag,
                     s.host_waits, s.fault_ins, s.evictions, s.maps, r.decided, r.summary));
    CHECK_THAT(r.decided, Catch::Contains("; a static placement:"));
    // Note [Room the plan leaves]: a placed plan leaves half the room, and needs no more here.
    CHECK_THAT(r.decided, Catch::Contains("less 1/128 of it as room"));
    CHECK(r.replans == 0);
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(s.host_waits == 0);
    CHECK(s.fault_ins == 0);
    CHECK(s.evictions > 0);
  }
}

namespace {

// A counter of the manager's exit line (SimResult::summary).
uint64_t counter(const std::string& summary, const std::string& key) {
  const size_t at = summary.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  return std::stoull(summary.substr(at + key.size() + 2));
}

}  // namespace

// Note [Across the iteration's end] (planner/offload_plan.h): with moves across the iteration's end,
// VGG-16's momentum and fc weights leave after their last use and come back before the next optimizer
// step; coming back the first time, each is adopted into its pool slot at its own address
// (MemoryManager::adopt_placed), and from then on it is a placed buffer. On the simulated device,
// keeping up or lagging: every byte kept, the budget held, no host wait, no fault-in. Lagging a whole
// iteration, as the H100 did behind a host with little to do, a buffer's copy back is not seen to end
// before its next planned copy out: it leaves all the same (every planned copy runs, no placed
// buffer falls back to the arena), where refusing it made ResNet-50 b128 at 90 % 1.5x slower.
TEST_CASE(
    "recorded VGG-16 iteration at 90%, moves across the end: optimizer state adopted into the pool, every byte "
    "kept",
    "[replay][memory][placement]") {
  const Trace& vgg16 = vgg16_b64();
  const uint64_t budget = 5888096376ull;  // VCUDNN_DEVICE_BUDGET of the benchmark at 90 %
  const test::SimResult within = test::simulate_trace(vgg16, budget, "vcudnn", kIterations, 64, kFirstRoom, true);
  for (const size_t lag : {size_t{0}, size_t{100}, size_t{2500}}) {
    const test::SimResult r = test::simulate_trace(vgg16, budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag,
                                                   true, AcrossEnd::kWhereFaster);
    const Steady s = steady(r);
    INFO(fmt::format("lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f} maps {:.1f}\n{}\n{}", lag,
                     s.host_waits, s.fault_ins, s.evictions, s.maps, r.decided, r.summary));
    CHECK_THAT(r.decided, Catch::Contains("; a static placement:"));
    CHECK_THAT(r.decided, Catch::Contains(" moves across the iteration's end ("));
    CHECK_THAT(within.decided, !Catch::Contains("across"));
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(r.replans == 0);
    CHECK(s.host_waits == 0);
    CHECK(s.fault_ins == 0);
    // The buffers alive through the iteration moved, into the pool: momentum and fc weights, 15
    // buffers (1018 MiB) an iteration, where the plan without them moves 742 MiB.
    const size_t at = r.summary.find(" adopted=");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(r.summary.substr(at + 9)) >= 10);
    CHECK(r.bytes_out > within.bytes_out);
    CHECK(counter(r.summary, "missed") == 0);
    CHECK(counter(r.summary, "fallbacks") == 0);
  }
  // The shipped ResNet-50 iteration (batch 64) at 80 %: 26 of the plan's moves are across the end (146
  // MiB of momentum and weights), the rest feature maps.
  const uint64_t rn_budget = kPeak * 80 / 100;
  const test::SimResult rn = test::simulate_trace(resnet50(), rn_budget, "vcudnn", kIterations, 64, kFirstRoom, true, 0,
                                                  true, AcrossEnd::kWhereFaster);
  for (const size_t lag : {size_t{2500}}) {
    const test::SimResult r = test::simulate_trace(resnet50(), rn_budget, "vcudnn", kIterations, 64, kFirstRoom, true,
                                                   lag, true, AcrossEnd::kWhereFaster);
    INFO(r.summary);
    CHECK(r.errors.empty());
    CHECK(counter(r.summary, "missed") == 0);
    CHECK(counter(r.summary, "fallbacks") == 0);
  }
  const Steady s = steady(rn);
  INFO(fmt::format("ResNet-50 80%: host waits {:.1f} fault-ins {:.1f}\n{}\n{}", s.host_waits, s.fault_ins, rn.decided,
                   rn.summary));
  CHECK_THAT(rn.decided, Catch::Contains("; a static placement:"));
  CHECK(rn.errors.empty());
  CHECK(rn.peak_bytes <= rn_budget);
  CHECK(s.fault_ins == 0);
  CHECK(s.host_waits == 0);
  const size_t at = rn.summary.find(" adopted=");
  REQUIRE(at != std::string::npos);
  const uint64_t adopted = std::stoull(rn.summary.substr(at + 9));
  CHECK(adopted >= 10);
  // Installed again after iteration 3: the first pool retires, and each buffer it took moves to the
  // new pool's slot while away (adopted again), every byte kept. Until they have moved, the first
  // pool still holds their bytes, which the new layout does not count: the iteration after the change
  // faulted 3 buffers in; the ones after it none.
  const test::SimResult again = test::simulate_trace(resnet50(), rn_budget, "vcudnn", kIterations, 64, kFirstRoom, true,
                                                     0, true, AcrossEnd::kWhereFaster, 3);
  INFO(again.summary);
  CHECK(again.errors.empty());
  CHECK(again.peak_bytes <= rn_budget);
  for (size_t i = again.iterations.size() - 2; i < again.iterations.size(); ++i) {
    INFO("iteration " << i);
    CHECK(again.iterations[i].fault_ins == 0);
    CHECK(again.iterations[i].host_waits == 0);
  }
  const size_t at2 = again.summary.find(" adopted=");
  REQUIRE(at2 != std::string::npos);
  CHECK(std::stoull(again.summary.substr(at2 + 9)) == 2 * adopted);
}

// The default, VCUDNN_OFFLOAD_PLACEMENT=static, moves buffers across the iteration's end only where
// no placed plan fits without them: the shipped VGG-16 iteration at the benchmark's 70 % is below what
// any plan without them needs (4820 MiB at a call of the forward's end), and with them it is followed
// without a host wait or a fault-in, keeping up or lagging a whole iteration. (On the H100: 2.50x
// PyTorch's step, where on-demand eviction took 3.95x.)
TEST_CASE(
    "recorded VGG-16 iteration at 70%: where nothing else fits, the default placement moves optimizer state "
    "across the iteration's end",
    "[replay][memory][placement]") {
  const uint64_t budget = 4579630514ull;  // VCUDNN_DEVICE_BUDGET of the benchmark at 70 %
  const test::SimResult never = test::simulate_trace(vgg16_b64(), budget, "vcudnn", kIterations, 64, kFirstRoom, true,
                                                     0, true, AcrossEnd::kNever);
  CHECK_THAT(never.decided, Catch::Contains("no static placement"));
  for (const size_t lag : {size_t{0}, size_t{2500}}) {
    const test::SimResult r =
        test::simulate_trace(vgg16_b64(), budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag);
    const Steady s = steady(r);
    INFO(fmt::format("lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f}\n{}\n{}", lag, s.host_waits,
                     s.fault_ins, s.evictions, r.decided, r.summary));
    CHECK_THAT(r.decided, Catch::Contains("; a static placement:"));
    CHECK_THAT(r.decided, Catch::Contains(" moves across the iteration's end ("));
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(r.replans == 0);
    CHECK(s.host_waits == 0);
    CHECK(s.fault_ins == 0);
    CHECK(counter(r.summary, "adopted") >= 10);
    CHECK(counter(r.summary, "missed") == 0);
    CHECK(counter(r.summary, "fallbacks") == 0);
  }
}

// Note [No placement beside unseen collectives]: the iteration one rank of DistributedDataParallel
// recorded (ResNet-50 batch 32, 2 x H200, NCCL; tests/data/resnet50_ddp_rank_trace.json, the real
// step after the fix to iterations without convolutions) at the budget whose placed plan failed
// there with an illegal memory access. On the simulated device the plan is followed with its
// placement, the device keeping up or lagging 400 operations, without a device error, a fault-in or
// a lost byte: what broke on the GPU is outside what the trace shows (NCCL's collectives).
TEST_CASE("recorded DDP rank at the failing budget: the placed plan is sound on the simulated device",
          "[replay][memory][placement]") {
  static const Trace rank = [] {
    auto r = read_trace(test::source_dir() + "/tests/data/resnet50_ddp_rank_trace.json");
    REQUIRE(r);
    return r.value();
  }();
  CHECK(rank.calls.size() == 2851);
  const uint64_t budget = 1894355301ull;  // VCUDNN_DEVICE_BUDGET of the [ddp] test's run
  for (const size_t lag : {size_t{0}, size_t{400}}) {
    const test::SimResult r = test::simulate_trace(rank, budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag);
    const Steady s = steady(r);
    INFO(fmt::format("lag {}: host waits {:.1f} fault-ins {:.1f} evictions {:.1f}\n{}\n{}", lag, s.host_waits,
                     s.fault_ins, s.evictions, r.decided, r.summary));
    CHECK_THAT(r.decided, Catch::Contains("; a static placement:"));
    CHECK(r.errors.empty());
    CHECK(r.peak_bytes <= budget);
    CHECK(s.fault_ins == 0);
    CHECK(s.evictions > 0);
  }
}

namespace {

// DDP's all-reduces as NCCL runs them, put into the recorded rank's iteration (which holds none:
// vcudnn did not see them then). A gradient bucket is alive through the iteration, and the copies
// into the gradients at the end of the backward pass (the iteration's start) read it; NCCL reduces
// it in place, on its own stream, right after its last use in the backward pass (the last gradient
// copied into it). Sequence numbers are doubled to make room.
Trace with_all_reduces(Trace t) {
  std::map<uint64_t, bool> copied_out;  // by buffer: a memcpy reads it
  for (const TraceCall& c : t.calls)
    for (const BufferAccess& a : c.accesses)
      if (c.kind == CallKind::kMemcpy && a.mode == AccessMode::kRead) copied_out[a.buffer] = true;
  std::map<uint64_t, uint32_t> reduce_after;  // seq of the bucket's last use -> bucket
  for (const BufferLife& b : lifetimes(t).buffers) {
    if (b.alloc_seq || b.free_seq || b.uses.empty() || t.buffers[b.buffer].bytes < (1u << 20)) continue;
    if (copied_out[b.buffer]) reduce_after[b.uses.back()] = b.buffer;
  }
  t.streams.push_back(0x7ccc);  // NCCL's
  t.names.push_back("ncclAllReduce");
  std::vector<TraceCall> calls;
  for (TraceCall c : t.calls) {
    c.seq *= 2;
    calls.push_back(c);
    if (const auto r = reduce_after.find(c.seq / 2); r != reduce_after.end()) {
      TraceCall reduce;
      reduce.seq = c.seq + 1;
      reduce.thread = c.thread;
      reduce.stream = static_cast<uint32_t>(t.streams.size() - 1);
      reduce.kind = CallKind::kLibrary;
      reduce.name = static_cast<int32_t>(t.names.size() - 1);
      reduce.gpu_ms = 1.0;
      reduce.accesses = {{r->second, AccessMode::kUnknown}};
      calls.push_back(reduce);
    }
  }
  t.calls = std::move(calls);
  t.first_seq *= 2;
  t.end_seq *= 2;
  return t;
}

}  // namespace

// Note [Collectives queue their work at the group's end]: the rank's iteration with the all-reduces
// NCCL runs on its own stream, the device lagging as on the GPU. Seen (vcudnn interposes them now),
// the placed plan keeps each bucket on the device while NCCL reduces it, also with moves across the
// iteration's end wherever they are faster, which take the buckets away from their reduction to
// their first copy out. Hidden from vcudnn (as before 2026-11-28), those moves copy a bucket out
// and back around NCCL's reduction: the kernels after it read stale gradients (the control below).
TEST_CASE("recorded DDP rank with its all-reduces: seen, NCCL's work never finds a bucket gone",
          "[replay][memory][placement][nccl]") {
  static const Trace rank = [] {
    auto r = read_trace(test::source_dir() + "/tests/data/resnet50_ddp_rank_trace.json");
    REQUIRE(r);
    return with_all_reduces(r.value());
  }();
  size_t reduces = 0;
  for (const TraceCall& c : rank.calls) reduces += is_collective(rank, c);
  CHECK(reduces == 5);  // ResNet-50's 90 MiB of gradients: DDP's buckets of 25 MiB, two smaller
  const uint64_t budget = 1894355301ull;  // as in the test above
  for (const AcrossEnd across : {AcrossEnd::kWhereNeeded, AcrossEnd::kWhereFaster}) {
    for (const size_t lag : {size_t{0}, size_t{400}}) {
      const test::SimResult r =
          test::simulate_trace(rank, budget, "vcudnn", kIterations, 64, kFirstRoom, true, lag, true, across);
      const Steady st = steady(r);
      INFO(fmt::format("across {} lag {}: fault-ins {:.1f}\n{}\n{}", static_cast<int>(across), lag, st.fault_ins,
                       r.decided, r.summary));
      CHECK_THAT(r.decided, Catch::Contains("; a static placement:"));
      CHECK(r.errors.empty());
      CHECK(r.peak_bytes <= budget);
      CHECK(st.fault_ins == 0);
    }
  }
  const auto hide = [](const Trace& t, const TraceCall& c) { return is_collective(t, c); };
  const test::SimResult hidden = test::simulate_trace(rank, budget, "vcudnn", kIterations, 64, kFirstRoom, true, 400,
                                                      true, AcrossEnd::kWhereFaster, -1, hide);
  INFO(hidden.decided);
  CHECK_FALSE(hidden.errors.empty());
  // What failed on the GPU (2026-11-24: no moves across the end) shows no error here even with the
  // all-reduces hidden: its cause is still not in this model (Note [No placement beside unseen
  // collectives]).
  const test::SimResult then = test::simulate_trace(rank, budget, "vcudnn", kIterations, 64, kFirstRoom, true, 400,
                                                    true, AcrossEnd::kNever, -1, hide);
  CHECK(then.errors.empty());
}

// Note [Room for a slot's blocks]: with little room left by the plan (1/1024 of the budget) the
// runtime makes room for a placed slot's missing blocks often, and making room gave back free blocks
// of that very slot: the blocks created then went over the budget (10 granules at 80 %, on the
// simulated device, which counts physical memory mapped; at 50 % on the library before this
// session's changes too).
TEST_CASE("recorded ResNet-50 iteration with a placement and little room: making room never goes over the budget",
          "[replay][memory][placement]") {
  for (const int percent : {80, 50}) {
    for (const size_t lag : {size_t{0}, size_t{300}}) {
      const uint64_t budget = kPeak * static_cast<uint64_t>(percent) / 100;
      const test::SimResult r = test::simulate_trace(resnet50(), budget, "vcudnn", 6, 64, 1024, true, lag);
      INFO(percent << "% lag " << lag << ": " << r.errors << "\n" << r.decided << "\n" << r.summary);
      CHECK_THAT(r.decided, Catch::Contains("a static placement:"));
      CHECK(r.errors.empty());
      CHECK(r.peak_bytes <= budget);
      CHECK(r.held_peak <= budget);
    }
  }
}

// Note [Room beside the pools] (runtime/memory_manager.cpp): after a re-plan the earlier plan's
// pool, retired, holds blocks no buffer owns any more; they go back before a need above the arena's
// budget is refused. On the recorded VGG-16 b64 iteration at 65 % of its peak, its plan installed
// again after the third iteration, 42 calls found no room for their buffers before (a GPU would have
// failed them with out of memory), none without the second install. (Evicting the retired pool's
// buffers as well, tried first, left 7 at 65 % and made 14 and 21 at 70 % and 75 %.)
TEST_CASE("re-install beside a retired pool: every call finds room (VGG-16 b64, 65% to 75%)", "[replay][memory][placement]") {
  const uint64_t peak = 6571819756ull;  // the VGG-16 trace's device bytes at its peak without a plan
  for (int pct : {65, 70, 75}) {
    for (int at : {-1, 3}) {
      INFO(pct << "% of the peak, installed again after iteration " << at);
      const test::SimResult r = test::simulate_trace(vgg16_b64(), peak * static_cast<uint64_t>(pct) / 100, "vcudnn",
                                                     kIterations, 64, kFirstRoom, true, 0, true,
                                                     AcrossEnd::kWhereNeeded, at);
      INFO(r.errors);
      CHECK(r.errors.empty());
    }
  }
}
