// Graph-API convolutions (runtime/backend_shadow.h) recorded by the Recorder as the legacy path's
// are: the iteration is found from them alone, and the trace holds their fingerprints, pointers,
// engines and workspaces. No GPU: the calls carry no stream and get no GPU time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "planner/lifetimes.h"
#include "planner/trace.h"
#include "runtime/hook_scope.h"
#include "runtime/memory/call_scope.h"
#include "runtime/memory_manager.h"
#include "runtime/recorder.h"
#include "tests/common/test_util.h"
#include "tests/cpu/graph_conv_builder.h"
#include "tests/cpu/sim_device.h"

using namespace vcudnn;
using test::conv_of;

namespace {

constexpr uint64_t kMiB = 1 << 20;

// A memory manager on the simulated device reporting to a recorder, as with VCUDNN_POLICY=offload
// and VCUDNN_TRACE set.
struct OwnedRecording {
  static memory::ManagerConfig config() {
    constexpr uint64_t kG = 2 * kMiB;
    memory::ManagerConfig c;
    c.device_total = 4096 * kG;
    c.host_budget = 64 * kMiB;
    c.host_slab_bytes = 8 * kMiB;
    c.reserve_bytes = 4096 * kG;
    return c;
  }
  test::SimDevice dev{2 * kMiB, 64};
  memory::MemoryManager m{dev, dev, dev, config()};
  test::TempDir tmp;
  std::string path = tmp.file("trace.json");
  Recorder r{RecorderConfig{path, 200000, nullptr, /*gpu_timing=*/false}};  // its streams are the simulation's
  memory::Stream s = test::SimDevice::stream(1);

  OwnedRecording() {
    memory::detail::g_active.store(true);
    m.set_sink(&r);
  }
  ~OwnedRecording() { memory::detail::g_active.store(false); }
  // Ends the recording and reads the trace back.
  Result<Trace> finish() {
    r.finish();
    memory::detail::g_active.store(false);
    dev.run_all();
    return read_trace(path);
  }
};

}  // namespace

TEST_CASE("recorder: graph-API convolutions alone make an iteration, recorded with every field", "[trace][shadow]") {
  test::TempDir tmp;
  const std::string path = tmp.file("graph.json");
  Recorder r(RecorderConfig{path, 200000, nullptr});
  // Two layers: forward 16 then 32 channels, backward in reverse; three iterations.
  const std::vector<GraphConv> step = {
      conv_of(ConvKind::kForward, 16, 7), conv_of(ConvKind::kForward, 32, 8), conv_of(ConvKind::kBackwardData, 32, 9),
      conv_of(ConvKind::kBackwardFilter, 32, 10), conv_of(ConvKind::kBackwardFilter, 16, 11)};
  for (int iteration = 0; iteration < 3; ++iteration) {
    for (const GraphConv& g : step) {
      Recorder::ConvProbe probe = r.before_graph_convolution(nullptr, g);
      r.after_graph_convolution(probe, nullptr, g, CUDNN_STATUS_SUCCESS);
    }
  }
  r.finish();
  INFO(r.outcome());
  const auto t = read_trace(path);
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  CHECK(trace.complete);
  CHECK(trace.detected_by == "auto");
  // The iteration is one step of five convolutions.
  size_t in_iteration = 0;
  for (const TraceCall& c : trace.calls)
    if (c.seq >= trace.first_seq && c.seq < trace.end_seq && c.kind == CallKind::kConvolution) ++in_iteration;
  CHECK(in_iteration == step.size());
  REQUIRE(trace.calls.size() >= step.size());
  for (size_t i = 0; i < step.size(); ++i) {
    const TraceCall& c = trace.calls[i];
    const GraphConv& g = step[i];
    INFO("call " << i);
    CHECK(c.kind == CallKind::kConvolution);
    CHECK(c.conv == g.kind);
    REQUIRE(c.layer >= 0);
    CHECK(trace.layers[static_cast<size_t>(c.layer)] == g.layer);
    CHECK(c.algo == g.engine);
    CHECK(c.workspace_bytes == static_cast<uint64_t>(*g.workspace_bytes));
    CHECK(c.ptrs == std::array<uint64_t, 4>{g.x, g.w, g.y, g.workspace});
    CHECK(c.status == CUDNN_STATUS_SUCCESS);
    CHECK_FALSE(c.gpu_ms.has_value());  // no stream, no events: no GPU here
  }
}

