// IterationDetector over synthetic PyTorch-like call sequences: training, repeated blocks, a
// warm-up pass, multi-phase (GAN) steps, inference, explicit boundaries, on_end, no repeat.
#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "runtime/iteration_detector.h"

namespace {

using vcudnn::ConvKind;
using vcudnn::DetectedIteration;
using vcudnn::ExecItem;
using vcudnn::IterationDetector;

struct Event {
  uint64_t seq;
  std::optional<ExecItem> exec;  // set for convolution executions
};

// Where one generated iteration (or pass) lies in the call sequence.
struct Span {
  uint64_t first_call = 0;  // first call that belongs to it (Note [Iteration boundaries])
  uint64_t first_conv = 0;
  uint64_t last_conv = 0;
  size_t convolutions = 0;
};

// A call sequence as PyTorch makes it: a set_stream before every convolution and, while
// `searching`, Get/Find/workspace queries before the first execution of each (kind, layer), or
// with benchmark(runs), `runs` executions of it (cudnn.benchmark timing candidate plans).
class Sequence {
 public:
  explicit Sequence(uint64_t first_seq = 0) : next_(first_seq) {}

  void benchmark(int runs) { benchmark_runs_ = runs; }

  uint64_t other() {
    events_.push_back({next_, std::nullopt});
    return next_++;
  }

  uint64_t conv(ConvKind kind, int layer) {
    other();  // cudnnSetStream
    if (searching_ && searched_.insert({kind, layer}).second) {
      if (benchmark_runs_ == 0) {
        other();  // cudnnGet*AlgorithmMaxCount
        other();  // cudnnFind*Algorithm
        other();  // cudnnGet*WorkspaceSize
      }
      for (int i = 0; i < benchmark_runs_; ++i) {
        execute(kind, layer);
        other();  // cudnnSetStream
      }
    }
    return execute(kind, layer);
  }
  uint64_t execute(ConvKind kind, int layer) {
    events_.push_back({next_, ExecItem{kind, layer}});
    if (open_) {
      if (open_->convolutions == 0) open_->first_conv = next_;
      open_->last_conv = next_;
      ++open_->convolutions;
    }
    return next_++;
  }

  // Brackets one iteration: non-convolution calls after the previous iteration's last
  // convolution belong to this one.
  void begin(bool searching) {
    searching_ = searching;
    Span s;
    s.first_call = spans_.empty() ? (events_.empty() ? next_ : events_.front().seq) : spans_.back().last_conv + 1;
    open_ = s;
  }
  void end() {
    spans_.push_back(*open_);
    open_.reset();
  }

  // One training step over forward `layers`: forward in order, then per layer in reverse order
  // backward-data (not for the first layer) and backward-filter; `tail` calls after it.
  void training(const std::vector<int>& layers, bool searching, int tail = 1) {
    begin(searching);
    forward_backward(layers);
    end();
    for (int i = 0; i < tail; ++i) other();
  }
  void forward_backward(const std::vector<int>& layers) {
    for (int l : layers) conv(ConvKind::kForward, l);
    backward(layers, true);
  }
  void backward(const std::vector<int>& layers, bool skip_first_data) {
    for (size_t i = layers.size(); i-- > 0;) {
      if (i > 0 || !skip_first_data) conv(ConvKind::kBackwardData, layers[i]);
      conv(ConvKind::kBackwardFilter, layers[i]);
    }
  }
  void inference(const std::vector<int>& layers, bool searching, int tail = 1) {
    begin(searching);
    for (int l : layers) conv(ConvKind::kForward, l);
    end();
    for (int i = 0; i < tail; ++i) other();
  }

  const std::vector<Event>& events() const { return events_; }
  const std::vector<Span>& spans() const { return spans_; }
  uint64_t next_seq() const { return next_; }

