// MicroConfig helpers and the candidate batch sizes.
#include "planner/microbatch.h"

#include <algorithm>
#include <cstdio>

namespace vcudnn {

MicroConfig MicroConfig::prepend(const MicroKernel& k, const MicroConfig& rest) {
  MicroConfig c;
  c.kernels.reserve(rest.kernels.size() + 1);
  c.kernels.push_back(k);
  c.kernels.insert(c.kernels.end(), rest.kernels.begin(), rest.kernels.end());
  c.time_ms = k.time_ms + rest.time_ms;
  c.workspace = std::max(k.workspace, rest.workspace);
  return c;
}

int32_t MicroConfig::batch() const {
  int32_t b = 0;
  for (const auto& k : kernels) b += k.batch;
  return b;
}

std::string MicroConfig::to_string() const {
  std::string s;
  for (size_t i = 0; i < kernels.size();) {
    size_t j = i;
    while (j < kernels.size() && kernels[j] == kernels[i]) ++j;
    if (!s.empty()) s += " + ";
    if (j - i > 1) s += std::to_string(j - i) + "x";
    s += "(algo " + std::to_string(kernels[i].algo) + ", " + std::to_string(kernels[i].batch) + ")";
    i = j;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, ": %.3f ms, %.1f MiB", time_ms, static_cast<double>(workspace) / (1 << 20));
  return s + buf;
}

std::vector<int32_t> candidate_batches(BatchPolicy policy, int32_t mini_batch) {
  std::vector<int32_t> sizes;
  if (mini_batch <= 0) return sizes;
  switch (policy) {
    case BatchPolicy::kUndivided:
      sizes.push_back(mini_batch);
      break;
    case BatchPolicy::kPowerOfTwo:
      for (int64_t b = 1; b < mini_batch; b *= 2) sizes.push_back(static_cast<int32_t>(b));
      sizes.push_back(mini_batch);
      break;
    case BatchPolicy::kAll:
      for (int32_t b = 1; b <= mini_batch; ++b) sizes.push_back(b);
      break;
  }
  return sizes;
}

}  // namespace vcudnn
