// decode_conv_layer() over real cuDNN descriptors (no GPU needed), and ConvLayer's equality, hash,
// JSON round trip and readable form.
#include <catch2/catch.hpp>

#include <cudnn.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/conv_layer.h"
#include "runtime/decode_conv.h"

namespace {

using vcudnn::ConvLayer;

// RAII owners of the three descriptor kinds; every cuDNN status is checked.
class TensorDesc {
 public:
  TensorDesc() { REQUIRE(cudnnCreateTensorDescriptor(&d_) == CUDNN_STATUS_SUCCESS); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc() { REQUIRE(cudnnCreateFilterDescriptor(&d_) == CUDNN_STATUS_SUCCESS); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc() { REQUIRE(cudnnCreateConvolutionDescriptor(&d_) == CUDNN_STATUS_SUCCESS); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

// The four descriptors of one convolution.
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;

  ConvLayer decode() const {
    auto r = vcudnn::decode_conv_layer(x.get(), w.get(), conv.get(), y.get());
    if (!r) FAIL("decode_conv_layer: " << r.error().message);
    return r.value();
  }
};

// A plain 2-D convolution: x N,C,H,W (format), w K,C,R,S, y computed by cuDNN's formula.
void set_2d(ConvDescs& d, cudnnTensorFormat_t format, cudnnDataType_t dtype, int n, int c, int h, int w, int k, int r,
            int s, int pad, int stride, int dilation, cudnnDataType_t compute) {
  REQUIRE(cudnnSetTensor4dDescriptor(d.x.get(), format, dtype, n, c, h, w) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetFilter4dDescriptor(d.w.get(), dtype, format, k, c, r, s) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolution2dDescriptor(d.conv.get(), pad, pad, stride, stride, dilation, dilation,
                                          CUDNN_CROSS_CORRELATION, compute) == CUDNN_STATUS_SUCCESS);
  int on = 0, oc = 0, oh = 0, ow = 0;
  REQUIRE(cudnnGetConvolution2dForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), &on, &oc, &oh, &ow) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetTensor4dDescriptor(d.y.get(), format, dtype, on, oc, oh, ow) == CUDNN_STATUS_SUCCESS);
}

// Fully distinct values in every field: x f16 NHWC 8x16x20x24, w 32x4x3x5 (4 groups), asymmetric
// pad/stride/dilation, convolution mode, tensor-op math, no-reorder.
void set_rich_2d(ConvDescs& d) {
  REQUIRE(cudnnSetTensor4dDescriptor(d.x.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, 8, 16, 20, 24) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetFilter4dDescriptor(d.w.get(), CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, 32, 4, 3, 5) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolution2dDescriptor(d.conv.get(), 1, 2, 2, 1, 1, 2, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolutionGroupCount(d.conv.get(), 4) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolutionMathType(d.conv.get(), CUDNN_TENSOR_OP_MATH) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolutionReorderType(d.conv.get(), CUDNN_NO_REORDER) == CUDNN_STATUS_SUCCESS);
  // y: (20 + 2 - 3) / 2 + 1 = 10, (24 + 4 - 2*4 - 1) / 1 + 1 = 20.
  REQUIRE(cudnnSetTensor4dDescriptor(d.y.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, 8, 32, 10, 20) ==
          CUDNN_STATUS_SUCCESS);
}

// A 3-D convolution (5-dim tensors): x 2x3x8x10x12 packed NCDHW, w 6x3x3x3x3.
void set_3d(ConvDescs& d) {
  const int xdims[5] = {2, 3, 8, 10, 12};
  const int xstrides[5] = {3 * 8 * 10 * 12, 8 * 10 * 12, 10 * 12, 12, 1};
  REQUIRE(cudnnSetTensorNdDescriptor(d.x.get(), CUDNN_DATA_FLOAT, 5, xdims, xstrides) == CUDNN_STATUS_SUCCESS);
  const int wdims[5] = {6, 3, 3, 3, 3};
  REQUIRE(cudnnSetFilterNdDescriptor(d.w.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 5, wdims) == CUDNN_STATUS_SUCCESS);
  const int pad[3] = {1, 0, 2}, stride[3] = {1, 2, 1}, dil[3] = {1, 1, 2};
  REQUIRE(cudnnSetConvolutionNdDescriptor(d.conv.get(), 3, pad, stride, dil, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolutionMathType(d.conv.get(), CUDNN_FMA_MATH) == CUDNN_STATUS_SUCCESS);
  int ydims[5] = {};
  REQUIRE(cudnnGetConvolutionNdForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), 5, ydims) == CUDNN_STATUS_SUCCESS);
  // 8+2-3+1 = 8, (10-3)/2+1 = 4, 12+4-5+1 = 12
  REQUIRE(ydims[0] == 2);
  REQUIRE(ydims[1] == 6);
  REQUIRE(ydims[2] == 8);
  REQUIRE(ydims[3] == 4);
  REQUIRE(ydims[4] == 12);
  const int ystrides[5] = {6 * 8 * 4 * 12, 8 * 4 * 12, 4 * 12, 12, 1};
  REQUIRE(cudnnSetTensorNdDescriptor(d.y.get(), CUDNN_DATA_FLOAT, 5, ydims, ystrides) == CUDNN_STATUS_SUCCESS);
}

template <typename Array>
std::vector<int64_t> head(const Array& a, int n) {
  return std::vector<int64_t>(a.begin(), a.begin() + n);
}

// "name[i]" (appended piece by piece: GCC 12's -Wrestrict misfires on operator+ chains).
std::string field(std::string name, int i) {
  name += '[';
  name += std::to_string(i);
  name += ']';
  return name;
}

// Every single-field change of `base`, each with a name for failure messages.
std::vector<std::pair<std::string, std::function<void(ConvLayer&)>>> single_field_changes(const ConvLayer& base) {
  std::vector<std::pair<std::string, std::function<void(ConvLayer&)>>> out;
  for (const auto& tensor : {std::pair{"x", &ConvLayer::x}, std::pair{"y", &ConvLayer::y}}) {
    const std::string t = tensor.first;
    const auto member = tensor.second;
    out.push_back({t + ".dtype", [member](ConvLayer& l) { (l.*member).dtype = CUDNN_DATA_BFLOAT16; }});
    for (int i = 0; i < (base.*member).nb_dims; ++i) {
      out.push_back({field(t + ".dims", i), [member, i](ConvLayer& l) { (l.*member).dims[i] += 1; }});
      out.push_back({field(t + ".strides", i), [member, i](ConvLayer& l) { (l.*member).strides[i] += 1; }});
    }
  }
  out.push_back({"w.dtype", [](ConvLayer& l) { l.w.dtype = CUDNN_DATA_BFLOAT16; }});
  out.push_back({"w.format", [](ConvLayer& l) { l.w.format = l.w.format == 0 ? 1 : 0; }});
  for (int i = 0; i < base.w.nb_dims; ++i) out.push_back({field("w.dims", i), [i](ConvLayer& l) { l.w.dims[i] += 1; }});
  for (int i = 0; i < base.conv.spatial_dims; ++i) {
    out.push_back({field("conv.pad", i), [i](ConvLayer& l) { l.conv.pad[i] += 1; }});
    out.push_back({field("conv.stride", i), [i](ConvLayer& l) { l.conv.stride[i] += 1; }});
    out.push_back({field("conv.dilation", i), [i](ConvLayer& l) { l.conv.dilation[i] += 1; }});
  }
  out.push_back({"conv.mode", [](ConvLayer& l) { l.conv.mode = 1 - l.conv.mode; }});
  out.push_back({"conv.compute_type", [](ConvLayer& l) { l.conv.compute_type = CUDNN_DATA_DOUBLE; }});
  out.push_back({"conv.groups", [](ConvLayer& l) { l.conv.groups += 1; }});
  out.push_back({"conv.math_type", [](ConvLayer& l) { l.conv.math_type = (l.conv.math_type + 1) % 4; }});
  out.push_back({"conv.reorder_type", [](ConvLayer& l) { l.conv.reorder_type = 1 - l.conv.reorder_type; }});
  return out;
}

}  // namespace

TEST_CASE("decode_conv_layer reads back every field of a 2-D convolution", "[conv_layer]") {
  ConvDescs d;
  set_rich_2d(d);
  const ConvLayer l = d.decode();

  CHECK(l.x.dtype == CUDNN_DATA_HALF);
  REQUIRE(l.x.nb_dims == 4);
  CHECK(head(l.x.dims, 4) == std::vector<int64_t>{8, 16, 20, 24});
  // NHWC packed: n = H*W*C, c = 1, h = W*C, w = C.
  CHECK(head(l.x.strides, 4) == std::vector<int64_t>{20 * 24 * 16, 1, 24 * 16, 16});
  CHECK(l.x.layout() == "NHWC");

  CHECK(l.y.dtype == CUDNN_DATA_HALF);
  REQUIRE(l.y.nb_dims == 4);
  CHECK(head(l.y.dims, 4) == std::vector<int64_t>{8, 32, 10, 20});
  CHECK(head(l.y.strides, 4) == std::vector<int64_t>{10 * 20 * 32, 1, 20 * 32, 32});
  CHECK(l.y.layout() == "NHWC");

  CHECK(l.w.dtype == CUDNN_DATA_HALF);
  CHECK(l.w.format == CUDNN_TENSOR_NHWC);
  REQUIRE(l.w.nb_dims == 4);
  CHECK(head(l.w.dims, 4) == std::vector<int64_t>{32, 4, 3, 5});

  REQUIRE(l.conv.spatial_dims == 2);
  CHECK(l.conv.pad[0] == 1);
  CHECK(l.conv.pad[1] == 2);
  CHECK(l.conv.stride[0] == 2);
  CHECK(l.conv.stride[1] == 1);
  CHECK(l.conv.dilation[0] == 1);
  CHECK(l.conv.dilation[1] == 2);
  CHECK(l.conv.mode == CUDNN_CONVOLUTION);
  CHECK(l.conv.compute_type == CUDNN_DATA_FLOAT);
  CHECK(l.conv.groups == 4);
  CHECK(l.conv.math_type == CUDNN_TENSOR_OP_MATH);
  CHECK(l.conv.reorder_type == CUDNN_NO_REORDER);

  // Nothing beyond the rank is set (equality compares whole arrays).
  for (int i = 4; i < vcudnn::kMaxDims; ++i) {
    CHECK(l.x.dims[i] == 0);
    CHECK(l.x.strides[i] == 0);
    CHECK(l.w.dims[i] == 0);
  }
  for (int i = 2; i < vcudnn::kMaxDims; ++i) CHECK(l.conv.pad[i] == 0);

  // Decoding is deterministic.
  CHECK(d.decode() == l);
}

TEST_CASE("decode_conv_layer: defaults of a plain NCHW float convolution", "[conv_layer]") {
  ConvDescs d;
  set_2d(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 9, 7, 5, 3, 3, 1, 1, 1, CUDNN_DATA_FLOAT);
  const ConvLayer l = d.decode();
  CHECK(l.x.dtype == CUDNN_DATA_FLOAT);
  CHECK(head(l.x.dims, 4) == std::vector<int64_t>{2, 3, 9, 7});
  CHECK(head(l.x.strides, 4) == std::vector<int64_t>{3 * 9 * 7, 9 * 7, 7, 1});
  CHECK(l.x.layout() == "NCHW");
  CHECK(head(l.y.dims, 4) == std::vector<int64_t>{2, 5, 9, 7});
  CHECK(l.y.layout() == "NCHW");
  CHECK(l.w.format == CUDNN_TENSOR_NCHW);
  CHECK(head(l.w.dims, 4) == std::vector<int64_t>{5, 3, 3, 3});
  CHECK(l.conv.mode == CUDNN_CROSS_CORRELATION);
  CHECK(l.conv.groups == 1);
  CHECK(l.conv.math_type == CUDNN_DEFAULT_MATH);
  CHECK(l.conv.reorder_type == CUDNN_DEFAULT_REORDER);
}

TEST_CASE("decode_conv_layer: a non-packed strided tensor has layout \"strided\"", "[conv_layer]") {
  ConvDescs d;
  set_2d(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 4, 5, 6, 1, 1, 0, 1, 1, CUDNN_DATA_FLOAT);
  // Rows padded from 5 to 8 elements.
  REQUIRE(cudnnSetTensor4dDescriptorEx(d.x.get(), CUDNN_DATA_FLOAT, 2, 3, 4, 5, 3 * 4 * 8, 4 * 8, 8, 1) ==
          CUDNN_STATUS_SUCCESS);
  const ConvLayer l = d.decode();
  CHECK(head(l.x.dims, 4) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(head(l.x.strides, 4) == std::vector<int64_t>{96, 32, 8, 1});
  CHECK(l.x.layout() == "strided");
  CHECK(l.y.layout() == "NCHW");

  // The same dims, packed, is NCHW and a different layer.
  ConvDescs packed;
  set_2d(packed, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 4, 5, 6, 1, 1, 0, 1, 1, CUDNN_DATA_FLOAT);
  const ConvLayer p = packed.decode();
  CHECK(p.x.layout() == "NCHW");
  CHECK(p != l);
  CHECK(p.hash() != l.hash());
}

TEST_CASE("decode_conv_layer: a 3-D convolution (5-dim tensors)", "[conv_layer]") {
  ConvDescs d;
  set_3d(d);
  const ConvLayer l = d.decode();
  REQUIRE(l.x.nb_dims == 5);
  CHECK(l.x.dtype == CUDNN_DATA_FLOAT);
  CHECK(head(l.x.dims, 5) == std::vector<int64_t>{2, 3, 8, 10, 12});
  CHECK(head(l.x.strides, 5) == std::vector<int64_t>{2880, 960, 120, 12, 1});
  CHECK(l.x.layout() == "NCHW");
  REQUIRE(l.y.nb_dims == 5);
  CHECK(head(l.y.dims, 5) == std::vector<int64_t>{2, 6, 8, 4, 12});
  CHECK(head(l.y.strides, 5) == std::vector<int64_t>{2304, 384, 48, 12, 1});
  REQUIRE(l.w.nb_dims == 5);
  CHECK(l.w.dtype == CUDNN_DATA_FLOAT);
  CHECK(l.w.format == CUDNN_TENSOR_NCHW);
  CHECK(head(l.w.dims, 5) == std::vector<int64_t>{6, 3, 3, 3, 3});
  REQUIRE(l.conv.spatial_dims == 3);
  CHECK(head(l.conv.pad, 3) == std::vector<int64_t>{1, 0, 2});
  CHECK(head(l.conv.stride, 3) == std::vector<int64_t>{1, 2, 1});
  CHECK(head(l.conv.dilation, 3) == std::vector<int64_t>{1, 1, 2});
  CHECK(l.conv.mode == CUDNN_CROSS_CORRELATION);
  CHECK(l.conv.compute_type == CUDNN_DATA_FLOAT);
  CHECK(l.conv.groups == 1);
  CHECK(l.conv.math_type == CUDNN_FMA_MATH);
}

TEST_CASE("decode_conv_layer: null descriptors give an error", "[conv_layer]") {
  ConvDescs d;
  set_2d(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 5, 5, 2, 3, 3, 1, 1, 1, CUDNN_DATA_FLOAT);
  REQUIRE(vcudnn::decode_conv_layer(d.x.get(), d.w.get(), d.conv.get(), d.y.get()).ok());
  SECTION("x") {
    auto r = vcudnn::decode_conv_layer(nullptr, d.w.get(), d.conv.get(), d.y.get());
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.error().message.empty());
  }
  SECTION("w") {
    auto r = vcudnn::decode_conv_layer(d.x.get(), nullptr, d.conv.get(), d.y.get());
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.error().message.empty());
  }
  SECTION("conv") {
    auto r = vcudnn::decode_conv_layer(d.x.get(), d.w.get(), nullptr, d.y.get());
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.error().message.empty());
  }
  SECTION("y") {
    auto r = vcudnn::decode_conv_layer(d.x.get(), d.w.get(), d.conv.get(), nullptr);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.error().message.empty());
  }
  SECTION("all") {
    auto r = vcudnn::decode_conv_layer(nullptr, nullptr, nullptr, nullptr);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.error().message.empty());
  }
}

