// MicroBatchResources: what the two micro-batchers (the legacy API's MicroBatcher and the graph
// API's GraphMicroBatcher) share: the settings read from the options, the SQLite benchmark cache
// (opened once, at the first kernel either plans) and the per-device stream-ordered workspace pool,
// so that one convolution's workspace comes from one pool whichever API runs it. Thread-safe.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "planner/conv_layer.h"
#include "planner/microbatch.h"
#include "pool/workspace_pool.h"
#include "runtime/bench_cache.h"
#include "runtime/cuda_pool_backend.h"
#include "runtime/options.h"

namespace vcudnn {

struct MicroBatchSettings {
  uint64_t limit = 64ull << 20;   // per kernel
  std::optional<uint64_t> total;  // whole network (WD)
  BatchPolicy batch_policy = BatchPolicy::kPowerOfTwo;
  std::string cache_path;              // empty: none
  std::optional<int32_t> force_split;  // VCUDNN_TEST_FORCE_SPLIT
  static MicroBatchSettings from(const Options& o);
  // The most workspace one kernel may use: the limit, or the total when that is smaller.
  uint64_t cap() const { return total && *total < limit ? *total : limit; }
};

// Whether a kernel may run as micro-batches: not a 16-bit weight gradient (splitting it would round
// every partial sum to 16 bits).
bool microbatch_split_allowed(ConvKind kind, const ConvLayer& layer);
// The micro-batch sizes measured for a kernel, both APIs: the batch policy's and the forced split's
// (and its remainder); only the whole batch where splitting is not allowed. Ascending.
std::vector<int32_t> microbatch_candidate_batches(const MicroBatchSettings& settings, ConvKind kind,
                                                  const ConvLayer& layer);

// The stream set in `handle` (the legacy default stream when it cannot be read).
cudaStream_t handle_stream(cudnnHandle_t handle);
// Whether `stream` is being captured into a CUDA graph; true when that cannot be told.
bool stream_capturing(cudaStream_t stream);

class MicroBatchResources {
 public:
  explicit MicroBatchResources(MicroBatchSettings settings) : settings_(std::move(settings)) {}

  const MicroBatchSettings& settings() const { return settings_; }
  // The cache, opened at the first call (with the limit's warning against the card's memory);
  // nullptr when off or unusable (said once in the log).
  BenchCache* cache();
  // The workspace pool of the current device (created at first use); nullptr when the device
  // cannot be told.
  pool::WorkspacePool* pool_for_current_device();
  // Over every device's pool: the most bytes held at once, and the most for one stream.
  struct PoolPeaks {
    uint64_t reserved = 0, stream_reserved = 0;
  };
  PoolPeaks pool_peaks() const;

 private:
  MicroBatchSettings settings_;
  std::mutex cache_mu_;
  bool cache_opened_ = false;
  std::unique_ptr<BenchCache> cache_;
  CudaPoolBackend backend_;
  mutable std::mutex pools_mu_;
  std::map<int, std::unique_ptr<pool::WorkspacePool>> pools_;
};

}  // namespace vcudnn
