// BackendShadow (runtime/backend_shadow.h) fed the calls a framework makes to build and run
// graph-API convolutions, as cudnn-frontend makes them (PyTorch's Conv_v8.cpp): tensors, a
// convolution, one operation, an operation graph, heuristics answering with engine configurations,
// a plan, a variant pack. The descriptors are stand-in handles (the graph API needs a GPU past the
// operation); the fingerprint is compared with what the legacy decoder reads from real legacy
// descriptors of the same convolution.
#include "runtime/backend_shadow.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/decode_conv.h"

using namespace vcudnn;

namespace {

struct Shape {
  std::vector<int64_t> x, w, y;
  std::vector<int64_t> pad, stride, dilation;
  bool channels_last = false;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
};

std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims, bool channels_last) {
  const size_t n = dims.size();
  std::vector<size_t> order(n);  // innermost last
  if (channels_last) {
    order[0] = 0;
    for (size_t i = 2; i < n; ++i) order[i - 1] = i;
    order[n - 1] = 1;
  } else {
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }
  std::vector<int64_t> strides(n);
  int64_t s = 1;
  for (size_t k = n; k-- > 0;) {
    strides[order[k]] = s;
    s *= dims[order[k]];
  }
  return strides;
}

// A framework driving the graph API, seen by the shadow (only successful calls are reported).
class Frontend {
 public:
  explicit Frontend(BackendShadow& s, uintptr_t base = 0x10000) : s_(s), next_(base) {}

  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    auto d = reinterpret_cast<cudnnBackendDescriptor_t>(next_);
    next_ += 16;
    s_.created(d, type);
    created_.push_back(d);
    return d;
  }
  template <typename T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           const std::vector<T>& values) {
    s_.set(d, name, type, static_cast<int64_t>(values.size()), values.data());
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    s_.set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }

  cudnnBackendDescriptor_t tensor(int64_t uid, const std::vector<int64_t>& dims, bool channels_last,
                                  cudnnDataType_t dtype) {
    auto t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set<cudnnDataType_t>(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, {dtype});
    set<int64_t>(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims);
    set<int64_t>(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, packed_strides(dims, channels_last));
    set<int64_t>(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, {uid});
    set<int64_t>(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, {16});
    return t;
  }

  cudnnBackendDescriptor_t conv(const Shape& s, const std::vector<int64_t>& post_pad = {}) {
    auto c = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    set<int64_t>(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, {static_cast<int64_t>(s.pad.size())});
    set<cudnnDataType_t>(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, {CUDNN_DATA_FLOAT});
    set<cudnnConvolutionMode_t>(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE,
                                {CUDNN_CROSS_CORRELATION});
    set<int64_t>(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, s.pad);
    set<int64_t>(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, post_pad.empty() ? s.pad : post_pad);
    set<int64_t>(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, s.stride);
    set<int64_t>(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, s.dilation);
    return c;
  }

  // One convolution operation of `kind` in a graph, heuristics, the first engine configuration
  // they give, a plan; the tensor and convolution descriptors destroyed once used, as frameworks do.
  cudnnBackendDescriptor_t plan(ConvKind kind, const Shape& s, const std::vector<int64_t>& post_pad = {}) {
    auto x = tensor(1, s.x, s.channels_last, s.dtype);
    auto w = tensor(2, s.w, s.channels_last, s.dtype);
    auto y = tensor(3, s.y, s.channels_last, s.dtype);
    auto c = conv(s, post_pad);
    cudnnBackendDescriptor_t op;
    if (kind == ConvKind::kForward) {
      op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, c);
      set<float>(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, {1.0f});
      set<float>(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, {0.0f});
    } else if (kind == ConvKind::kBackwardData) {
      op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, x);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, y);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, c);
      set<double>(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_DOUBLE, {2.0});
    } else {
      op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, w);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, y);
      set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, c);
    }
    for (auto d : {x, w, y, c}) destroy(d);
    return plan_of({op});
  }

  cudnnBackendDescriptor_t plan_of(const std::vector<cudnnBackendDescriptor_t>& ops) {
    auto graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set<cudnnBackendDescriptor_t>(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops);
    auto heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    // cudnn-frontend creates the configurations; cuDNN fills them.
    std::vector<cudnnBackendDescriptor_t> cfgs = {create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR),
                                                  create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)};
    s_.got(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, cfgs.data());
    auto engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    s_.got(cfgs[0], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
    const int64_t index = 42;
    s_.got(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    auto plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[0]);
    const int64_t workspace = 1 << 20;
    s_.got(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &workspace);
    for (auto d : ops) destroy(d);
    for (auto d : {graph, heur, cfgs[0], cfgs[1], engine}) destroy(d);
    return plan;
  }

  cudnnBackendDescriptor_t variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                                        void* workspace) {
    auto vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set<int64_t>(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids);
    set<void*>(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers);
    s_.set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    return vp;
  }

  void destroy(cudnnBackendDescriptor_t d) { s_.destroyed(d); }
  void destroy_all() {
    for (auto d : created_) s_.destroyed(d);
  }

 private:
  BackendShadow& s_;
  uintptr_t next_;
  std::vector<cudnnBackendDescriptor_t> created_;
};

