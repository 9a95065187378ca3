// Helpers shared by the GPU test clients (plain programs on cuDNN; no vcudnn).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

// Any failed CUDA / cuDNN call ends the client with its location and the status text.
#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CHECK_CUDNN(expr)                                                                         \
  do {                                                                                            \
    cudnnStatus_t s_ = (expr);                                                                    \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudnnGetErrorString(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace vcudnn::test {

// Fully packed strides of `dims`; NHWC (and NDHWC) put the channels innermost.
inline std::vector<int> packed_strides(const std::vector<int>& dims, cudnnTensorFormat_t format) {
  const int nb = static_cast<int>(dims.size());
  std::vector<int> order(nb);  // outermost to innermost
  if (format == CUDNN_TENSOR_NHWC) {
    order[0] = 0;
    for (int d = 2; d < nb; ++d) order[d - 1] = d;
    order[nb - 1] = 1;
  } else {
    for (int d = 0; d < nb; ++d) order[d] = d;
  }
  std::vector<int> strides(nb);
  int s = 1;
  for (int i = nb - 1; i >= 0; --i) {
    strides[order[i]] = s;
    s *= dims[order[i]];
  }
  return strides;
}

}  // namespace vcudnn::test
