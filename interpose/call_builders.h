// Decoding of cuDNN's argument lists into runtime's normalised calls, shared by the interposed
// hooks (cudnn_hooks.cpp) and the wrapped-handle API (vcudnn_api.cpp), plus the one function
// each of them calls. Argument order follows cudnn_cnn.h; see ConvCall for the layer terms.
#pragma once

#include <cudnn.h>

#include "runtime/barrier.h"
#include "runtime/conv_call.h"
#include "runtime/engine.h"
#include "runtime/hook_scope.h"

namespace vcudnn::interpose {

inline ConvCall forward_call(cudnnHandle_t h, const void* alpha, cudnnTensorDescriptor_t xd, const void* x,
                             cudnnFilterDescriptor_t wd, const void* w, cudnnConvolutionDescriptor_t cd,
                             cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_size, const void* beta,
                             cudnnTensorDescriptor_t yd, void* y, uint64_t layer = 0) {
  return {ConvKind::kForward,     h,  alpha,   beta, {xd, wd, cd, yd}, const_cast<void*>(x), const_cast<void*>(w), y,
          static_cast<int>(algo), ws, ws_size, layer};
}

inline ConvCall backward_data_call(cudnnHandle_t h, const void* alpha, cudnnFilterDescriptor_t wd, const void* w,
                                   cudnnTensorDescriptor_t dyd, const void* dy, cudnnConvolutionDescriptor_t cd,
                                   cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t ws_size, const void* beta,
                                   cudnnTensorDescriptor_t dxd, void* dx, uint64_t layer = 0) {
  return {
      ConvKind::kBackwardData, h,  alpha,   beta, {dxd, wd, cd, dyd}, dx, const_cast<void*>(w), const_cast<void*>(dy),
      static_cast<int>(algo),  ws, ws_size, layer};
}

inline ConvCall backward_filter_call(cudnnHandle_t h, const void* alpha, cudnnTensorDescriptor_t xd, const void* x,
                                     cudnnTensorDescriptor_t dyd, const void* dy, cudnnConvolutionDescriptor_t cd,
                                     cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t ws_size, const void* beta,
                                     cudnnFilterDescriptor_t dwd, void* dw, uint64_t layer = 0) {
  return {
      ConvKind::kBackwardFilter, h,  alpha,   beta, {xd, dwd, cd, dyd}, const_cast<void*>(x), dw, const_cast<void*>(dy),
      static_cast<int>(algo),    ws, ws_size, layer};
}

// Get_v7 and Find: descriptors in layer terms (x, w, conv, y).
inline AlgoQuery algo_query(ConvKind kind, QueryVariant variant, cudnnHandle_t h, ConvDescs d, int requested,
                            int* returned, void* perf, uint64_t layer = 0) {
  AlgoQuery q;
  q.kind = kind;
  q.variant = variant;
  q.handle = h;
  q.desc = d;
  q.requested = requested;
  q.returned = returned;
  q.perf = perf;
  q.user_layer = layer;
  return q;
}

inline AlgoQuery find_ex_query(ConvKind kind, cudnnHandle_t h, ConvDescs d, const void* x, const void* w, const void* y,
                               int requested, int* returned, void* perf, void* ws, size_t ws_size, uint64_t layer = 0) {
  AlgoQuery q = algo_query(kind, QueryVariant::kFindEx, h, d, requested, returned, perf, layer);
  q.x = const_cast<void*>(x);
  q.w = const_cast<void*>(w);
  q.y = const_cast<void*>(y);
  q.workspace = ws;
  q.workspace_bytes = ws_size;
  return q;
}

// The engine's handling of a call, behind the exception barrier (Note [Exception barrier]): if
// vcudnn throws before the real call, the real call is made unchanged; after it, its status is
// returned; while it was under way (micro-batches), cuDNN's internal-error status.
template <typename Real, typename Handle>
cudnnStatus_t guarded(HookScope& scope, const char* where, Real&& real_call, Handle&& handle) {
  return barrier(
      where, handle,
      [&] {
        switch (scope.real_state()) {
          case HookScope::RealState::kNotMade:
            return real_call();
          case HookScope::RealState::kDone:
            return static_cast<cudnnStatus_t>(scope.real_status());
          case HookScope::RealState::kRunning:
            break;
        }
        return CUDNN_STATUS_INTERNAL_ERROR;
      },
      CUDNN_STATUS_INTERNAL_ERROR);
}

inline cudnnStatus_t run(HookId id, bool wrapped, const ConvCall& c) {
  HookScope scope(id, wrapped);
  if (scope.nested()) return call_real(c);
  return guarded(scope, "a cuDNN convolution", [&] { return call_real(c); }, [&] { return Engine::get().convolution(scope, c); });
}

inline cudnnStatus_t run(HookId id, bool wrapped, const AlgoQuery& q) {
  HookScope scope(id, wrapped);
  if (scope.nested()) return call_real(q);
  return guarded(scope, "a cuDNN algorithm query", [&] { return call_real(q); }, [&] { return Engine::get().algo_query(scope, q); });
}

inline cudnnStatus_t run(HookId id, bool wrapped, const WorkspaceQuery& q) {
  HookScope scope(id, wrapped);
  if (scope.nested()) return call_real(q);
  return guarded(scope, "a cuDNN workspace query", [&] { return call_real(q); }, [&] { return Engine::get().workspace_size(scope, q); });
}

inline cudnnStatus_t run(HookId id, bool wrapped, const MaxCountQuery& q) {
  HookScope scope(id, wrapped);
  if (scope.nested()) return call_real(q);
  return guarded(scope, "cudnnGet*AlgorithmMaxCount", [&] { return call_real(q); }, [&] { return Engine::get().max_count(scope, q); });
}

}  // namespace vcudnn::interpose