 private:
  uint64_t next_;
  bool searching_ = false;
  int benchmark_runs_ = 0;
  std::set<std::pair<ConvKind, int>> searched_;
  std::vector<Event> events_;
  std::vector<Span> spans_;
  std::optional<Span> open_;
};

struct Outcome {
  std::optional<DetectedIteration> found;  // the first detection
  uint64_t fired_at = 0;                   // seq of the call that produced it
  int detections = 0;
  std::optional<DetectedIteration> at_end;  // on_end() when nothing was found before
};

Outcome feed(const std::vector<Event>& events, IterationDetector& d, bool call_end = true) {
  Outcome o;
  for (const auto& e : events) {
    auto r = d.on_call(e.seq, e.exec ? &*e.exec : nullptr);
    if (!r) continue;
    ++o.detections;
    if (!o.found) {
      o.found = r;
      o.fired_at = e.seq;
    }
  }
  if (call_end && !o.found) o.at_end = d.on_end();
  return o;
}

Outcome feed(const Sequence& s) {
  IterationDetector d;
  return feed(s.events(), d);
}

std::vector<int> iota(int n, int first = 0) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// ResNet-like forward: a unique stem, `blocks` identical blocks of 3 layers, a unique head.
std::vector<int> resnet_like(int blocks) {
  std::vector<int> v = {0};
  for (int b = 0; b < blocks; ++b)
    for (int l : {1, 2, 3}) v.push_back(l);
  v.push_back(4);
  return v;
}

}  // namespace

TEST_CASE("iteration: plain training is detected at the start of iteration 3", "[iteration]") {
  const int tail = GENERATE(0, 1, 3);
  const int L = GENERATE(1, 2, 4, 7);
  INFO("L=" << L << " tail=" << tail);
  Sequence s;
  for (int it = 0; it < 4; ++it) s.training(iota(L), it == 0, tail);
  const auto& sp = s.spans();
  REQUIRE(sp.size() == 4);
  REQUIRE(sp[0].convolutions == static_cast<size_t>(3 * L - 1));
  // Iteration 2 starts right after iteration 1's last convolution (its trailing calls and the
  // set_stream before its first convolution belong to it).
  REQUIRE(sp[1].first_call == sp[0].last_conv + 1);

  auto o = feed(s);
  REQUIRE(o.found);
  CHECK(o.fired_at == sp[2].first_conv);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[1].first_call);
  CHECK(o.found->how == "auto");
  CHECK(o.found->convolutions == static_cast<size_t>(3 * L - 1));
}

TEST_CASE("iteration: detection is not fooled by the first iteration's extra searches", "[iteration]") {
  // The first iteration holds many more calls than the others, all of them inside its span.
  Sequence s;
  for (int it = 0; it < 3; ++it) s.training(iota(5), it == 0, 0);
  const auto& sp = s.spans();
  IterationDetector d;
  auto o = feed(s.events(), d);
  REQUIRE(o.found);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[0].last_conv + 1);
  // Iteration 1 has 1 set_stream per convolution plus 3 search calls per (kind, layer).
  CHECK(o.found->end_seq == 14 * (1 + 1) + 14 * 3);
  CHECK(d.convolutions_seen() == 3 * 14);
}

TEST_CASE("iteration: identical repeated blocks do not shorten the iteration", "[iteration]") {
  const auto layers = resnet_like(5);
  REQUIRE(layers.size() == 17);
  Sequence s;
  for (int it = 0; it < 4; ++it) s.training(layers, it == 0);
  const auto& sp = s.spans();
  REQUIRE(sp[0].convolutions == 3 * 17 - 1);

  auto o = feed(s);
  REQUIRE(o.found);
  CHECK(o.fired_at == sp[2].first_conv);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[1].first_call);
  CHECK(o.found->convolutions == sp[0].convolutions);
  CHECK(o.found->how == "auto");
}

