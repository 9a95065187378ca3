// Micro-batch configurations (µ-cuDNN): a convolution's mini-batch split into micro-batches,
// each run with its own algorithm, one after another on one workspace. Time adds up, workspace
// is the largest any micro-batch needs. Plain data; the DP and the knapsack plan with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vcudnn {

// One measured cuDNN call: algorithm `algo` on a micro-batch of `batch` samples.
struct MicroKernel {
  int32_t algo = 0;
  int32_t batch = 0;
  double time_ms = 0;
  uint64_t workspace = 0;
  int32_t math_type = -1;  // cudnnMathType_t the algorithm was measured with (-1: the layer's own)
  bool operator==(const MicroKernel&) const = default;
};

// A whole convolution: micro-kernels whose batches sum to the mini-batch.
struct MicroConfig {
  std::vector<MicroKernel> kernels;  // in execution order
  double time_ms = 0;                // sum
  uint64_t workspace = 0;            // max

  static MicroConfig single(const MicroKernel& k) { return {{k}, k.time_ms, k.workspace}; }
  // `k` followed by `rest`.
  static MicroConfig prepend(const MicroKernel& k, const MicroConfig& rest);
  int32_t batch() const;
  std::string to_string() const;  // "4x(algo 1, 60) + (algo 0, 16): 12.3 ms, 64.0 MiB"
};

// Which micro-batch sizes are measured (VCUDNN_BATCH_POLICY).
enum class BatchPolicy { kUndivided, kPowerOfTwo, kAll };
// undivided: {B}; powerOfTwo: {1, 2, 4, ..., <= B} plus B; all: {1, ..., B}. Ascending.
std::vector<int32_t> candidate_batches(BatchPolicy policy, int32_t mini_batch);

}  // namespace vcudnn
