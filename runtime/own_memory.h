// Device memory vcudnn uses itself (micro-batching workspaces, benchmark scratch buffers). When the
// process's memory is owned it comes from the arena (runtime/memory_manager.h), counts against
// VCUDNN_DEVICE_BUDGET and is never evicted; otherwise from the real CUDA runtime. A failure
// clears CUDA's last error so that the framework never sees it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

namespace vcudnn {

// `stream`: stream-ordered (cudaMallocAsync / cudaFreeAsync); nullopt: cudaMalloc / cudaFree.
void* allocate_own(uint64_t bytes, std::optional<cudaStream_t> stream);
void free_own(void* ptr, std::optional<cudaStream_t> stream);

}  // namespace vcudnn
