// The status of a CUDA runtime call vcudnn makes for itself: a failure is logged (rate-limited,
// naming the part of vcudnn and the call) and cleared from CUDA's last error, so that the framework
// never sees vcudnn's failures.
#pragma once

#include <cuda_runtime_api.h>

namespace vcudnn {

bool cuda_ok(cudaError_t status, const char* who, const char* what);

}  // namespace vcudnn