TEST_CASE("iteration: a forward-only evaluation pass before training is skipped", "[iteration]") {
  const auto layers = iota(4);
  Sequence s;
  s.inference(layers, true);  // evaluation / warm-up pass, with its searches
  const Span eval = s.spans()[0];
  for (int it = 0; it < 4; ++it) s.training(layers, it == 0);
  const auto& sp = s.spans();  // sp[1] is the first training iteration
  REQUIRE(sp.size() == 5);

  auto o = feed(s);
  REQUIRE(o.found);
  INFO("detected [" << o.found->first_seq << ", " << o.found->end_seq << ") at " << o.fired_at << "; expected ["
                    << eval.last_conv + 1 << ", " << sp[2].first_call << ") at " << sp[3].first_conv);
  CHECK(o.found->first_seq == eval.last_conv + 1);
  CHECK(o.found->first_seq == sp[1].first_call);
  CHECK(o.found->end_seq == sp[2].first_call);
  CHECK(o.found->convolutions == 3 * 4 - 1);
  CHECK(o.fired_at == sp[3].first_conv);
}

TEST_CASE("iteration: a step with two different forward/backward phases (GAN) is one iteration", "[iteration]") {
  const std::vector<int> g = {0, 1, 2}, dnet = {3, 4, 5};
  auto gan_step = [&](Sequence& s, bool searching) {
    s.begin(searching);
    // Discriminator step: G forward, D on fake and on real, D backward twice.
    for (int l : g) s.conv(ConvKind::kForward, l);
    for (int pass = 0; pass < 2; ++pass)
      for (int l : dnet) s.conv(ConvKind::kForward, l);
    s.backward(dnet, true);
    s.backward(dnet, true);
    // Generator step: D on fake, backward through D and G.
    for (int l : dnet) s.conv(ConvKind::kForward, l);
    s.backward(dnet, false);
    s.backward(g, true);
    s.end();
    s.other();
  };
  Sequence s;
  for (int it = 0; it < 4; ++it) gan_step(s, it == 0);
  const auto& sp = s.spans();
  const size_t per_step = 3 + 6 + 5 + 5 + 3 + 6 + 5;
  REQUIRE(sp[0].convolutions == per_step);

  auto o = feed(s);
  REQUIRE(o.found);
  CHECK(o.fired_at == sp[2].first_conv);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[1].first_call);
  CHECK(o.found->convolutions == per_step);
  CHECK(o.found->how == "auto");
}

TEST_CASE("iteration: inference is detected after three copies of one pass", "[iteration]") {
  // A unique first layer; later layers repeat within the pass.
  const std::vector<int> pass = {0, 1, 2, 1, 2, 3, 4};
  Sequence s;
  for (int it = 0; it < 5; ++it) s.inference(pass, it == 0);
  const auto& sp = s.spans();

  auto o = feed(s);
  REQUIRE(o.found);
  CHECK(o.fired_at == sp[2].last_conv);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[0].last_conv + 1);
  CHECK(o.found->end_seq == sp[1].first_call);
  CHECK(o.found->convolutions == pass.size());
  CHECK(o.found->how == "auto");

  // Two copies are not enough.
  Sequence two;
  for (int it = 0; it < 2; ++it) two.inference(pass, it == 0);
  IterationDetector d;
  auto o2 = feed(two.events(), d, false);
  CHECK_FALSE(o2.found);
}

TEST_CASE("iteration: inference starting with identical layers gives no period-1 detection", "[iteration]") {
  // A A B C D, repeated.
  const std::vector<int> pass = {0, 0, 1, 2, 3};
  Sequence s;
  for (int it = 0; it < 4; ++it) s.inference(pass, it == 0);
  const auto& sp = s.spans();

  auto o = feed(s);
  REQUIRE(o.found);
  CHECK(o.found->convolutions == 5);
  CHECK(o.fired_at == sp[2].last_conv);
  CHECK(o.found->first_seq == 0);
  CHECK(o.found->end_seq == sp[1].first_call);

  // A B A B A C: no period-2 detection either (the third copy breaks at C).
  Sequence t;
  t.inference({0, 1, 0, 1, 0, 2, 3}, true);
  IterationDetector d;
  auto ot = feed(t.events(), d, false);
  CHECK_FALSE(ot.found);
}

