// LruPolicy (eviction_policy.h).
#include "runtime/memory/eviction_policy.h"

#include <algorithm>

namespace vcudnn::memory {

std::vector<Buffer*> LruPolicy::choose(std::vector<EvictionCandidate> candidates, uint64_t bytes) {
  std::sort(candidates.begin(), candidates.end(),
            [](const EvictionCandidate& a, const EvictionCandidate& b) { return a.last_use < b.last_use; });
  std::vector<Buffer*> victims;
  uint64_t got = 0;
  for (const EvictionCandidate& c : candidates) {
    if (got >= bytes) break;
    victims.push_back(c.buffer);
    got += c.bytes;
  }
  return victims;
}

std::unique_ptr<EvictionPolicy> make_lru_policy() { return std::make_unique<LruPolicy>(); }

}  // namespace vcudnn::memory
