// The staircase insert: find the last entry with workspace <= c's; c must be strictly faster than
// it; then c removes the entries above it that are not faster than c.
#include "planner/pareto.h"

#include <algorithm>

namespace vcudnn {

bool ParetoFront::insert(MicroConfig c) {
  auto above = std::upper_bound(configs_.begin(), configs_.end(), c.workspace,
                                [](uint64_t ws, const MicroConfig& e) { return ws < e.workspace; });
  if (above != configs_.begin() && std::prev(above)->time_ms <= c.time_ms) return false;
  auto last_dominated = above;
  while (last_dominated != configs_.end() && last_dominated->time_ms >= c.time_ms) ++last_dominated;
  // An entry with the same workspace sits just below `above` and is slower: replace it.
  auto first = above;
  if (first != configs_.begin() && std::prev(first)->workspace == c.workspace) --first;
  auto pos = configs_.erase(first, last_dominated);
  configs_.insert(pos, std::move(c));
  return true;
}

const MicroConfig* ParetoFront::fastest_within(uint64_t limit) const {
  auto above = std::upper_bound(configs_.begin(), configs_.end(), limit,
                                [](uint64_t ws, const MicroConfig& e) { return ws < e.workspace; });
  return above == configs_.begin() ? nullptr : &*std::prev(above);
}

}  // namespace vcudnn