// With memory owned, the memory runtime reports to the recorder: allocations, frees and each
// tracked call's buffers join the sequence (schema 2); a convolution's buffers are its accesses.
// The trace is valid by the reader's rules and its lifetimes are the program's.
TEST_CASE("recorder: allocations, frees and every call's buffers join the recorded sequence", "[trace][memory]") {
  using namespace vcudnn::memory;
  OwnedRecording o;
  MemoryManager& m = o.m;
  Recorder& r = o.r;
  const Stream s = o.s;
  const auto weight = m.allocate(3 * kMiB, s, Origin::kFramework);  // before the iteration: existing
  REQUIRE(weight);
  // Iterations are delimited from the first cuDNN call on (the setup before it is no iteration's).
  r.record_handle_call(CallKind::kCreate, nullptr, nullptr, CUDNN_STATUS_SUCCESS, vcudnn::monotonic_ns());
  const GraphConv fwd = conv_of(ConvKind::kForward, 16, 1), bwd = conv_of(ConvKind::kBackwardFilter, 16, 2);
  for (int iteration = 0; iteration < 3; ++iteration) {
    const auto act = m.allocate(8 * kMiB, s, Origin::kFramework);
    REQUIRE(act);
    {
      CallScope scope;
      REQUIRE(m.touch(&*act, 1, Access::kWrite, s, "cudaLaunchKernel"));  // an elementwise kernel
    }
    for (const GraphConv* g : {&fwd, &bwd}) {
      Recorder::ConvProbe probe = r.before_graph_convolution(nullptr, *g);
      const uint64_t words[] = {*weight, *act};
      REQUIRE(m.touch(words, 2, Access::kUnknown, s, "cudnnBackendExecute"));  // inside the call
      r.after_graph_convolution(probe, nullptr, *g, CUDNN_STATUS_SUCCESS);
    }
    REQUIRE(m.free(*act, s));
  }
  const auto t = o.finish();
  INFO(r.outcome());
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  REQUIRE(trace.complete);
  std::map<CallKind, int> kinds;
  for (const TraceCall& c : trace.calls)
    if (c.seq >= trace.first_seq && c.seq < trace.end_seq) ++kinds[c.kind];
  // One iteration: the launch, two convolutions, and (in whichever iteration the span starts) an
  // allocation and a free; the touches inside the convolutions are no calls of their own.
  CHECK(kinds[CallKind::kConvolution] == 2);
  CHECK(kinds[CallKind::kLaunch] == 1);
  CHECK(kinds[CallKind::kLibrary] == 0);
  CHECK(kinds[CallKind::kGraphExecute] == 0);
  for (const TraceCall& c : trace.calls) {
    if (c.kind == CallKind::kConvolution) {
      CHECK(c.accesses.size() == 2);  // the weight and the activation
    }
    if (c.kind == CallKind::kLaunch) {
      REQUIRE(c.accesses.size() == 1);
      CHECK(c.accesses[0].mode == AccessMode::kWrite);
      REQUIRE(c.name >= 0);
      CHECK(trace.names[static_cast<size_t>(c.name)] == "cudaLaunchKernel");
    }
  }
  const auto weight_it = std::find_if(trace.buffers.begin(), trace.buffers.end(),
                                      [&](const TraceBuffer& b) { return b.address == *weight; });
  REQUIRE(weight_it != trace.buffers.end());
  CHECK(weight_it->bytes == 3 * kMiB);
  const Lifetimes l = lifetimes(trace);
  // Note [A steady iteration]: the first repeat ends with an activation alive that it did not begin
  // with, so the iteration is the second: from the free of the previous activation to the backward.
  // Alive at its start: the weight (allocated before the first cuDNN call) and that activation.
  CHECK(trace.alive_at_start == std::optional<uint64_t>(11 * kMiB));
  CHECK(l.existing_bytes == 11 * kMiB);
  CHECK(l.untouched_bytes == 0);
  CHECK(l.allocated_bytes == 8 * kMiB);
  CHECK(l.peak_bytes == 11 * kMiB);
}

