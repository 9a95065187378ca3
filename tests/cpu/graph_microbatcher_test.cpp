// GraphMicroBatcher (runtime/graph_microbatcher.h) without a GPU: the numerics mask, which layers
// can be sliced, the sizes measured, a decision's micro-batches and where they lie, the cache's key
// space, and the workspace-size answer: plans of one convolution over the limit are taken over
// (answer 0), plans under it, other graphs and unsliceable layers keep cuDNN's answer. The shadow
// is fed by hand, as cudnn-frontend would feed it (stand-in descriptor handles).
#include "runtime/graph_microbatcher.h"

#include <unistd.h>
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/bench_cache.h"
#include "runtime/conv_descriptors.h"
#include "tests/common/test_util.h"
#include "tests/cpu/graph_conv_builder.h"

using namespace vcudnn;

namespace {

constexpr uint32_t kTensorCore = note_bit(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
constexpr uint32_t kNondeterministic = note_bit(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
constexpr uint32_t kDownConvert = note_bit(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
constexpr uint32_t kWinograd = note_bit(CUDNN_NUMERICAL_NOTE_WINOGRAD);
constexpr uint32_t kFft = note_bit(CUDNN_NUMERICAL_NOTE_FFT);

MicroBatchSettings settings(uint64_t limit, std::optional<int32_t> force = std::nullopt) {
  MicroBatchSettings s;
  s.limit = limit;
  s.force_split = force;
  return s;
}

GraphMicroBatcher batcher(uint64_t limit, std::optional<int32_t> force = std::nullopt) {
  return GraphMicroBatcher(std::make_shared<MicroBatchResources>(settings(limit, force)));
}

cudnnBackendDescriptor_t handle_at(uintptr_t a) { return reinterpret_cast<cudnnBackendDescriptor_t>(a); }

// A framework building plans, seen by a shadow of the test's own.
class Builder {
 public:
  explicit Builder(BackendShadow& s) : s_(s) {}
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    auto d = handle_at(next_ += 16);
    s_.created(d, type);
    return d;
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v) {
    s_.set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  cudnnBackendDescriptor_t tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
    auto t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    s_.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    s_.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    s_.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    s_.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    return t;
  }
  // A forward 3x3 convolution of 16 channels on 8x16x16 maps (x strided when `strided`).
  cudnnBackendDescriptor_t conv_op(bool strided) {
    const int64_t n = 8, c = 16, hw = 16;
    auto x = tensor('x', {n, c, hw, hw}, {strided ? 2 * c * hw * hw : c * hw * hw, hw * hw, hw, 1});
    auto w = tensor('w', {c, c, 3, 3}, {c * 9, 9, 3, 1});
    auto y = tensor('y', {n, c, hw, hw}, {c * hw * hw, hw * hw, hw, 1});
    auto conv = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const int64_t two = 2, ones[] = {1, 1};
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    s_.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &two);
    s_.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    s_.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    for (auto a : {CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
                   CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_ATTR_CONVOLUTION_DILATIONS})
      s_.set(conv, a, CUDNN_TYPE_INT64, 2, ones);
    auto op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
    return op;
  }
  cudnnBackendDescriptor_t pointwise_op() { return create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR); }
  // The plan of a graph of `op`, on engine 7.
  cudnnBackendDescriptor_t plan_of(cudnnBackendDescriptor_t op) {
    auto graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    s_.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    auto engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    set_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    const int64_t index = 7;
    s_.set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    auto cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, engine);
    auto plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    return plan;
  }

 private:
  BackendShadow& s_;
  uintptr_t next_ = 0x40000;
};

// What the GetAttribute hook does after the real call answered `real`: the answer the program sees.
int64_t answer(GraphMicroBatcher& g, BackendShadow& shadow, cudnnBackendDescriptor_t plan, int64_t real) {
  shadow.got(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &real);
  int64_t size = real;
  g.workspace_size(plan, shadow.convolution(plan, nullptr), &size);
  return size;
}

}  // namespace

