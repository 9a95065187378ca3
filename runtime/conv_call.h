// The intercepted convolution calls in one normalised form: the three kinds (forward,
// backward-data, backward-filter) share one struct in layer terms, so that recording (and later
// micro-batching) is written once. call_real() forwards each to the real cuDNN unchanged.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "planner/conv_layer.h"
#include "planner/trace.h"

namespace vcudnn {

// In layer terms: forward reads x, w and writes y; backward-data reads w, y (= dy) and writes
// x (= dx); backward-filter reads x, y (= dy) and writes w (= dw).
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnTensorDescriptor_t y = nullptr;
};

struct ConvCall {
  ConvKind kind = ConvKind::kForward;
  cudnnHandle_t handle = nullptr;
  const void* alpha = nullptr;
  const void* beta = nullptr;
  ConvDescs desc;
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  int algo = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  uint64_t user_layer = 0;  // from the wrapped handle; 0 = none
};

enum class QueryVariant { kGetV7, kFind, kFindEx };

// cudnnGetConvolution*Algorithm_v7, cudnnFindConvolution*Algorithm and ...AlgorithmEx.
struct AlgoQuery {
  ConvKind kind = ConvKind::kForward;
  QueryVariant variant = QueryVariant::kGetV7;
  cudnnHandle_t handle = nullptr;
  ConvDescs desc;
  void* x = nullptr;  // Ex only
  void* w = nullptr;
  void* y = nullptr;
  int requested = 0;
  int* returned = nullptr;
  void* perf = nullptr;       // cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t[requested]
  void* workspace = nullptr;  // Ex only
  size_t workspace_bytes = 0;
  uint64_t user_layer = 0;
};

struct WorkspaceQuery {
  ConvKind kind = ConvKind::kForward;
  cudnnHandle_t handle = nullptr;
  ConvDescs desc;
  int algo = 0;
  size_t* size = nullptr;
  uint64_t user_layer = 0;
};

struct MaxCountQuery {
  ConvKind kind = ConvKind::kForward;
  cudnnHandle_t handle = nullptr;
  int* count = nullptr;
};

// Returned when the real entry point could not be resolved (logged once per function).
inline constexpr cudnnStatus_t kUnresolvedStatus = CUDNN_STATUS_NOT_INITIALIZED;

cudnnStatus_t call_real(const ConvCall& c);
cudnnStatus_t call_real(const AlgoQuery& q);
cudnnStatus_t call_real(const WorkspaceQuery& q);
cudnnStatus_t call_real(const MaxCountQuery& q);

// The first *returned rows of a query's perf array (empty when the call failed).
std::vector<AlgoPerf> read_perf(const AlgoQuery& q, int count);

// Logs (once per function) that a real entry point is missing and returns kUnresolvedStatus.
cudnnStatus_t unresolved(const char* function);

}  // namespace vcudnn
