// The workspace pool's CUDA backend: memory from allocate_own (the arena when memory is owned,
// else cudaMallocAsync), events without timing, cudaStreamWaitEvent. Every call goes to the real
// CUDA runtime (real_api), and a failure clears CUDA's sticky last error so the framework never
// sees vcudnn's failures.
#pragma once

#include "pool/workspace_pool.h"

namespace vcudnn {

class CudaPoolBackend final : public pool::PoolBackend {
 public:
  void* allocate(uint64_t bytes, pool::StreamHandle stream) override;
  void release(void* ptr, pool::StreamHandle stream) override;
  pool::EventHandle create_event() override;
  void destroy_event(pool::EventHandle event) override;
  bool record(pool::EventHandle event, pool::StreamHandle stream) override;
  bool wait(pool::StreamHandle stream, pool::EventHandle event) override;
};

}  // namespace vcudnn