TEST_CASE("graph microbatch: vcudnn's engines carry no numerical note the caller's lacks", "[graph_api][microbatch]") {
  // fp32: TF32 (TENSOR_CORE) only where the caller's engine used it.
  CHECK((denied_notes_for(0u, CUDNN_DATA_FLOAT) & kTensorCore) != 0);
  CHECK((denied_notes_for(kTensorCore, CUDNN_DATA_FLOAT) & kTensorCore) == 0);
  // 16-bit data: tensor cores change nothing.
  CHECK((denied_notes_for(0u, CUDNN_DATA_BFLOAT16) & kTensorCore) == 0);
  CHECK((denied_notes_for(0u, CUDNN_DATA_HALF) & kTensorCore) == 0);
  // Atomics, FFT and Winograd likewise; down-conversion never.
  CHECK((denied_notes_for(0u, CUDNN_DATA_FLOAT) & (kNondeterministic | kFft | kWinograd)) ==
        (kNondeterministic | kFft | kWinograd));
  CHECK((denied_notes_for(kNondeterministic | kWinograd, CUDNN_DATA_FLOAT) & (kNondeterministic | kWinograd)) == 0);
  CHECK((denied_notes_for(kDownConvert, CUDNN_DATA_HALF) & kDownConvert) != 0);
  // Unknown: the strictest mask.
  CHECK(denied_notes_for(std::nullopt, CUDNN_DATA_FLOAT) == denied_notes_for(0u, CUDNN_DATA_FLOAT));
  CHECK((denied_notes_for(std::nullopt, CUDNN_DATA_FLOAT) & kTensorCore) != 0);
}

TEST_CASE("graph microbatch: packed NCHW or NHWC layers of sliceable types only", "[graph_api][microbatch]") {
  const GraphConv g = test::conv_of(ConvKind::kForward, 16, 7);
  CHECK_FALSE(graph_unsliceable(g.layer));
  ConvLayer nhwc = g.layer;
  nhwc.x.strides = {16 * 256, 1, 16 * 16, 16};
  nhwc.y.strides = nhwc.x.strides;
  nhwc.w.format = CUDNN_TENSOR_NHWC;
  CHECK_FALSE(graph_unsliceable(nhwc));
  ConvLayer strided = g.layer;
  strided.x.strides[0] *= 2;  // a slice of a larger batch tensor
  REQUIRE(graph_unsliceable(strided));
  CHECK_THAT(*graph_unsliceable(strided), Catch::Contains("NCHW or NHWC"));
  ConvLayer int8 = g.layer;
  int8.x.dtype = int8.y.dtype = int8.w.dtype = CUDNN_DATA_INT8;
  REQUIRE(graph_unsliceable(int8));
  CHECK_THAT(*graph_unsliceable(int8), Catch::Contains("data type"));
  ConvLayer odd_filter = g.layer;
  odd_filter.w.format = -1;
  REQUIRE(graph_unsliceable(odd_filter));
  CHECK_THAT(*graph_unsliceable(odd_filter), Catch::Contains("filter"));
}

TEST_CASE("graph microbatch: the sizes measured follow the policy, the forced split, the 16-bit rule",
          "[graph_api][microbatch]") {
  const ConvLayer l = test::conv_of(ConvKind::kForward, 16, 7).layer;  // N = 8
  CHECK(microbatch_candidate_batches(settings(1 << 20), ConvKind::kForward, l) == std::vector<int32_t>{1, 2, 4, 8});
  CHECK(microbatch_candidate_batches(settings(1 << 20, 3), ConvKind::kForward, l) ==
        std::vector<int32_t>{1, 2, 3, 4, 8});
  CHECK(microbatch_candidate_batches(settings(1 << 20, 5), ConvKind::kBackwardData, l) ==
        std::vector<int32_t>{1, 2, 3, 4, 5, 8});
  MicroBatchSettings undivided = settings(1 << 20);
  undivided.batch_policy = BatchPolicy::kUndivided;
  CHECK(microbatch_candidate_batches(undivided, ConvKind::kForward, l) == std::vector<int32_t>{8});
  ConvLayer bf16 = l;
  bf16.x.dtype = bf16.y.dtype = bf16.w.dtype = CUDNN_DATA_BFLOAT16;
  CHECK(microbatch_candidate_batches(settings(1 << 20, 3), ConvKind::kBackwardFilter, bf16) == std::vector<int32_t>{8});
  CHECK(microbatch_candidate_batches(settings(1 << 20, 3), ConvKind::kForward, bf16).size() == 5);
}

