// Iteration detection over the call sequence.
//
// Note [Iteration boundaries]
// - Only executed convolutions (kind + full fingerprint) are compared. Algorithm searches,
//   workspace queries and stream calls are left out, because PyTorch makes them on the first
//   iteration only; they still belong to the iteration whose seq range holds them.
// - Threads are ignored: PyTorch runs forward and backward on different threads, one after the
//   other, so the process-wide order is the iteration's order.
// - Training: a segment starts wherever a forward convolution follows a backward one. The first
//   k consecutive segments that are repeated by the next k (smallest k, earliest start) form the
//   iteration; k > 1 covers iterations with several forward/backward phases (e.g. a GAN step).
//   A forward-only warm-up or evaluation pass before training has no backward to end it, so it
//   shares the first segment with training iteration 1; when that segment's tail repeats, the
//   tail is the iteration and the pass is skipped.
// - Forward only (no backward seen yet): the first p convolutions, when the next 2p repeat them
//   (three copies, because a net may start with a few identical layers).
// - What an iteration holds: with cudnn.benchmark, PyTorch times each candidate plan of a
//   convolution on its first call, a few executions each. That one (kind, layer), executed over
//   and over with other calls (set_stream) between, repeats as exactly as a training step. A search
//   holds one layer: PyTorch searches one layer's one direction at a time. So an automatic
//   iteration must hold two different layers, or a forward and a backward-filter (a training step
//   computes its weights' gradient, so a network of one layer still counts, with or without
//   backward-data); forward only, two different layers. The search then stays inside the
//   iteration that holds it, and a later one is found. Not found automatically (mark them with
//   vcudnnIterationBoundary()): forward only with one layer fingerprint, and inference with a
//   search (forward-only mode is anchored at the first convolution, inside the search). Windows
//   that fail the rule are not compared: all end at the newest convolution, so the latest start
//   that passes is kept up to date in O(1) per convolution.
// - Explicit: once vcudnnIterationBoundary() is called, automatic detection stops; the calls
//   between two boundaries (or the start and the first boundary) are an iteration, and a span
//   with no convolution is skipped as a preamble.
// - Non-convolution calls that come after an iteration's last convolution go to the next
//   iteration: they are its setup (PyTorch sets the stream and may search before the first conv).
#include "runtime/iteration_detector.h"

#include <algorithm>