// ---- Note [Iteration boundaries]: what an iteration holds --------------------------------------

namespace {

// How a cudnn.benchmark search of one layer (layer 0) executes it, over and over.
enum class Search { kForward, kBackwardFilter, kForwardAndData, kForwardAndDataRuns };

const char* name(Search p) {
  switch (p) {
    case Search::kForward:
      return "forward";
    case Search::kBackwardFilter:
      return "backward-filter";
    case Search::kForwardAndData:
      return "forward and backward-data taking turns";
    case Search::kForwardAndDataRuns:
      return "3 forwards and 3 backward-data taking turns";
  }
  return "?";
}

ConvKind kind_at(Search p, int i) {
  switch (p) {
    case Search::kForward:
      return ConvKind::kForward;
    case Search::kBackwardFilter:
      return ConvKind::kBackwardFilter;
    case Search::kForwardAndData:
      return i % 2 == 0 ? ConvKind::kForward : ConvKind::kBackwardData;
    case Search::kForwardAndDataRuns:
      return (i / 3) % 2 == 0 ? ConvKind::kForward : ConvKind::kBackwardData;
  }
  return ConvKind::kForward;
}

// `n` executions of layer 0, a set_stream before each; returns the seq of the last.
uint64_t search_run(Sequence& s, Search p, int n) {
  uint64_t last = 0;
  for (int i = 0; i < n; ++i) last = s.conv(kind_at(p, i), 0);
  return last;
}

}  // namespace

TEST_CASE("iteration: a cudnn.benchmark search in iteration 1 is no iteration", "[iteration]") {
  // Seen on an H100 (mobilenet_v3_small): three executions of one layer's forward in the search
  // were taken for three forward-only iterations of 1 convolution (7 calls). Iteration 1 holds
  // every search; iteration 2 is the first clean one.
  const int runs = GENERATE(2, 3, 10, 40);
  const bool resnet = GENERATE(false, true);
  const auto layers = resnet ? resnet_like(2) : iota(4);
  INFO("runs=" << runs << " layers=" << layers.size());
  Sequence s;
  s.benchmark(runs);
  for (int it = 0; it < 5; ++it) s.training(layers, it == 0);
  const auto& sp = s.spans();
  const size_t per_step = 3 * layers.size() - 1;
  REQUIRE(sp[1].convolutions == per_step);
  REQUIRE(sp[0].convolutions > per_step);

  auto o = feed(s);
  REQUIRE(o.found);
  INFO("detected [" << o.found->first_seq << ", " << o.found->end_seq << ") at " << o.fired_at << "; expected ["
                    << sp[1].first_call << ", " << sp[2].first_call << ") at " << sp[3].first_conv);
  CHECK(o.found->first_seq == sp[1].first_call);
  CHECK(o.found->end_seq == sp[2].first_call);
  CHECK(o.found->convolutions == per_step);
  CHECK(o.fired_at == sp[3].first_conv);
  CHECK(o.found->how == "auto");
}