TEST_CASE("ConvLayer: changing any single field changes equality and hash", "[conv_layer]") {
  ConvDescs d2, d3;
  set_rich_2d(d2);
  set_3d(d3);
  for (const ConvLayer& base : {d2.decode(), d3.decode()}) {
    INFO("base " << base.to_string());
    const ConvLayer copy = base;
    REQUIRE(copy == base);
    REQUIRE(copy.hash() == base.hash());
    REQUIRE(std::hash<ConvLayer>{}(copy) == std::hash<ConvLayer>{}(base));

    const auto changes = single_field_changes(base);
    // 2 tensors x (dtype + 2 * rank) + w (dtype, format, rank) + conv (3 * spatial + 5).
    REQUIRE(changes.size() ==
            static_cast<size_t>(2 * (1 + 2 * base.x.nb_dims) + 2 + base.w.nb_dims + 3 * base.conv.spatial_dims + 5));
    std::set<uint64_t> hashes = {base.hash()};
    for (const auto& [name, change] : changes) {
      INFO("field " << name);
      ConvLayer m = base;
      change(m);
      CHECK(m != base);
      CHECK_FALSE(m == base);
      CHECK(m.hash() != base.hash());
      CHECK(std::hash<ConvLayer>{}(m) != std::hash<ConvLayer>{}(base));
      hashes.insert(m.hash());
    }
    // And all the changed layers hash differently from one another.
    CHECK(hashes.size() == changes.size() + 1);
  }
}

