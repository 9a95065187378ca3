// A 2-D convolution described by its sizes (PyTorch's arguments), as the ConvLayer fingerprint the
// BackendShadow decodes from a graph-API plan: dense NCHW or channels-last (NHWC) x, w and y.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "planner/conv_layer.h"

namespace vcudnn::test {

struct ConvShape {
  int64_t n = 8, c = 16, k = 32, h = 14, w = 14, r = 3, s = 3;
  int64_t pad = 1, stride = 1, dilation = 1, groups = 1;
  bool nhwc = false;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;

  int64_t p() const { return (h + 2 * pad - dilation * (r - 1) - 1) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - dilation * (s - 1) - 1) / stride + 1; }
  std::array<int64_t, 4> x_dims() const { return {n, c, h, w}; }
  std::array<int64_t, 4> w_dims() const { return {k, c / groups, r, s}; }
  std::array<int64_t, 4> y_dims() const { return {n, k, p(), q()}; }
  std::string name() const {
    std::ostringstream o;
    o << "n" << n << "c" << c << "k" << k << "_" << h << "x" << w << "_r" << r << "u" << stride << "g" << groups
      << (nhwc ? "_nhwc" : "_nchw") << (dtype == CUDNN_DATA_BFLOAT16 ? "_bf16" : "");
    return o.str();
  }
};

// Dense strides of NCHW dims, in NCHW or NHWC memory order.
inline std::array<int64_t, 4> dense_strides(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

inline int64_t elements(const std::array<int64_t, 4>& d) { return d[0] * d[1] * d[2] * d[3]; }

inline ConvLayer conv_layer(const ConvShape& s) {
  ConvLayer l;
  const auto tensor = [&](const std::array<int64_t, 4>& dims) {
    TensorFingerprint t;
    t.dtype = s.dtype;
    t.nb_dims = 4;
    const auto strides = dense_strides(dims, s.nhwc);
    for (int i = 0; i < 4; ++i) {
      t.dims[i] = dims[i];
      t.strides[i] = strides[i];
    }
    return t;
  };
  l.x = tensor(s.x_dims());
  l.y = tensor(s.y_dims());
  l.w.dtype = s.dtype;
  l.w.format = s.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  l.w.nb_dims = 4;
  const auto wd = s.w_dims();
  for (int i = 0; i < 4; ++i) l.w.dims[i] = wd[i];
  l.conv.spatial_dims = 2;
  for (int i = 0; i < 2; ++i) {
    l.conv.pad[i] = static_cast<int32_t>(s.pad);
    l.conv.stride[i] = static_cast<int32_t>(s.stride);
    l.conv.dilation[i] = static_cast<int32_t>(s.dilation);
  }
  l.conv.mode = CUDNN_CROSS_CORRELATION;
  l.conv.compute_type = CUDNN_DATA_FLOAT;
  l.conv.groups = static_cast<int32_t>(s.groups);
  l.conv.math_type = -1;  // the graph API's engine decides
  return l;
}

}  // namespace vcudnn::test