TEST_CASE("iteration: one convolution executed over and over, then training, gives a training iteration",
          "[iteration]") {
  const Search p =
      GENERATE(Search::kForward, Search::kBackwardFilter, Search::kForwardAndData, Search::kForwardAndDataRuns);
  const int n = GENERATE(40, 1000);
  INFO(name(p) << " x" << n);
  Sequence s;
  s.other();  // cudnnCreate
  const uint64_t last_search = search_run(s, p, n);
  const size_t search_events = s.events().size();
  const auto layers = iota(4);
  for (int it = 0; it < 4; ++it) s.training(layers, false);
  const auto& sp = s.spans();

  // The search alone is nothing, not even when the program ends there.
  IterationDetector d;
  const std::vector<Event> search(s.events().begin(), s.events().begin() + static_cast<std::ptrdiff_t>(search_events));
  const std::vector<Event> training(s.events().begin() + static_cast<std::ptrdiff_t>(search_events), s.events().end());
  const auto during = feed(search, d, false);
  CHECK(during.detections == 0);
  CHECK_FALSE(d.on_end().has_value());

  // Then training iteration 1, from the call after the search's last execution, found when
  // iteration 3 starts.
  auto o = feed(training, d, false);
  REQUIRE(o.found);
  INFO("detected [" << o.found->first_seq << ", " << o.found->end_seq << ") at " << o.fired_at << "; expected ["
                    << last_search + 1 << ", " << sp[1].first_call << ")");
  CHECK(o.found->first_seq == last_search + 1);
  CHECK(o.found->end_seq == sp[1].first_call);
  CHECK(o.found->convolutions == 3 * 4 - 1);
  CHECK(o.fired_at == sp[2].first_conv);
  CHECK(o.found->how == "auto");
}

TEST_CASE("iteration: a network of one convolution layer is still found", "[iteration]") {
  // PyTorch skips backward-data when the input needs no gradient; the weights' gradient is always
  // there in training.
  const bool with_data = GENERATE(false, true);
  const int runs = GENERATE(0, 5);
  INFO("with_data=" << with_data << " runs=" << runs);
  Sequence s;
  s.benchmark(runs);
  for (int it = 0; it < 5; ++it) {
    s.begin(it == 0);
    s.conv(ConvKind::kForward, 0);
    if (with_data) s.conv(ConvKind::kBackwardData, 0);
    s.conv(ConvKind::kBackwardFilter, 0);
    s.end();
    s.other();
  }
  const auto& sp = s.spans();
  const size_t per_step = with_data ? 3 : 2;
  REQUIRE(sp[1].convolutions == per_step);

  auto o = feed(s);
  REQUIRE(o.found);
  // Without a search iteration 1 repeats; a search makes iteration 2 the first clean one.
  const size_t first = runs == 0 ? 0 : 1;
  CHECK(o.found->first_seq == sp[first].first_call);
  CHECK(o.found->end_seq == sp[first + 1].first_call);
  CHECK(o.found->convolutions == per_step);
  CHECK(o.fired_at == sp[first + 2].first_conv);
  CHECK(o.found->how == "auto");
}

TEST_CASE("iteration: a long search of one convolution stays cheap", "[iteration]") {
  const Search p =
      GENERATE(Search::kForward, Search::kBackwardFilter, Search::kForwardAndData, Search::kForwardAndDataRuns);
  INFO(name(p));
  Sequence s;
  search_run(s, p, 200000);
  IterationDetector d;
  const auto t0 = std::chrono::steady_clock::now();
  const auto o = feed(s.events(), d, false);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN(name(p) << ", 200000 executions: " << secs << " s");
  CHECK(o.detections == 0);
  CHECK(secs < 20.0);  // no candidate period or segment window is kept or compared per execution
}

TEST_CASE("iteration: explicit boundaries", "[iteration]") {
  const auto layers = iota(3);
  Sequence s(500);
  s.other();  // cudnnCreate
  s.other();  // cudnnSetStream
  s.other();
  IterationDetector d;
  auto pre = feed(s.events(), d, false);
  REQUIRE_FALSE(pre.found);

  // A preamble with no convolution is skipped.
  const uint64_t start = s.next_seq();
  CHECK_FALSE(d.on_explicit_boundary(start).has_value());
  CHECK(d.explicit_mode());

  Sequence it1(start);
  it1.training(layers, true, 2);
  REQUIRE_FALSE(feed(it1.events(), d, false).found);
  auto first = d.on_explicit_boundary(it1.next_seq());
  REQUIRE(first);
  CHECK(first->how == "explicit");
  CHECK(first->first_seq == start);
  CHECK(first->end_seq == it1.next_seq());
  CHECK(first->convolutions == 3 * 3 - 1);

  // Automatic detection no longer fires, however often the step repeats.
  Sequence more(it1.next_seq());
  for (int it = 0; it < 5; ++it) more.training(layers, false);
  auto o = feed(more.events(), d, false);
  CHECK(o.detections == 0);
  CHECK_FALSE(d.on_end().has_value());

  // The next boundary covers everything since the previous one.
  auto second = d.on_explicit_boundary(more.next_seq());
  REQUIRE(second);
  CHECK(second->how == "explicit");
  CHECK(second->first_seq == it1.next_seq());
  CHECK(second->end_seq == more.next_seq());
  CHECK(second->convolutions == 5 * (3 * 3 - 1));
}

