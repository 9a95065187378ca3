// ConvLayer: the full fingerprint of one cuDNN convolution (x, w, y and the convolution
// descriptor), read back from cuDNN's descriptors by runtime/decode_conv.cpp. Plain data, no CUDA
// headers: enum fields hold cuDNN's ABI values (stable integers, checked against cudnn.h there).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace vcudnn {

inline constexpr int kMaxDims = 8;  // CUDNN_DIM_MAX

// Which of the three convolution computations a call performs. One ConvLayer serves all three:
// backward-data reads (w, dy) and writes dx = x's shape; backward-filter reads (x, dy), writes dw.
enum class ConvKind : uint8_t { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
std::string_view conv_kind_name(ConvKind kind);  // "fwd", "bwd_data", "bwd_filter"

struct TensorFingerprint {
  int32_t dtype = -1;  // cudnnDataType_t
  int32_t nb_dims = 0;
  std::array<int64_t, kMaxDims> dims{};
  std::array<int64_t, kMaxDims> strides{};

  bool operator==(const TensorFingerprint&) const = default;
  // "NCHW" / "NHWC" when densely packed in that order (any rank), "strided" otherwise.
  std::string layout() const;
};

struct FilterFingerprint {
  int32_t dtype = -1;   // cudnnDataType_t
  int32_t format = -1;  // cudnnTensorFormat_t
  int32_t nb_dims = 0;
  std::array<int64_t, kMaxDims> dims{};

  bool operator==(const FilterFingerprint&) const = default;
};

struct ConvFingerprint {
  int32_t spatial_dims = 0;
  std::array<int32_t, kMaxDims> pad{};
  std::array<int32_t, kMaxDims> stride{};
  std::array<int32_t, kMaxDims> dilation{};
  int32_t mode = -1;          // cudnnConvolutionMode_t
  int32_t compute_type = -1;  // cudnnDataType_t
  int32_t groups = 1;
  int32_t math_type = -1;    // cudnnMathType_t
  int32_t reorder_type = 0;  // cudnnReorderType_t

  bool operator==(const ConvFingerprint&) const = default;
};

struct ConvLayer {
  TensorFingerprint x;  // input (dx for backward-data)
  FilterFingerprint w;  // filter (dw for backward-filter)
  TensorFingerprint y;  // output (dy for the backward kinds)
  ConvFingerprint conv;

  bool operator==(const ConvLayer&) const = default;
  // Hash over every field: two layers that differ anywhere hash differently (with 2^-64 odds).
  uint64_t hash() const;
  // One line for logs, e.g. "x=f32[8,3,32,32]NCHW w=f32[16,3,3,3]NCHW y=... pad=1,1 ...".
  std::string to_string() const;
};

// Names of cuDNN enum values for logs and JSON ("f32", "bf16", "NHWC", "tensor_op" ...).
std::string dtype_name(int32_t dtype);
std::string format_name(int32_t format);
std::string math_type_name(int32_t math);
std::string conv_mode_name(int32_t mode);

void to_json(nlohmann::json& j, const ConvLayer& layer);
void from_json(const nlohmann::json& j, ConvLayer& layer);

}  // namespace vcudnn

template <>
struct std::hash<vcudnn::ConvLayer> {
  size_t operator()(const vcudnn::ConvLayer& layer) const noexcept { return layer.hash(); }
};
