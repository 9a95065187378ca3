// GraphConvPlan's parts that need no GPU (runtime/graph_conv_plan.h): how a batch is cut into
// micro-batches, where each starts in memory and which alignment its tensors may declare, the
// filter's strides from its format, and the operation graph of one convolution built through the
// real cuDNN (cuDNN 9.8+ finalizes one without a handle); the heuristics and plans need a GPU
// (tests/gpu/graph_test.cpp).
#include "runtime/graph_conv_plan.h"

#include <catch2/catch.hpp>

#include <vector>

#include "runtime/backend_descriptor.h"
#include "tests/common/conv_shape.h"

using namespace vcudnn;
using namespace vcudnn::test;

namespace {

using Slices = std::vector<MicroBatchSlice>;

// cuDNN before 9.8 needs a handle (so a GPU) to finalize an operation graph.
bool graph_without_gpu() { return cudnnGetVersion() >= 90800; }

float read_float(const BackendDescriptor& d, cudnnBackendAttributeName_t name) {
  float v = -42.f;
  int64_t n = 0;
  REQUIRE(real_backend().get(d.get(), name, CUDNN_TYPE_FLOAT, 1, &n, &v) == CUDNN_STATUS_SUCCESS);
  REQUIRE(n == 1);
  return v;
}

}  // namespace

