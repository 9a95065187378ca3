// Placement: a static layout of a recorded iteration's device memory under an offload plan, so that
// the runtime can serve a budget without mapping memory anew every iteration. CUDA-free; the
// runtime that follows it is later work (Note [A static placement]).
//
// Note [A static placement]
// Under a budget today every large buffer takes extents of its own so that it can be evicted alone
// (Note [Extents under a budget], pool/vmm_arena.h), and the memory an evicted buffer leaves is
// reused by a later buffer only through unmapping it and mapping fresh memory at the later buffer's
// addresses: ResNet-50 b64 at 90 % spent ~30 ms a step on the H100's host in cuMemCreate / Map /
// SetAccess / Unmap / Release (README, "Where the time goes"), 1.6-1.8x the step without a budget.
//
// A buffer's addresses need not be its physical memory's only addresses: CUDA maps one physical
// allocation at several virtual ranges at once, and a part of it (cuMemMap's offset). So the
// iteration's buffers can be laid out once, in a pool of physical memory, by the offsets a planner
// gives them: each allocation of the iteration that the runtime can name (its index among the
// iteration's allocations; Note [Replaying an offload plan]) gets its own virtual range, mapped once
// onto its part of the pool and left mapped, and two buffers share pool bytes only when they are
// never on the device at the same time, counting a moved buffer as off the device while the plan
// has it on the host. In the steady state nothing is created, mapped or released: an allocation
// returns its range, a free returns nothing, and the pool bytes an evicted buffer left hold the
// buffers placed there during its absence. Only a moved buffer's own range is unmapped when it
// leaves (so that a stray access faults rather than reads another buffer's bytes) and mapped again
// when it comes back: a few driver calls per move (`remap_calls`), where the arena makes a hundred.
//
// What is placed: buffers of a granule or more, not a library's, that the iteration allocates and
// frees, and those it allocates and leaves to the next iteration (gradients, freed by the next
// step's zero_grad), each paired with the buffer of the same size alive at the iteration's start
// that the iteration frees (the previous iteration's instance), in order: such a buffer is on the
// device from its allocation to the end and again from the start to its partner's free. The rest
// (parameters and optimizer state, buffers below a granule, libraries' buffers) stays in the arena,
// which serves it without a budget's churn; `other_peak` is the most of it on the device at once.
// The device then holds at most pool_bytes + other_peak (and the arena's fragmentation).
//
// The layout: placed buffers, largest bytes x time on the device first, each at the best-fitting
// gap (the smallest that fits) among the offsets held by the placed buffers it shares a moment with,
// else on top. On the shipped ResNet-50 iteration (batch 64, H100) the pool comes within 0.5 % of the
// most placed bytes ever on the device at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/lifetimes.h"
#include "planner/offload_plan.h"
#include "planner/result.h"
#include "planner/trace.h"

namespace vcudnn {

// Where a part of a placed buffer lies in the pool: its bytes [at, at + bytes) at pool offset `offset`
// (Note [Buffers in pieces]).
struct PlacedSegment {
  uint64_t at = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const PlacedSegment&) const = default;
};

struct PlacedBuffer {
  size_t life = 0;  // index into Lifetimes::buffers (and SpanModel::lives)
  // The buffer alive at the iteration's start that this one's previous instance is (a buffer the
  // iteration leaves to the next); kNoPartner for a buffer the iteration allocates and frees.
  static constexpr size_t kNoPartner = SIZE_MAX;
  size_t partner = kNoPartner;
  uint64_t offset = 0;  // in the pool, a multiple of the granule: its first segment's
  uint64_t bytes = 0;   // granule-rounded
  // Where its bytes lie in the pool, by `at`, covering [0, bytes); none straddles `kept`. Empty: all
  // of it at `offset`.
  std::vector<PlacedSegment> segments;
  // Positions (calls of the span) where it is on the device, ascending and disjoint: its life less
  // the plan's absences; a buffer with a partner wraps around (from 0, and to the span's end).
  std::vector<std::pair<size_t, size_t>> resident;
  bool moved = false;  // the plan takes it off the device at least once
  // Alive through the span, not allocated by it (OffloadOptions::across_end: placed when it moves,
  // Note [Across the iteration's end] in offload_plan.h); on the device from the span's start to its
  // first move and after its last.
  bool through = false;
  // Note [Moving part of a buffer]: its first `kept` bytes never leave (on the device over its
  // whole life, `kept_resident`); `resident` is then its moving part's residency.
  uint64_t kept = 0;
  std::vector<std::pair<size_t, size_t>> kept_resident;
};

