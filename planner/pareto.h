// ParetoFront: the desirable configurations (µ-cuDNN's D): for every workspace size, the fastest
// configuration that fits in it. Kept as a staircase sorted by workspace with strictly falling
// time; a configuration at least as slow as one using no more workspace is dropped, and pruning
// to the front loses no optimum of either the per-layer DP or the whole-network knapsack.
#pragma once

#include <vector>

#include "planner/microbatch.h"

namespace vcudnn {

class ParetoFront {
 public:
  // Adds `c` unless a kept configuration is at least as fast with no more workspace (on an exact
  // tie the one already kept wins); drops what `c` makes undesirable. True when kept.
  bool insert(MicroConfig c);
  // Ascending workspace, descending time.
  const std::vector<MicroConfig>& configs() const { return configs_; }
  bool empty() const { return configs_.empty(); }
  size_t size() const { return configs_.size(); }
  // The fastest configuration using at most `limit` bytes; nullptr if none fits.
  const MicroConfig* fastest_within(uint64_t limit) const;

 private:
  std::vector<MicroConfig> configs_;
};

}  // namespace vcudnn
