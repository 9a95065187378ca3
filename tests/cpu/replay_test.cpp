// Replay of an offload plan (Note [Replaying an offload plan]): the script a plan becomes
// (planner/replay_script.h), the Replayer following iterations and finding their start again after
// the program strays (runtime/memory/replay.h), and a training loop recorded and then replayed
// through MemoryManager on the simulated device, whose every byte is checked.
#include <catch2/catch.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "planner/lifetimes.h"
#include "planner/offload_plan.h"
#include "planner/replay_script.h"
#include "runtime/log.h"
#include "runtime/memory/call_scope.h"
#include "runtime/memory/replay.h"
#include "runtime/memory_manager.h"
#include "runtime/offload_replay.h"
#include "runtime/recorder.h"
#include "tests/common/test_util.h"
#include "tests/cpu/graph_conv_builder.h"
#include "tests/cpu/manager_fixture.h"
#include "tests/cpu/sim_device.h"
#include "tests/cpu/trace_builder.h"

using namespace vcudnn;
using M = AccessMode;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Forward: a weight read by every layer, activations a0..a(n-1) each written by one call and read
// by the next; backward: each read again in reverse, then freed. A buffer freed inside the span
// that existed before it (a gradient of the last step) is read first.
struct Net {
  test::TraceBuilder b;
  uint32_t weight = 0, old_grad = 0;
  std::vector<uint32_t> acts;
};

Net net(const std::vector<uint64_t>& sizes) {
  Net n;
  test::TraceBuilder& b = n.b;
  n.weight = b.buffer(4 * kMiB);
  n.old_grad = b.buffer(16 * kMiB);
  for (uint64_t s : sizes) n.acts.push_back(b.buffer(s));
  const uint64_t first = b.add(CallKind::kLaunch, -1, {{n.old_grad, M::kRead}});
  b.add(CallKind::kFree, static_cast<int32_t>(n.old_grad));
  for (size_t i = 0; i < sizes.size(); ++i) {
    b.add(CallKind::kAlloc, static_cast<int32_t>(n.acts[i]));
    b.add(CallKind::kSetStream);  // no buffers: not a memory event
    std::vector<BufferAccess> uses = {{n.weight, M::kRead}, {n.acts[i], M::kWrite}};
    if (i > 0) uses.push_back({n.acts[i - 1], M::kRead});
    b.add(CallKind::kConvolution, -1, uses);
  }
  for (size_t i = sizes.size(); i-- > 0;) {
    b.add(CallKind::kConvolution, -1, {{n.weight, M::kRead}, {n.acts[i], M::kRead}}, ConvKind::kBackwardData);
    b.add(CallKind::kFree, static_cast<int32_t>(n.acts[i]));
  }
  b.done(first);
  return n;
}

struct Planned {
  Lifetimes lt;
  SpanModel model;
  OffloadPlan plan;
  ReplayScript script;
};

Planned plan_and_script(const Trace& t, uint64_t budget) {
  Planned p;
  p.lt = lifetimes(t);
  OffloadOptions o;
  o.replayable_only = true;
  auto plan = plan_offload(t, p.lt, budget, OffloadPolicy::kVcudnn, o);
  INFO((plan ? "" : plan.error().message));
  REQUIRE(plan.ok());
  p.plan = plan.value();
  p.model = span_model(t, p.lt, o);
  auto script = replay_script(t, p.lt, p.model, p.plan);
  INFO((script ? "" : script.error().message));
  REQUIRE(script.ok());
  p.script = script.value();
  return p;
}

}  // namespace