TEST_CASE("ConvLayer: ResNet-50 1x1 and 3x3 layers of the same shape differ (the µ-cuDNN collision)", "[conv_layer]") {
  ConvDescs one, three;
  set_2d(one, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 32, 64, 56, 56, 64, 1, 1, 0, 1, 1, CUDNN_DATA_FLOAT);
  set_2d(three, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 32, 64, 56, 56, 64, 3, 3, 1, 1, 1, CUDNN_DATA_FLOAT);
  const ConvLayer a = one.decode(), b = three.decode();
  // Same input and output tensors...
  REQUIRE(a.x == b.x);
  REQUIRE(a.y == b.y);
  REQUIRE(head(a.y.dims, 4) == std::vector<int64_t>{32, 64, 56, 56});
  // ...but different layers.
  CHECK(a != b);
  CHECK(a.hash() != b.hash());
  CHECK(a.to_string() != b.to_string());
}

TEST_CASE("ConvLayer: JSON round trip", "[conv_layer]") {
  ConvDescs rich, three, strided;
  set_rich_2d(rich);
  set_3d(three);
  set_2d(strided, CUDNN_TENSOR_NCHW, CUDNN_DATA_DOUBLE, 2, 3, 4, 5, 6, 1, 1, 0, 1, 1, CUDNN_DATA_DOUBLE);
  REQUIRE(cudnnSetTensor4dDescriptorEx(strided.x.get(), CUDNN_DATA_DOUBLE, 2, 3, 4, 5, 100, 32, 8, 1) ==
          CUDNN_STATUS_SUCCESS);
  for (const ConvLayer& layer : {rich.decode(), three.decode(), strided.decode()}) {
    INFO(layer.to_string());
    nlohmann::json j = layer;
    const ConvLayer back = j.get<ConvLayer>();
    CHECK(back == layer);
    CHECK(back.hash() == layer.hash());
    // Through text as well.
    const ConvLayer reparsed = nlohmann::json::parse(j.dump()).get<ConvLayer>();
    CHECK(reparsed == layer);
    CHECK(j.at("hash").get<uint64_t>() == layer.hash());
  }
  // A mismatched rank is rejected, not silently accepted.
  nlohmann::json bad = three.decode();
  bad["x"]["strides"] = {1, 2, 3};
  CHECK_THROWS(bad.get<ConvLayer>());
}

