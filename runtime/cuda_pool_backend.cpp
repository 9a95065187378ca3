// CudaPoolBackend (see header).
#include "runtime/cuda_pool_backend.h"

#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#include "runtime/log.h"
#include "runtime/own_memory.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

bool check(cudaError_t e, const char* what) { return cuda_ok(e, "workspace pool", what); }

}  // namespace

// Workspaces come from vcudnn's own memory: the arena (within the device budget) when the
// process's memory is owned, each for one call there (MicroBatchResources gives the pool
// Holding::kReturn: Note [Workspace that lives for one call]), else cudaMallocAsync.
void* CudaPoolBackend::allocate(uint64_t bytes, pool::StreamHandle stream) {
  return allocate_own(bytes, static_cast<cudaStream_t>(stream), memory_owned());
}

void CudaPoolBackend::release(void* ptr, pool::StreamHandle stream) { free_own(ptr, static_cast<cudaStream_t>(stream)); }

pool::EventHandle CudaPoolBackend::create_event() {
  const RealCudart& rt = real_cudart();
  if (!rt.cudaEventCreateWithFlags) return nullptr;
  cudaEvent_t e = nullptr;
  if (!check(rt.cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags")) return nullptr;
  return e;
}

void CudaPoolBackend::destroy_event(pool::EventHandle event) {
  const RealCudart& rt = real_cudart();
  if (event && rt.cudaEventDestroy) check(rt.cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
}

bool CudaPoolBackend::record(pool::EventHandle event, pool::StreamHandle stream) {
  const RealCudart& rt = real_cudart();
  return rt.cudaEventRecord &&
         check(rt.cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
               "cudaEventRecord");
}

bool CudaPoolBackend::wait(pool::StreamHandle stream, pool::EventHandle event) {
  const RealCudart& rt = real_cudart();
  return rt.cudaStreamWaitEvent &&
         check(rt.cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
               "cudaStreamWaitEvent");
}

}  // namespace vcudnn