template <typename T, void (*destroy)(T)>
struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value) destroy(value);
  }
};
void destroy_tensor(cudnnTensorDescriptor_t d) { cudnnDestroyTensorDescriptor(d); }
void destroy_filter(cudnnFilterDescriptor_t d) { cudnnDestroyFilterDescriptor(d); }
void destroy_conv(cudnnConvolutionDescriptor_t d) { cudnnDestroyConvolutionDescriptor(d); }

// The legacy decoder's fingerprint of the same convolution, from real legacy descriptors.
ConvLayer legacy_layer(const Shape& s, int groups) {
  const auto ints = [](const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); };
  Owned<cudnnTensorDescriptor_t, destroy_tensor> x, y;
  Owned<cudnnFilterDescriptor_t, destroy_filter> w;
  Owned<cudnnConvolutionDescriptor_t, destroy_conv> c;
  REQUIRE(cudnnCreateTensorDescriptor(&x.value) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateTensorDescriptor(&y.value) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateFilterDescriptor(&w.value) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateConvolutionDescriptor(&c.value) == CUDNN_STATUS_SUCCESS);
  const auto xd = ints(s.x), yd = ints(s.y), wd = ints(s.w);
  const auto xs = ints(packed_strides(s.x, s.channels_last)), ys = ints(packed_strides(s.y, s.channels_last));
  REQUIRE(cudnnSetTensorNdDescriptor(x.value, s.dtype, static_cast<int>(xd.size()), xd.data(), xs.data()) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetTensorNdDescriptor(y.value, s.dtype, static_cast<int>(yd.size()), yd.data(), ys.data()) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetFilterNdDescriptor(w.value, s.dtype, s.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                     static_cast<int>(wd.size()), wd.data()) == CUDNN_STATUS_SUCCESS);
  const auto pad = ints(s.pad), stride = ints(s.stride), dil = ints(s.dilation);
  REQUIRE(cudnnSetConvolutionNdDescriptor(c.value, static_cast<int>(pad.size()), pad.data(), stride.data(), dil.data(),
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolutionGroupCount(c.value, groups) == CUDNN_STATUS_SUCCESS);
  auto r = decode_conv_layer(x.value, w.value, c.value, y.value);
  if (!r) FAIL("decode_conv_layer: " << r.error().message);
  return r.value();
}

}  // namespace

