// allocate_own / free_own (own_memory.h).
#include "runtime/own_memory.h"

#include "runtime/memory_manager.h"
#include "runtime/process.h"
#include "runtime/real_api.h"

namespace vcudnn {

void* allocate_own(uint64_t bytes, std::optional<cudaStream_t> stream, bool one_call) {
  if (bytes == 0) return nullptr;
  if (memory::MemoryManager* m = Process::get().memory()) {
    const auto a = m->allocate(bytes, stream, one_call ? memory::Origin::kScratch : memory::Origin::kLibrary);
    return a ? reinterpret_cast<void*>(*a) : nullptr;
  }
  const RealCudart& rt = real_cudart();
  void* p = nullptr;
  const cudaError_t e = stream ? (rt.cudaMallocAsync ? rt.cudaMallocAsync(&p, bytes, *stream) : cudaErrorUnknown)
                               : (rt.cudaMalloc ? rt.cudaMalloc(&p, bytes) : cudaErrorUnknown);
  if (e == cudaSuccess) return p;
  if (rt.cudaGetLastError) rt.cudaGetLastError();
  return nullptr;
}

bool memory_owned() { return Process::get().memory() != nullptr; }

void free_own(void* ptr, std::optional<cudaStream_t> stream) {
  if (!ptr) return;
  if (memory::MemoryManager* m = Process::get().memory(); m && m->free(reinterpret_cast<uint64_t>(ptr), stream))
    return;
  const RealCudart& rt = real_cudart();
  const cudaError_t e = stream ? (rt.cudaFreeAsync ? rt.cudaFreeAsync(ptr, *stream) : cudaErrorUnknown)
                               : (rt.cudaFree ? rt.cudaFree(ptr) : cudaErrorUnknown);
  if (e != cudaSuccess && rt.cudaGetLastError) rt.cudaGetLastError();
}

}  // namespace vcudnn
