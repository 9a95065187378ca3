// cuda_ok (cuda_check.h).
#include "runtime/cuda_check.h"

#include <string>

#include "runtime/log.h"
#include "runtime/real_api.h"

namespace vcudnn {

bool cuda_ok(cudaError_t status, const char* who, const char* what) {
  if (status == cudaSuccess) return true;
  const RealCudart& rt = real_cudart();
  if (rt.cudaGetLastError) rt.cudaGetLastError();
  VCUDNN_WARN_LIMITED("{}: {} failed: {}", who, what,
                      rt.cudaGetErrorString ? rt.cudaGetErrorString(status) : std::to_string(static_cast<int>(status)));
  return false;
}

}  // namespace vcudnn
