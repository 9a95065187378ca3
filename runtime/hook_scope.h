// HookScope: what every hook does around its work. It counts the call, detects re-entry (cuDNN
// calling one of its own exported functions while we are inside a hook: that call is forwarded
// untouched), and accounts the host time spent inside vcudnn, the real call excluded.
#pragma once

#include <time.h>

#include <cstdint>

#include "runtime/stats.h"

namespace vcudnn {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

class HookScope {
 public:
  explicit HookScope(HookId id, bool wrapped = false) : nested_(depth()++ > 0) {
    Stats& s = stats();
    if (nested_) {
      s.nested_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    s.calls[static_cast<int>(id)].fetch_add(1, std::memory_order_relaxed);
    if (wrapped) s.wrapped_calls.fetch_add(1, std::memory_order_relaxed);
    start_ns_ = monotonic_ns();
  }
  ~HookScope() {
    --depth();
    if (!nested_) stats().self_ns.fetch_add(monotonic_ns() - start_ns_ - real_ns_, std::memory_order_relaxed);
  }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;

  bool nested() const { return nested_; }

  // Runs the real call and keeps its duration out of vcudnn's own time; remembers whether it was
  // made, and its status, for the exception barrier (runtime/barrier.h).
  template <typename F>
  auto real(F&& f) {
    const uint64_t t0 = monotonic_ns();
    real_state_ = RealState::kRunning;
    auto result = f();
    real_state_ = RealState::kDone;
    real_status_ = static_cast<int64_t>(result);
    real_ns_ += monotonic_ns() - t0;
    return result;
  }
  enum class RealState { kNotMade, kRunning, kDone };
  RealState real_state() const { return real_state_; }
  int64_t real_status() const { return real_status_; }

 private:
  static int& depth() {
    static thread_local int d = 0;
    return d;
  }
  bool nested_;
  uint64_t start_ns_ = 0;
  uint64_t real_ns_ = 0;
  RealState real_state_ = RealState::kNotMade;
  int64_t real_status_ = 0;
};

}  // namespace vcudnn
