// Forwarding of normalised convolution calls to the real cuDNN, argument order per kind.
#include "runtime/conv_call.h"

#include <cstddef>
#include <mutex>
#include <set>
#include <string>

#include "runtime/log.h"
#include "runtime/no_destroy.h"
#include "runtime/real_api.h"

namespace vcudnn {

// The three perf structs must share one layout for read_perf.
#define VCUDNN_SAME_PERF_LAYOUT(T)                                                                  \
  static_assert(sizeof(T) == sizeof(cudnnConvolutionFwdAlgoPerf_t) &&                               \
                offsetof(T, status) == offsetof(cudnnConvolutionFwdAlgoPerf_t, status) &&           \
                offsetof(T, time) == offsetof(cudnnConvolutionFwdAlgoPerf_t, time) &&               \
                offsetof(T, memory) == offsetof(cudnnConvolutionFwdAlgoPerf_t, memory) &&           \
                offsetof(T, determinism) == offsetof(cudnnConvolutionFwdAlgoPerf_t, determinism) && \
                offsetof(T, mathType) == offsetof(cudnnConvolutionFwdAlgoPerf_t, mathType));
VCUDNN_SAME_PERF_LAYOUT(cudnnConvolutionBwdDataAlgoPerf_t)
VCUDNN_SAME_PERF_LAYOUT(cudnnConvolutionBwdFilterAlgoPerf_t)
#undef VCUDNN_SAME_PERF_LAYOUT

cudnnStatus_t unresolved(const char* function) {
  struct Logged {
    std::mutex mu;
    std::set<std::string> names;
  };
  static NoDestroy<Logged> logged;
  std::lock_guard<std::mutex> lock(logged->mu);
  if (logged->names.insert(function).second)
    VCUDNN_LOG_ERROR("{} is not available in the real cuDNN ({}); returning CUDNN_STATUS_NOT_INITIALIZED", function,
                     cudnn_library().found ? cudnn_library().path : cudnn_library().error);
  return kUnresolvedStatus;
}

#define VCUDNN_REAL_OR_FAIL(fn) \
  if (!r.fn) return unresolved(#fn);

cudnnStatus_t call_real(const ConvCall& c) {
  const RealCudnn& r = real();
  const auto& d = c.desc;
  switch (c.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnConvolutionForward)
      return r.cudnnConvolutionForward(c.handle, c.alpha, d.x, c.x, d.w, c.w, d.conv,
                                       static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), c.workspace, c.workspace_bytes,
                                       c.beta, d.y, c.y);
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnConvolutionBackwardData)
      return r.cudnnConvolutionBackwardData(c.handle, c.alpha, d.w, c.w, d.y, c.y, d.conv,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), c.workspace,
                                            c.workspace_bytes, c.beta, d.x, c.x);
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnConvolutionBackwardFilter)
      return r.cudnnConvolutionBackwardFilter(c.handle, c.alpha, d.x, c.x, d.y, c.y, d.conv,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), c.workspace,
                                              c.workspace_bytes, c.beta, d.w, c.w);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

