// AccessLog (access_log.h).
#include "runtime/memory/access_log.h"

namespace vcudnn::memory {

void AccessLog::add(uint64_t call, const uint64_t* serials, size_t n, Access mode) {
  if (full_.load(std::memory_order_relaxed)) return;  // no lock on the hot path once full
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    if (log_.size() >= kCap) {
      full_.store(true, std::memory_order_relaxed);
      return;
    }
    log_.push_back({call, serials[i], mode});
  }
}

std::vector<AccessLog::Record> AccessLog::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

}  // namespace vcudnn::memory