namespace {

// A training loop under memory ownership, as PyTorch runs one: each step frees the previous step's
// gradient (zero_grad), allocates an activation and a gradient, runs a forward and a backward
// convolution, frees the activation and updates the weight with the optimizer's state, which the
// first update allocates. `leak`: each step also keeps 1 MiB for good (losses kept on the device).
// A 5 MiB buffer no call ever uses (a library's workspace) is alive throughout.
// `unused` and `state_pieces` (the optimizer's state as that many buffers, one per parameter)
// change the defaults for the test of many small state buffers in a large step.
struct TrainingLoop {
  static constexpr uint64_t kWeight = 4 * kMiB, kAct = 8 * kMiB, kGrad = 3 * kMiB, kState = 2 * kMiB,
                            kUnused = 5 * kMiB, kLeak = 1 * kMiB;
  uint64_t unused_bytes = kUnused;
  int state_pieces = 1;
  Result<Trace> run(OwnedRecording& o, int steps, bool leak) {
    using namespace vcudnn::memory;
    MemoryManager& m = o.m;
    const Stream s = o.s;
    const auto weight = m.allocate(kWeight, s, Origin::kFramework);
    const auto unused = m.allocate(unused_bytes, s, Origin::kFramework);
    REQUIRE(weight);
    REQUIRE(unused);
    o.r.record_handle_call(CallKind::kCreate, nullptr, nullptr, CUDNN_STATUS_SUCCESS, vcudnn::monotonic_ns());
    const GraphConv fwd = conv_of(ConvKind::kForward, 16, 1), bwd = conv_of(ConvKind::kBackwardFilter, 16, 2);
    std::optional<uint64_t> grad, state;
    for (int step = 0; step < steps; ++step) {
      if (grad) REQUIRE(m.free(*grad, s));
      const auto act = m.allocate(kAct, s, Origin::kFramework);
      REQUIRE(act);
      {
        CallScope scope;
        REQUIRE(m.touch(&*act, 1, Access::kWrite, s, "cudaLaunchKernel"));
      }
      Recorder::ConvProbe probe = o.r.before_graph_convolution(nullptr, fwd);
      const uint64_t words[] = {*weight, *act};
      REQUIRE(m.touch(words, 2, Access::kUnknown, s, "cudnnBackendExecute"));
      o.r.after_graph_convolution(probe, nullptr, fwd, CUDNN_STATUS_SUCCESS);
      grad = m.allocate(kGrad, s, Origin::kFramework);
      REQUIRE(grad);
      probe = o.r.before_graph_convolution(nullptr, bwd);
      const uint64_t bwords[] = {*weight, *act, *grad};
      REQUIRE(m.touch(bwords, 3, Access::kUnknown, s, "cudnnBackendExecute"));
      o.r.after_graph_convolution(probe, nullptr, bwd, CUDNN_STATUS_SUCCESS);
      REQUIRE(m.free(*act, s));
      if (!state) {
        state = m.allocate(kState / static_cast<uint64_t>(state_pieces), s, Origin::kFramework);
        for (int piece = 1; piece < state_pieces; ++piece)
          REQUIRE(m.allocate(kState / static_cast<uint64_t>(state_pieces), s, Origin::kFramework));
      }
      REQUIRE(state);
      if (leak) REQUIRE(m.allocate(kLeak, s, Origin::kFramework));
      CallScope scope;
      const uint64_t owords[] = {*weight, *grad, *state};
      REQUIRE(m.touch(owords, 3, Access::kUnknown, s, "cudaLaunchKernel"));  // the optimizer's update
    }
    return o.finish();
  }
};

int count_kind(const Trace& t, CallKind kind) {
  int n = 0;
  for (const TraceCall& c : t.calls) n += c.seq >= t.first_seq && c.seq < t.end_seq && c.kind == kind;
  return n;
}

}  // namespace

