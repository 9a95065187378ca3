// cuDNN descriptors that vcudnn owns, built from a layer's fingerprint: the x and y tensors at a
// micro-batch size (N changed, strides kept, so a micro-batch is a slice of the caller's
// tensors), the filter, and the convolution with a given math type. Built once per plan, read-only
// afterwards (never shared scratch between threads), destroyed with it.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>

#include "planner/conv_layer.h"
#include "planner/result.h"

namespace vcudnn {

class OwnedTensor {
 public:
  static Result<std::unique_ptr<OwnedTensor>> make(const TensorFingerprint& t, int32_t batch);
  ~OwnedTensor();
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class OwnedFilter {
 public:
  static Result<std::unique_ptr<OwnedFilter>> make(const FilterFingerprint& f);
  ~OwnedFilter();
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class OwnedConvolution {
 public:
  // math_type < 0: the fingerprint's own.
  static Result<std::unique_ptr<OwnedConvolution>> make(const ConvFingerprint& c, int32_t math_type);
  ~OwnedConvolution();
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// Bytes per element of a cuDNN data type vcudnn can slice (float, double, half, bf16); 0 otherwise.
size_t element_bytes(int32_t dtype);

// The layer with N of x and y set to `batch` (strides unchanged): the key of a micro-batch.
ConvLayer micro_layer(const ConvLayer& layer, int32_t batch);

// Bytes spanned by a tensor (largest offset + 1 element), for scratch buffers.
uint64_t tensor_span_bytes(const TensorFingerprint& t);

}  // namespace vcudnn