TEST_CASE("graph-API shadow: a single-convolution plan decodes to the legacy fingerprint, every kind",
          "[shadow]") {
  const Shape plain{{8, 16, 32, 32}, {32, 16, 3, 3}, {8, 32, 32, 32}, {1, 1}, {1, 1}, {1, 1}};
  const Shape strided_nhwc{{4, 32, 56, 56}, {64, 32, 1, 1}, {4, 64, 28, 28}, {0, 0}, {2, 2}, {1, 1}, true};
  const Shape depthwise{{2, 24, 20, 20}, {24, 1, 5, 5}, {2, 24, 10, 10}, {4, 4}, {2, 2}, {2, 2}};
  const Shape half3d{{2, 8, 6, 10, 10}, {8, 8, 3, 3, 3}, {2, 8, 6, 10, 10}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1},
                     false, CUDNN_DATA_HALF};
  const std::vector<std::pair<Shape, int>> shapes = {{plain, 1}, {strided_nhwc, 1}, {depthwise, 24}, {half3d, 1}};
  for (const auto& [shape, groups] : shapes) {
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      BackendShadow s;
      Frontend f(s);
      const auto plan = f.plan(kind, shape);
      int x = 0, w = 0, y = 0, ws = 0;
      const auto vp = f.variant_pack({3, 1, 2}, {&y, &x, &w}, &ws);
      const GraphKind expected = kind == ConvKind::kForward        ? GraphKind::kConvForward
                                 : kind == ConvKind::kBackwardData ? GraphKind::kConvBackwardData
                                                                   : GraphKind::kConvBackwardFilter;
      CHECK(s.classify(plan) == expected);
      const auto g = s.convolution(plan, vp);
      REQUIRE(g);
      CHECK(g->kind == kind);
      ConvLayer want = legacy_layer(shape, groups);
      INFO(conv_kind_name(kind) << ": graph " << g->layer.to_string() << "\nlegacy " << want.to_string());
      want.conv.math_type = -1;  // chosen by the engine in the graph API
      CHECK(g->layer == want);
      CHECK(g->x == reinterpret_cast<uintptr_t>(&x));
      CHECK(g->w == reinterpret_cast<uintptr_t>(&w));
      CHECK(g->y == reinterpret_cast<uintptr_t>(&y));
      CHECK(g->workspace == reinterpret_cast<uintptr_t>(&ws));
      CHECK(g->workspace_bytes == std::optional<int64_t>(1 << 20));
      CHECK(g->engine == 42);
      CHECK(g->alpha == (kind == ConvKind::kBackwardData ? 2.0 : 1.0));
      f.destroy_all();
      CHECK(s.size() == 0);  // nothing kept once every descriptor is destroyed
    }
  }
}

