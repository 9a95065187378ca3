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
  Recorder r{RecorderConfig{path, 200000, nullptr}};
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
  // The weight (allocated before the first cuDNN call: existing) and one activation.
  CHECK(l.existing_bytes + l.allocated_bytes == 11 * kMiB);
  CHECK(l.peak_bytes == 11 * kMiB);
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
