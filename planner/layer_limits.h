// Per-layer workspace limits from a budget that varies over the iteration: at each convolution
// the device budget minus the bytes live there (activations, weights, gradients), capped by the
// per-layer limit. This is how the offload planner hands micro-batching the memory it leaves.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace vcudnn {

// limit[i] = min(cap, device_budget - live_bytes[i]), or 0 when nothing is left.
std::vector<uint64_t> per_layer_limits(uint64_t device_budget, const std::vector<uint64_t>& live_bytes,
                                       uint64_t cap = std::numeric_limits<uint64_t>::max());

}  // namespace vcudnn
