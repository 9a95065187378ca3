// Rounding shared by pool/'s allocators.
#pragma once

#include <cstdint>
#include <optional>

namespace vcudnn::pool {

// `bytes` rounded up to a multiple of `to` (> 0); nullopt on overflow.
inline std::optional<uint64_t> round_up(uint64_t bytes, uint64_t to) {
  const uint64_t rem = bytes % to;
  if (rem == 0) return bytes;
  if (bytes > UINT64_MAX - (to - rem)) return std::nullopt;
  return bytes + (to - rem);
}

}  // namespace vcudnn::pool