namespace vcudnn {
namespace {

bool is_backward(ConvKind k) { return k != ConvKind::kForward; }

}  // namespace

bool IterationDetector::same_items(size_t a_begin, size_t b_begin, size_t len) const {
  for (size_t i = 0; i < len; ++i)
    if (!(items_[a_begin + i] == items_[b_begin + i])) return false;
  return true;
}

std::optional<DetectedIteration> IterationDetector::on_call(uint64_t seq, const ExecItem* exec) {
  if (first_call_) {
    first_call_ = false;
    seg_seq_[0] = seq;
    explicit_start_seq_ = seq;
  }
  if (!exec) return std::nullopt;
  std::optional<DetectedIteration> found;
  if (!explicit_mode_ && exec->kind == ConvKind::kForward && !items_.empty() && is_backward(items_.back().kind)) {
    seg_item_.push_back(items_.size());
    seg_seq_.push_back(item_seq_.back() + 1);
    found = check_segments(seg_item_.size() - 1);
  }
  note_item(*exec);
  items_.push_back(*exec);
  item_seq_.push_back(seq);
  if (is_backward(exec->kind)) seen_backward_ = true;
  if (!found && !explicit_mode_ && !seen_backward_) found = check_forward_only(items_.size() - 1);
  return found;
}

// Before `e` joins items_: keeps what latest_iteration_start() needs.
void IterationDetector::note_item(const ExecItem& e) {
  const size_t i = items_.size();
  if (i == 0 || e.layer != items_.back().layer) layer_run_start_ = i;
  if (i > 0 && first_other_layer_ == SIZE_MAX && e.layer != items_[0].layer) first_other_layer_ = i;
  if (e.kind == ConvKind::kForward) last_forward_ = static_cast<int64_t>(i);
  if (e.kind == ConvKind::kBackwardFilter) last_backward_filter_ = static_cast<int64_t>(i);
}

// The latest s such that items [s, items_.size()) may be an iteration (Note [Iteration
// boundaries]): two layers, or a forward and a backward-filter. -1 when no start may. An earlier
// start only adds items, so every s' <= s may too.
int64_t IterationDetector::latest_iteration_start() const {
  const int64_t two_layers = static_cast<int64_t>(layer_run_start_) - 1;
  const int64_t fwd_and_filter = std::min(last_forward_, last_backward_filter_);
  return std::max(two_layers, fwd_and_filter);
}

// Segments [0, closed) are complete. Looks for the smallest k such that the k segments ending at
// `closed` repeat the k before them.
std::optional<DetectedIteration> IterationDetector::check_segments(size_t closed) {
  const int64_t latest = latest_iteration_start();
  if (latest < 0) return std::nullopt;
  // Windows of fewer than k0 segments start after `latest`: no iteration can be that short.
  const auto ok_end = std::upper_bound(seg_item_.begin(), seg_item_.begin() + static_cast<std::ptrdiff_t>(closed),
                                       static_cast<size_t>(latest));
  const size_t k0 = closed + 1 - static_cast<size_t>(ok_end - seg_item_.begin());
  for (size_t k = k0; 2 * k <= closed; ++k) {
    const size_t a = closed - 2 * k, b = closed - k;
    const size_t a_items = seg_item_[b] - seg_item_[a];
    const size_t b_items = seg_item_[closed] - seg_item_[b];
    if (a_items == b_items && same_items(seg_item_[a], seg_item_[b], a_items))
      return DetectedIteration{seg_seq_[a], seg_seq_[b], "auto", a_items};
    // The first segment also holds whatever forward-only pass ran before training (it has no
    // backward to end it): the iteration is then its tail, when that tail repeats.
    if (k == 1 && a == 0 && a_items > b_items && same_items(seg_item_[b] - b_items, seg_item_[b], b_items)) {
      const size_t start = seg_item_[b] - b_items;
      return DetectedIteration{item_seq_[start - 1] + 1, seg_seq_[b], "auto", b_items};
    }
  }
  return std::nullopt;
}

std::optional<DetectedIteration> IterationDetector::check_forward_only(size_t m) {
  // A period must hold two layers (Note [Iteration boundaries]): one layer repeated is a search.
  if (m > 0 && items_[m] == items_[0] && first_other_layer_ < m) fwd_candidates_.push_back(m);
  std::optional<DetectedIteration> found;
  std::vector<size_t> alive;
  for (size_t p : fwd_candidates_) {
    if (p == m) {  // just added: nothing to check yet
      alive.push_back(p);
      continue;
    }
    if (!(items_[m] == items_[m - p])) continue;
    if (m == 3 * p - 1 && !found) found = DetectedIteration{seg_seq_[0], item_seq_[p - 1] + 1, "auto", p};
    if (m < 3 * p - 1) alive.push_back(p);
  }
  fwd_candidates_ = std::move(alive);
  return found;
}

std::optional<DetectedIteration> IterationDetector::on_explicit_boundary(uint64_t next_seq) {
  if (!explicit_mode_) {
    explicit_mode_ = true;
    fwd_candidates_.clear();
  }
  first_call_ = false;  // the next iteration starts here, not at the next call seen
  const size_t convs = items_.size() - explicit_start_items_;
  const uint64_t start = explicit_start_seq_;
  explicit_start_seq_ = next_seq;
  explicit_start_items_ = items_.size();
  if (convs == 0) return std::nullopt;  // a preamble without convolutions
  return DetectedIteration{start, next_seq, "explicit", convs};
}

std::optional<DetectedIteration> IterationDetector::on_end() {
  if (explicit_mode_ || items_.empty()) return std::nullopt;
  // The trailing segment is complete: close it as if the next iteration had started.
  seg_item_.push_back(items_.size());
  seg_seq_.push_back(item_seq_.back() + 1);
  auto found = check_segments(seg_item_.size() - 1);
  seg_item_.pop_back();
  seg_seq_.pop_back();
  return found;
}

// ---- Note [Iterations without convolutions] -------------------------------------------------

namespace {
constexpr uint64_t kBase = 0x9E3779B97F4A7C15ull;  // odd: the rolling hash is a polynomial mod 2^64
}  // namespace

std::optional<DetectedIteration> OpRepeatDetector::on_op(uint64_t seq, uint64_t identity, int64_t live_before) {
  // Boundary n is the point just before this op, at the live bytes the frees since the last op left.
  const size_t n = ids_.size();
  level_.push_back(live_before);
  highest_ = std::max(highest_, live_before);
  std::vector<size_t>& same = at_level_[live_before];
  std::optional<DetectedIteration> found;
  // Middle boundaries m at this level, the latest first (the shortest windows).
  size_t tries = 0;
  for (auto it = same.rbegin(); it != same.rend() && !found && tries < kMaxTries; ++it, ++tries) {
    const size_t m = *it, p = n - m;
    if (p < kMinOps || m < p) continue;
    const size_t k = m - p;
    if (level_[k] != live_before) continue;
    const auto window = [&](size_t a) { return prefix_[a + p] - prefix_[a] * power_[p]; };
    if (window(k) != window(m)) continue;
    if (!std::equal(ids_.begin() + static_cast<std::ptrdiff_t>(k), ids_.begin() + static_cast<std::ptrdiff_t>(m),
                    ids_.begin() + static_cast<std::ptrdiff_t>(m)))
      continue;
    const int64_t peak = *std::max_element(level_.begin() + static_cast<std::ptrdiff_t>(k),
                                           level_.begin() + static_cast<std::ptrdiff_t>(m + 1));
    // No turn worth the name. Strictly above its ends: at the highest level seen so far half of no
    // distance is none, and a stretch that allocates nothing would pass (Note [Iterations without
    // convolutions]).
    if (peak <= live_before || peak - live_before < (highest_ - live_before + 1) / 2) continue;
    found = DetectedIteration{seq_[k], seq_[m], "auto", 0};
  }
  same.push_back(n);
  seq_.push_back(seq);
  ids_.push_back(identity);
  prefix_.push_back(prefix_.back() * kBase + identity);
  power_.push_back(power_.back() * kBase);
  return found;
}

std::vector<int64_t> align_ops(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, size_t window) {
  std::vector<int64_t> match(a.size(), -1);
  // How far ahead of `from` in `seq` the value `v` is, within the window.
  const auto ahead = [window](const std::vector<uint64_t>& seq, size_t from, uint64_t v) -> std::optional<size_t> {
    for (size_t k = 1; k <= window && from + k < seq.size(); ++k)
      if (seq[from + k] == v) return k;
    return std::nullopt;
  };
  // How many operations match in a row from a[x] and b[y] (up to a few: enough to choose a side).
  const auto run = [&](size_t x, size_t y) {
    size_t r = 0;
    while (r < 16 && x + r < a.size() && y + r < b.size() && a[x + r] == b[y + r]) ++r;
    return r;
  };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      match[i++] = static_cast<int64_t>(j++);
      continue;
    }
    const std::optional<size_t> in_b = ahead(b, j, a[i]);  // b has extra operations here
    const std::optional<size_t> in_a = ahead(a, i, b[j]);  // a has extra operations here
    // Both possible (a repeated operation): the side whose skip lines up the longer run.
    bool skip_b = in_b.has_value();
    if (in_b && in_a) {
      const size_t run_b = run(i, j + *in_b), run_a = run(i + *in_a, j);
      skip_b = run_b != run_a ? run_b > run_a : *in_b <= *in_a;
    }
    if (skip_b) {
      j += *in_b;
    } else if (in_a) {
      i += *in_a;
    } else {
      ++i;  // neither: each has an operation the other lacks
      ++j;
    }
  }
  return match;
}

}  // namespace vcudnn