TEST_CASE("graph-API shadow: other graphs, unseen plans and asymmetric padding are told apart and counted",
          "[shadow]") {
  BackendShadow s;
  Frontend f(s);
  const Shape plain{{8, 16, 32, 32}, {32, 16, 3, 3}, {8, 32, 32, 32}, {1, 1}, {1, 1}, {1, 1}};
  // A convolution fused with a pointwise bias: two operations.
  auto x = f.tensor(1, plain.x, false, CUDNN_DATA_FLOAT);
  auto w = f.tensor(2, plain.w, false, CUDNN_DATA_FLOAT);
  auto y = f.tensor(3, plain.y, false, CUDNN_DATA_FLOAT);
  auto conv_op = f.create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  f.set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
  f.set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
  f.set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
  f.set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, f.conv(plain));
  auto bias_op = f.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  const auto fused = f.plan_of({conv_op, bias_op});
  CHECK(s.classify(fused) == GraphKind::kOther);
  CHECK_FALSE(s.convolution(fused, nullptr));
  // A lone pointwise operation (a norm, an activation).
  const auto pointwise = f.plan_of({f.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)});
  CHECK(s.classify(pointwise) == GraphKind::kOther);
  // A plan loaded from JSON, and one the shadow never saw.
  auto json_plan = f.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  const char text[] = "{}";
  s.set(json_plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 2, text);
  CHECK(s.classify(json_plan) == GraphKind::kUnknown);
  CHECK(s.classify(reinterpret_cast<cudnnBackendDescriptor_t>(uintptr_t{0xdead0})) == GraphKind::kUnknown);
  // Asymmetric padding: a convolution, but no legacy fingerprint.
  const auto asym = f.plan(ConvKind::kForward, plain, {2, 2});
  CHECK(s.classify(asym) == GraphKind::kConvForward);
  CHECK_FALSE(s.convolution(asym, nullptr));
  // A variant pack that does not name every tensor: the missing pointers stay 0.
  const auto plan = f.plan(ConvKind::kForward, plain);
  int only_x = 0;
  const auto g = s.convolution(plan, f.variant_pack({1}, {&only_x}, nullptr));
  REQUIRE(g);
  CHECK(g->x == reinterpret_cast<uintptr_t>(&only_x));
  CHECK(g->w == 0);
  CHECK(g->y == 0);

  for (GraphKind k : {GraphKind::kConvForward, GraphKind::kConvForward, GraphKind::kOther, GraphKind::kUnknown})
    s.count_execution(k);
  CHECK(s.executions(GraphKind::kConvForward) == 2);
  CHECK(s.summary() ==
        "graph_api: conv_fwd_plans=2 conv_bwd_data_plans=0 conv_bwd_filter_plans=0 other_plans=1 unknown_plans=1");
  f.destroy_all();
  CHECK(s.size() == 0);
}

TEST_CASE("graph-API shadow: plans built and run on several threads at once", "[shadow][threads]") {
  BackendShadow s;
  const Shape plain{{8, 16, 32, 32}, {32, 16, 3, 3}, {8, 32, 32, 32}, {1, 1}, {1, 1}, {1, 1}};
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Frontend f(s, 0x100000ull * (t + 1));
      for (int i = 0; i < 200; ++i) {
        const ConvKind kind = static_cast<ConvKind>(i % 3);
        const auto plan = f.plan(kind, plain);
        int x = 0, w = 0, y = 0;
        const auto g = s.convolution(plan, f.variant_pack({1, 2, 3}, {&x, &w, &y}, nullptr));
        if (!g || g->kind != kind || g->x != reinterpret_cast<uintptr_t>(&x)) ++wrong;
        f.destroy_all();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(s.size() == 0);
}

// The shadow runs on every graph-API call PyTorch makes (about seven per convolution executed:
// a variant pack created, three attributes, finalize, execute, destroy). Its cost per call:
TEST_CASE("graph-API shadow: cost per backend call", "[shadow][cost]") {
  BackendShadow s;
  Frontend f(s);
  const Shape plain{{8, 16, 32, 32}, {32, 16, 3, 3}, {8, 32, 32, 32}, {1, 1}, {1, 1}, {1, 1}};
  const auto plan = f.plan(ConvKind::kForward, plain);
  int x = 0, w = 0, y = 0, ws = 0;
  const std::vector<int64_t> uids{1, 2, 3};
  const std::vector<void*> pointers{&x, &w, &y};
  void* workspace = &ws;
  constexpr int kRounds = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {  // what one convolution execution costs in shadow calls
    const auto vp = reinterpret_cast<cudnnBackendDescriptor_t>(uintptr_t{0x900000} + (i % 64) * 16);
    s.created(vp, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    s.set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data());
    s.set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers.data());
    s.set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    s.count_execution(s.classify(plan));
    s.destroyed(vp);
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  const double per_call = ns / kRounds / 6;
  WARN("graph-API shadow: " << per_call << " ns per backend call (" << ns / kRounds << " ns per convolution run)");
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)  // sanitizers slow every access 10-50x
  CHECK(per_call < 2000);  // far below a convolution's launch cost; a regression to a scan would show
#endif
  CHECK(s.executions(GraphKind::kConvForward) == kRounds);
}