TEST_CASE("iteration: a first explicit boundary after convolutions covers everything from the start", "[iteration]") {
  Sequence s(42);
  s.inference({0, 1, 2}, true);
  IterationDetector d;
  REQUIRE_FALSE(feed(s.events(), d, false).found);
  auto r = d.on_explicit_boundary(s.next_seq());
  REQUIRE(r);
  CHECK(r->first_seq == 42);
  CHECK(r->end_seq == s.next_seq());
  CHECK(r->convolutions == 3);
  CHECK(r->how == "explicit");
  // An immediately repeated boundary covers nothing.
  CHECK_FALSE(d.on_explicit_boundary(s.next_seq()).has_value());
}

TEST_CASE("iteration: on_end closes the trailing iteration", "[iteration]") {
  const auto layers = iota(4);
  SECTION("two iterations: iteration 1 is found at the end") {
    Sequence s;
    for (int it = 0; it < 2; ++it) s.training(layers, it == 0);
    IterationDetector d;
    auto o = feed(s.events(), d, false);
    REQUIRE(o.detections == 0);
    auto r = d.on_end();
    REQUIRE(r);
    CHECK(r->first_seq == 0);
    CHECK(r->end_seq == s.spans()[1].first_call);
    CHECK(r->convolutions == 3 * 4 - 1);
    CHECK(r->how == "auto");
  }
  SECTION("one iteration: nothing") {
    Sequence s;
    s.training(layers, true);
    IterationDetector d;
    auto o = feed(s.events(), d, false);
    REQUIRE(o.detections == 0);
    CHECK_FALSE(d.on_end().has_value());
  }
  SECTION("two different iterations: nothing") {
    Sequence s;
    s.training(layers, true);
    s.training(iota(4, 10), true);
    IterationDetector d;
    REQUIRE(feed(s.events(), d, false).detections == 0);
    CHECK_FALSE(d.on_end().has_value());
  }
  SECTION("no calls at all: nothing") {
    IterationDetector d;
    CHECK_FALSE(d.on_end().has_value());
  }
}

TEST_CASE("iteration: a stream that never repeats gives nothing", "[iteration]") {
  SECTION("training") {
    Sequence s;
    for (int it = 0; it < 6; ++it) s.training(iota(4, 10 * it), it == 0);
    auto o = feed(s);
    CHECK(o.detections == 0);
    CHECK_FALSE(o.at_end.has_value());
  }
  SECTION("training with a changing number of layers") {
    Sequence s;
    for (int it = 0; it < 6; ++it) s.training(iota(3 + it), it == 0);
    auto o = feed(s);
    CHECK(o.detections == 0);
    CHECK_FALSE(o.at_end.has_value());
  }
  SECTION("inference") {
    Sequence s;
    for (int it = 0; it < 6; ++it) s.inference(iota(5, 10 * it), it == 0);
    auto o = feed(s);
    CHECK(o.detections == 0);
    CHECK_FALSE(o.at_end.has_value());
  }
}

// ---- Note [Iterations without convolutions] ---------------------------------------------------