TEST_CASE("replay script: the plan's copies at memory events, buffers named for later iterations", "[replay]") {
  const std::vector<uint64_t> sizes = {8 * kMiB, 8 * kMiB, 6 * kMiB, 8 * kMiB, 4 * kMiB, 8 * kMiB};
  Net n = net(sizes);
  const Trace& t = n.b.t;
  // Peak: weight 4 + every activation (42) after the old gradient's 16 went: 46 MiB; 30 must leave.
  const Planned p = plan_and_script(t, 30 * kMiB);
  const ReplayScript& s = p.script;
  CHECK(check_plan(p.model, p.plan) == "");
  REQUIRE(p.plan.fits);

  // Memory events: everything but the set_stream calls.
  size_t events = 0;
  for (const TraceCall& c : t.calls) events += is_memory_event(c) ? 1 : 0;
  CHECK(s.events == events);
  CHECK(events == t.calls.size() - sizes.size());
  // Steps: the free of the old gradient, the allocations, the frees in reverse, with their events.
  REQUIRE(s.steps.size() == 1 + 2 * sizes.size());
  CHECK_FALSE(s.steps[0].alloc);
  CHECK(s.steps[0].bytes == 16 * kMiB);
  CHECK(s.steps[0].event == 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK(s.steps[1 + i].alloc);
    CHECK(s.steps[1 + i].bytes == sizes[i]);
    CHECK(s.steps[1 + i].event == 2 + 2 * i);
  }
  // The first step is unique: the anchor is one step long.
  CHECK(s.anchor == 1);

  // The old gradient was alive at the start and freed inside: it never moves. The weight lives
  // through the span: persistent. Activations: named by their allocation's index.
  REQUIRE(!s.targets.empty());
  CHECK(s.targets.size() == p.plan.moves.size());
  for (size_t k = 0; k < s.targets.size(); ++k) {
    const ReplayTarget& target = s.targets[k];
    const BufferLife& bl = p.lt.buffers[p.plan.moves[k].life];
    CHECK(bl.buffer != n.old_grad);
    if (bl.buffer == n.weight) {
      CHECK(target.persistent);
      CHECK(target.serial == t.buffers[n.weight].id);
    } else {
      const auto i = static_cast<size_t>(std::find(n.acts.begin(), n.acts.end(), bl.buffer) - n.acts.begin());
      REQUIRE(i < n.acts.size());
      CHECK_FALSE(target.persistent);
      CHECK(target.alloc_index == i);
      CHECK(target.bytes == sizes[i]);
    }
  }
  // Each copy out at the memory event after the use it follows; each copy back no later than the
  // event of the use it is for, and after its copy out.
  std::vector<uint32_t> event_of(t.calls.size());
  uint32_t e = 0;
  for (size_t c = 0; c < t.calls.size(); ++c) {
    event_of[c] = e;
    e += is_memory_event(t.calls[c]) ? 1 : 0;
  }
  REQUIRE(s.actions.size() == 2 * s.targets.size());
  CHECK(std::is_sorted(s.actions.begin(), s.actions.end(),
                       [](const ReplayAction& a, const ReplayAction& b) { return a.event < b.event; }));
  for (size_t k = 0; k < s.targets.size(); ++k) {
    const OffloadMove& mv = p.plan.moves[k];
    uint32_t out = 0, back = 0;
    for (const ReplayAction& a : s.actions) {
      if (a.target != k) continue;
      (a.kind == ReplayAction::kOffload ? out : back) = a.event;
    }
    CHECK(out == event_of[mv.out_after] + 1);
    CHECK(back > out);
    CHECK(back <= event_of[mv.next_use]);
  }
  uint64_t moved = 0;
  for (const OffloadMove& mv : p.plan.moves) moved += mv.bytes;
  CHECK(s.bytes_moved == moved);
}