TEST_CASE("graph microbatch: a decision's micro-batches run in order, offsets accumulating",
          "[graph_api][microbatch][split]") {
  // Two micro-batches of 3 on engine 7, then 2 on engine 9: 3 + 3 + 2 = 8.
  MicroConfig c;
  c.kernels = {{7, 3, 1.0, 100, -1}, {7, 3, 1.0, 100, -1}, {9, 2, 0.5, 50, -1}};
  const std::vector<SplitStep> steps = steps_of(c);
  REQUIRE(steps.size() == 3);
  CHECK(steps[0] == SplitStep{3, 7});
  CHECK(steps[2] == SplitStep{2, 9});

  // x: 3 channels of 5x5 fp32 = 300 bytes a sample; micro-batches at 0, 900, 1800 bytes: 4-byte aligned.
  ConvLayer l = test::conv_of(ConvKind::kForward, 16, 7).layer;
  l.x.dims = {8, 3, 5, 5};
  l.x.strides = {75, 25, 5, 1};
  l.y.dims = {8, 4, 5, 5};  // 400 bytes a sample: 1200, 2400: 16-byte aligned
  l.y.strides = {100, 25, 5, 1};
  auto g = steps_geometry(l, steps);
  REQUIRE(g);
  CHECK(g->x_sample_bytes == 300);
  CHECK(g->x_alignment == 4);
  CHECK(g->y_alignment == 16);
  CHECK(g->w_alignment == 16);
  // One micro-batch of the whole batch starts at the base: the base's alignment.
  auto whole = steps_geometry(l, {{8, std::nullopt}}, 8);
  REQUIRE(whole);
  CHECK(whole->x_alignment == 8);
  // Micro-batches that do not cover the batch are refused.
  auto short_steps = steps_geometry(l, {{3, 7}, {3, 7}});
  REQUIRE_FALSE(short_steps);
  CHECK_THAT(short_steps.error().message, Catch::Contains("not 8"));
  // A 16-bit weight gradient is not split, whatever the decision says (before any cuDNN call).
  ConvLayer bf16 = l;
  bf16.x.dtype = bf16.y.dtype = bf16.w.dtype = CUDNN_DATA_BFLOAT16;
  auto split = build_steps_split(nullptr, bf16, ConvKind::kBackwardFilter, steps, GraphConvSplitOptions{});
  REQUIRE_FALSE(split);
  CHECK_THAT(split.error().message, Catch::Contains("16-bit"));
}

TEST_CASE("graph microbatch: a timing round holds enough executions to hide their launches",
          "[graph_api][microbatch]") {
  // kTimingRoundMs (0.5 ms) of work per round: a 0.05 ms kernel 10 times, a long one once.
  CHECK(reps_per_round(0.05) == 10);
  CHECK(reps_per_round(0.2) == 3);
  CHECK(reps_per_round(0.5) == 1);
  CHECK(reps_per_round(7.0) == 1);
  // Tiny and unmeasurable times are capped, never 0 executions or an overflow.
  CHECK(reps_per_round(0.001) == kMaxRepsPerRound);
  CHECK(reps_per_round(0.0) == kMaxRepsPerRound);
  CHECK(reps_per_round(-1.0) == kMaxRepsPerRound);
  CHECK(reps_per_round(std::numeric_limits<double>::quiet_NaN()) == kMaxRepsPerRound);
  CHECK(reps_per_round(std::numeric_limits<double>::infinity()) == 1);
}

