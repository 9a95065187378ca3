// IterationDetector: finds the first complete training iteration in the process-wide sequence of
// intercepted calls. CUDA-free, so that it can be tested on recorded and synthetic sequences.
// See Note [Iteration boundaries] in iteration_detector.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/conv_layer.h"

namespace vcudnn {

// One executed convolution, as the detector compares them: kind plus the interned layer index
// (equal index <=> equal full fingerprint).
struct ExecItem {
  ConvKind kind = ConvKind::kForward;
  int32_t layer = -1;
  bool operator==(const ExecItem&) const = default;
};

struct DetectedIteration {
  uint64_t first_seq = 0;  // first call of the iteration
  uint64_t end_seq = 0;    // one past its last call
  std::string how;         // "explicit" or "auto"
  size_t convolutions = 0;
};

class IterationDetector {
 public:
  // Every recorded call, in order; `exec` is set for convolution executions.
  std::optional<DetectedIteration> on_call(uint64_t seq, const ExecItem* exec);
  // vcudnnIterationBoundary(): the calls so far (from the previous boundary) form one iteration.
  // `next_seq` is the seq the next call will get.
  std::optional<DetectedIteration> on_explicit_boundary(uint64_t next_seq);
  // The recording ends (process exit): the trailing segment is complete too.
  std::optional<DetectedIteration> on_end();

  bool explicit_mode() const { return explicit_mode_; }
  size_t convolutions_seen() const { return items_.size(); }

 private:
  std::optional<DetectedIteration> check_segments(size_t closed);
  std::optional<DetectedIteration> check_forward_only(size_t m);
  bool same_items(size_t a_begin, size_t b_begin, size_t len) const;

  std::vector<ExecItem> items_;
  std::vector<uint64_t> item_seq_;
  // Segments end where a forward convolution follows a backward one. seg_item_ holds the item
  // index that starts each segment, seg_seq_ the call seq where it starts.
  std::vector<size_t> seg_item_{0};
  std::vector<uint64_t> seg_seq_{0};
  bool seen_backward_ = false;
  bool first_call_ = true;
  std::vector<size_t> fwd_candidates_;  // forward-only periods still consistent with items_

  bool explicit_mode_ = false;
  uint64_t explicit_start_seq_ = 0;
  size_t explicit_start_items_ = 0;
};

}  // namespace vcudnn
