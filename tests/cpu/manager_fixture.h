// What the memory-manager tests on the simulated device share: ownership switched on for the
// test's scope (call scopes arm only then), and a manager configuration of a 4096-granule card with
// 256 MiB of pinned host memory in 8 MiB slabs.
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/memory_access.h"
#include "runtime/memory_manager.h"

namespace vcudnn::test {

struct MemoryActive {
  MemoryActive() { memory::detail::g_active.store(true); }
  ~MemoryActive() { memory::detail::g_active.store(false); }
  MemoryActive(const MemoryActive&) = delete;
  MemoryActive& operator=(const MemoryActive&) = delete;
};

inline memory::ManagerConfig manager_config(std::optional<uint64_t> budget, uint64_t granularity) {
  constexpr uint64_t kMiB = 1ull << 20;
  memory::ManagerConfig c;
  c.device_budget = budget;
  c.device_total = 4096 * granularity;
  c.host_budget = 256 * kMiB;
  c.host_slab_bytes = 8 * kMiB;
  c.reserve_bytes = 16384 * granularity;
  return c;
}

}  // namespace vcudnn::test
