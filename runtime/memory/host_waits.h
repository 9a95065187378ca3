// Every place where the memory runtime still blocks the host, counted by cause for the exit line
// and vcudnnGetMemoryStats. None is on the steady-state path of a training loop that fits its
// budget: frees, reuse, eviction copies, unmaps and fault-ins are ordered by events.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace vcudnn::memory {

// X(name, why the host waits)
#define VCUDNN_HOST_WAITS(X)                                                                                   \
  X(eviction, "an allocation or fault-in needs the memory of an eviction whose copy has not finished")       \
  X(reclaim, "an allocation or fault-in needs idle memory whose free has not finished on its stream")        \
  X(unknown_stream, "an access by a call whose stream vcudnn cannot know waited for a restore copy")         \
  X(sync_allocation, "cudaMalloc (usable on every stream at once) reused memory freed on a stream")          \
  X(pin, "a pointer kept by a library (cublasSetWorkspace, texture objects) made an evicted buffer come back") \
  X(graph, "a CUDA graph capture touched an evicted buffer (or a graph vcudnn did not see built was used)")

enum class HostWait {
#define VCUDNN_HOST_WAIT_ID(name, why) k_##name,
  VCUDNN_HOST_WAITS(VCUDNN_HOST_WAIT_ID)
#undef VCUDNN_HOST_WAIT_ID
      kCount
};

class HostWaitCounts {
 public:
  void add(HostWait cause) { counts_[static_cast<size_t>(cause)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t get(HostWait cause) const { return counts_[static_cast<size_t>(cause)].load(std::memory_order_relaxed); }
  uint64_t total() const {
    uint64_t n = 0;
    for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
    return n;
  }
  // "3 (eviction=2 reclaim=1)", or "0".
  std::string text() const;
  static const char* name(HostWait cause);

 private:
  std::array<std::atomic<uint64_t>, static_cast<size_t>(HostWait::kCount)> counts_{};
};

}  // namespace vcudnn::memory
