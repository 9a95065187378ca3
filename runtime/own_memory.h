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
// `one_call`: a workspace freed right after the call that uses it (Note [Workspace that lives for one
// call], pool/workspace_pool.h): under ownership it is recorded and placed like the framework's buffers.
void* allocate_own(uint64_t bytes, std::optional<cudaStream_t> stream, bool one_call = false);
// Whether the process's device memory is owned (VCUDNN_POLICY=offload or microbatch+offload).
bool memory_owned();
void free_own(void* ptr, std::optional<cudaStream_t> stream);

}  // namespace vcudnn
