// From the recorded iteration to a replayed offload plan: under a device budget, once the recorder
// has the first complete iteration, the plan VCUDNN_OFFLOAD_POLICY names is made from it
// (planner/offload_plan.h) and handed to the memory manager as a ReplayScript. One log line says
// what was decided; any failure leaves eviction on demand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/offload_plan.h"
#include "planner/trace.h"

namespace vcudnn {

namespace memory {
class MemoryManager;
}

// Note [Room the plan leaves]
// The plan's model counts each buffer's granules; it does not see buffers below a granule sharing
// slabs, idle memory whose frees have not settled, or extents a request cannot take exactly. So a
// plan is made for the budget less some room: every byte of room is a byte more to move each way
// each iteration. The first plan leaves 1/64 of the budget; when a steady iteration still needed
// on-demand evictions or fault-ins, the manager asks (set_replanner) and the plan is made again with
// twice the room, up to 1/8 (kMostRoom). On the recorded ResNet-50 iteration (tests/cpu/
// trace_sim_test.cpp) 1/64 needs no help at 90-60 % and moves 30 % fewer bytes at 90 % than the
// 1/16 used before; VGG-16 on the H100 needed more than 1/16 (its workspaces).
// A plan with a static placement (Note [A static placement]) leaves half that room (1/128 first):
// its layout counts the bytes outside the pool, and what it does not see is what is left (H100,
// 2026-11-25: the peak mapped was 17 MiB above the layout's total for ResNet-50 b128 at 90 %, 29 MiB
// for VGG-16 under micro-batching; 1/128 of those budgets is 76 and 44 MiB). Every byte of room is
// moved each way, and the layout has less to work with: the plan's timelines at 1/64 and 1/128 were
// 77.6 and 75.7 ms for ResNet-50 b128 at 90 % (72.4 of compute), 56.7 and 56.1 for VGG-16.
inline constexpr uint32_t kFirstRoom = 64;
inline constexpr uint32_t kMostRoom = 8;

// Note [No placement beside unseen collectives]
// Under DistributedDataParallel (2 x H200, ResNet-50 batch 32, 60 % budget, PyTorch 2.11, NCCL) the
// plan replayed with its static placement made the first replayed iteration fail with an illegal
// memory access; the same plan without the placement (VCUDNN_OFFLOAD_PLACEMENT=off) trained with
// the losses of DDP alone. NCCL queued its collectives where vcudnn saw nothing (its own launches,
// on its own stream, on the gradient buckets the trace shows only as copies in and out), and which
// of the placement's assumptions that breaks is not yet found: that rank's recorded iteration,
// replayed with the placement on the simulated device (tests/cpu/trace_sim_test.cpp), shows no
// error, also with DDP's in-place all-reduces added on a stream of their own, hidden from vcudnn,
// the device lagging 400 operations. Moves across the iteration's end (2026-11-25) make hidden
// collectives a certain hazard: the gradient buckets are idle from their last use in the backward
// pass to the first copy out of them at the iteration's end, which is when NCCL reduces them, and
// on the simulated device such moves bring a bucket back without NCCL's result (stale gradients,
// silently). Since 2026-11-28 vcudnn sees the collectives that NCCL's shared library queues (Note
// [Collectives queue their work at the group's end], collectives.h): the recorded iteration holds
// them, on NCCL's stream, copies out of their buffers wait for them, and the same simulation is
// clean. No run on two GPUs has tested that yet, so a process where NCCL runs still gets the plan
// without the placement, and the log says so, unless VCUDNN_OFFLOAD_PLACEMENT is set explicitly
// (then it is kept, with a warning). Any one sign is enough (a false one costs only the placement's
// speed): a PyTorch NCCL process group's watchdog thread ("pt_nccl_watchdg", started with the
// group; seen in the failing run's messages), a thread whose name begins "NCCL", or WORLD_SIZE
// above 1 (torchrun and its kin set it for every rank).

// Why the static placement is not used in this process ("" when nothing speaks against it):
// collectives_hazard() reads the names of the process's threads and WORLD_SIZE; the rule is in
// collectives_hazard_in(), for tests.
std::string collectives_hazard();
std::string collectives_hazard_in(const std::vector<std::string>& thread_names, const char* world_size);

// Whether the placement goes ahead where `hazard` (collectives_hazard()) speaks against it: only when
// VCUDNN_OFFLOAD_PLACEMENT was `asked` for explicitly and vcudnn has `seen` collectives (none seen
// where NCCL runs: they go where the hooks cannot see them, a NCCL linked statically, and moves
// across the iteration's end would return stale buckets); the warning says which way it went.
struct PlacementVerdict {
  bool place = true;
  std::string warning;  // "" when there is no hazard
};
PlacementVerdict placement_beside_collectives(const std::string& hazard, bool asked, uint64_t seen);

// What was decided, for the log and the tests ("" when nothing was to be done). `room`: the plan
// leaves 1/room of the budget out (Note [Room the plan leaves]); later plans leave more if needed.
// `placement`: the vcudnn policy's plan comes with a static placement of the iteration's buffers
// (Note [A static placement]) when one fits the budget; `partial`: that plan may move part of a
// buffer (Note [Moving part of a buffer]); `across`: buffers alive through the iteration may stay
// off the device across its end (Note [Across the iteration's end]).
std::string replay_recorded_iteration(const Trace& trace, memory::MemoryManager& manager, const std::string& policy,
                                      uint32_t room = kFirstRoom, bool placement = true, bool partial = true,
                                      AcrossEnd across = AcrossEnd::kNever);

}  // namespace vcudnn
