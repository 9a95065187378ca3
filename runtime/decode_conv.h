// Reads a convolution's full fingerprint back from its cuDNN descriptors (real getters only).
#pragma once

#include <cudnn.h>

#include "planner/conv_layer.h"
#include "planner/result.h"

namespace vcudnn {

// x and y are the tensor descriptors in layer terms (x or dx; y or dy), w the filter (w or dw).
Result<ConvLayer> decode_conv_layer(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y);

// alpha/beta as cuDNN reads them: double for double data, float otherwise.
double read_scaling(const void* p, int32_t data_type);

// cuDNN's name for a status (via the real library), for logs.
const char* cudnn_status_name(cudnnStatus_t status);

}  // namespace vcudnn
