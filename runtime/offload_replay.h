// From the recorded iteration to a replayed offload plan: under a device budget, once the recorder
// has the first complete iteration, the plan VCUDNN_OFFLOAD_POLICY names is made from it
// (planner/offload_plan.h) and handed to the memory manager as a ReplayScript. One log line says
// what was decided; any failure leaves eviction on demand.
#pragma once

#include <string>

#include "planner/trace.h"

namespace vcudnn {

namespace memory {
class MemoryManager;
}

// What was decided, for the log and the tests ("" when nothing was to be done).
std::string replay_recorded_iteration(const Trace& trace, memory::MemoryManager& manager, const std::string& policy);

}  // namespace vcudnn
