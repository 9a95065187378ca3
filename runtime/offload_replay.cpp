// From the recorded iteration to a replayed offload plan (offload_replay.h).
#include "runtime/offload_replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <utility>

#include "planner/lifetimes.h"
#include "planner/offload_plan.h"
#include "planner/placement.h"
#include "planner/replay_script.h"
#include "runtime/log.h"
#include "runtime/memory_manager.h"

namespace vcudnn {
namespace {

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// A call the trace has no GPU time for (on no known stream, or a trace of an older vcudnn, which
// timed convolutions only) counts as a small kernel when
// prefetches are placed; late ones move earlier at run time.
constexpr double kUntimedCallMs = 0.005;

// Plans `trace` for the budget less 1/room of it and installs the script; what was decided, and
// whether a script was installed.
std::pair<std::string, bool> plan_and_install(const Trace& trace, memory::MemoryManager& manager,
                                              const std::string& name, OffloadPolicy policy, uint32_t room,
                                              bool placement, bool partial_moves, AcrossEnd across) {
  const auto t0 = std::chrono::steady_clock::now();
  const Lifetimes lt = lifetimes(trace);
  OffloadOptions options;
  options.granule = manager.granularity();
  options.replayable_only = true;
  // Note [Moving part of a buffer]: only a static placement follows a plan that moves part of a buffer.
  options.partial_moves = placement && partial_moves && policy == OffloadPolicy::kVcudnn;
  // Note [Across the iteration's end]: for plan_placed() alone, which places such buffers.
  OffloadOptions placed_options = options;
  placed_options.across_end = placement && across != AcrossEnd::kNever && policy == OffloadPolicy::kVcudnn;
  placed_options.across_only_where_needed = across == AcrossEnd::kWhereNeeded;
  const LinkModel link =
      trace.link ? LinkModel{trace.link->device_to_host, trace.link->host_to_device, trace.link->both} : kAssumedLink;
  // The plan leaves 1/room of the budget for what its model does not see: buffers below a granule
  // share granules, and freed memory stays mapped until reused (Note [Room the plan leaves]).
  const uint64_t budget = *manager.budget();
  uint64_t target = budget - budget / room;
  const SpanModel model = span_model(trace, lt, options);
  // Note [A static placement]: the plan whose layout fits, when there is one.
  std::optional<Placement> placed;
  std::string placed_what;
  Result<OffloadPlan> plan = Error{""};
  if (placement && policy == OffloadPolicy::kVcudnn) {
    // Note [Room the plan leaves]: a static placement counts the bytes outside its pool; half the room.
    const uint64_t placed_target = budget - budget / (2 * room);
    Result<PlacedPlan> p = plan_placed(trace, lt, placed_target, placed_options, link, kUntimedCallMs);
    if (p) {
      room *= 2;
      target = placed_target;
      placed = std::move(p->placement);
      std::string across_what;  // Note [Across the iteration's end]
      if (placed_options.across_end) {
        size_t n = 0;
        uint64_t bytes = 0;
        for (const OffloadMove& mv : p->plan.moves)
          if (mv.next_use == model.seqs.size()) ++n, bytes += mv.bytes;
        if (n || across == AcrossEnd::kWhereFaster)  // the default says so only where it took them
          across_what = fmt::format("; {} moves across the iteration's end ({})", n, mib(bytes));
      }
      placed_what =
          fmt::format(
              "; a static placement: {} pool for {} buffers (the plan made for {}; moved buffers' bytes {}; predicted "
              "step {:.1f} ms, {:.1f} of it waiting for copies out), at most {} outside it, {} driver calls an "
              "iteration",
              mib(placed->pool_bytes), placed->buffers.size(), mib(p->plan_budget),
              p->held ? "held until copied out" : "handed over as they leave", p->step_ms, p->handover_ms,
              mib(placed->other_peak), placed->remap_calls) +
          across_what;
      plan = std::move(p->plan);
    } else {
      placed_what = "; no static placement (" + p.error().message + ")";
    }
  }
  options.partial_moves = options.partial_moves && placed.has_value();
  if (!placed) plan = plan_offload(trace, lt, target, policy, options, link, kUntimedCallMs);
  if (!plan) {
    target = budget;
    plan = plan_offload(trace, lt, target, policy, options, link, kUntimedCallMs);
  }
  // Some calls need more than the budget in the plan's model (an optimizer's loop uses every
  // parameter a call apart, which no plan moves, though on-demand eviction can): the plan then
  // brings every other call under the least it can, and on-demand eviction covers the rest.
  const uint64_t least = offload_bound(model).least_bytes + options.granule;
  const std::vector<uint64_t> without = simulate(model, {});
  const uint64_t peak = without.empty() ? 0 : *std::max_element(without.begin(), without.end());
  bool partial = false;
  if (!plan) {
    partial = true;
    for (target = std::max(target, least); target < peak; target += std::max(options.granule, budget / 32)) {
      plan = plan_offload(trace, lt, target, policy, options, link, kUntimedCallMs);
      if (plan) break;
    }
  }
  if (!plan)
    return {"no " + name + " plan for the budget: " + plan.error().message + "; eviction stays on demand", false};
  if (!placed) schedule_prefetches(trace, model, plan.value(), link, kUntimedCallMs);  // plan_placed() did
  Result<ReplayScript> script = replay_script(trace, lt, model, plan.value());
  if (!script) return {"the " + name + " plan cannot be replayed: " + script.error().message, false};
  if (placed) {
    if (Status s = place_script(script.value(), trace, lt, model, *placed); !s)
      placed_what = "; no static placement (" + s.error().message + ")";
  }
  if (script->anchor == 0)
    return {"the recorded iteration has no unique start among its allocations; eviction stays on demand", false};
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Note [Moving part of a buffer]: the buffers that leave in part, and what of them stays.
  std::vector<size_t> in_part;
  uint64_t kept = 0;
  for (const OffloadMove& mv : plan->moves) {
    if (!mv.offset || std::find(in_part.begin(), in_part.end(), mv.life) != in_part.end()) continue;
    in_part.push_back(mv.life);
    kept += mv.offset;
  }
  const std::string parts =
      in_part.empty() ? "" : fmt::format(" ({} of them in part: {} of theirs stay)", in_part.size(), mib(kept));
  std::string what = fmt::format(
      "{} plan from the recorded iteration ({} calls, {} memory events): {} buffers out and back{}, {} each way per "
      "iteration; predicted peak {} for {}{}{}; least budget of any plan {}; made in {:.1f} ms; replayed from the "
      "next iteration",
      name, trace.calls.size(), script->events, script->targets.size(), parts, mib(script->bytes_moved),
      mib(plan->peak_bytes), mib(target),
      partial
          ? fmt::format(" (above the budget of {}: calls that need more are served by on-demand eviction)", mib(budget))
          : fmt::format(" (the budget {} less 1/{} of it as room)", mib(budget), room),
      plan->fits ? "" : " (does NOT fit: the rest is evicted on demand)", mib(least - options.granule), ms);
  what += placed_what;
  manager.install_replay(std::move(script.value()));
  return {what, true};
}

}  // namespace

// Note [No placement beside unseen collectives]
constexpr const char* kPlacementBesideNccl =
    "the placement failed beside NCCL's collectives under DDP when vcudnn did not see them (2026-11-24), and no run "
    "has shown it safe since they are seen";

std::string collectives_hazard_in(const std::vector<std::string>& thread_names, const char* world_size) {
  for (const std::string& name : thread_names)
    if (name.rfind("pt_nccl_watchdg", 0) == 0 || name.rfind("NCCL", 0) == 0)
      return "NCCL runs in this process (thread " + name + "): " + kPlacementBesideNccl;
  if (world_size && std::strtol(world_size, nullptr, 10) > 1)
    return fmt::format("WORLD_SIZE={}: a rank of a distributed job: {}", world_size, kPlacementBesideNccl);
  return "";
}

PlacementVerdict placement_beside_collectives(const std::string& hazard, bool asked, uint64_t seen) {
  if (hazard.empty()) return {};
  const std::string off = "no static placement (VCUDNN_OFFLOAD_PLACEMENT=off from here on): " + hazard;
  if (!asked) return {false, off};
  if (!seen)
    return {false, off +
                       "; kept off although VCUDNN_OFFLOAD_PLACEMENT asks for it: vcudnn has seen no NCCL "
                       "collective, so they run where its hooks cannot see them (a NCCL linked statically?)"};
  return {true, fmt::format("static placement kept beside NCCL, as VCUDNN_OFFLOAD_PLACEMENT asks ({}; vcudnn has "
                            "seen {} of its collectives)",
                            hazard, seen)};
}

std::string collectives_hazard() {
  std::vector<std::string> names;
  try {
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      std::ifstream in(task.path() / "comm");
      std::string name;
      if (std::getline(in, name)) names.push_back(std::move(name));
    }
    return collectives_hazard_in(names, std::getenv("WORLD_SIZE"));
  } catch (...) {  // no /proc, or no memory: nothing known against the placement
    return "";
  }
}

