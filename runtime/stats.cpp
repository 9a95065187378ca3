// Counters and their text form for the exit summary.
#include "runtime/stats.h"

#include "runtime/no_destroy.h"

namespace vcudnn {
namespace {

constexpr const char* kHookNames[] = {
#define VCUDNN_CUDNN_HOOK(short_name, fn) #short_name,
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
};

constexpr const char* kHookFunctions[] = {
#define VCUDNN_CUDNN_HOOK(short_name, fn) #fn,
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
};

}  // namespace

const char* hook_name(HookId id) { return kHookNames[static_cast<int>(id)]; }
const char* hook_function(HookId id) { return kHookFunctions[static_cast<int>(id)]; }

uint64_t Stats::total_calls() const {
  uint64_t n = 0;
  for (const auto& c : calls) n += c.load(std::memory_order_relaxed);
  return n;
}

std::string Stats::calls_text() const {
  std::string s;
  for (int i = 0; i < kHookCount; ++i) {
    uint64_t n = calls[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    if (!s.empty()) s += ' ';
    s += std::string(kHookNames[i]) + "=" + std::to_string(n);
  }
  return s.empty() ? "none" : s;
}

Stats& stats() {
  static NoDestroy<Stats> s;
  return s.get();
}

}  // namespace vcudnn
