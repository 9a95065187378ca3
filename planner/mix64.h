// splitmix64's finaliser: a strong 64-bit mix (every input bit reaches every output bit), for hash
// tables and fingerprints whose inputs differ in a few bits only (sizes that are multiples of 512,
// descriptor fields).
#pragma once

#include <cstdint>

namespace vcudnn {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace vcudnn