TEST_CASE("replay script: repeated blocks need a longer anchor, a plan without replayable_only may be refused",
          "[replay]") {
  // Six activations of one size: the first allocation is like the next five.
  Net n = net(std::vector<uint64_t>(6, 8 * kMiB));
  const Planned p = plan_and_script(n.b.t, 30 * kMiB);
  // F16 A8 A8 ... : the free of the old gradient already tells the start.
  CHECK(p.script.anchor == 1);

  // Without the old gradient's free, steps are A8 x6, F8 x6: the anchor takes all six allocations.
  test::TraceBuilder b;
  const uint32_t w = b.buffer(4 * kMiB);
  std::vector<uint32_t> acts;
  for (int i = 0; i < 6; ++i) acts.push_back(b.buffer(8 * kMiB));
  uint64_t first = 0;
  for (int i = 0; i < 6; ++i) {
    const uint64_t seq = b.add(CallKind::kAlloc, static_cast<int32_t>(acts[i]));
    if (i == 0) first = seq;
    b.add(CallKind::kConvolution, -1, {{w, M::kRead}, {acts[i], M::kWrite}});
  }
  for (int i = 6; i-- > 0;) {
    b.add(CallKind::kConvolution, -1, {{w, M::kRead}, {acts[i], M::kRead}}, ConvKind::kBackwardData);
    b.add(CallKind::kFree, static_cast<int32_t>(acts[i]));
  }
  b.done(first);
  const Planned q = plan_and_script(b.t, 30 * kMiB);
  CHECK(q.script.anchor == 6);  // A8 x6 is at no other offset

  // The old gradient of the first net moved by a plan made without replayable_only: no script.
  const Lifetimes lt = lifetimes(n.b.t);
  OffloadPlan plan;
  plan.budget = 30 * kMiB;
  size_t grad_life = lt.buffers.size();
  for (size_t i = 0; i < lt.buffers.size(); ++i)
    if (lt.buffers[i].buffer == n.old_grad) grad_life = i;
  REQUIRE(grad_life < lt.buffers.size());
  const SpanModel m = span_model(n.b.t, lt);
  REQUIRE(m.lives[grad_life].movable);  // movable for the planner alone
  plan.moves.push_back({grad_life, 16 * kMiB, 0, 1, 0, 0});
  const auto refused = replay_script(n.b.t, lt, m, plan);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("one end of the iteration"));
}

namespace {

// A script by hand: steps A1 A2 F2 F1 (bytes 1 and 2) at events 0, 2, 4, 6 of 8; target 0 is the
// first allocation, copied out at event 3 and back at event 5; target 1 is persistent (serial 7),
// out at 1, back at 7.
ReplayScript small_script() {
  ReplayScript s;
  s.events = 8;
  s.steps = {{true, 1, 0}, {true, 2, 2}, {false, 2, 4}, {false, 1, 6}};
  s.anchor = 1;
  s.targets = {{false, 0, 0, 1}, {true, 0, 7, 3}};
  s.actions = {{1, ReplayAction::kOffload, 1, 1},
               {3, ReplayAction::kOffload, 0, 3},
               {5, ReplayAction::kPrefetch, 0, 4},
               {7, ReplayAction::kPrefetch, 1, 2}};
  return s;
}

struct Loop {
  memory::Replayer& r;
  std::vector<memory::Buffer>& buffers;  // stand-ins, one per allocation
  size_t next = 0;
  std::vector<std::pair<uint32_t, memory::Replayer::Due>> dues;  // (event, due)
  uint32_t event = 0;
  void take(std::vector<memory::Replayer::Due>& due) {
    for (const auto& d : due) dues.push_back({event, d});
    due.clear();
    ++event;
  }
  memory::Buffer* alloc(uint64_t bytes) {
    std::vector<memory::Replayer::Due> due;
    r.on_alloc(bytes, due);
    memory::Buffer* b = &buffers.at(next++);
    b->bytes = bytes;
    b->serial = 100 + next;
    r.bind(b);
    take(due);
    return b;
  }
  void free(uint64_t bytes) {
    std::vector<memory::Replayer::Due> due;
    r.on_free(bytes, due);
    take(due);
  }
  void use() {
    std::vector<memory::Replayer::Due> due;
    r.on_use(due);
    take(due);
  }
  // One iteration as recorded: A1 use A2 use F2 use F1 use.
  memory::Buffer* iteration() {
    memory::Buffer* first = alloc(1);
    use();
    alloc(2);
    use();
    free(2);
    use();
    free(1);
    use();
    return first;
  }
};

}  // namespace

