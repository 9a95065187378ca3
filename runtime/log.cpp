// The "vcudnn" logger. It is never destroyed (NoDestroy), so the exit summary can still log
// after other static objects are gone. Lines look like "vcudnn[pid] info: ...".
#include "runtime/log.h"

#include <unistd.h>

#include <cstdio>

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <mutex>

#include "runtime/no_destroy.h"

namespace vcudnn::log {

std::atomic<int> g_level{static_cast<int>(LogLevel::kOff)};

namespace {

std::atomic<uint64_t> g_suppressed{0};

struct State {
  std::mutex mu;
  std::shared_ptr<spdlog::logger> logger;
};

State& state() {
  static NoDestroy<State> s;
  return s.get();
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

std::string configure(const Options& options) {
  std::string error;
  spdlog::sink_ptr sink;
  const std::string& file = options.get(kLogFile);
  if (!file.empty()) {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(expand_path(file), /*truncate=*/false);
    } catch (const std::exception& e) {
      error = "VCUDNN_LOG_FILE=\"" + file + "\" cannot be opened (" + e.what() + "); logging to stderr";
    }
  }
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("vcudnn", sink);
  logger->set_pattern(file.empty() || !error.empty() ? "vcudnn[%P] %l: %v" : "%Y-%m-%d %H:%M:%S.%e vcudnn[%P] %l: %v");
  logger->set_level(to_spdlog(options.log_level));
  logger->flush_on(spdlog::level::trace);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().logger = std::move(logger);
  }
  g_level.store(static_cast<int>(options.log_level), std::memory_order_relaxed);
  return error;
}

bool configure_once(const Options& options) {
  static std::once_flag once;
  bool first = false;
  std::call_once(once, [&] {
    first = true;
    const std::string error = configure(options);
    for (const auto& e : options.errors) VCUDNN_LOG_ERROR("{}", e);
    // A bad setting is always seen once on stderr, even with logging off or going to a file.
    const bool on_stderr = options.log_level != LogLevel::kOff && (options.get(kLogFile).empty() || !error.empty());
    if (!on_stderr)
      for (const auto& e : options.errors) std::fprintf(stderr, "vcudnn[%d] error: %s\n", static_cast<int>(::getpid()), e.c_str());
    if (!error.empty()) VCUDNN_LOG_ERROR("{}", error);
    for (const auto& w : options.warnings) VCUDNN_LOG_WARN("{}", w);
  });
  return first;
}

void emit(LogLevel level, std::string_view message) {
  std::shared_ptr<spdlog::logger> logger;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    logger = state().logger;
  }
  if (logger) logger->log(to_spdlog(level), message);
}

bool SiteLimit::allow() {
  if (count_.fetch_add(1, std::memory_order_relaxed) < kLimit) return true;
  g_suppressed.fetch_add(1, std::memory_order_relaxed);
  return false;
}

uint64_t suppressed_count() { return g_suppressed.load(std::memory_order_relaxed); }

}  // namespace vcudnn::log
