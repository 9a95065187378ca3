// Exact multiple-choice knapsack by dominance (Nemhauser–Ullmann): after each group keep only the
// partial choices that no other partial choice beats in both total workspace and total time.
// A dominated partial choice can be swapped for its dominator in any completion without raising
// time or workspace, so the last group's fastest state within the budget is optimal. The states
// stay few because workspace sums repeat and most options are dominated.
#include "planner/knapsack.h"

#include <algorithm>
#include <limits>
#include <string>

namespace vcudnn {
namespace {

struct State {
  uint64_t workspace;
  double time_ms;
  int parent;  // index in the previous layer of states
  int option;  // option of this group
};

std::vector<State> prune(std::vector<State> s) {
  std::sort(s.begin(), s.end(), [](const State& a, const State& b) {
    return a.workspace != b.workspace ? a.workspace < b.workspace : a.time_ms < b.time_ms;
  });
  std::vector<State> kept;
  for (const auto& st : s)
    if (kept.empty() || st.time_ms < kept.back().time_ms) kept.push_back(st);
  return kept;
}

}  // namespace

Result<KnapsackChoice> solve_multiple_choice_knapsack(const std::vector<std::vector<KnapsackOption>>& groups,
                                                      uint64_t budget) {
  uint64_t lower_bound = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) return Error{"kernel " + std::to_string(g) + " has no configuration"};
    uint64_t least = std::numeric_limits<uint64_t>::max();
    for (const auto& o : groups[g]) least = std::min(least, o.workspace);
    lower_bound += least;
  }
  if (lower_bound > budget)
    return Error{"a total workspace of " + std::to_string(budget) + " bytes is below the least possible, " +
                 std::to_string(lower_bound) + " bytes"};
  std::vector<std::vector<State>> layers{{State{0, 0.0, -1, -1}}};
  for (const auto& group : groups) {
    const auto& prev = layers.back();
    std::vector<State> next;
    next.reserve(prev.size() * group.size());
    for (int p = 0; p < static_cast<int>(prev.size()); ++p)
      for (int o = 0; o < static_cast<int>(group.size()); ++o) {
        const uint64_t ws = prev[p].workspace + group[o].workspace;
        if (ws < prev[p].workspace || ws > budget) continue;  // overflow or over budget
        next.push_back({ws, prev[p].time_ms + group[o].time_ms, p, o});
      }
    layers.push_back(prune(std::move(next)));
  }
  // The last layer is sorted by workspace with falling time: its last state is the fastest.
  KnapsackChoice choice;
  choice.option.assign(groups.size(), -1);
  const State* st = &layers.back().back();
  choice.time_ms = st->time_ms;
  choice.workspace = st->workspace;
  for (size_t g = groups.size(); g > 0; --g) {
    choice.option[g - 1] = st->option;
    st = &layers[g - 1][st->parent];
  }
  return choice;
}

}  // namespace vcudnn
