// The accesses of the first calls (call number, buffer, mode), for VCUDNN_TRACE's
// path.memory.json. Bounded: once full it costs one relaxed load per access and takes no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/memory_access.h"

namespace vcudnn::memory {

class AccessLog {
 public:
  static constexpr size_t kCap = 1u << 20;
  struct Record {
    uint64_t call = 0;
    uint64_t buffer = 0;  // allocation sequence number
    Access mode = Access::kUnknown;
  };
  void add(uint64_t call, const uint64_t* serials, size_t n, Access mode);
  bool full() const { return full_.load(std::memory_order_relaxed); }
  std::vector<Record> records() const;

 private:
  mutable std::mutex mu_;
  std::vector<Record> log_;
  std::atomic<bool> full_{false};
};

}  // namespace vcudnn::memory
