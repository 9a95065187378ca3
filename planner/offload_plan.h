// Offload planning from a recorded iteration (trace schema 2): which buffers leave the device
// between two of their uses, when they go, when they come back, and what that leaves on the device
// at every call, against a budget. CUDA-free; the runtime's replay of a plan is later work.
//
// The model is the call sequence, not time (the trace has no GPU time for every operation yet):
// a buffer moved over the gap between two consecutive uses u and v is on the device until the
// call after u has run (its copy out is queued after u and overlaps that call), off the device
// from then until its prefetch, issued `prefetch_at` (at the latest the call before v, so that the
// copy back overlaps one call), and on the device again from there. Device bytes round a buffer of
// a granule or more up to whole granules, as vcudnn's arena maps them; smaller buffers share
// granules and are never moved, nor are NVIDIA libraries' own buffers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "planner/lifetimes.h"
#include "planner/result.h"
#include "planner/trace.h"

namespace vcudnn {

// vcudnn: the moves with the fewest bytes that bring every call under the budget (greedy cover,
// then moves that turned out unneeded dropped, then, with OffloadOptions::partial_moves, each
// moved buffer's part that the budget does not need kept on the device: Note [Moving part of a
// buffer]). vdnn-all / vdnn-conv: vDNN's static policies, as
// published: every feature map a forward layer reads (all layers / convolutions only) leaves after
// its last forward use and is prefetched when the backward layer before its next use starts,
// whatever the budget. modnn: moDNN's scheduler (Algorithm 1 of the TPDS paper) without its
// convolution-algorithm and sub-batch choices and without address-level fragmentation: the calls
// are simulated in order; when an allocation or a copy back does not fit, buffers the iteration
// allocated are offloaded, fewest seconds of delay first (never one not yet used since it arrived,
// nor one this call or the next uses); before each call, copies back start for the calls ahead
// whose inputs would otherwise arrive late (the paper's Eq. 9), stopping at the first that can
// wait; one transfer stream serves both directions.
enum class OffloadPolicy { kVcudnn, kVdnnAll, kVdnnConv, kModnn };
inline constexpr OffloadPolicy kOffloadPolicies[] = {OffloadPolicy::kVcudnn, OffloadPolicy::kVdnnAll,
                                                     OffloadPolicy::kVdnnConv, OffloadPolicy::kModnn};
std::string_view offload_policy_name(OffloadPolicy policy);
std::optional<OffloadPolicy> offload_policy_from_name(std::string_view name);

// Note [Moving part of a buffer]
// A plan of whole buffers moves more than the budget needs where the buffers are large: VGG-16 b64's
// feature maps are 784 MiB each, and at the target the runtime plans for at 90 % of PyTorch's peak
// (5395 MiB, the shipped trace) its plan moves 1666 MiB each way where 1122 do with parts, 81.1
// against 91.6 ms in the plan's timeline. The device memory of a buffer is granules mapped into its
// virtual range, so a part of it can leave alone: the plan moves a buffer's last granules and keeps
// its first ones, `offset` bytes, on the device. After the greedy cover, each moved buffer, the
// last to leave first, keeps as many granules as every call of its absences has room for under the
// budget (its moves keep the same part, so that its layout is one shape: placement.h). Only a static
// placement follows such a plan: the buffer's range is cut where the moving part begins, its kept
// part stays mapped, its moving part's pool bytes take other buffers in its absence
// (PlacedPool::Slot::kept); a buffer the arena serves instead leaves whole. A plan whose calls all
// sit at their target leaves its layout no slack, so plan_placed() lays out both plans, in part and
// whole, and keeps the faster: on the shipped traces at the runtime's 90 % targets the placed plan
// moves 886 MiB where whole buffers need 984 (ResNet-50 b64; 46.2 against 46.9 ms) and 2092 MiB
// where they need 2352 (VGG-16 b64; 102.3 against 111.5 ms). What the layout adds over the plan
// alone (the pool's fragmentation, and the bytes outside it peaking elsewhere) is now the larger
// cost.
struct OffloadOptions {
  uint64_t granule = 2ull << 20;  // the arena's mapping granularity; smaller buffers never move
  // Only buffers a later iteration can name move (Note [Replaying an offload plan]): those the span
  // allocates and frees, and those alive through all of it.
  bool replayable_only = false;
  // vcudnn's plan may move part of a buffer the span allocates and frees (Note [Moving part of a
  // buffer]): only a static placement can follow such a plan (the arena evicts whole buffers).
  bool partial_moves = false;
  // Buffers alive through the span may stay off the device across its end (Note [Across the
  // iteration's end]): for plans laid out by a static placement that places them (the runtime follows
  // them: MemoryManager::adopt_placed). Which plans use them: AcrossEnd below.
  bool across_end = false;
  // plan_placed() lays out a plan with such moves only where none without them fits the budget
  // (VCUDNN_OFFLOAD_PLACEMENT=static, the default); else wherever the model predicts a shorter step.
  bool across_only_where_needed = false;
  // vcudnn's plan takes every such move first (each buffer idle over more than half the span), then
  // covers what is left; plan_placed() tries it both ways.
  bool across_first = false;
};

// Which plans may move buffers across the iteration's end (VCUDNN_OFFLOAD_PLACEMENT).
enum class AcrossEnd : uint8_t {
  kNever,        // static-whole, and the CLI without --across-end
  kWhereNeeded,  // static: only where no placed plan without them fits the budget
  kWhereFaster,  // static-across: wherever the model predicts a shorter step
};

// Note [Across the iteration's end]
// The span a trace records begins with the optimizer step (the previous step's gradients applied),
// then the forward and backward passes. SGD's momentum buffers (and Adam's moments) are used there
// only: idle over the whole forward and backward pass (98 MiB on ResNet-50, 536 MiB on VGG-16), as
// are weights after their backward use: on ResNet-50 b128 150 MiB of such buffers can move, on VGG-16
// b64 1018 MiB (its fc6 weight and momentum are 392 MiB each).
// A gap between two uses inside the span cannot name them. A move across the end does: out after the
// buffer's last use, back before the span's end (next_use is the span's size, the next iteration's
// first call), so that it is on the device again when the next optimizer step runs.
//   - Its copy out starts as soon as the optimizer step has run, when the link has nothing else to
//     carry: on ResNet-50 b128 the first feature map that can leave is free 2.6 ms into the step.
//   - Only a static placement turns its absence into room: a buffer alive through the span is
//     otherwise outside the pool, and what stays outside counts at its most (Placement::other_peak,
//     at the optimizer step). So such buffers are placed when they move, on the device from the
//     span's start to the move and again after it (placement.h).
//   - At run time such a buffer lives in the arena, at the address the program holds, until the
//     plan first takes it away. Coming back, its pool slot takes
//     it at that address (an external slot: PlacedPool::adopt, MemoryManager::adopt_placed); from then
//     on it leaves and comes back as any placed buffer.
//   - Each such move unmaps its range and maps it again, block by block: on the simulated device the
//     27 moves across the end of ResNet-50 b128 at 90 % (momentum of 2-10 MiB a buffer) made ~80 more
//     pool mappings an iteration (blocks 27 -> 113); on the H100 60 driver calls an iteration
//     (~6.5 ms of host time, hidden: the host stayed ahead of the device).
//   - Its next copy out may come while the host has not yet seen its copy back end: it runs all the
//     same (copies out queue after every copy back). Refusing it, as the first H100 run did, kept it
//     on its pool bytes every other iteration and made ResNet-50 b128 at 90 % 1.5x slower.
//   - Measured on the H100 (two rounds each), the model's gains did not appear where a plan fits
//     without such moves: ResNet-50 b128 at 90 % 81.1 against 79.5 ms, VGG-16 `offload` at 90 % 72.6
//     against 71.9 ms. Where none fits they make one: VGG-16 `offload` at 70 % 132 ms (2.45x PyTorch)
//     against 195-215 ms on demand. So by default (AcrossEnd::kWhereNeeded) they are taken only there.
// In the plan's model on the H100 traces of 2026-11-25 (budgets as the runtime set them): ResNet-50
// b128 at 90 % 73.07 -> 71.41 ms (its compute: no wait left); VGG-16 `offload` at 90 % 73.8 ->
// 60.9 ms, at 70 % from no plan at all to 127.5 ms; VGG-16 under micro-batching at 70 % 134.6 ->
// 105.7 ms (at 90 % the plan without such moves stays the faster).

// One buffer's trip off the device, in positions (indexes of the span's calls, 0-based).
struct OffloadMove {
  size_t life = 0;         // index into Lifetimes::buffers
  uint64_t bytes = 0;      // device bytes freed (granule-rounded)
  size_t out_after = 0;    // the use the copy out follows
  size_t prefetch_at = 0;  // the copy back is issued before this call runs
  size_t next_use = 0;     // the use it is back for
  size_t off_from = 0;     // the first call it is off the device for (out_after + 2 when the copy
                           // out overlaps the next call; moDNN's later, when an allocation needs it)
  // Where the part that moves begins in the buffer's device bytes (a multiple of the granule): 0 for
  // the whole buffer, else `bytes` is its last part (Note [Moving part of a buffer]).
  uint64_t offset = 0;
  // Off the device while calls first_absent..last_absent run.
  size_t first_absent() const { return off_from; }
  size_t last_absent() const { return prefetch_at - 1; }
};

struct OffloadPlan {
  OffloadPolicy policy = OffloadPolicy::kVcudnn;
  uint64_t budget = 0;
  std::vector<OffloadMove> moves;  // by out_after
  uint64_t bytes_moved = 0;        // each crosses the link twice (out and back)
  uint64_t peak_bytes = 0;         // device bytes at the worst call with the plan
  size_t peak_at = 0;
  uint64_t peak_without = 0;  // the same without any move
  bool fits = false;          // peak_bytes <= budget
};

// What the span needs at least, in this model: at each call, what no move can take off the device
// then (buffers below a granule, library buffers, buffers used by this call or the one before or
// after, buffers without a gap of four calls around it); the largest over the span, and where.
struct OffloadBound {
  uint64_t least_bytes = 0;
  size_t at = 0;
  uint64_t seq = 0;
};

// The span's calls in order (positions) and each buffer's life in positions: what the planner and
// the simulator share.
struct SpanModel {
  std::vector<uint64_t> seqs;  // position -> seq
  struct Life {
    size_t first = 0, last = 0;  // on the device for calls first..last (alloc .. free, or the span)
    std::vector<size_t> uses;    // positions
    uint64_t bytes = 0;          // device bytes
    bool movable = false;
    bool partial = false;  // part of it may move (OffloadOptions::partial_moves, and the span allocates and frees it)
    bool through = false;  // alive through the span: neither allocated nor freed in it (parameters, optimizer state)
  };
  std::vector<Life> lives;   // parallel to Lifetimes::buffers
  uint64_t fixed_bytes = 0;  // on the device throughout, in no life: Lifetimes::untouched_bytes
  bool across_end = false;   // OffloadOptions::across_end
};
SpanModel span_model(const Trace& trace, const Lifetimes& lifetimes, const OffloadOptions& options = {});

OffloadBound offload_bound(const SpanModel& model);

// Device bytes at every position with these moves.
std::vector<uint64_t> simulate(const SpanModel& model, const std::vector<OffloadMove>& moves);

// Note [Workspaces that decide the budget]
// A convolution's workspace is a buffer of the iteration like any other, but it lives for one call,
// so no plan can move it: where the framework's are large they are what a budget cannot go below,
// and they take the room a plan needs to bring buffers back. On PyTorch's default path (cuDNN's
// graph API, fp32) VGG-16 b64's backward convolutions of conv1 take 1.5 GiB each, at the end of the
// backward pass: with the budget at 90 % of PyTorch's live peak the plan could bring the first
// feature map back only a few calls before its use (1.45x PyTorch's step on the H100), and at 70 %
// it was below the least budget any plan needed. Micro-batching bounds them: VCUDNN_POLICY=
// microbatch+offload with VCUDNN_WORKSPACE_LIMIT=512M ran those convolutions as micro-batches in
// vcudnn's workspace of at most 401 MiB, freed after each call (Note [Workspace that lives for
// one call], pool/workspace_pool.h), and the step took 1.18x at 90 % and 2.40x at 70 %, without
// fault-ins (2026-11-25). Micro-batching changes the order of floating-point sums, so it is the
// user's choice, never made for them: the plan only says when it would help, from the largest
// workspace a convolution of the iteration used.
struct ConvWorkspace {
  uint64_t bytes = 0;  // as requested; 0: no convolution of the span had a workspace buffer
  uint64_t seq = 0;    // the convolution's
};
// Over the trace's iteration: the workspace buffer (among a convolution's accesses, at its
// workspace pointer) with the most bytes.
ConvWorkspace largest_conv_workspace(const Trace& trace);
// The advice for a plan under `budget` when that workspace is at least a tenth of it (or ""), for
// the log and `vcudnn plan`.
std::string workspace_advice(const ConvWorkspace& workspace, uint64_t budget);

// The host link's bandwidths (GB/s, pinned memory), for timing and for moDNN's scheduler.
struct LinkModel {
  double device_to_host_gbps = 0;
  double host_to_device_gbps = 0;
  double both_gbps = 0;  // the sum when both directions move at once
};
// H100 SXM over PCIe 5 as measured for DESIGN.md: the default when a trace carries no link.
inline constexpr LinkModel kAssumedLink{55.0, 55.0, 78.0};

// A plan for `budget` under `policy`. Errors: a budget below offload_bound (naming it and the call),
// a vDNN policy on a trace without a forward-to-backward turn, moDNN finding no buffer to offload. A
// vDNN plan that does not bring the peak under the budget is returned with fits = false (those
// policies do not look at the budget). moDNN times calls as time_plan does (`link`,
// `default_call_ms`); the others ignore both.
Result<OffloadPlan> plan_offload(const Trace& trace, const Lifetimes& lifetimes, uint64_t budget, OffloadPolicy policy,
                                 const OffloadOptions& options = {}, const LinkModel& link = kAssumedLink,
                                 double default_call_ms = 0);

// ---- Time: what a plan costs, predicted from the trace's GPU times and the host link.
//
// Three lanes run side by side: the calls in order on one compute stream, copies out on the
// device-to-host link, copies back on the host-to-device link (each lane one copy at a time, at
// its own bandwidth, the two together at no more than `both_gbps`: Note [Both directions at once]
// in offload_plan.cpp). A copy out starts when its use has
// run and the lane is free; a copy back when its prefetch call starts, the lane is free and the copy
// out is done; a call waits for the copies back of the buffers it uses (a stall). The model of
// device bytes above counts a move off the device from its off_from call; a copy out not done by
// then is late, its bytes still held, and a call that would go over the budget with them waits
// for enough copies out to end (room), as the runtime does.

struct TimedCopy {
  size_t move = 0;  // index into OffloadPlan::moves
  double start_ms = 0, end_ms = 0;
};

struct PlanTimeline {
  double step_ms = 0;                              // the calls' end
  double compute_ms = 0;                           // the calls alone, without stalls
  double stall_ms = 0;                             // calls waiting for copies back
  double room_ms = 0;                              // calls waiting for copies out (room under the budget)
  size_t room_waits = 0;                           // calls that waited for room
  size_t late_prefetches = 0;                      // copies back not done when their call was due
  size_t late_offloads = 0;                        // copies out not done when the move's off_from call started
  size_t untimed_calls = 0;                        // calls that queue work and have no GPU time (counted as `default_call_ms`)
  std::vector<double> call_start_ms, call_end_ms;  // by position
  std::vector<TimedCopy> copies_out, copies_back;
  // Note [The lower bound]
  // The least time any plan for the budget can take in this model. At every call p over the budget
  // without a plan, its excess e_p must be off the device before p starts and come back after p
  // has ended, and no call waits for nothing. Only buffers that some plan could have off the device
  // at p count: movable, alive at p, not used by p, with a use before p and one after it (a plan
  // moves a buffer between two uses). Out: a buffer's copy out starts when its use before p has
  // run, at the earliest (the calls back to back without stalls); so e_p can be off the device no
  // earlier than one device-to-host lane moving those bytes, the earliest-ready first, can have
  // moved e_p of them (whole buffers or parts of them: a relaxation), and p starts no earlier than
  // that or its place in the compute. Back: a buffer must be back before its next use starts, after
  // which at least the compute from that use on remains; the same lane argument, run from the end
  // of the step backwards, gives the least time from p's end to the step's end. So the step takes
  // at least max(compute before p, out) + p + max(compute after p, back), the largest over every p
  // (and at least the compute). Each term is a relaxation of time_plan()'s rules, so every plan's
  // predicted step is at least the bound.
  // History: before 2026-11-23 the bound took the largest e_p alone; until 2026-11-24 it let the
  // bytes leave from the iteration's start (e_p / device-to-host + the compute from p on), which
  // at 90% of ResNet-50 b64's peak ignores that the 786 MiB cannot start to leave before the
  // forward pass has produced them.
  double lower_bound_ms = 0;
};

// Note [The lower bound], for `budget`: the calls' GPU times by position, the link's bytes per ms.
double lower_bound_ms(const SpanModel& m, const std::vector<double>& duration, uint64_t budget, double d2h, double h2d);

// After changing moves: sorts them (by out_after) and sets bytes_moved, the peaks and fits.
void finish_plan(const SpanModel& m, OffloadPlan& plan);

// Times `plan` (budget and moves) over the span. default_call_ms: the time of a call that queues
// work and that the trace did not time (traces of older vcudnn time convolutions only); a call that
// queues none (an allocation, a free) takes no GPU time.
// `handovers`: (call, move) pairs where the call cannot start before that move's copy out has read
// the bytes a static placement gave the call's new buffer (time_placed() in placement.h); counted as
// waits for room. `pooled` (by move; empty: none): moves whose bytes change hands only so, a placed
// buffer's, to which the room rule above does not apply (the pool's bytes are within the budget).
struct Handover {
  size_t call = 0;
  size_t move = 0;  // index into plan.moves
  // The copy out must have read the move's first `upto` bytes (in its order: Note [Copies out in
  // pieces]); 0: all of them.
  uint64_t upto = 0;
};
PlanTimeline time_plan(const Trace& trace, const SpanModel& model, const OffloadPlan& plan, const LinkModel& link,
                       double default_call_ms = 0, const std::vector<Handover>& handovers = {},
                       const std::vector<bool>& pooled = {});

// Note [Copies out in pieces]
// A moved buffer's copy out reads its bytes in order, in pieces of kCopyPiece bytes, each ending
// with a fence of its own, so that a buffer a static placement gives part of its bytes (a
// hand-over) waits only for the pieces it takes, not for the whole copy; and the layout gives a
// buffer arriving while the copy runs the pieces read by then (Note [Laying out around copies
// out], piece by piece, in the timeline without waits for room). On VGG-16 b64 under micro-batching
// (512 MiB workspaces) at 90 % of its peak the plan moves conv1_1's 784 MiB output, whose copy out
// takes 15 ms, while the forward pass goes over the budget by 24 MiB at its first call over it and
// by 122 MiB a few calls on; whole, those calls waited for the whole copy. In the plan's timeline
// of the shipped iteration bounded to 512M (`vcudnn plan --workspace-limit 512M --placement`) the
// step went from 60.9 ms (6.5 waiting for copies out) to 53.6, its lower bound; on the H100 it went
// from 1.18x to 1.13x PyTorch's with pieces alone (2026-11-25). 32 MiB takes 0.6 ms on the link:
// pieces of 64 MiB left 2.1 ms of waits in that timeline, of 16 MiB none fewer than 32.
inline constexpr uint64_t kCopyPiece = 32ull << 20;

// Note [Prefetches with room to spare]
// Prefetches are placed for a link slower than measured: on the H100 a 196 MiB copy back, 3.8 ms
// at the 54 GB/s measured alone, took 3.8-4.6 ms while the backward pass ran, and placed for the
// measured rate a chain of five copies back came 2-5 ms late each (scripts/bench/profile_step.py
// --gaps). At 85 % of the rate the shipped ResNet-50 iteration's timelines stay within 1 ms of
// those at the full rate (75 % cost 3-4 ms at 60-70 % budgets: copies issued earlier need room
// the budget has only later). A copy back that lands early holds its bytes a little longer, which
// the backward pass, freeing as it goes, usually has.
inline constexpr double kPrefetchRate = 0.85;

// Note [Copies out with room to spare]
// A static placement is laid out for copies out slower than measured: the hand-overs it plans wait
// for the pieces of copies out the layout expects read by then, and on the H100 (2026-11-25) VGG-16
// b64 under micro-batching at 90 % stood 0.75-1.0 ms a step for them where its plan's timeline had
// none. That timeline with the copies out at 93 % of the measured rate shows 0.77 ms of it; a layout
// made for 93 % waits for none at 93, 95 or 100 % of the rate, and ResNet-50 b128's at 90 % waits
// less at each of those rates (74.6 against 74.9 ms at the full rate) on the same run's traces.
inline constexpr double kCopyOutRate = 0.93;

// vcudnn's prefetches as late as the link allows: the copies back share one lane, so, latest use
// first, each is issued at the latest call from which it ends before its use and before the copy
// after it in the lane begins (GPU times from the trace), but never so early that the budget breaks
// (then as early as it holds). Only vcudnn plans move; returns how many prefetches moved.
size_t schedule_prefetches(const Trace& trace, const SpanModel& model, OffloadPlan& plan, const LinkModel& link,
                           double default_call_ms = 0);

// Note [Prefetches as early as the budget allows]
// A static placement cannot move a copy back earlier at run time (the buffers placed in its
// absence hold its bytes until the planned call), so its prefetches are placed with the room to
// spare that the GPU, not the plan's model, turned out to need. On the H100 with ResNet-50 b64 at
// 90 % (2026-11-24), prefetches placed as late as the link allows (schedule_prefetches, at 85 % of
// the measured rate) left the device standing 6-10 ms a step for 2-3 of the 5 copies back, each
// late by about one whole copy (3.0-3.7 ms), though the model gave two of them 5-9 ms to spare;
// timed on the device (Note [Timing the waits for vcudnn's copies]) the copies ran at 53-55 GB/s
// and waited 1-6 ms a step in all for the memory's previous holders: why they started so late was
// not found. Issued as early as the budget allows, no copy back kept the device waiting, and the
// step fell from 56.2 to 48.2 ms in the same run, although the layout, sharing less, needed a plan
// that moves 980 MiB each way instead of 882 (the model, which sees no such lateness, predicted
// 53.4 against 51.5 ms). At 60 % the step was the same either way (114.0 and 114.7 ms); at 70 %
// and 60 % the model predicts early prefetches 8-18 ms faster.
//
// vcudnn's prefetches as early as the budget allows, in the order of their uses (the lane's order):
// each copy back is issued at the earliest call from which the device bytes stay within the budget
// until its use, and not before the one issued for the use before it. Only vcudnn plans move;
// returns how many prefetches moved.
size_t schedule_prefetches_early(const SpanModel& model, OffloadPlan& plan);

// The plan's timeline as Chrome trace JSON (chrome://tracing, Perfetto): compute, device-to-host
// and host-to-device lanes, one event per call and per copy.
std::string timeline_json(const SpanModel& model, const OffloadPlan& plan, const PlanTimeline& timeline);

// The invariants every plan keeps: each move is over a gap between two consecutive uses of its
// buffer (nothing leaves while a use of it is queued, and it is back before its next use), its
// buffer is movable, its absent range is not empty, no buffer makes two trips over one gap, and
// the simulated peak is what the plan says. Empty when they hold, else what breaks first.
std::string check_plan(const SpanModel& model, const OffloadPlan& plan);

}  // namespace vcudnn
