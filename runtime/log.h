// Logging: one spdlog logger named "vcudnn" (spdlog is included by log.cpp only). A disabled
// level costs one relaxed load; warnings from a hot call site stop after a few and the rest are
// counted and reported at exit.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "runtime/options.h"

namespace vcudnn::log {

// Level below which nothing is formatted; kOff until configure() runs.
extern std::atomic<int> g_level;

inline bool enabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed) && level != LogLevel::kOff;
}
void emit(LogLevel level, std::string_view message);

// Sets level and destination from the options. Returns an error text when the log file cannot be
// opened (logging then goes to stderr).
std::string configure(const Options& options);
// configure() once per process, whoever starts first (the engine, or memory ownership in a
// program that never calls cuDNN). The first caller prints the options' errors and warnings and
// gets true.
bool configure_once(const Options& options);

template <typename... Args>
void write(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(level)) emit(level, fmt::format(format, std::forward<Args>(args)...));
}

// Per call site: the first kLimit messages pass; later ones only count.
class SiteLimit {
 public:
  static constexpr uint32_t kLimit = 8;
  bool allow();

 private:
  std::atomic<uint32_t> count_{0};
};
uint64_t suppressed_count();

}  // namespace vcudnn::log

#define VCUDNN_LOG_TRACE(...) ::vcudnn::log::write(::vcudnn::LogLevel::kTrace, __VA_ARGS__)
#define VCUDNN_LOG_DEBUG(...) ::vcudnn::log::write(::vcudnn::LogLevel::kDebug, __VA_ARGS__)
#define VCUDNN_LOG_INFO(...) ::vcudnn::log::write(::vcudnn::LogLevel::kInfo, __VA_ARGS__)
#define VCUDNN_LOG_WARN(...) ::vcudnn::log::write(::vcudnn::LogLevel::kWarn, __VA_ARGS__)
#define VCUDNN_LOG_ERROR(...) ::vcudnn::log::write(::vcudnn::LogLevel::kError, __VA_ARGS__)
// Rate-limited at this call site.
#define VCUDNN_WARN_LIMITED(...)                                  \
  do {                                                            \
    static ::vcudnn::log::SiteLimit vcudnn_site_limit_;           \
    if (vcudnn_site_limit_.allow()) VCUDNN_LOG_WARN(__VA_ARGS__); \
  } while (0)
