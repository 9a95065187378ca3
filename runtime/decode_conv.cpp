// Decoding descriptors into ConvLayer. The planner keeps cuDNN's enum values as plain integers;
// the static_asserts pin the values its name tables assume.
#include "runtime/decode_conv.h"

#include <string>

#include "runtime/real_api.h"

namespace vcudnn {

static_assert(CUDNN_DATA_FLOAT == 0 && CUDNN_DATA_HALF == 2 && CUDNN_DATA_BFLOAT16 == 9 && CUDNN_DATA_INT64 == 10);
static_assert(CUDNN_TENSOR_NCHW == 0 && CUDNN_TENSOR_NHWC == 1 && CUDNN_TENSOR_NCHW_VECT_C == 2);
static_assert(CUDNN_DEFAULT_MATH == 0 && CUDNN_TENSOR_OP_MATH == 1 && CUDNN_FMA_MATH == 3);
static_assert(CUDNN_CONVOLUTION == 0 && CUDNN_CROSS_CORRELATION == 1);
static_assert(CUDNN_DIM_MAX == kMaxDims);

namespace {

std::string failed(const char* what, cudnnStatus_t st) {
  return std::string(what) + " failed: " + cudnn_status_name(st);
}

Result<TensorFingerprint> decode_tensor(cudnnTensorDescriptor_t d, const char* what) {
  if (!d) return Error{std::string(what) + " descriptor is null"};
  TensorFingerprint t;
  cudnnDataType_t dtype{};
  int nb = 0, dims[kMaxDims] = {}, strides[kMaxDims] = {};
  cudnnStatus_t st = real().cudnnGetTensorNdDescriptor(d, kMaxDims, &dtype, &nb, dims, strides);
  if (st != CUDNN_STATUS_SUCCESS) return Error{failed("cudnnGetTensorNdDescriptor", st)};
  if (nb < 0 || nb > kMaxDims) return Error{std::string(what) + " has " + std::to_string(nb) + " dims"};
  t.dtype = dtype;
  t.nb_dims = nb;
  for (int i = 0; i < nb; ++i) {
    t.dims[i] = dims[i];
    t.strides[i] = strides[i];
  }
  return t;
}

}  // namespace

const char* cudnn_status_name(cudnnStatus_t status) {
  if (real().cudnnGetErrorString) return real().cudnnGetErrorString(status);
  return "CUDNN_STATUS_?";
}

Result<ConvLayer> decode_conv_layer(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y) {
  const RealCudnn& r = real();
  if (!r.cudnnGetTensorNdDescriptor || !r.cudnnGetFilterNdDescriptor || !r.cudnnGetConvolutionNdDescriptor ||
      !r.cudnnGetConvolutionGroupCount || !r.cudnnGetConvolutionMathType || !r.cudnnGetConvolutionReorderType)
    return Error{"cuDNN descriptor getters are not available"};
  ConvLayer layer;
  auto tx = decode_tensor(x, "x");
  if (!tx) return tx.error();
  auto ty = decode_tensor(y, "y");
  if (!ty) return ty.error();
  layer.x = tx.value();
  layer.y = ty.value();

  if (!w) return Error{"filter descriptor is null"};
  cudnnDataType_t wtype{};
  cudnnTensorFormat_t wformat{};
  int wnb = 0, wdims[kMaxDims] = {};
  cudnnStatus_t st = r.cudnnGetFilterNdDescriptor(w, kMaxDims, &wtype, &wformat, &wnb, wdims);
  if (st != CUDNN_STATUS_SUCCESS) return Error{failed("cudnnGetFilterNdDescriptor", st)};
  if (wnb < 0 || wnb > kMaxDims) return Error{"filter has " + std::to_string(wnb) + " dims"};
  layer.w.dtype = wtype;
  layer.w.format = wformat;
  layer.w.nb_dims = wnb;
  for (int i = 0; i < wnb; ++i) layer.w.dims[i] = wdims[i];

  if (!conv) return Error{"convolution descriptor is null"};
  int n = 0, pad[kMaxDims] = {}, stride[kMaxDims] = {}, dil[kMaxDims] = {};
  cudnnConvolutionMode_t mode{};
  cudnnDataType_t compute{};
  // cuDNN refuses (NOT_SUPPORTED) a requested length above CUDNN_DIM_MAX - 2 spatial dims.
  st = r.cudnnGetConvolutionNdDescriptor(conv, kMaxDims - 2, &n, pad, stride, dil, &mode, &compute);
  if (st != CUDNN_STATUS_SUCCESS) return Error{failed("cudnnGetConvolutionNdDescriptor", st)};
  if (n < 0 || n > kMaxDims) return Error{"convolution has " + std::to_string(n) + " spatial dims"};
  auto& c = layer.conv;
  c.spatial_dims = n;
  for (int i = 0; i < n; ++i) {
    c.pad[i] = pad[i];
    c.stride[i] = stride[i];
    c.dilation[i] = dil[i];
  }
  c.mode = mode;
  c.compute_type = compute;
  cudnnMathType_t math{};
  cudnnReorderType_t reorder{};
  if ((st = r.cudnnGetConvolutionGroupCount(conv, &c.groups)) != CUDNN_STATUS_SUCCESS)
    return Error{failed("cudnnGetConvolutionGroupCount", st)};
  if ((st = r.cudnnGetConvolutionMathType(conv, &math)) != CUDNN_STATUS_SUCCESS)
    return Error{failed("cudnnGetConvolutionMathType", st)};
  if ((st = r.cudnnGetConvolutionReorderType(conv, &reorder)) != CUDNN_STATUS_SUCCESS)
    return Error{failed("cudnnGetConvolutionReorderType", st)};
  c.math_type = math;
  c.reorder_type = reorder;
  return layer;
}

double read_scaling(const void* p, int32_t data_type) {
  if (!p) return 0.0;
  if (data_type == CUDNN_DATA_DOUBLE) return *static_cast<const double*>(p);
  return *static_cast<const float*>(p);
}

}  // namespace vcudnn
