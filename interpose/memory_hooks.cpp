// The allocation hooks of memory ownership (VCUDNN_POLICY=offload): cudaMalloc, cudaFree,
// cudaMallocAsync, cudaFreeAsync served from vcudnn's arena; cudaMemGetInfo reports the budget;
// cudaMallocFromPoolAsync passes through, counted. Under any other policy (or when the arena could
// not start) every hook forwards to the real runtime unchanged.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <unordered_map>

#include "runtime/barrier.h"
#include "runtime/entry_points.h"
#include "runtime/log.h"
#include "runtime/memory_manager.h"
#include "runtime/real_api.h"

using namespace vcudnn;
using namespace vcudnn::memory;

namespace {

// NVIDIA's libraries allocate memory their own kernels use out of vcudnn's sight: never evicted.
Origin origin_lookup(void* return_address) {
  static std::mutex mu;
  static std::unordered_map<void*, Origin>* cache = new std::unordered_map<void*, Origin>();
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache->find(return_address);
  if (it != cache->end()) return it->second;
  Dl_info info{};
  const Origin o = dladdr(return_address, &info) && info.dli_fname && entry_points::is_nvidia_library(info.dli_fname) ? Origin::kLibrary
                                                                                                   : Origin::kFramework;
  cache->emplace(return_address, o);
  return o;
}

// Every allocation asks: a per-thread cache of recent call sites keeps the shared lock away.
Origin origin_of(void* return_address) {
  struct Recent {
    void* caller = nullptr;
    Origin origin = Origin::kFramework;
  };
  static thread_local Recent recent[16];
  Recent& r = recent[(reinterpret_cast<uintptr_t>(return_address) >> 2) % 16];
  if (r.caller != return_address) r = {return_address, origin_lookup(return_address)};
  return r.origin;
}

// The manager when it serves the calling thread's current device.
MemoryManager* serving() {
  MemoryManager* m = manager();
  if (!m) return nullptr;
  int device = -1;
  const RealCudart& rt = real_cudart();
  if (!rt.cudaGetDevice || rt.cudaGetDevice(&device) != cudaSuccess || device != manager_device()) return nullptr;
  return m;
}

cudaError_t unresolved() { return cudaErrorSharedObjectSymbolNotFound; }

// An exception inside vcudnn is an allocation failure (Note [Exception barrier]).
cudaError_t serve(MemoryManager* m, void** ptr, size_t size, StreamRef stream, void* caller) {
  return barrier(
      "an allocation",
      [&] {
        const std::optional<uint64_t> a = m->allocate(size, stream, origin_of(caller));
        if (!a) return cudaErrorMemoryAllocation;
        *ptr = reinterpret_cast<void*>(*a);
        return cudaSuccess;
      },
      [] { return cudaErrorMemoryAllocation; }, cudaErrorMemoryAllocation);
}

// true when vcudnn served `ptr` and freed it now; *status is then the answer (an exception inside
// vcudnn: cudaErrorUnknown, the buffer stays vcudnn's).
bool release(void* ptr, StreamRef stream, cudaError_t* status) {
  MemoryManager* m = manager();
  if (!m) return false;
  bool freed = false;
  *status = barrier(
      "a free",
      [&] {
        freed = m->free(reinterpret_cast<uint64_t>(ptr), stream);
        return cudaSuccess;
      },
      [&] {
        freed = true;
        return cudaErrorUnknown;
      },
      cudaErrorUnknown);
  return freed;
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  MemoryManager* m = devPtr ? serving() : nullptr;
  if (m) return serve(m, devPtr, size, std::nullopt, __builtin_return_address(0));
  const auto real = real_cudart().cudaMalloc;
  return real ? real(devPtr, size) : unresolved();
}

cudaError_t cudaFree(void* devPtr) {
  // cudaFree(nullptr) initialises the context: always the real one.
  cudaError_t status = cudaSuccess;
  if (devPtr && release(devPtr, std::nullopt, &status)) return status;
  const auto real = real_cudart().cudaFree;
  return real ? real(devPtr) : unresolved();
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  MemoryManager* m = devPtr ? serving() : nullptr;
  if (m && m->graphs_seen()) {
    // Inside a capture the allocation belongs to the graph: CUDA's own allocator serves it.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const RealCudart& rt = real_cudart();
    if (!rt.cudaStreamIsCapturing || rt.cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
        status != cudaStreamCaptureStatusNone)
      m = nullptr;
  }
  if (m) return serve(m, devPtr, size, stream, __builtin_return_address(0));
  const auto real = real_cudart().cudaMallocAsync;
  return real ? real(devPtr, size, stream) : unresolved();
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  if (devPtr && release(devPtr, stream, &status)) return status;
  const auto real = real_cudart().cudaFreeAsync;
  return real ? real(devPtr, stream) : unresolved();
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream) {
  if (manager()) count_foreign_allocation("cudaMallocFromPoolAsync", size);
  const auto real = real_cudart().cudaMallocFromPoolAsync;
  return real ? real(ptr, size, pool, stream) : unresolved();
}

// The program gives cached memory back (torch.cuda.empty_cache() and cudnn.benchmark's search under
// cudaMallocAsync): vcudnn's idle memory goes too, or a later launch could find the card full of
// memory nobody uses (lazy module loading, cuDNN's own allocations). Then the real pool's trim.
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  if (MemoryManager* m = serving()) {
    barrier(
        "cudaMemPoolTrimTo",
        [&] {
          const uint64_t released = m->trim_to(minBytesToKeep);
          if (released) VCUDNN_LOG_DEBUG("offload: cudaMemPoolTrimTo gave {} bytes of idle memory back", released);
          return 0;
        },
        [] { return 0; }, 0);
  }
  const auto real = real_cudart().cudaMemPoolTrimTo;
  return real ? real(memPool, minBytesToKeep) : unresolved();
}

// Under a budget: the budget. Without one: the device's numbers, plus the idle memory vcudnn keeps
// mapped, which it gives back to any allocation that needs it.
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  MemoryManager* m = free && total ? serving() : nullptr;
  if (m && m->budget()) {
    const auto [f, t] = m->budget_info();
    *free = f;
    *total = t;
    return cudaSuccess;
  }
  const auto real = real_cudart().cudaMemGetInfo;
  if (!real) return unresolved();
  const cudaError_t status = real(free, total);
  if (m && status == cudaSuccess) *free = m->memory_info(*free, *total).first;
  return status;
}

}  // extern "C"
#pragma GCC visibility pop