struct Placement {
  uint64_t granule = 0;
  uint64_t pool_bytes = 0;     // the pool's size
  uint64_t resident_peak = 0;  // the most placed bytes on the device at once: no layout needs less
  uint64_t other_peak = 0;     // the most bytes outside the pool on the device at once
  uint64_t total() const { return pool_bytes + other_peak; }
  std::vector<PlacedBuffer> buffers;  // by offset, then life
  // Driver calls per iteration once the layout stands: a moved placed buffer's range (its moving
  // part's) is unmapped when it leaves and mapped (and made accessible) when it comes back, one
  // mapping per block of the pool it covers (the pool is made of blocks cut at both ends of every
  // moved buffer's moving part, so that each move maps whole blocks); a moved buffer outside the
  // pool (alive through the iteration) as the arena does today, one extent each way.
  uint64_t blocks = 0;
  std::vector<uint64_t> cuts;  // the blocks' boundaries in bytes, from 0 to pool_bytes
  uint64_t remap_calls = 0;
  // Mappings made once, when each placed allocation is first served.
  uint64_t first_mappings = 0;
};

// Note [Buffers in pieces]
// A layout of whole buffers leaves holes no later buffer fits: on the shipped VGG-16 iteration (b64,
// feature maps of 784 MiB) the pool of the plan for 92 % of the runtime's target at 90 % was 392 MiB
// above the most placed bytes on the device at once, so the plan had to move 2352 MiB each way
// where 1666 would have fitted the budget without a layout. A buffer's virtual range can show
// several parts of the pool one after another (each mapped on its own), so a buffer (or the kept or
// moving part of one: Note [Moving part of a buffer]) that fits no hole whole may fill holes in up
// to kMaxSegments pieces, the rest on top, its pieces' ends block boundaries. Both layouts, whole
// and in pieces, are tried in each order; the smaller pool is kept.
inline constexpr size_t kMaxSegments = 4;

// By life: the calls (closed intervals, ascending) during which its copy out is still reading the
// bytes of its moving part, though the plan has it off the device: `whole`, until the copy ends;
// `pieces[k]`, until it has read piece k (its moving part's bytes from k * kCopyPiece on: Note
// [Copies out in pieces]).
struct CopyWindow {
  std::vector<std::pair<size_t, size_t>> whole;
  std::vector<std::vector<std::pair<size_t, size_t>>> pieces;
};
using CopyWindows = std::vector<CopyWindow>;
// In time_plan()'s timeline `t` of `plan`: from each move's first absent call to the last that starts
// before its copy out ends (has read the piece).
CopyWindows copy_windows(const SpanModel& model, const OffloadPlan& plan, const PlanTimeline& t);

// Lays out the span's placeable buffers under `moves` (an offload plan's, or none). `fit` (0: none):
// while the layout needs more than that (pool and what stays outside it), more orders are tried
// (Note [Searching for a layout that fits]). `copying`: each part goes where no copy out is still
// reading while it is on the device, if such a gap fits it below `copy_room` bytes of pool (or the
// most placed bytes on the device at once, if more) (Note [Laying out around copies out]).
Placement place_buffers(const Trace& trace, const Lifetimes& lifetimes, const SpanModel& model,
                        const std::vector<OffloadMove>& moves, uint64_t granule, uint64_t fit = 0,
                        const CopyWindows* copying = nullptr, uint64_t copy_room = 0);

// What a layout must keep: offsets aligned to the granule and within the pool, no two placed
// buffers on the device at one position sharing a byte, each buffer's residency its life less its
// absences, the peaks as stated. Empty when they hold, else what breaks first.
std::string check_placement(const SpanModel& model, const std::vector<OffloadMove>& moves, const Placement& placement);

// An offload plan whose static placement fits `budget`: the vcudnn plan for the budget, else for
// a budget lower by one percent at a time (more bytes move, so that what the layout adds fits),
// down to the least budget any plan needs. `plan_budget` is the budget the plan was made for.
// The calls that wait for a copy out because the layout gives their new buffer (allocated, or back
// from the host) bytes of a moved buffer while that buffer is off the device: the runtime orders
// the new owner after the copy (a hand-over).
std::vector<Handover> handovers(const std::vector<OffloadMove>& moves, const Placement& placement);
// time_plan() with the layout's hand-overs.
PlanTimeline time_placed(const Trace& trace, const SpanModel& model, const OffloadPlan& plan,
                         const Placement& placement, const LinkModel& link, double default_call_ms = 0);

struct PlacedPlan {
  OffloadPlan plan;
  Placement placement;
  uint64_t plan_budget = 0;
  bool held = false;       // moves hold their bytes until copied (Note [Bytes held until the copy out ends])
  double step_ms = 0;      // time_placed()'s step (at the link's measured rates)
  double handover_ms = 0;  // of which calls wait for copies out (room and hand-overs)
};
// Plans and lays out for copies out at kCopyOutRate of `link`'s rates (Note [Copies out with room
// to spare], offload_plan.h); the step it predicts is at `link`'s.
Result<PlacedPlan> plan_placed(const Trace& trace, const Lifetimes& lifetimes, uint64_t budget,
                               const OffloadOptions& options, const LinkModel& link = kAssumedLink,
                               double default_call_ms = 0);

}  // namespace vcudnn