// Note [A steady iteration]: the iteration recorded is one whose live bytes end where they began,
// not the first step (no optimizer state yet) nor the second (its first update allocates the state):
// its peak is the steady steps' peak, and what no call uses is still counted in it.
TEST_CASE("recorder: the iteration recorded is a steady one, its peak a steady step's", "[trace][memory][steady]") {
  using L = TrainingLoop;
  OwnedRecording o;
  const auto t = L{}.run(o, 6, false);
  INFO(o.r.outcome());
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  REQUIRE(trace.complete);
  CHECK(trace.detected_by == "auto");
  CHECK(count_kind(trace, CallKind::kConvolution) == 2);
  CHECK(count_kind(trace, CallKind::kAlloc) == 2);  // the activation and the gradient: no optimizer state
  CHECK(count_kind(trace, CallKind::kFree) == 2);   // the activation and the previous gradient
  const Lifetimes l = lifetimes(trace);
  // A steady step's peak: weight, optimizer state, the previous gradient gone, activation and gradient.
  CHECK(l.peak_bytes == L::kUnused + L::kWeight + L::kState + L::kAct + L::kGrad);
  CHECK(l.untouched_bytes == L::kUnused);
  // It starts after a backward convolution: that step's activation and gradient are still alive.
  CHECK(trace.alive_at_start == std::optional<uint64_t>(L::kUnused + L::kWeight + L::kState + L::kAct + L::kGrad));
  REQUIRE(l.curve.size() >= 1);
  CHECK(l.curve.back().live_bytes == *trace.alive_at_start);  // it ends where it began
  // Found during training, not at exit: the trace was complete before the program ended.
  CHECK(o.r.outcome().find("(at exit)") == std::string::npos);
}

// Note [A steady iteration]: in a large step (1 GiB alive throughout) the optimizer's state, 16
// buffers of 128 KiB, is under 1% of the peak, but the repeat that allocates it makes 16 more
// allocations than frees: refused; the next one is the steady step (fails when bytes alone decide).
TEST_CASE("recorder: a repeat that allocates more buffers than it frees is no steady iteration",
          "[trace][memory][steady]") {
  TrainingLoop loop;
  loop.unused_bytes = 1024 * kMiB;
  loop.state_pieces = 16;
  OwnedRecording o;
  const auto t = loop.run(o, 6, false);
  INFO(o.r.outcome());
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  REQUIRE(trace.complete);
  CHECK(trace.detected_by == "auto");
  CHECK(count_kind(trace, CallKind::kAlloc) == 2);  // the activation and the gradient: no optimizer state
  CHECK(count_kind(trace, CallKind::kFree) == 2);
  CHECK(trace.alive_at_start ==
        std::optional<uint64_t>(loop.unused_bytes + TrainingLoop::kWeight + TrainingLoop::kState + TrainingLoop::kAct +
                                TrainingLoop::kGrad));
}

TEST_CASE("recorder: memory that grows every step still gives an iteration, after three refusals",
          "[trace][memory][steady]") {
  using L = TrainingLoop;
  OwnedRecording o;
  const auto t = L{}.run(o, 8, true);
  INFO(o.r.outcome());
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  REQUIRE(trace.complete);
  CHECK(trace.detected_by == "auto");
  CHECK(o.r.outcome().find("(at exit)") == std::string::npos);
  CHECK(count_kind(trace, CallKind::kAlloc) == 3);  // activation, gradient and the 1 MiB kept
  // The fourth repeat: three earlier ones refused (the first two also grew by the gradient and the state).
  const Lifetimes l = lifetimes(trace);
  // It starts after the third step's backward convolution: two steps have kept their 1 MiB.
  CHECK(*trace.alive_at_start == L::kUnused + L::kWeight + L::kState + L::kAct + L::kGrad + 2 * L::kLeak);
  CHECK(l.curve.back().live_bytes == *trace.alive_at_start + L::kLeak);
}