TEST_CASE("graph microbatch: measurements have a cache key space of their own", "[graph_api][microbatch][cache]") {
  const ConvLayer l = micro_layer(test::conv_of(ConvKind::kForward, 16, 7).layer, 4);
  const std::string key = graph_bench_layer_key(l, 0x12, 1.0, 0.0, 16);
  CHECK(key.rfind(kGraphBenchKeySchema, 0) == 0);
  CHECK(key != graph_bench_layer_key(l, 0x13, 1.0, 0.0, 16));
  CHECK(key != graph_bench_layer_key(l, 0x12, 0.5, 0.0, 16));
  CHECK(key != graph_bench_layer_key(l, 0x12, 1.0, 1.0, 16));
  CHECK(key != graph_bench_layer_key(l, 0x12, 1.0, 0.0, 8));
  CHECK(key != graph_bench_layer_key(micro_layer(l, 2), 0x12, 1.0, 0.0, 16));

  test::TempDir tmp;
  std::string warning, error;
  auto cache = BenchCache::open(tmp.file("bench.sqlite"), &warning, &error);
  REQUIRE(cache);
  BenchKey graph{"GPU", 132, 91900, key, static_cast<int32_t>(ConvKind::kForward), 4};
  const std::vector<BenchRow> rows = {{7, -1, 1, 0.25, 1 << 20}, {9, -1, 1, 0.5, 0}};
  REQUIRE(cache->store(graph, 64 << 20, rows, &error));
  auto back = cache->lookup(graph, 64 << 20, /*exact=*/true);
  REQUIRE(back);
  CHECK(*back == rows);
  CHECK_FALSE(cache->lookup(graph, 32 << 20, /*exact=*/true));  // another limit: measured again
  BenchKey legacy = graph;
  legacy.layer = nlohmann::json(l).dump();  // the legacy path's key of the same layer
  CHECK_FALSE(cache->lookup(legacy, 64 << 20));
}

TEST_CASE("graph microbatch: plans of one convolution over the limit are taken over, the rest untouched",
          "[graph_api][microbatch][shadow]") {
  BackendShadow shadow;
  Builder b(shadow);
  const int64_t limit = 1 << 20;
  GraphMicroBatcher g = batcher(limit);

  const auto big = b.plan_of(b.conv_op(false));
  CHECK(answer(g, shadow, big, 4 * limit) == 0);  // vcudnn supplies it
  CHECK(g.managed(big));
  CHECK(answer(g, shadow, big, 4 * limit) == 0);  // asked again: the same answer
  CHECK_FALSE(g.plan_info(big));                  // taken over, but no decision before its first execution
  // cuDNN's own answer stays in the shadow (the caller's plan needs it when vcudnn runs it).
  CHECK(shadow.convolution(big, nullptr)->workspace_bytes == 4 * limit);

  const auto small = b.plan_of(b.conv_op(false));
  CHECK(answer(g, shadow, small, limit) == limit);  // fits: cuDNN's engine, untouched
  CHECK_FALSE(g.managed(small));
  CHECK_FALSE(g.plan_info(small));

  const auto other = b.plan_of(b.pointwise_op());
  CHECK(answer(g, shadow, other, 4 * limit) == 4 * limit);  // not a convolution
  CHECK_FALSE(g.managed(other));

  const auto strided = b.plan_of(b.conv_op(true));
  CHECK(answer(g, shadow, strided, 4 * limit) == 4 * limit);  // cannot be sliced
  CHECK_FALSE(g.managed(strided));

  const auto unseen = handle_at(0x9990);  // a plan the shadow never saw built
  CHECK(answer(g, shadow, unseen, 4 * limit) == 4 * limit);
  CHECK_FALSE(g.managed(unseen));

  // Destroyed: forgotten, so a new descriptor at the same address starts afresh.
  g.forget(big);
  CHECK_FALSE(g.managed(big));
  CHECK(g.summary().find("graph_managed=1 ") != std::string::npos);
}

TEST_CASE("graph microbatch: VCUDNN_TEST_FORCE_SPLIT takes over plans under the limit too",
          "[graph_api][microbatch][shadow]") {
  BackendShadow shadow;
  Builder b(shadow);
  GraphMicroBatcher g = batcher(1 << 20, 3);
  const auto small = b.plan_of(b.conv_op(false));
  CHECK(answer(g, shadow, small, 4096) == 0);
  CHECK(g.managed(small));
  const auto other = b.plan_of(b.pointwise_op());
  CHECK(answer(g, shadow, other, 4096) == 4096);
}
