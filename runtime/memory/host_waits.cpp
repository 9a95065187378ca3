// HostWaitCounts (host_waits.h).
#include "runtime/memory/host_waits.h"

namespace vcudnn::memory {

const char* HostWaitCounts::name(HostWait cause) {
  static constexpr const char* kNames[] = {
#define VCUDNN_HOST_WAIT_NAME(name, why) #name,
      VCUDNN_HOST_WAITS(VCUDNN_HOST_WAIT_NAME)
#undef VCUDNN_HOST_WAIT_NAME
  };
  return kNames[static_cast<size_t>(cause)];
}

std::string HostWaitCounts::text() const {
  std::string causes;
  for (size_t i = 0; i < counts_.size(); ++i) {
    const uint64_t n = counts_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    if (!causes.empty()) causes += ' ';
    causes += name(static_cast<HostWait>(i));
    causes += '=';
    causes += std::to_string(n);
  }
  std::string out = std::to_string(total());
  if (!causes.empty()) {
    out += " (";
    out += causes;
    out += ')';
  }
  return out;
}

}  // namespace vcudnn::memory