namespace {

// A program of operations with live-bytes bookkeeping, fed to an OpRepeatDetector.
struct OpProgram {
  vcudnn::OpRepeatDetector d;
  uint64_t seq = 0;
  int64_t live = 0;
  std::optional<vcudnn::DetectedIteration> found;
  uint64_t found_at = 0;
  // An operation that allocates `delta` bytes, or uses them and frees -delta bytes right after it.
  void op(uint64_t identity, int64_t delta = 0) {
    auto r = d.on_op(seq, identity, live);
    if (r && !found) {
      found = r;
      found_at = seq;
    }
    ++seq;
    live += delta;
    if (delta < 0) ++seq;  // the free's own call: no operation
  }
  void free(int64_t bytes) {
    live -= bytes;
    ++seq;
  }
};

// A transformer-like step: six identical layers forward (each keeps an activation), six backward
// (each frees one), then the optimizer: in iteration 1 it allocates its state for good, then a
// per-parameter loop of temporaries. Returns the seq the iteration started at.
uint64_t transformer_step(OpProgram& p, bool first) {
  const uint64_t start = p.seq;
  constexpr int64_t kAct = 8 << 20;
  for (int layer = 0; layer < 6; ++layer) {
    p.op(101, kAct);  // the activation
    p.op(102);        // matmul
    p.op(103);        // softmax
  }
  p.op(110, 1024);  // the loss
  p.op(111);
  for (int layer = 0; layer < 6; ++layer) {
    p.op(201);
    p.op(202);
    p.op(203, -kAct);
  }
  p.op(112, -1024);
  if (first) p.op(300, 64 << 20);  // optimizer state, kept
  for (int param = 0; param < 10; ++param) {
    p.op(301, 4096);
    p.op(302);
    p.op(303, -4096);
  }
  return start;
}

}  // namespace

TEST_CASE("iteration without convolutions: the step repeats, not a layer nor the optimizer's loop",
          "[iteration][ops]") {
  OpProgram p;
  p.op(1, 100 << 20);  // parameters
  p.op(2);
  const uint64_t first = transformer_step(p, true);
  const uint64_t second = transformer_step(p, false);
  const uint64_t third = transformer_step(p, false);
  const uint64_t fourth = transformer_step(p, false);
  REQUIRE(p.found);
  // One whole step: the window may begin anywhere the steady state repeats from (here as early as
  // iteration 1's optimizer loop, after its state was allocated), never a layer or the loop.
  CHECK(p.found->end_seq - p.found->first_seq == third - second);
  CHECK(p.found->first_seq > first);
  CHECK(p.found->first_seq <= second);
  CHECK(p.found_at < fourth);  // found once two whole steps repeated, before the fourth step
  CHECK(p.found->how == "auto");
}

// Frees are not the program's order: a tensor kept alive by a reference cycle goes when the garbage
// collector runs, at another point of each step. The step is found all the same, from its other
// operations and the levels at its ends.
TEST_CASE("iteration without convolutions: frees that move from one step to the next", "[iteration][ops]") {
  OpProgram p;
  p.op(1, 100 << 20);
  std::vector<uint64_t> starts;
  for (int step = 0; step < 5; ++step) {
    starts.push_back(p.seq);
    p.op(50, 3 << 20);  // a tensor the collector frees later in the step, at a point that moves
    for (int layer = 0; layer < 6; ++layer) {
      p.op(101, 8 << 20);
      p.op(102);
      if (layer == step % 6) p.free(3 << 20);
    }
    for (int layer = 0; layer < 6; ++layer) {
      p.op(201);
      p.op(203, -(8 << 20));
    }
  }
  REQUIRE(p.found);
  CHECK(p.found->end_seq - p.found->first_seq == starts[2] - starts[1]);
  CHECK(p.found_at < starts[4]);
  // With the frees among the operations (as before) no two steps would be alike.
}