TEST_CASE(
    "replayer: copies due at their events, iteration after iteration, and a stray allocation stops them until "
    "the next start",
    "[replay]") {
  memory::Replayer r(small_script());
  std::vector<memory::Buffer> buffers(64);
  memory::Buffer weight;
  weight.serial = 7;
  r.bind_persistent(&weight);
  Loop loop{r, buffers, 0, {}, 0};
  // Events before the first start are not followed: a use, and the second half of an iteration.
  loop.use();
  loop.free(2);
  loop.free(1);
  CHECK_FALSE(r.synced());
  CHECK(loop.dues.empty());

  std::vector<memory::Buffer*> firsts;
  for (int it = 0; it < 3; ++it) {
    loop.dues.clear();
    loop.event = 0;
    firsts.push_back(loop.iteration());
    CHECK(r.synced());
    // The start is found at its first step: the copies of this very iteration are due already.
    REQUIRE(loop.dues.size() == 4);
    CHECK(loop.dues[0].first == 1);
    CHECK(loop.dues[0].second.buffer == &weight);
    CHECK(loop.dues[0].second.kind == ReplayAction::kOffload);
    CHECK(loop.dues[1].first == 3);
    CHECK(loop.dues[1].second.buffer == firsts.back());
    CHECK(loop.dues[1].second.serial == firsts.back()->serial);
    CHECK(loop.dues[2].first == 5);
    CHECK(loop.dues[2].second.kind == ReplayAction::kPrefetch);
    CHECK(loop.dues[2].second.buffer == firsts.back());
    CHECK(loop.dues[3].first == 7);
    CHECK(loop.dues[3].second.buffer == &weight);
  }
  CHECK(r.stats().iterations == 3);
  CHECK(r.stats().syncs == 1);

  // Steps the script does not have, a few in a row (a tensor the loop keeps, say): passed over.
  loop.dues.clear();
  loop.event = 0;
  loop.alloc(1);
  loop.use();
  loop.alloc(5);  // not in the script
  loop.free(5);   // not in the script
  loop.alloc(2);
  loop.use();
  loop.free(2);
  loop.use();
  loop.free(1);
  loop.use();
  CHECK(r.synced());
  CHECK(r.stats().extra_steps == 2);
  CHECK(loop.dues.size() == 4);

  // Steps of the script that never come (the recorded iteration was the first, which allocated
  // state once): passed over; the allocations after them keep their indexes.
  loop.dues.clear();
  loop.event = 0;
  memory::Buffer* first = loop.alloc(1);
  loop.use();
  loop.use();  // alloc(2) and free(2) never come
  loop.free(1);
  loop.use();
  CHECK(r.synced());
  CHECK(r.stats().skipped_steps == 2);
  REQUIRE(loop.dues.size() == 4);
  CHECK(loop.dues[1].second.buffer == first);

  // A stray run longer than the lookahead (an evaluation pass): nothing is due until the next
  // iteration starts, and the log says where the program strayed.
  loop.dues.clear();
  loop.alloc(1);
  for (int k = 0; k < 12; ++k) loop.alloc(5);
  CHECK_FALSE(r.synced());
  CHECK(r.stats().mismatches == 1);
  CHECK_THAT(r.stats().first_mismatch, Catch::Contains("alloc 0.00 MiB where the script has alloc 0.00 MiB"));
  for (int k = 0; k < 12; ++k) loop.free(5);
  loop.free(1);
  const size_t before = loop.dues.size();
  loop.event = 0;
  loop.iteration();
  CHECK(r.synced());
  CHECK(loop.dues.size() == before + 4);
  CHECK(r.stats().syncs == 2);

  // Fewer uses at the end than recorded: the next iteration's first step still starts it; more
  // uses than recorded: the position waits at the last event for the remaining steps.
  loop.dues.clear();
  loop.event = 0;
  loop.alloc(1);
  loop.use();
  loop.alloc(2);
  loop.use();
  loop.use();
  loop.use();
  loop.use();  // two more than recorded
  loop.free(2);
  loop.free(1);  // the last use is missing
  loop.event = 0;
  const uint64_t mismatches = r.stats().mismatches;
  loop.iteration();
  CHECK(r.stats().mismatches == mismatches);
  CHECK(r.synced());

  // A late copy back is queued earlier from the next iteration on, never before its copy out.
  for (int k = 0; k < 10; ++k) r.late(2);
  CHECK(r.stats().late_prefetches == 10);
  CHECK(r.stats().moved_earlier == 1);  // event 5 -> 4 (its copy out is at 3: 4 is the earliest)
  loop.dues.clear();
  loop.event = 0;
  loop.iteration();
  REQUIRE(loop.dues.size() == 4);
  CHECK(loop.dues[2].first == 4);
  CHECK(loop.dues[2].second.kind == ReplayAction::kPrefetch);
}

