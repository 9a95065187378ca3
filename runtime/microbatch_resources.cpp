// MicroBatchResources (microbatch_resources.h): settings, the benchmark cache opened once, the
// workspace pools per device.
#include "runtime/microbatch_resources.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "runtime/log.h"
#include "runtime/own_memory.h"
#include "runtime/real_api.h"

namespace vcudnn {

bool microbatch_split_allowed(ConvKind kind, const ConvLayer& layer) {
  const int32_t w = layer.w.dtype;
  return !(kind == ConvKind::kBackwardFilter && (w == CUDNN_DATA_HALF || w == CUDNN_DATA_BFLOAT16));
}

std::vector<int32_t> microbatch_candidate_batches(const MicroBatchSettings& settings, ConvKind kind,
                                                  const ConvLayer& layer) {
  const int32_t batch = static_cast<int32_t>(layer.x.dims[0]);
  if (!microbatch_split_allowed(kind, layer)) return {batch};
  std::vector<int32_t> batches = candidate_batches(settings.batch_policy, batch);
  if (settings.force_split && *settings.force_split < batch) {
    batches.push_back(*settings.force_split);
    if (batch % *settings.force_split) batches.push_back(batch % *settings.force_split);
  }
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  return batches;
}

cudaStream_t handle_stream(cudnnHandle_t handle) {
  cudaStream_t s = nullptr;
  if (real().cudnnGetStream && real().cudnnGetStream(handle, &s) != CUDNN_STATUS_SUCCESS) s = nullptr;
  return s;
}

bool stream_capturing(cudaStream_t stream) {
  const RealCudart& rt = real_cudart();
  if (!rt.cudaStreamIsCapturing) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    rt.cudaGetLastError();
    return true;  // cannot tell: behave as under capture
  }
  return status != cudaStreamCaptureStatusNone;
}

MicroBatchSettings MicroBatchSettings::from(const Options& o) {
  MicroBatchSettings s;
  s.limit = o.workspace_limit;
  s.total = o.total_workspace;
  s.batch_policy = static_cast<BatchPolicy>(std::clamp(o.batch_policy, 0, 2));
  const std::string& cache = o.get(kCache);
  if (cache.empty())
    s.cache_path = default_bench_cache_path();
  else if (cache != "off")
    s.cache_path = expand_path(cache);
  if (const char* f = std::getenv("VCUDNN_TEST_FORCE_SPLIT"); f && std::atoi(f) > 0) s.force_split = std::atoi(f);
  return s;
}

BenchCache* MicroBatchResources::cache() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_opened_) return cache_.get();
  cache_opened_ = true;
  const RealCudart& rt = real_cudart();
  size_t free_bytes = 0, card = 0;
  if (rt.cudaMemGetInfo && rt.cudaMemGetInfo(&free_bytes, &card) == cudaSuccess) {
    if (auto w = workspace_limit_warning(settings_.limit, settings_.total, card)) VCUDNN_LOG_WARN("microbatch: {}", *w);
  } else if (rt.cudaGetLastError) {
    rt.cudaGetLastError();
  }
  if (!settings_.cache_path.empty()) {
    std::string warning, error;
    cache_ = BenchCache::open(settings_.cache_path, &warning, &error);
    if (!warning.empty()) VCUDNN_LOG_WARN("benchmark cache: {}", warning);
    if (!cache_) VCUDNN_LOG_WARN("benchmark cache unusable, benchmarking without it: {}", error);
  }
  return cache_.get();
}

pool::WorkspacePool* MicroBatchResources::pool_for_current_device() {
  const RealCudart& rt = real_cudart();
  int dev = 0;
  if (!rt.cudaGetDevice || rt.cudaGetDevice(&dev) != cudaSuccess) {
    if (rt.cudaGetLastError) rt.cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(pools_mu_);
  auto& p = pools_[dev];
  if (!p) {
    const uint64_t total = settings_.total ? *settings_.total : std::numeric_limits<uint64_t>::max() / 4;
    // Note [Workspace that lives for one call]: where vcudnn owns the memory, the arena reuses freed
    // memory itself and a block kept here would be memory no offload plan can use.
    const auto holding = memory_owned() ? pool::WorkspacePool::Holding::kReturn : pool::WorkspacePool::Holding::kKeep;
    p = std::make_unique<pool::WorkspacePool>(backend_, total, settings_.cap(), uint64_t{1} << 20, holding);
  }
  return p.get();
}

MicroBatchResources::PoolPeaks MicroBatchResources::pool_peaks() const {
  PoolPeaks peaks;
  std::lock_guard<std::mutex> lock(pools_mu_);
  for (const auto& [dev, p] : pools_) {
    const auto s = p->stats();
    peaks.reserved += s.peak_reserved;
    peaks.stream_reserved = std::max(peaks.stream_reserved, s.peak_stream_reserved);
  }
  return peaks;
}

}  // namespace vcudnn