std::string replay_recorded_iteration(const Trace& trace, memory::MemoryManager& manager, const std::string& name,
                                      uint32_t room, bool placement, bool partial, AcrossEnd across) {
  if (!manager.budget()) return "";
  if (name == "lru") return "eviction on demand (VCUDNN_OFFLOAD_POLICY=lru)";
  const std::optional<OffloadPolicy> policy = offload_policy_from_name(name);
  if (!policy) return "unknown VCUDNN_OFFLOAD_POLICY " + name + "; eviction stays on demand";
  room = std::max(room, kMostRoom);
  // A plan that needs on-demand help in a steady iteration is made again with twice the room, down
  // to 1/kMostRoom of the budget (Note [Room the plan leaves]).
  struct Replan {
    Trace trace;
    std::string name;
    OffloadPolicy policy = OffloadPolicy::kVcudnn;
    uint32_t room = kFirstRoom;
    bool said_last = false;
    bool placement = true;
    bool partial = true;
    AcrossEnd across = AcrossEnd::kNever;
    std::mutex mu;  // two threads may each find a re-plan due
  };
  auto state = std::make_shared<Replan>();
  state->trace = trace;
  state->name = name;
  state->policy = *policy;
  state->room = room;
  state->placement = placement;
  state->partial = partial;
  state->across = across;
  manager.set_replanner([state, &manager](uint64_t helped) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->room <= kMostRoom) {
      if (!std::exchange(state->said_last, true))
        VCUDNN_LOG_INFO(
            "offload: the plan (1/{} of the budget as room) still needed {} on-demand evictions or "
            "fault-ins in an iteration; on-demand eviction covers them from now on",
            state->room, helped);
      return;
    }
    state->room /= 2;
    const auto [what, installed] = plan_and_install(state->trace, manager, state->name, state->policy, state->room,
                                                    state->placement, state->partial, state->across);
    VCUDNN_LOG_INFO("offload: the plan needed {} on-demand evictions or fault-ins in an iteration; planned again: {}",
                    helped, what);
  });
  const auto [what, installed] = plan_and_install(trace, manager, name, *policy, room, placement, partial, across);
  if (!installed) manager.set_replanner(nullptr);
  return what;
}

}  // namespace vcudnn