namespace {

// What a convolution's hook does: report its pointers (once), then queue its kernel, which reads
// some buffers (checking their bytes) and writes one.
struct Kernel {
  memory::MemoryManager& m;
  test::SimDevice& dev;
  memory::Stream s = test::SimDevice::stream(1);
  struct Region {
    uint64_t va = 0, bytes = 0;
    uint32_t seed = 0;
  };
  bool run(const std::vector<Region>& reads, std::optional<Region> write) {
    memory::CallScope scope;
    std::vector<uint64_t> words;
    for (const Region& r : reads) words.push_back(r.va);
    if (write) words.push_back(write->va);
    if (!m.touch(words.data(), words.size(), memory::Access::kUnknown, s, "kernel")) return false;
    for (const Region& r : reads) dev.check(s, r.va, r.bytes, r.seed);
    if (write) dev.write(s, write->va, write->bytes, write->seed);
    return true;
  }
};

struct LoopResult {
  memory::ManagerStats at_third, at_end;
  std::optional<memory::ReplayStats> replay;
  std::string decided;
  uint64_t peak_granules = 0;
  std::string errors;
};

// A training loop on the simulated device, recorded (explicit boundaries around convolutions)
// and then, under `policy`, replayed: weights of 24 granules read by every layer, 12 activations a
// step of 3 to 6 granules, read back in reverse and freed. The device finishes what was queued
// before each host step, as a GPU that keeps up with the host.
LoopResult train(const std::string& policy, int iterations, bool log_iterations = false) {
  test::MemoryActive on;
  constexpr uint64_t kBudget = 64;
  constexpr uint64_t kG = 64 * 1024;  // small granules keep the byte checks cheap
  constexpr uint64_t kWeights = 24 * kG;
  test::SimDevice dev(kG, kBudget);
  memory::ManagerConfig config = test::manager_config(kBudget * kG, kG);
  config.log_iterations = log_iterations;
  memory::MemoryManager m(dev, dev, dev, config);
  LoopResult out;
  Recorder rec(
      RecorderConfig{"", 200000, [&](const Trace& t) { out.decided = replay_recorded_iteration(t, m, policy); },
                     /*gpu_timing=*/false});  // its streams are the simulation's
  m.set_sink(&rec);
  Kernel k{m, dev};
  const auto weights = m.allocate(kWeights, k.s, memory::Origin::kFramework);
  REQUIRE(weights);
  const Kernel::Region w{*weights, kWeights, 77};
  REQUIRE(k.run({}, w));
  rec.explicit_boundary();  // the preamble ends
  const auto act_bytes = [&](uint32_t i) { return (3 + i % 4) * kG; };
  for (int it = 0; it < iterations; ++it) {
    if (it == 3) out.at_third = m.stats();
    std::vector<Kernel::Region> acts;
    for (uint32_t i = 0; i < 12; ++i) {
      dev.run_all();
      const auto a = m.allocate(act_bytes(i), k.s, memory::Origin::kFramework);
      REQUIRE(a);
      const GraphConv conv = test::conv_of(ConvKind::kForward, 16 + i, 1);
      Recorder::ConvProbe probe = rec.before_graph_convolution(nullptr, conv);
      std::vector<Kernel::Region> reads = {w};
      if (i > 0) reads.push_back(acts.back());
      const Kernel::Region out_map{*a, act_bytes(i), static_cast<uint32_t>(1000 * it + i)};
      REQUIRE(k.run(reads, out_map));
      rec.after_graph_convolution(probe, nullptr, conv, CUDNN_STATUS_SUCCESS);
      acts.push_back(out_map);
    }
    for (uint32_t i = 12; i-- > 0;) {
      dev.run_all();
      const GraphConv conv = test::conv_of(ConvKind::kBackwardData, 16 + i, 2);
      Recorder::ConvProbe probe = rec.before_graph_convolution(nullptr, conv);
      REQUIRE(k.run({w, acts[i]}, std::nullopt));
      rec.after_graph_convolution(probe, nullptr, conv, CUDNN_STATUS_SUCCESS);
      REQUIRE(m.free(acts[i].va, k.s));
    }
    rec.explicit_boundary();
  }
  dev.run_all();
  out.at_end = m.stats();
  out.replay = m.replay_stats();
  out.peak_granules = dev.peak_mapped_granules();
  out.errors = dev.first_errors();
  INFO(m.summary());
  CHECK(dev.errors.empty());
  return out;
}

}  // namespace

