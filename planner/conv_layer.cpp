// ConvLayer hashing, readable form and JSON. The JSON keeps every field (numbers are cuDNN's
// enum values) plus readable names that from_json ignores.
#include "planner/conv_layer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>

#include "planner/json_read.h"
#include "planner/mix64.h"

namespace vcudnn {
namespace {

// Combines field by field through splitmix64's finaliser, so that nothing is lost.
uint64_t mix(uint64_t h, uint64_t v) { return mix64(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2))); }

template <typename Array>
uint64_t mix_array(uint64_t h, const Array& a, int n) {
  h = mix(h, static_cast<uint64_t>(n));
  for (int i = 0; i < n; ++i) h = mix(h, static_cast<uint64_t>(a[i]));
  return h;
}

template <typename Array>
std::string join(const Array& a, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(a[i]);
  }
  return s;
}

std::string name_or_number(const char* const* names, size_t count, int32_t v, const char* what) {
  if (v >= 0 && static_cast<size_t>(v) < count && names[v]) return names[v];
  return std::string(what) + "#" + std::to_string(v);
}

template <typename Array>
std::vector<int64_t> to_vector(const Array& a, int n) {
  return std::vector<int64_t>(a.begin(), a.begin() + std::clamp(n, 0, kMaxDims));
}

template <typename Array>
void from_vector(const nlohmann::json& j, Array& a, int32_t* n) {
  if (!j.is_array()) json_read::refuse(j, "dims", "not an array");
  if (j.size() > static_cast<size_t>(kMaxDims)) throw nlohmann::json::other_error::create(501, "too many dims", &j);
  std::vector<int64_t> v;
  for (const auto& e : j) v.push_back(json_read::integer<int64_t>(e, "dims[]"));
  a.fill(0);
  std::copy(v.begin(), v.end(), a.begin());
  if (n) *n = static_cast<int32_t>(v.size());
}

void tensor_to_json(nlohmann::json& j, const TensorFingerprint& t) {
  j = {{"dtype", t.dtype},
       {"dims", to_vector(t.dims, t.nb_dims)},
       {"strides", to_vector(t.strides, t.nb_dims)},
       {"dtype_name", dtype_name(t.dtype)},
       {"layout", t.layout()}};
}

void tensor_from_json(const nlohmann::json& j, TensorFingerprint& t) {
  t.dtype = json_read::integer_at<int32_t>(j, "dtype");
  from_vector(j.at("dims"), t.dims, &t.nb_dims);
  int32_t n = 0;
  from_vector(j.at("strides"), t.strides, &n);
  if (n != t.nb_dims) throw nlohmann::json::other_error::create(501, "dims and strides differ in rank", &j);
}

}  // namespace

std::string_view conv_kind_name(ConvKind kind) {
  switch (kind) {
    case ConvKind::kForward:
      return "fwd";
    case ConvKind::kBackwardData:
      return "bwd_data";
    case ConvKind::kBackwardFilter:
      return "bwd_filter";
  }
  return "?";
}

std::string TensorFingerprint::layout() const {
  if (nb_dims < 3) return "strided";
  // Order of dimensions from outermost to innermost for NCHW (0,1,2,..) and NHWC (0,2,..,1).
  std::vector<int> nchw(nb_dims), nhwc;
  std::iota(nchw.begin(), nchw.end(), 0);
  nhwc.push_back(0);
  for (int d = 2; d < nb_dims; ++d) nhwc.push_back(d);
  nhwc.push_back(1);
  auto packed = [&](const std::vector<int>& order) {
    int64_t expect = 1;
    for (int i = nb_dims - 1; i >= 0; --i) {
      int d = order[i];
      if (dims[d] != 1 && strides[d] != expect) return false;
      expect *= dims[d];
    }
    return true;
  };
  if (packed(nchw)) return "NCHW";
  if (packed(nhwc)) return "NHWC";
  return "strided";
}

uint64_t ConvLayer::hash() const {
  uint64_t h = 0x76637564'6e6e0001ULL;
  for (const TensorFingerprint* t : {&x, &y}) {
    h = mix(h, static_cast<uint64_t>(t->dtype));
    h = mix_array(h, t->dims, t->nb_dims);
    h = mix_array(h, t->strides, t->nb_dims);
  }
  h = mix(h, static_cast<uint64_t>(w.dtype));
  h = mix(h, static_cast<uint64_t>(w.format));
  h = mix_array(h, w.dims, w.nb_dims);
  h = mix_array(h, conv.pad, conv.spatial_dims);
  h = mix_array(h, conv.stride, conv.spatial_dims);
  h = mix_array(h, conv.dilation, conv.spatial_dims);
  for (int32_t v : {conv.mode, conv.compute_type, conv.groups, conv.math_type, conv.reorder_type})
    h = mix(h, static_cast<uint64_t>(v));
  return h;
}

