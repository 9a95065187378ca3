// Owned descriptors: created and set through the real cuDNN (real_api), statuses checked.
#include "runtime/conv_descriptors.h"

#include <string>

#include "runtime/decode_conv.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

Error failed(const char* what, cudnnStatus_t st) {
  return Error{std::string(what) + " failed: " + cudnn_status_name(st)};
}

}  // namespace

size_t element_bytes(int32_t dtype) {
  switch (dtype) {
    case CUDNN_DATA_FLOAT:
      return 4;
    case CUDNN_DATA_DOUBLE:
      return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

ConvLayer micro_layer(const ConvLayer& layer, int32_t batch) {
  ConvLayer m = layer;
  m.x.dims[0] = batch;
  m.y.dims[0] = batch;
  return m;
}

uint64_t tensor_span_bytes(const TensorFingerprint& t) {
  uint64_t last = 0;
  for (int i = 0; i < t.nb_dims; ++i) {
    if (t.dims[i] <= 0) return 0;
    last += static_cast<uint64_t>(t.dims[i] - 1) * static_cast<uint64_t>(t.strides[i]);
  }
  return (last + 1) * element_bytes(t.dtype);
}

Result<std::unique_ptr<OwnedTensor>> OwnedTensor::make(const TensorFingerprint& t, int32_t batch) {
  const RealCudnn& r = real();
  if (!r.cudnnCreateTensorDescriptor || !r.cudnnSetTensorNdDescriptor || !r.cudnnDestroyTensorDescriptor)
    return Error{"cuDNN tensor descriptor functions are missing"};
  auto out = std::unique_ptr<OwnedTensor>(new OwnedTensor);
  cudnnStatus_t st = r.cudnnCreateTensorDescriptor(&out->desc_);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnCreateTensorDescriptor", st);
  int dims[kMaxDims], strides[kMaxDims];
  for (int i = 0; i < t.nb_dims; ++i) {
    dims[i] = static_cast<int>(i == 0 ? batch : t.dims[i]);
    strides[i] = static_cast<int>(t.strides[i]);
  }
  st = r.cudnnSetTensorNdDescriptor(out->desc_, static_cast<cudnnDataType_t>(t.dtype), t.nb_dims, dims, strides);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetTensorNdDescriptor", st);
  return out;
}

OwnedTensor::~OwnedTensor() {
  if (desc_ && real().cudnnDestroyTensorDescriptor) real().cudnnDestroyTensorDescriptor(desc_);
}

Result<std::unique_ptr<OwnedFilter>> OwnedFilter::make(const FilterFingerprint& f) {
  const RealCudnn& r = real();
  if (!r.cudnnCreateFilterDescriptor || !r.cudnnSetFilterNdDescriptor || !r.cudnnDestroyFilterDescriptor)
    return Error{"cuDNN filter descriptor functions are missing"};
  auto out = std::unique_ptr<OwnedFilter>(new OwnedFilter);
  cudnnStatus_t st = r.cudnnCreateFilterDescriptor(&out->desc_);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnCreateFilterDescriptor", st);
  int dims[kMaxDims];
  for (int i = 0; i < f.nb_dims; ++i) dims[i] = static_cast<int>(f.dims[i]);
  st = r.cudnnSetFilterNdDescriptor(out->desc_, static_cast<cudnnDataType_t>(f.dtype),
                                    static_cast<cudnnTensorFormat_t>(f.format), f.nb_dims, dims);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetFilterNdDescriptor", st);
  return out;
}

OwnedFilter::~OwnedFilter() {
  if (desc_ && real().cudnnDestroyFilterDescriptor) real().cudnnDestroyFilterDescriptor(desc_);
}

Result<std::unique_ptr<OwnedConvolution>> OwnedConvolution::make(const ConvFingerprint& c, int32_t math_type) {
  const RealCudnn& r = real();
  if (!r.cudnnCreateConvolutionDescriptor || !r.cudnnSetConvolutionNdDescriptor || !r.cudnnSetConvolutionGroupCount ||
      !r.cudnnSetConvolutionMathType || !r.cudnnSetConvolutionReorderType || !r.cudnnDestroyConvolutionDescriptor)
    return Error{"cuDNN convolution descriptor functions are missing"};
  auto out = std::unique_ptr<OwnedConvolution>(new OwnedConvolution);
  cudnnStatus_t st = r.cudnnCreateConvolutionDescriptor(&out->desc_);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnCreateConvolutionDescriptor", st);
  int pad[kMaxDims], stride[kMaxDims], dilation[kMaxDims];
  for (int i = 0; i < c.spatial_dims; ++i) {
    pad[i] = c.pad[i];
    stride[i] = c.stride[i];
    dilation[i] = c.dilation[i];
  }
  st = r.cudnnSetConvolutionNdDescriptor(out->desc_, c.spatial_dims, pad, stride, dilation,
                                         static_cast<cudnnConvolutionMode_t>(c.mode),
                                         static_cast<cudnnDataType_t>(c.compute_type));
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetConvolutionNdDescriptor", st);
  st = r.cudnnSetConvolutionGroupCount(out->desc_, c.groups);
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetConvolutionGroupCount", st);
  st = r.cudnnSetConvolutionMathType(out->desc_, static_cast<cudnnMathType_t>(math_type < 0 ? c.math_type : math_type));
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetConvolutionMathType", st);
  st = r.cudnnSetConvolutionReorderType(out->desc_, static_cast<cudnnReorderType_t>(c.reorder_type));
  if (st != CUDNN_STATUS_SUCCESS) return failed("cudnnSetConvolutionReorderType", st);
  return out;
}

OwnedConvolution::~OwnedConvolution() {
  if (desc_ && real().cudnnDestroyConvolutionDescriptor) real().cudnnDestroyConvolutionDescriptor(desc_);
}

}  // namespace vcudnn
