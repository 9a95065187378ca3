// IterationDetector: finds the first complete training iteration in the process-wide sequence of
// intercepted calls. CUDA-free, so that it can be tested on recorded and synthetic sequences.
// See Note [Iteration boundaries] in iteration_detector.cpp.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
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
  void note_item(const ExecItem& e);
  int64_t latest_iteration_start() const;

  std::vector<ExecItem> items_;
  std::vector<uint64_t> item_seq_;
  // Segments end where a forward convolution follows a backward one. seg_item_ holds the item
  // index that starts each segment, seg_seq_ the call seq where it starts.
  std::vector<size_t> seg_item_{0};
  std::vector<uint64_t> seg_seq_{0};
  bool seen_backward_ = false;
  bool first_call_ = true;
  std::vector<size_t> fwd_candidates_;  // forward-only periods still consistent with items_
  // What an iteration must hold (Note [Iteration boundaries]), tracked for windows ending at
  // items_.size(): where the trailing run of one layer starts, the last forward and the last
  // backward-filter (-1: none), and the first item of another layer than items_[0]'s.
  size_t layer_run_start_ = 0;
  int64_t last_forward_ = -1;
  int64_t last_backward_filter_ = -1;
  size_t first_other_layer_ = SIZE_MAX;

  bool explicit_mode_ = false;
  uint64_t explicit_start_seq_ = 0;
  size_t explicit_start_items_ = 0;
};

// Note [Iterations without convolutions]
// A program without convolutions (a transformer) gives IterationDetector nothing to compare. With
// memory owned, every allocation, free, launch and library call is recorded too. Every one but the
// frees is an operation here, with an identity (its kind, API and the sizes of the buffers it
// allocates or uses, a kernel launch's aside: identity_of in recorder.cpp); a boundary is the point
// just before an operation, at the live bytes the frees since the one before left. An iteration is
// then the first window of operations that
//   - the next window of the same length repeats exactly (by identity),
//   - begins, ends (and so does its repeat) at the same live-bytes level: what an iteration
//     allocates it frees, except state it keeps for good (an optimizer's, in iteration 1 only),
//   - rises, somewhere inside, above that level and at least halfway from it to the highest live
//     bytes seen so far: a training step holds its activations at the turn from forward to
//     backward, where a repeated layer or an optimizer's per-parameter loop holds almost nothing.
//     Above, strictly: DDP's start copies each parameter out of one broadcast bucket (ResNet-50:
//     161 copies, at the highest level yet, allocating nothing; a copy's identity is taken when it
//     reports its source, so all alike), and with "at least halfway" alone that run was taken for
//     the iteration on both ranks (H200 x2),
//   - and has at least kMinOps operations.
// Frees are no operations because their order is not the program's: tensors a Python reference cycle
// holds go when the garbage collector runs, at a point that moves from one step to the next. With
// frees among the operations, the transformer of the [pytorch] tests under a device budget repeated
// no two steps exactly in eight (H100; its frees came in another order from one step to the next):
// only the levels at a window's ends see them now.
// Candidate windows are found in O(1) per operation on average: only boundaries at the current
// live-bytes level are tried, and windows are compared by rolling hashes, then op by op.
class OpRepeatDetector {
 public:
  static constexpr size_t kMinOps = 16;
  // Boundaries at one level tried per operation, the latest first (a long stretch of operations
  // that allocate nothing would otherwise make each try all of them).
  static constexpr size_t kMaxTries = 256;
  // One more operation (no free: Note [Iterations without convolutions]): its call seq, identity and
  // the live bytes just before it. An iteration found is repeated by the window that ends just before it.
  std::optional<DetectedIteration> on_op(uint64_t seq, uint64_t identity, int64_t live_before);
  size_t ops_seen() const { return ids_.size(); }

 private:
  std::vector<uint64_t> seq_;        // per op
  std::vector<uint64_t> ids_;        // per op
  std::vector<uint64_t> prefix_{0};  // rolling hash of ops [0, i)
  std::vector<uint64_t> power_{1};   // kBase^i
  std::vector<int64_t> level_;       // live bytes at boundary i (just before op i)
  std::unordered_map<int64_t, std::vector<size_t>> at_level_;  // boundaries by level
  int64_t highest_ = INT64_MIN;
};

// Note [GPU times from the next iteration]
// The first iteration a program runs is slower on the GPU than the ones after it (cuDNN and cuBLAS
// load kernels and build plans on first use: ResNet-50's recorded convolutions took 10x their
// steady time), and recording finds an iteration only once the next one has repeated it, so the
// recorder holds that next iteration too. Each operation of the iteration takes the GPU time of
// the same operation (by identity, in order) in the next one. align_ops() walks both sequences,
// matching equal identities; at a mismatch (an operation only one iteration has: optimizer state
// allocated once, a search's extra calls) it skips ahead on the side after which more operations
// match in a row (the nearer match when equal), looking at most `window` operations ahead.
// Operations left unmatched keep their own time.
// Returns, for each operation of `a`, the index of its match in `b`, or -1.
std::vector<int64_t> align_ops(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, size_t window = 1024);

}  // namespace vcudnn
