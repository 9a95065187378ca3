// ReplayScript: an offload plan (offload_plan.h) turned into what the runtime can follow in later
// iterations without the trace: the iteration's allocations and frees in order (by size), the
// position of each among the iteration's memory events, which buffers the plan moves (named so that
// a later iteration's buffer can be found), and the copies out and back at their positions.
// CUDA-free; runtime/memory/replay.h follows it. See Note [Replaying an offload plan].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/offload_plan.h"
#include "planner/placement.h"

namespace vcudnn {

// Note [Replaying an offload plan]
// The runtime sees memory events only: allocations, frees, and calls whose pointers hit tracked
// buffers (each convolution, launch, copy or library call that uses one counts once). The trace
// records the same events, so a position in the iteration is an index into them. Later iterations
// repeat the recorded one event for event when the program repeats itself (same shapes, same
// order); the runtime checks that at every allocation and free against `steps` (kind and size) and
// takes its position from the step, so that a use the trace and the runtime count differently does
// not shift the copies for long.
//   - A buffer the iteration allocates and frees is the one the `alloc_index`-th allocation of the
//     iteration returns; a buffer that lives through the whole iteration (parameters, optimizer
//     state) is the same buffer in every iteration, found by its serial number. Buffers alive at
//     one end of the span only (gradients freed by the next step's zero_grad, say) are never
//     moved: the plan is made with them immovable (OffloadOptions::replayable_only).
//   - The copy out of a move is queued at the first memory event after its buffer's use: that use
//     has queued its work, and the copy's stream waits for it. The copy back is queued at the
//     first memory event at or after the call the plan prefetches at.
//   - While the script is followed, room the plan did not foresee (fragmentation, a buffer below
//     a granule) is made on demand from the buffer whose next use is farthest ahead.
//   - The first `anchor` steps of the iteration occur nowhere else in it (cyclically): the runtime
//     finds the start of an iteration by them, at the beginning and after any mismatch; until then
//     eviction is on demand.
struct ReplayStep {
  bool alloc = false;  // else a free
  uint64_t bytes = 0;  // as requested
  uint32_t event = 0;  // its index among the iteration's memory events
};

struct ReplayTarget {
  bool persistent = false;   // lives through the iteration: found by serial; else by alloc_index
  uint32_t alloc_index = 0;  // the iteration's allocations counted from 0
  uint64_t serial = 0;       // persistent: vcudnn's serial number of the buffer
  uint64_t bytes = 0;        // as requested
};

struct ReplayAction {
  enum Kind : uint8_t { kOffload, kPrefetch };
  uint32_t event = 0;  // queued when the runtime reaches this memory event (before it is handled)
  Kind kind = kOffload;
  uint32_t target = 0;  // index into ReplayScript::targets
  // A prefetch found late at run time moves earlier, never before this event: as early as the
  // budget holds in the plan's model, each prefetch given its share in turn (earliest first).
  uint32_t earliest = 0;
};

// The events at which a buffer the runtime can name is used: for on-demand eviction while the
// script is followed, the buffer used farthest ahead leaves first (Belady's rule).
struct ReplayUses {
  uint64_t serial = 0;           // persistent buffers
  std::vector<uint32_t> events;  // ascending
};

// A static placement to follow (Note [A static placement]), in granules: the pool's blocks and,
// by allocation index, the pool granules each allocation of the iteration takes.
struct ReplaySegment {
  uint64_t offset = 0, granules = 0;
};
struct ReplaySlot {
  uint64_t offset = 0;
  uint64_t granules = 0;  // 0: not placed
  uint64_t kept = 0;      // its first granules that stay when it leaves (Note [Moving part of a buffer])
  std::vector<ReplaySegment>
      segments;  // where its granules lie, in its order (Note [Buffers in pieces]); empty: at offset
};
// A buffer alive through the iteration placed while it moves (Note [Across the iteration's end],
// planner/offload_plan.h): found by its serial; its range is its own (PlacedPool::adopt).
struct ReplayThroughSlot {
  uint64_t serial = 0;
  ReplaySlot slot;
};
struct ReplayPlacement {
  uint64_t granule = 0;
  std::vector<uint64_t> cuts;     // block boundaries, from 0 to the pool's granules; empty: no placement
  std::vector<ReplaySlot> slots;  // by allocation index
  std::vector<ReplayThroughSlot> through;
  uint64_t pool_granules() const { return cuts.empty() ? 0 : cuts.back(); }
};

struct ReplayScript {
  uint32_t events = 0;  // memory events per iteration
  std::vector<ReplayStep> steps;
  std::vector<std::vector<uint32_t>> alloc_uses;  // by allocation index: the events that use it
  std::vector<ReplayUses> persistent_uses;        // buffers alive through the iteration
  size_t anchor = 0;                              // 0: no unique anchor found; the script cannot be followed
  std::vector<ReplayTarget> targets;
  std::vector<ReplayAction> actions;  // by event, offloads before prefetches at one event
  uint64_t bytes_moved = 0;           // per iteration, each way
  ReplayPlacement placement;
};

// Whether the trace call at a position is a memory event the runtime sees.
bool is_memory_event(const TraceCall& call);

// The plan's moves as a script. A move whose buffer cannot be named in a later iteration is an
// error (plan with OffloadOptions::replayable_only).
Result<ReplayScript> replay_script(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                                   const OffloadPlan& plan);

// The script follows `placement` too (made for the same plan's moves). An error when a placed buffer
// is not one the script's iteration allocates.
Status place_script(ReplayScript& script, const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                    const Placement& placement);

}  // namespace vcudnn
