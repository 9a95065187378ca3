// The exported cuDNN hooks: same names and signatures as cudnn.h. Each decodes its arguments
// (call_builders.h) and makes one Engine call. Only these and the vcudnn* API are exported
// (exports.map); every other cuDNN function resolves to the real library untouched.
#include <cudnn.h>

#include "interpose/call_builders.h"
#include "runtime/real_api.h"

using namespace vcudnn;
using namespace vcudnn::interpose;

namespace {

// cudnnCreate/Destroy/SetStream/GetStream: nested calls go straight to the real library.
template <typename Real, typename... Args>
cudnnStatus_t forward_nested(Real fn, const char* name, Args... args) {
  return fn ? fn(args...) : unresolved(name);
}

}  // namespace

// The hooks keep cudnn.h's declarations, which carry no visibility: export them explicitly.
#pragma GCC visibility push(default)
extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  HookScope scope(HookId::create);
  if (scope.nested()) return forward_nested(real().cudnnCreate, "cudnnCreate", handle);
  return guarded(
      scope, "cudnnCreate", [&] { return forward_nested(real().cudnnCreate, "cudnnCreate", handle); },
      [&] { return Engine::get().create(scope, handle); });
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  HookScope scope(HookId::destroy);
  if (scope.nested()) return forward_nested(real().cudnnDestroy, "cudnnDestroy", handle);
  return guarded(
      scope, "cudnnDestroy", [&] { return forward_nested(real().cudnnDestroy, "cudnnDestroy", handle); },
      [&] { return Engine::get().destroy(scope, handle); });
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  HookScope scope(HookId::set_stream);
  if (scope.nested()) return forward_nested(real().cudnnSetStream, "cudnnSetStream", handle, stream);
  return guarded(
      scope, "cudnnSetStream", [&] { return forward_nested(real().cudnnSetStream, "cudnnSetStream", handle, stream); },
      [&] { return Engine::get().set_stream(scope, handle, stream); });
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  HookScope scope(HookId::get_stream);
  if (scope.nested()) return forward_nested(real().cudnnGetStream, "cudnnGetStream", handle, stream);
  return guarded(
      scope, "cudnnGetStream", [&] { return forward_nested(real().cudnnGetStream, "cudnnGetStream", handle, stream); },
      [&] { return Engine::get().get_stream(scope, handle, stream); });
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* ws, size_t wsSize, const void* beta, const cudnnTensorDescriptor_t yDesc,
                                      void* y) {
  return run(HookId::conv_fwd, false,
             forward_call(h, alpha, xDesc, x, wDesc, w, convDesc, algo, ws, wsSize, beta, yDesc, y));
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t wsSize,
                                           const void* beta, const cudnnTensorDescriptor_t dxDesc, void* dx) {
  return run(HookId::conv_bwd_data, false,
             backward_data_call(h, alpha, wDesc, w, dyDesc, dy, convDesc, algo, ws, wsSize, beta, dxDesc, dx));
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                             const void* x, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t wsSize,
                                             const void* beta, const cudnnFilterDescriptor_t dwDesc, void* dw) {
  return run(HookId::conv_bwd_filter, false,
             backward_filter_call(h, alpha, xDesc, x, dyDesc, dy, convDesc, algo, ws, wsSize, beta, dwDesc, dw));
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                     const cudnnFilterDescriptor_t wDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  return run(HookId::get_algo_v7_fwd, false,
             algo_query(ConvKind::kForward, QueryVariant::kGetV7, h, {xDesc, wDesc, convDesc, yDesc}, requested,
                        returned, perf));
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return run(HookId::get_algo_v7_bwd_data, false,
             algo_query(ConvKind::kBackwardData, QueryVariant::kGetV7, h, {dxDesc, wDesc, convDesc, dyDesc}, requested,
                        returned, perf));
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                            const cudnnTensorDescriptor_t dyDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, const int requested,
                                                            int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return run(HookId::get_algo_v7_bwd_filter, false,
             algo_query(ConvKind::kBackwardFilter, QueryVariant::kGetV7, h, {xDesc, dwDesc, convDesc, dyDesc},
                        requested, returned, perf));
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                   const cudnnFilterDescriptor_t wDesc,
                                                   const cudnnConvolutionDescriptor_t convDesc,
                                                   const cudnnTensorDescriptor_t yDesc, const int requested,
                                                   int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  return run(HookId::find_algo_fwd, false,
             algo_query(ConvKind::kForward, QueryVariant::kFind, h, {xDesc, wDesc, convDesc, yDesc}, requested,
                        returned, perf));
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                        const cudnnTensorDescriptor_t dyDesc,
                                                        const cudnnConvolutionDescriptor_t convDesc,
                                                        const cudnnTensorDescriptor_t dxDesc, const int requested,
                                                        int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return run(HookId::find_algo_bwd_data, false,
             algo_query(ConvKind::kBackwardData, QueryVariant::kFind, h, {dxDesc, wDesc, convDesc, dyDesc}, requested,
                        returned, perf));
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnFilterDescriptor_t dwDesc, const int requested,
                                                          int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return run(HookId::find_algo_bwd_filter, false,
             algo_query(ConvKind::kBackwardFilter, QueryVariant::kFind, h, {xDesc, dwDesc, convDesc, dyDesc}, requested,
                        returned, perf));
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                     const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void* y, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws,
                                                     size_t wsSize) {
  return run(HookId::find_algo_ex_fwd, false,
             find_ex_query(ConvKind::kForward, h, {xDesc, wDesc, convDesc, yDesc}, x, w, y, requested, returned, perf,
                           ws, wsSize));
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void* dx,
    const int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, size_t wsSize) {
  return run(HookId::find_algo_ex_bwd_data, false,
             find_ex_query(ConvKind::kBackwardData, h, {dxDesc, wDesc, convDesc, dyDesc}, dx, w, dy, requested,
                           returned, perf, ws, wsSize));
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void* dw,
    const int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, size_t wsSize) {
  return run(HookId::find_algo_ex_bwd_filter, false,
             find_ex_query(ConvKind::kBackwardFilter, h, {xDesc, dwDesc, convDesc, dyDesc}, x, dw, dy, requested,
                           returned, perf, ws, wsSize));
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* size) {
  return run(HookId::ws_size_fwd, false,
             WorkspaceQuery{ConvKind::kForward, h, {xDesc, wDesc, convDesc, yDesc}, static_cast<int>(algo), size, 0});
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t h, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* size) {
  return run(
      HookId::ws_size_bwd_data, false,
      WorkspaceQuery{ConvKind::kBackwardData, h, {dxDesc, wDesc, convDesc, dyDesc}, static_cast<int>(algo), size, 0});
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* size) {
  return run(HookId::ws_size_bwd_filter, false,
             WorkspaceQuery{
                 ConvKind::kBackwardFilter, h, {xDesc, gradDesc, convDesc, dyDesc}, static_cast<int>(algo), size, 0});
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t h, int* count) {
  return run(HookId::max_count_fwd, false, MaxCountQuery{ConvKind::kForward, h, count});
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t h, int* count) {
  return run(HookId::max_count_bwd_data, false, MaxCountQuery{ConvKind::kBackwardData, h, count});
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t h, int* count) {
  return run(HookId::max_count_bwd_filter, false, MaxCountQuery{ConvKind::kBackwardFilter, h, count});
}

}  // extern "C"
#pragma GCC visibility pop