TEST_CASE(
    "replay: a recorded training loop is replayed under the budget: copies out after the forward use, back "
    "before the backward one, no fault-ins, every byte kept",
    "[replay][memory]") {
  const LoopResult plan = train("vcudnn", 10);
  INFO(plan.decided);
  CHECK_THAT(plan.decided, Catch::StartsWith("vcudnn plan from the recorded iteration"));
  INFO(plan.errors);
  CHECK(plan.peak_granules <= 64);
  REQUIRE(plan.replay);
  CHECK(plan.replay->syncs == 1);
  CHECK(plan.replay->mismatches == 0);
  CHECK(plan.replay->iterations >= 7);
  CHECK(plan.at_end.planned_offloads > plan.at_third.planned_offloads);
  CHECK(plan.at_end.prefetches > plan.at_third.prefetches);
  // The steady state: every copy back planned, none on demand.
  CHECK(plan.at_end.fault_ins == plan.at_third.fault_ins);
  // Every eviction of the steady state is the plan's. (The host still waits at times for a copy
  // out whose memory the next allocation needs: this device runs only between host steps.)
  CHECK(plan.at_end.evictions_started - plan.at_third.evictions_started ==
        plan.at_end.planned_offloads - plan.at_third.planned_offloads);

  // The same loop on demand: fault-ins in every iteration.
  const LoopResult lru = train("lru", 10);
  CHECK(lru.decided == "eviction on demand (VCUDNN_OFFLOAD_POLICY=lru)");
  CHECK_FALSE(lru.replay);
  CHECK(lru.at_end.fault_ins > lru.at_third.fault_ins);
  CHECK(lru.peak_granules <= 64);
}