TEST_CASE("iteration without convolutions: a loop that never rises is no iteration", "[iteration][ops]") {
  OpProgram p;
  p.op(1, 100 << 20);
  p.op(5, 1 << 30);  // a peak long ago
  p.op(6, -(1 << 30));
  for (int i = 0; i < 2000; ++i) {  // an evaluation-style loop of temporaries: repeats, barely rises
    p.op(301, 4096);
    p.op(302);
    p.op(303, -4096);
  }
  CHECK_FALSE(p.found);
  // Fewer than 2 x kMinOps operations repeating: no window is long enough. (A short period that
  // goes on repeating is found through its multiples: the step of a program that does only that.)
  OpProgram q;
  for (size_t i = 0; i < vcudnn::OpRepeatDetector::kMinOps - 1; ++i) {
    q.op(7, 1 << 20);
    q.op(8, -(1 << 20));
  }
  CHECK_FALSE(q.found);
  q.op(7, 1 << 20);
  q.op(8, -(1 << 20));
  CHECK_FALSE(q.found);  // a window ends at a boundary: the one before the next operation
  q.op(7, 1 << 20);
  CHECK(q.found);
}

// DDP's start (H200 x2, ResNet-50): the parameters are broadcast as one flat bucket, at the highest
// live bytes yet, and copied out one by one; the copies allocate nothing and look alike. Found as
// the iteration on both ranks before the fix; the training steps after them are.
TEST_CASE("iteration without convolutions: copies out of a bucket at the highest level are no iteration",
          "[iteration][ops]") {
  OpProgram p;
  p.op(1, 100 << 20);  // parameters
  p.op(2, 94 << 20);   // the broadcast bucket
  for (int i = 0; i < 161; ++i) p.op(60);
  p.free(94 << 20);
  const uint64_t first = transformer_step(p, true);
  const uint64_t second = transformer_step(p, false);
  const uint64_t third = transformer_step(p, false);
  transformer_step(p, false);
  REQUIRE(p.found);
  CHECK(p.found->first_seq > first);
  CHECK(p.found->end_seq - p.found->first_seq == third - second);
}

TEST_CASE("iteration without convolutions: a long stretch that allocates nothing stays cheap", "[iteration][ops]") {
  OpProgram p;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < 200000; ++i) p.op(1000 + i % 7);  // one level throughout
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("200000 operations at one level: " << s << " s");
  CHECK(s < 20.0);  // bounded tries per operation (kMaxTries), not a scan of every boundary
}

// Note [GPU times from the next iteration]
TEST_CASE("align_ops: the same operations of two iterations are matched in order, extra ones skipped",
          "[iteration][ops]") {
  using vcudnn::align_ops;
  using V = std::vector<uint64_t>;
  using M = std::vector<int64_t>;
  CHECK(align_ops(V{1, 2, 3}, V{1, 2, 3}) == M{0, 1, 2});
  CHECK(align_ops(V{}, V{1, 2}) == M{});
  CHECK(align_ops(V{1, 2}, V{}) == M{-1, -1});
  // The first iteration allocates optimizer state (9, 9) the next one does not.
  CHECK(align_ops(V{1, 9, 9, 2, 3}, V{1, 2, 3}) == M{0, -1, -1, 1, 2});
  // The next one has a call the first lacks.
  CHECK(align_ops(V{1, 2, 3}, V{1, 7, 2, 3}) == M{0, 2, 3});
  // One operation differs (another size): neither matches, the rest still do.
  CHECK(align_ops(V{1, 5, 3, 4}, V{1, 6, 3, 4}) == M{0, -1, 2, 3});
  // Repeated identities (a layer repeated) stay in order, never matched twice or crosswise.
  const M m = align_ops(V{4, 4, 4, 8, 4, 4}, V{4, 4, 8, 4, 4, 4});
  int64_t last = -1;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i] < 0) continue;
    CHECK(m[i] > last);
    last = m[i];
  }
  CHECK(m[3] == 2);  // the 8s meet
  // A run of extra operations longer than the window is not searched past.
  V longer(200, 5);
  longer.push_back(1);
  CHECK(align_ops(V{1}, longer, 64) == M{-1});
  CHECK(align_ops(V{1}, longer, 256) == M{200});
}
