// The DP: front[0] = {nothing}; front[b] = D({single kernel of size b} ∪ {kernel of size s <= b/2
// followed by any entry of front[b - s]}). Every split of b into two or more parts has a part of
// at most b/2, and time and workspace do not depend on order, so taking that part first loses
// nothing; pruning each front to its desirable entries loses no optimum (pareto.h).
#include "planner/microbatch_dp.h"

namespace vcudnn {

ParetoFront microbatch_front(const MicroBatchMeasurements& m, uint64_t limit) {
  const int32_t batch = m.mini_batch;
  if (batch <= 0) return {};
  // Per size, only the desirable single kernels matter.
  std::map<int32_t, ParetoFront> singles;
  for (const auto& [size, kernels] : m.by_batch) {
    if (size <= 0 || size > batch) continue;
    for (const auto& k : kernels)
      if (k.workspace <= limit && k.batch == size) singles[size].insert(MicroConfig::single(k));
  }
  std::vector<ParetoFront> front(static_cast<size_t>(batch) + 1);
  for (int32_t b = 1; b <= batch; ++b) {
    ParetoFront& f = front[b];
    if (auto it = singles.find(b); it != singles.end())
      for (const auto& c : it->second.configs()) f.insert(c);
    for (const auto& [size, kernels] : singles) {
      if (2 * size > b) break;
      for (const auto& rest : front[b - size].configs())
        for (const auto& k : kernels.configs()) f.insert(MicroConfig::prepend(k.kernels.front(), rest));
    }
  }
  return front[batch];
}

std::optional<MicroConfig> fastest_microbatch_config(const MicroBatchMeasurements& m, uint64_t limit) {
  ParetoFront f = microbatch_front(m, limit);
  if (f.empty()) return std::nullopt;
  return f.configs().back();
}

}  // namespace vcudnn
