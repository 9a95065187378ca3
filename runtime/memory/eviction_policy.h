// EvictionPolicy: which resident buffers leave the device when the budget needs room. The
// mechanism (residency.h) moves the bytes; the policy only chooses. Today: least recently used.
// The offload planner (a later issue) implements the same interface from a recorded iteration.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/memory/buffer.h"

namespace vcudnn::memory {

struct EvictionCandidate {
  Buffer* buffer = nullptr;
  uint64_t last_use = 0;  // global tick of its latest access
  uint64_t bytes = 0;     // device memory its eviction gives back (whole granules)
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  // Victims that give back at least `bytes` if there are enough, most preferred first, chosen
  // from `candidates` (resident, evictable, not held by a call in progress).
  virtual std::vector<Buffer*> choose(std::vector<EvictionCandidate> candidates, uint64_t bytes) = 0;
};

// Least recently used first.
class LruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "lru"; }
  std::vector<Buffer*> choose(std::vector<EvictionCandidate> candidates, uint64_t bytes) override;
};

std::unique_ptr<EvictionPolicy> make_lru_policy();

}  // namespace vcudnn::memory