TEST_CASE("ConvLayer::to_string names dtypes, dims and layout", "[conv_layer]") {
  ConvDescs rich, three;
  set_rich_2d(rich);
  set_3d(three);
  const std::string s = rich.decode().to_string();
  INFO(s);
  CHECK_THAT(s, Catch::Contains("x=f16[8,16,20,24]NHWC"));
  CHECK_THAT(s, Catch::Contains("w=f16[32,4,3,5]NHWC"));
  CHECK_THAT(s, Catch::Contains("y=f16[8,32,10,20]NHWC"));
  CHECK_THAT(s, Catch::Contains("pad=1,2"));
  CHECK_THAT(s, Catch::Contains("stride=2,1"));
  CHECK_THAT(s, Catch::Contains("dil=1,2"));
  CHECK_THAT(s, Catch::Contains("groups=4"));
  CHECK_THAT(s, Catch::Contains("compute=f32"));
  CHECK_THAT(s, Catch::Contains("tensor_op"));

  const std::string t = three.decode().to_string();
  INFO(t);
  CHECK_THAT(t, Catch::Contains("x=f32[2,3,8,10,12]NCHW"));
  CHECK_THAT(t, Catch::Contains("w=f32[6,3,3,3,3]NCHW"));
  CHECK_THAT(t, Catch::Contains("y=f32[2,6,8,4,12]NCHW"));
  CHECK_THAT(t, Catch::Contains("pad=1,0,2"));
  CHECK_THAT(t, Catch::Contains("fma"));
}
