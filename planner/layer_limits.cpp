// Per-layer limits (layer_limits.h).
#include "planner/layer_limits.h"

#include <algorithm>

namespace vcudnn {

std::vector<uint64_t> per_layer_limits(uint64_t device_budget, const std::vector<uint64_t>& live_bytes, uint64_t cap) {
  std::vector<uint64_t> limits;
  limits.reserve(live_bytes.size());
  for (uint64_t live : live_bytes) limits.push_back(live >= device_budget ? 0 : std::min(cap, device_budget - live));
  return limits;
}

}  // namespace vcudnn