namespace {

cudnnStatus_t get_v7(const RealCudnn& r, const AlgoQuery& q) {
  const auto& d = q.desc;
  switch (q.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionForwardAlgorithm_v7)
      return r.cudnnGetConvolutionForwardAlgorithm_v7(q.handle, d.x, d.w, d.conv, d.y, q.requested, q.returned,
                                                      static_cast<cudnnConvolutionFwdAlgoPerf_t*>(q.perf));
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardDataAlgorithm_v7)
      return r.cudnnGetConvolutionBackwardDataAlgorithm_v7(q.handle, d.w, d.y, d.conv, d.x, q.requested, q.returned,
                                                           static_cast<cudnnConvolutionBwdDataAlgoPerf_t*>(q.perf));
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardFilterAlgorithm_v7)
      return r.cudnnGetConvolutionBackwardFilterAlgorithm_v7(q.handle, d.x, d.y, d.conv, d.w, q.requested, q.returned,
                                                             static_cast<cudnnConvolutionBwdFilterAlgoPerf_t*>(q.perf));
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t find(const RealCudnn& r, const AlgoQuery& q) {
  const auto& d = q.desc;
  switch (q.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionForwardAlgorithm)
      return r.cudnnFindConvolutionForwardAlgorithm(q.handle, d.x, d.w, d.conv, d.y, q.requested, q.returned,
                                                    static_cast<cudnnConvolutionFwdAlgoPerf_t*>(q.perf));
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionBackwardDataAlgorithm)
      return r.cudnnFindConvolutionBackwardDataAlgorithm(q.handle, d.w, d.y, d.conv, d.x, q.requested, q.returned,
                                                         static_cast<cudnnConvolutionBwdDataAlgoPerf_t*>(q.perf));
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionBackwardFilterAlgorithm)
      return r.cudnnFindConvolutionBackwardFilterAlgorithm(q.handle, d.x, d.y, d.conv, d.w, q.requested, q.returned,
                                                           static_cast<cudnnConvolutionBwdFilterAlgoPerf_t*>(q.perf));
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t find_ex(const RealCudnn& r, const AlgoQuery& q) {
  const auto& d = q.desc;
  switch (q.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionForwardAlgorithmEx)
      return r.cudnnFindConvolutionForwardAlgorithmEx(q.handle, d.x, q.x, d.w, q.w, d.conv, d.y, q.y, q.requested,
                                                      q.returned, static_cast<cudnnConvolutionFwdAlgoPerf_t*>(q.perf),
                                                      q.workspace, q.workspace_bytes);
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionBackwardDataAlgorithmEx)
      return r.cudnnFindConvolutionBackwardDataAlgorithmEx(
          q.handle, d.w, q.w, d.y, q.y, d.conv, d.x, q.x, q.requested, q.returned,
          static_cast<cudnnConvolutionBwdDataAlgoPerf_t*>(q.perf), q.workspace, q.workspace_bytes);
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnFindConvolutionBackwardFilterAlgorithmEx)
      return r.cudnnFindConvolutionBackwardFilterAlgorithmEx(
          q.handle, d.x, q.x, d.y, q.y, d.conv, d.w, q.w, q.requested, q.returned,
          static_cast<cudnnConvolutionBwdFilterAlgoPerf_t*>(q.perf), q.workspace, q.workspace_bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

}  // namespace

cudnnStatus_t call_real(const AlgoQuery& q) {
  const RealCudnn& r = real();
  switch (q.variant) {
    case QueryVariant::kGetV7:
      return get_v7(r, q);
    case QueryVariant::kFind:
      return find(r, q);
    case QueryVariant::kFindEx:
      return find_ex(r, q);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t call_real(const WorkspaceQuery& q) {
  const RealCudnn& r = real();
  const auto& d = q.desc;
  switch (q.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionForwardWorkspaceSize)
      return r.cudnnGetConvolutionForwardWorkspaceSize(q.handle, d.x, d.w, d.conv, d.y,
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(q.algo), q.size);
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardDataWorkspaceSize)
      return r.cudnnGetConvolutionBackwardDataWorkspaceSize(q.handle, d.w, d.y, d.conv, d.x,
                                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(q.algo), q.size);
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardFilterWorkspaceSize)
      return r.cudnnGetConvolutionBackwardFilterWorkspaceSize(
          q.handle, d.x, d.y, d.conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(q.algo), q.size);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t call_real(const MaxCountQuery& q) {
  const RealCudnn& r = real();
  switch (q.kind) {
    case ConvKind::kForward:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionForwardAlgorithmMaxCount)
      return r.cudnnGetConvolutionForwardAlgorithmMaxCount(q.handle, q.count);
    case ConvKind::kBackwardData:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)
      return r.cudnnGetConvolutionBackwardDataAlgorithmMaxCount(q.handle, q.count);
    case ConvKind::kBackwardFilter:
      VCUDNN_REAL_OR_FAIL(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)
      return r.cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(q.handle, q.count);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

#undef VCUDNN_REAL_OR_FAIL

std::vector<AlgoPerf> read_perf(const AlgoQuery& q, int count) {
  std::vector<AlgoPerf> out;
  if (!q.perf || count <= 0) return out;
  count = std::min(count, q.requested);
  const auto* rows = static_cast<const cudnnConvolutionFwdAlgoPerf_t*>(q.perf);
  for (int i = 0; i < count; ++i)
    out.push_back({static_cast<int32_t>(rows[i].algo), static_cast<int32_t>(rows[i].status), rows[i].time,
                   static_cast<uint64_t>(rows[i].memory), static_cast<int32_t>(rows[i].determinism),
                   static_cast<int32_t>(rows[i].mathType)});
  return out;
}

}  // namespace vcudnn