// Note [What an iteration cost]: one line per followed iteration, the first a baseline; in the
// steady state every copy is the plan's, so the lines say so.
TEST_CASE("replay: VCUDNN_LOG_ITERATIONS logs what each followed iteration cost", "[replay][memory]") {
  test::TempDir tmp;
  const Options o = parse_options(
      [&](const char* name) -> const char* {
        static std::string file;
        file = tmp.file("log");
        return std::string(name) == "VCUDNN_LOG_FILE" ? file.c_str() : nullptr;
      },
      {"VCUDNN_LOG_FILE"});
  REQUIRE(log::configure(o).empty());
  const LoopResult plan = train("vcudnn", 10, /*log_iterations=*/true);
  const LoopResult quiet = train("vcudnn", 10);
  log::g_level.store(static_cast<int>(LogLevel::kOff));
  const std::string text = test::read_file(tmp.file("log"));
  INFO(text);
  REQUIRE(plan.replay);
  const std::vector<std::string> lines = test::grep(text, "offload: iteration ");
  // Lines from the first run only (the second logs none): one per iteration followed, logged at the
  // next allocation after its end (none follows the last); the first end is the baseline.
  CHECK(lines.size() < plan.replay->iterations);
  CHECK(lines.size() + 2 >= plan.replay->iterations);
  REQUIRE(lines.size() >= 5);
  CHECK_THAT(lines[0], Catch::Contains("offload: iteration 1: "));
  for (size_t i = 2; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK_THAT(lines[i], Catch::Contains("on demand 0)"));
    CHECK_THAT(lines[i], Catch::Contains("fault-ins 0)"));
    CHECK_THAT(lines[i], Catch::Contains(" 12 allocations ("));
    CHECK_THAT(lines[i], Catch::Contains(" and 12 frees in "));
  }
  CHECK(quiet.replay);  // ran, and logged nothing (the count above)
}

// Note [No placement beside unseen collectives]
TEST_CASE("a PyTorch NCCL process group in the process turns the static placement off", "[replay][placement]") {
  using vcudnn::collectives_hazard_in;
  CHECK(collectives_hazard_in({"python3", "pt_autograd_0", "cuda-EvtHandlr"}, nullptr).empty());
  CHECK(collectives_hazard_in({"python3"}, "1").empty());  // one rank alone
  CHECK(collectives_hazard_in({"python3"}, "").empty());
  CHECK(collectives_hazard_in({"python3", "pt_nccl_watchdg"}, nullptr).find("pt_nccl_watchdg") != std::string::npos);
  CHECK_FALSE(collectives_hazard_in({"NCCL Progress 0"}, nullptr).empty());
  CHECK(collectives_hazard_in({"python3"}, "2").find("WORLD_SIZE=2") != std::string::npos);
  // This process's own threads, as the runtime reads them: none such, then a thread of that name
  // (WORLD_SIZE unset: tests ignore the caller's environment here as everywhere).
  ::unsetenv("WORLD_SIZE");
  CHECK(vcudnn::collectives_hazard().empty());
  std::atomic<int> stage{0};
  std::thread watchdog([&] {
    pthread_setname_np(pthread_self(), "pt_nccl_watchdg");
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });
  while (stage.load() != 1) std::this_thread::yield();
  CHECK_FALSE(vcudnn::collectives_hazard().empty());
  stage = 2;
  watchdog.join();
  CHECK(vcudnn::collectives_hazard().empty());
}

TEST_CASE("beside NCCL the placement goes ahead only when asked for, and the log says which", "[replay][placement]") {
  using vcudnn::placement_beside_collectives;
  CHECK(placement_beside_collectives("", false, 0).place);
  CHECK(placement_beside_collectives("", false, 0).warning.empty());
  const std::string hazard = vcudnn::collectives_hazard_in({"pt_nccl_watchdg"}, nullptr);
  const auto by_default = placement_beside_collectives(hazard, false, 12);
  CHECK_FALSE(by_default.place);
  CHECK_THAT(by_default.warning, Catch::StartsWith("no static placement (VCUDNN_OFFLOAD_PLACEMENT=off"));
  CHECK_THAT(by_default.warning, Catch::Contains("pt_nccl_watchdg"));
  const auto asked = placement_beside_collectives(hazard, true, 12);
  CHECK(asked.place);
  CHECK_THAT(asked.warning, Catch::StartsWith("static placement kept beside NCCL"));
  CHECK_THAT(asked.warning, Catch::Contains("seen 12 of its collectives"));
  // Asked for, but no collective seen: NCCL's work goes where the hooks cannot see it.
  const auto unseen = placement_beside_collectives(hazard, true, 0);
  CHECK_FALSE(unseen.place);
  CHECK_THAT(unseen.warning, Catch::Contains("vcudnn has seen no NCCL collective"));
}