// Note [Iterations without convolutions]: a transformer-like program under memory ownership has
// its iteration found from the operations alone, and the trace holds one whole step.
TEST_CASE("recorder: an iteration without convolutions is found from the operations", "[trace][memory][ops]") {
  using namespace vcudnn::memory;
  OwnedRecording o;
  MemoryManager& m = o.m;
  Recorder& r = o.r;
  const Stream s = o.s;
  const auto launch = [&](uint64_t a, const char* api) {
    CallScope scope;
    REQUIRE(m.touch(&a, 1, Access::kUnknown, s, api));
  };
  const auto weights = m.allocate(16 * kMiB, s, Origin::kFramework);
  REQUIRE(weights);
  std::vector<uint64_t> state;
  for (int step = 0; step < 4; ++step) {
    std::vector<uint64_t> acts;
    for (int layer = 0; layer < 6; ++layer) {  // forward: identical layers, each keeps an activation
      acts.push_back(*m.allocate(4 * kMiB, s, Origin::kFramework));
      launch(*weights, "cublasSgemm_v2");
      launch(acts.back(), "cudaLaunchKernel");
    }
    for (int layer = 5; layer >= 0; --layer) {  // backward
      launch(acts[static_cast<size_t>(layer)], "cudaLaunchKernel");
      launch(*weights, "cublasSgemm_v2");
      REQUIRE(m.free(acts[static_cast<size_t>(layer)], s));
    }
    if (step == 0) state.push_back(*m.allocate(16 * kMiB, s, Origin::kFramework));  // optimizer state
    launch(state.front(), "cudaLaunchKernel");
  }
  INFO(r.outcome());
  const auto t = o.finish();
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  CHECK(trace.complete);
  CHECK(trace.detected_by == "auto");
  // One step: 6 x (alloc + 2 uses) forward, 6 x (2 uses + free) backward, one optimizer launch.
  CHECK(trace.end_seq - trace.first_seq == 6 * 3 + 6 * 3 + 1);
  const Lifetimes l = lifetimes(trace);
  CHECK(l.allocated_bytes == 6 * 4 * kMiB);                // the step's activations
  CHECK(l.peak_bytes == l.existing_bytes + 6 * 4 * kMiB);  // all six held at the turn
}

// What varies from one step to the next under a device budget (an H100 trace of the transformer):
// a tensor's free comes at another point, and a launch's parameters hold a word that hits a
// buffer, another launch in each step (a launch's buffers are found by scanning for pointers). Neither is the
// program's repeat: the step is still found, whole.
TEST_CASE("recorder: without convolutions a step is found though frees move and a launch picks up a stray buffer",
          "[trace][memory][ops]") {
  using namespace vcudnn::memory;
  OwnedRecording o;
  MemoryManager& m = o.m;
  Recorder& r = o.r;
  const Stream s = o.s;
  const auto launch = [&](std::vector<uint64_t> words, const char* api) {
    CallScope scope;
    REQUIRE(m.touch(words.data(), words.size(), Access::kUnknown, s, api));
  };
  const auto weights = m.allocate(16 * kMiB, s, Origin::kFramework);
  REQUIRE(weights);
  std::vector<uint64_t> state;
  for (int step = 0; step < 6; ++step) {
    const auto temp = m.allocate(1 * kMiB, s, Origin::kFramework);  // freed by a collector, somewhere
    REQUIRE(temp);
    std::vector<uint64_t> acts;
    for (int layer = 0; layer < 6; ++layer) {
      acts.push_back(*m.allocate(4 * kMiB, s, Origin::kFramework));
      launch({*weights}, "cublasSgemm_v2");
      if (layer == (step * 5) % 6)
        launch({acts.back(), *weights}, "cudaLaunchKernel");  // a stray word hits the weights
      else
        launch({acts.back()}, "cudaLaunchKernel");
    }
    for (int layer = 5; layer >= 0; --layer) {
      launch({acts[static_cast<size_t>(layer)]}, "cudaLaunchKernel");
      launch({*weights}, "cublasSgemm_v2");
      REQUIRE(m.free(acts[static_cast<size_t>(layer)], s));
      if (layer == step % 6) REQUIRE(m.free(*temp, s));
    }
    if (step == 0) state.push_back(*m.allocate(16 * kMiB, s, Origin::kFramework));
    launch({state.front()}, "cudaLaunchKernel");
  }
  INFO(r.outcome());
  const auto t = o.finish();
  REQUIRE(t.ok());
  const Trace& trace = t.value();
  CHECK(trace.complete);
  CHECK(trace.detected_by == "auto");
  CHECK(trace.end_seq - trace.first_seq == 1 + 1 + 6 * 3 + 6 * 3 + 1);  // the temporary's two calls, then as above
}