std::string dtype_name(int32_t dtype) {
  static const char* const kNames[] = {"f32",     "f64",     "f16",     "i8",      "i32",
                                       "i8x4",    "u8",      "u8x4",    "i8x32",   "bf16",
                                       "i64",     "bool",    "fp8e4m3", "fp8e5m2", "fast_float_for_fp8",
                                       "fp8e8m0", "fp4e2m1", "i4",      "u4",      "u32",
                                       "c32",     "c64"};
  return name_or_number(kNames, std::size(kNames), dtype, "dtype");
}

std::string format_name(int32_t format) {
  static const char* const kNames[] = {"NCHW", "NHWC", "NCHW_VECT_C"};
  return name_or_number(kNames, std::size(kNames), format, "format");
}

std::string math_type_name(int32_t math) {
  static const char* const kNames[] = {"default", "tensor_op", "tensor_op_allow_conversion", "fma"};
  return name_or_number(kNames, std::size(kNames), math, "math");
}

std::string conv_mode_name(int32_t mode) {
  static const char* const kNames[] = {"convolution", "cross_correlation"};
  return name_or_number(kNames, std::size(kNames), mode, "mode");
}

std::string ConvLayer::to_string() const {
  auto tensor = [](const TensorFingerprint& t) {
    return dtype_name(t.dtype) + "[" + join(t.dims, t.nb_dims) + "]" + t.layout();
  };
  std::string s = "x=" + tensor(x) + " w=" + dtype_name(w.dtype) + "[" + join(w.dims, w.nb_dims) + "]" +
                  format_name(w.format) + " y=" + tensor(y);
  s += " pad=" + join(conv.pad, conv.spatial_dims) + " stride=" + join(conv.stride, conv.spatial_dims) +
       " dil=" + join(conv.dilation, conv.spatial_dims) + " groups=" + std::to_string(conv.groups) + " " +
       conv_mode_name(conv.mode) + " compute=" + dtype_name(conv.compute_type) +
       " math=" + math_type_name(conv.math_type);
  if (conv.reorder_type != 0) s += " reorder=" + std::to_string(conv.reorder_type);
  return s;
}

void to_json(nlohmann::json& j, const ConvLayer& layer) {
  nlohmann::json x, y;
  tensor_to_json(x, layer.x);
  tensor_to_json(y, layer.y);
  const auto& c = layer.conv;
  j = {{"x", x},
       {"w",
        {{"dtype", layer.w.dtype},
         {"format", layer.w.format},
         {"dims", to_vector(layer.w.dims, layer.w.nb_dims)},
         {"dtype_name", dtype_name(layer.w.dtype)},
         {"format_name", format_name(layer.w.format)}}},
       {"y", y},
       {"conv",
        {{"pad", to_vector(c.pad, c.spatial_dims)},
         {"stride", to_vector(c.stride, c.spatial_dims)},
         {"dilation", to_vector(c.dilation, c.spatial_dims)},
         {"mode", c.mode},
         {"compute_type", c.compute_type},
         {"groups", c.groups},
         {"math_type", c.math_type},
         {"reorder_type", c.reorder_type},
         {"mode_name", conv_mode_name(c.mode)},
         {"math_type_name", math_type_name(c.math_type)}}},
       {"hash", layer.hash()},
       {"text", layer.to_string()}};
}

void from_json(const nlohmann::json& j, ConvLayer& layer) {
  layer = ConvLayer{};
  tensor_from_json(j.at("x"), layer.x);
  tensor_from_json(j.at("y"), layer.y);
  const auto& w = j.at("w");
  layer.w.dtype = json_read::integer_at<int32_t>(w, "dtype");
  layer.w.format = json_read::integer_at<int32_t>(w, "format");
  from_vector(w.at("dims"), layer.w.dims, &layer.w.nb_dims);
  const auto& c = j.at("conv");
  from_vector(c.at("pad"), layer.conv.pad, &layer.conv.spatial_dims);
  int32_t n_stride = 0, n_dilation = 0;
  from_vector(c.at("stride"), layer.conv.stride, &n_stride);
  from_vector(c.at("dilation"), layer.conv.dilation, &n_dilation);
  if (n_stride != layer.conv.spatial_dims || n_dilation != layer.conv.spatial_dims)
    throw nlohmann::json::other_error::create(501, "pad, stride and dilation differ in rank", &c);
  layer.conv.mode = json_read::integer_at<int32_t>(c, "mode");
  layer.conv.compute_type = json_read::integer_at<int32_t>(c, "compute_type");
  layer.conv.groups = json_read::integer_at<int32_t>(c, "groups");
  layer.conv.math_type = json_read::integer_at<int32_t>(c, "math_type");
  layer.conv.reorder_type = json_read::integer_or<int32_t>(c, "reorder_type", 0);
}

}  // namespace vcudnn
