// Benchmarker: measures one convolution kernel at each candidate micro-batch size with the real
// cudnnFind*AlgorithmEx, on the caller's input buffers (read only: a micro-batch is a leading
// slice) and on a scratch output of vcudnn's own, with a workspace of the limit. Results go
// through the SQLite cache (BenchCache): a size found there is not measured again. Runs once per
// kernel, on the caller's handle and stream, at the first call of that kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/conv_layer.h"
#include "planner/microbatch_dp.h"
#include "planner/result.h"
#include "runtime/bench_cache.h"
#include "runtime/conv_call.h"

namespace vcudnn {

struct BenchOutcome {
  MicroBatchMeasurements measurements;
  int measured = 0;    // sizes timed now
  int cache_hits = 0;  // sizes answered by the cache
  uint64_t cap = 0;    // workspace the measurements had (may be below the request when memory is short)
};

// The current device's name and SM count, part of every cache key (also the graph API's);
// read once per device.
struct BenchDevice {
  std::string name;
  int sm_count = 0;
};
Result<BenchDevice> bench_device();

// True when a result measured with cuDNN math type `row` may run for a layer whose descriptor
// asks for `layer`: never more permissive (FMA stays FMA; no down-conversion unless allowed).
bool math_type_compatible(int32_t layer, int32_t row);

// `cache` may be null (VCUDNN_CACHE=off or unusable).
Result<BenchOutcome> benchmark_kernel(const ConvCall& call, const ConvLayer& layer, const std::vector<int32_t>& batches,
                                      uint64_t cap, BenchCache* cache);

}  // namespace vcudnn
