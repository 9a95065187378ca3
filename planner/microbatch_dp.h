// µ-cuDNN's per-layer dynamic program ("WR", research/seed-ucudnn.md §3.2) in its set form:
// the Pareto front (time, workspace) of every way to cover the mini-batch with measured
// micro-kernels, under a workspace limit. The fastest entry is the per-layer (WR) choice; the
// whole front feeds the network-wide knapsack (WD).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "planner/microbatch.h"
#include "planner/pareto.h"

namespace vcudnn {

// What the benchmarker measured for one convolution kind: successful calls per micro-batch size.
struct MicroBatchMeasurements {
  int32_t mini_batch = 0;
  std::map<int32_t, std::vector<MicroKernel>> by_batch;
};

// Front of configurations covering exactly `mini_batch` samples whose workspace is <= limit.
// Empty when nothing fits (the caller falls back to a zero-workspace algorithm and warns).
ParetoFront microbatch_front(const MicroBatchMeasurements& m, uint64_t limit);

// The fastest configuration within `limit` (WR), if any.
std::optional<MicroConfig> fastest_microbatch_config(const MicroBatchMeasurements& m, uint64_t limit);

}  // namespace vcudnn