TEST_CASE("graph conv plan: a batch is cut into micro-batches, the last taking the rest", "[graph_api][split]") {
  CHECK(split_batch(8, 4) == Slices{{0, 4}, {4, 4}});
  CHECK(split_batch(8, 2) == Slices{{0, 2}, {2, 2}, {4, 2}, {6, 2}});
  CHECK(split_batch(10, 3) == Slices{{0, 3}, {3, 3}, {6, 3}, {9, 1}});
  CHECK(split_batch(17, 16) == Slices{{0, 16}, {16, 1}});
  CHECK(split_batch(15, 16) == Slices{{0, 15}});
  CHECK(split_batch(8, 8) == Slices{{0, 8}});
  CHECK(split_batch(8, 0) == Slices{{0, 8}});
  CHECK(split_batch(8, -1) == Slices{{0, 8}});
  CHECK(split_batch(1, 1) == Slices{{0, 1}});
  CHECK(split_batch(0, 4).empty());
  // Every sample exactly once, in order.
  for (int64_t n : {1, 2, 7, 16, 31, 33, 64}) {
    for (int32_t m = 1; m <= n + 1; ++m) {
      int64_t next = 0;
      for (const auto& s : split_batch(n, m)) {
        CHECK(s.offset == next);
        CHECK(s.batch >= 1);
        CHECK(s.batch <= std::max<int64_t>(m, 1));
        next += s.batch;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("graph conv plan: offset pointers declare the largest power of two dividing base and step",
          "[graph_api][split]") {
  CHECK(offset_alignment(16, 0) == 16);  // one micro-batch: the base's
  CHECK(offset_alignment(16, 16) == 16);
  CHECK(offset_alignment(16, 4096) == 16);
  CHECK(offset_alignment(256, 4096) == 16);  // never above 16
  CHECK(offset_alignment(16, 24) == 8);
  CHECK(offset_alignment(16, 12) == 4);
  CHECK(offset_alignment(16, 6) == 2);
  CHECK(offset_alignment(16, 3 * 4 * 25) == 4);  // 3 samples of 25 floats
  CHECK(offset_alignment(16, 7) == 1);
  CHECK(offset_alignment(8, 64) == 8);
  CHECK(offset_alignment(4, 2) == 2);
  CHECK(offset_alignment(0, 64) == 1);
  // The declared alignment holds for every micro-batch's start.
  for (uint64_t step : {2u, 6u, 12u, 40u, 300u, 1000u, 4096u})
    for (uint64_t k = 0; k < 9; ++k) CHECK((4096 + k * step) % static_cast<uint64_t>(offset_alignment(16, step)) == 0);

  alignas(16) static char buffer[64];
  CHECK(pointer_alignment(buffer) == 16);
  CHECK(pointer_alignment(buffer + 8) == 8);
  CHECK(pointer_alignment(buffer + 4) == 4);
  CHECK(pointer_alignment(buffer + 6) == 2);
  CHECK(pointer_alignment(buffer + 3) == 1);
  CHECK(pointer_alignment(buffer + 32) == 16);
}

TEST_CASE("graph conv plan: the filter's strides follow its format", "[graph_api][split]") {
  ConvShape s;
  s.c = 3;
  s.k = 16;
  FilterFingerprint w = conv_layer(s).w;
  const auto nchw = filter_strides(w);
  REQUIRE(nchw);
  CHECK(std::vector<int64_t>(nchw->begin(), nchw->begin() + 4) == std::vector<int64_t>{27, 9, 3, 1});
  w.format = CUDNN_TENSOR_NHWC;
  const auto nhwc = filter_strides(w);
  REQUIRE(nhwc);
  CHECK(std::vector<int64_t>(nhwc->begin(), nhwc->begin() + 4) == std::vector<int64_t>{27, 1, 9, 3});
  w.format = -1;  // strided: no legacy format
  CHECK(!filter_strides(w));
  w.format = CUDNN_TENSOR_NCHW;
  w.nb_dims = 2;
  CHECK(!filter_strides(w));
}

TEST_CASE("graph conv plan: where micro-batches lie and what their tensors declare", "[graph_api][split]") {
  ConvShape s;  // n 8, c 16, k 32, 14x14 -> 14x14
  s.n = 10;
  s.c = 3;
  s.k = 8;
  s.h = s.w = 5;
  const ConvLayer l = conv_layer(s);
  auto g = split_geometry(l, 3, 16);
  REQUIRE(g);
  CHECK(g->x_sample_bytes == 3 * 25 * 4);
  CHECK(g->y_sample_bytes == 8 * 25 * 4);
  CHECK(g->x_alignment == 4);   // 3 samples: 900 bytes
  CHECK(g->y_alignment == 16);  // 2400 bytes
  CHECK(g->w_alignment == 16);  // never offset
  g = split_geometry(l, 2, 16);
  REQUIRE(g);
  CHECK(g->x_alignment == 8);     // 600 bytes
  g = split_geometry(l, 10, 16);  // undivided: only the base
  REQUIRE(g);
  CHECK(g->x_alignment == 16);
  CHECK(g->y_alignment == 16);
  g = split_geometry(l, 4, 8);
  REQUIRE(g);
  CHECK(g->x_alignment == 8);  // 1200 bytes, but the base only 8
  CHECK(g->w_alignment == 8);
  CHECK(!split_geometry(l, 4, 12));  // not a power of two

  ConvShape nhwc = s;  // channels-last: the N stride is still one sample
  nhwc.nhwc = true;
  g = split_geometry(conv_layer(nhwc), 1, 16);
  REQUIRE(g);
  CHECK(g->x_sample_bytes == 300);
  CHECK(g->x_alignment == 4);
}

TEST_CASE("graph conv plan: the operation graph of every kind builds through the real cuDNN", "[graph_api][cudnn]") {
  if (!graph_without_gpu()) {
    WARN("cuDNN " << cudnnGetVersion() << " needs a GPU to finalize an operation graph; skipped");
    return;
  }
  ConvShape plain;
  ConvShape nhwc_strided;
  nhwc_strided.nhwc = true;
  nhwc_strided.stride = 2;
  nhwc_strided.r = nhwc_strided.s = 1;
  nhwc_strided.pad = 0;
  ConvShape grouped;
  grouped.c = grouped.k = 32;
  grouped.groups = 4;
  ConvShape depthwise;
  depthwise.c = depthwise.k = depthwise.groups = 24;
  depthwise.nhwc = true;
  ConvShape bf16 = plain;
  bf16.dtype = CUDNN_DATA_BFLOAT16;
  for (const ConvShape& s : {plain, nhwc_strided, grouped, depthwise, bf16}) {
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      for (int32_t batch : {0, 1, 3}) {
        INFO(s.name() << " " << conv_kind_name(kind) << " batch " << batch);
        GraphConvPlanSpec spec;
        spec.batch = batch;
        spec.x_alignment = 4;
        spec.alpha = 0.5;
        spec.beta = kind == ConvKind::kBackwardFilter ? 1.0 : 0.0;
        auto g = build_conv_graph(nullptr, conv_layer(s), kind, spec);
        if (!g) FAIL(g.error().message);
        CHECK(g->graph.get() != nullptr);
        // alpha and beta live on the operation (Note [Graph-API alpha and beta]).
        const auto [alpha, beta] =
            kind == ConvKind::kForward        ? std::pair{CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                                   CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA}
            : kind == ConvKind::kBackwardData ? std::pair{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                                          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA}
                                              : std::pair{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                                                          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
        CHECK(read_float(g->op, alpha) == 0.5f);
        CHECK(read_float(g->op, beta) == static_cast<float>(spec.beta));
      }
    }
  }
}

TEST_CASE("graph conv plan: a layer the graph cannot express is refused with the reason", "[graph_api][cudnn]") {
  if (!graph_without_gpu()) {
    WARN("cuDNN " << cudnnGetVersion() << " needs a GPU to finalize an operation graph; skipped");
    return;
  }
  const ConvShape s;
  GraphConvPlanSpec spec;
  {
    ConvLayer l = conv_layer(s);
    l.w.format = -1;
    auto g = build_conv_graph(nullptr, l, ConvKind::kForward, spec);
    REQUIRE(!g);
    CHECK_THAT(g.error().message, Catch::Contains("neither NCHW nor NHWC"));
  }
  {
    spec.batch = static_cast<int32_t>(s.n) + 1;
    auto g = build_conv_graph(nullptr, conv_layer(s), ConvKind::kForward, spec);
    REQUIRE(!g);
    CHECK_THAT(g.error().message, Catch::Contains("micro-batch"));
    spec.batch = 0;
  }
  {
    spec.x_alignment = 12;
    auto g = build_conv_graph(nullptr, conv_layer(s), ConvKind::kForward, spec);
    REQUIRE(!g);
    CHECK_THAT(g.error().message, Catch::Contains("powers of two"));
    spec.x_alignment = 16;
  }
  {  // y one row short of what the convolution gives: cuDNN refuses the operation
    ConvLayer l = conv_layer(s);
    l.y.dims[2] -= 1;
    auto g = build_conv_graph(nullptr, l, ConvKind::kForward, spec);
    REQUIRE(!g);
    CHECK_THAT(g.error().message, Catch::Contains("finalizing"));
  }
  {
    ConvLayer l = conv_layer(s);
    l.y.dims[0] = 4;
    auto g = build_conv_graph(nullptr, l, ConvKind::kForward, spec);
    REQUIRE(!g);
    CHECK_THAT(g.error().message, Catch::Contains("batch"));
  }
}

TEST_CASE("graph conv plan: a 16-bit weight gradient is not split", "[graph_api][split]") {
  ConvShape s;
  s.dtype = CUDNN_DATA_BFLOAT16;
  auto split = build_split(nullptr, conv_layer(s), ConvKind::kBackwardFilter, 4, GraphConvSplitOptions{});
  REQUIRE(!split);
  CHECK_THAT(split.error().message, Catch::Contains("16-bit"));
}

TEST_CASE("graph conv plan: a configuration id names the engine and which of its configurations", "[graph_api]") {
  // An engine's first configuration is named by the engine's own index (what the caller's plans and
  // older decisions name), a later one by the index plus a multiple of the stride.
  STATIC_REQUIRE(config_id(67, 0) == 67);
  STATIC_REQUIRE(config_engine(config_id(67, 0)) == 67);
  STATIC_REQUIRE(config_variant(config_id(67, 0)) == 0);
  for (int64_t engine : {0, 1, 76, 9999})
    for (int64_t variant : {0, 1, 5, 300}) {
      const int64_t id = config_id(engine, variant);
      CHECK(config_engine(id) == engine);
      CHECK(config_variant(id) == variant);
      CHECK(id <= INT32_MAX);  // stored in the benchmark cache's 32-bit algorithm column
    }
}
