// Graph-API convolutions (runtime/backend_shadow.h) recorded by the Recorder as the legacy path's
// are: the iteration is found from them alone, and the trace holds their fingerprints, pointers,
// engines and workspaces. No GPU: the calls carry no stream and get no GPU time.
#include <catch2/catch.hpp>

#include "planner/trace.h"
#include "runtime/recorder.h"
#include "tests/common/test_util.h"

using namespace vcudnn;

namespace {

GraphConv conv_of(ConvKind kind, int64_t channels, int64_t engine) {
  GraphConv g;
  g.kind = kind;
  ConvLayer& l = g.layer;
  l.x = {CUDNN_DATA_FLOAT, 4, {8, channels, 16, 16}, {channels * 256, 256, 16, 1}};
  l.y = {CUDNN_DATA_FLOAT, 4, {8, channels, 16, 16}, {channels * 256, 256, 16, 1}};
  l.w = {CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, {channels, channels, 3, 3}};
  l.conv.spatial_dims = 2;
  l.conv.pad = {1, 1};
  l.conv.stride = {1, 1};
  l.conv.dilation = {1, 1};
  l.conv.mode = CUDNN_CROSS_CORRELATION;
  l.conv.compute_type = CUDNN_DATA_FLOAT;
  l.conv.math_type = -1;
  g.x = 0x7000000000 + static_cast<uint64_t>(channels) * 0x1000;
  g.w = g.x + 0x100;
  g.y = g.x + 0x200;
  g.workspace = 0x7100000000;
  g.workspace_bytes = 4096 * channels;
  g.engine = engine;
  return g;
}

}  // namespace

TEST_CASE("recorder: graph-API convolutions alone make an iteration, recorded with every field", "[trace][shadow]") {
  test::TempDir tmp;
  const std::string path = tmp.file("graph.json");
  Recorder r(RecorderConfig{path});
  // Two layers: forward 16 then 32 channels, backward in reverse; three iterations.
  const std::vector<GraphConv> step = {
      conv_of(ConvKind::kForward, 16, 7),        conv_of(ConvKind::kForward, 32, 8),
      conv_of(ConvKind::kBackwardData, 32, 9),   conv_of(ConvKind::kBackwardFilter, 32, 10),
      conv_of(ConvKind::kBackwardFilter, 16, 11)};
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
