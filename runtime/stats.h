// Process-wide counters: calls per hook (made by the application; calls cuDNN makes into itself
// are counted apart as nested), and host time spent inside vcudnn excluding the real calls.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace vcudnn {

enum class HookId : uint16_t {
#define VCUDNN_CUDNN_HOOK(short_name, fn) short_name,
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
};
inline constexpr int kHookCount = 0
#define VCUDNN_CUDNN_HOOK(short_name, fn) +1
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
    ;

const char* hook_name(HookId id);      // "conv_fwd"
const char* hook_function(HookId id);  // "cudnnConvolutionForward"

struct Stats {
  std::array<std::atomic<uint64_t>, kHookCount> calls{};
  std::atomic<uint64_t> wrapped_calls{0};  // through vcudnnHandle_t
  std::atomic<uint64_t> nested_calls{0};   // cuDNN calling its own exported entry points
  std::atomic<uint64_t> self_ns{0};        // time inside vcudnn, real calls excluded

  uint64_t total_calls() const;
  // "conv_fwd=60 conv_bwd_data=57 ... set_stream=357" (non-zero counters only)
  std::string calls_text() const;
};

Stats& stats();

}  // namespace vcudnn
