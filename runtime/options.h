// Options: every VCUDNN_* environment variable, from one table (options.def). A bad value gives
// one error naming the variable and the accepted values, and vcudnn runs in pass-through.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace vcudnn {

enum class OptionType { kEnum, kPath };

enum OptionId {
#define VCUDNN_OPTION(id, env, type, def, accepted, doc) id,
#include "runtime/options.def"
#undef VCUDNN_OPTION
  kOptionCount
};

struct OptionSpec {
  OptionId id;
  const char* env;
  OptionType type;
  const char* default_value;
  const char* accepted;  // '|'-separated, enums only
  const char* doc;
};
const std::array<OptionSpec, kOptionCount>& option_specs();

// Enum values in the order of their `accepted` lists (checked by a test).
enum class Policy { kPassthrough = 0, kRecord = 1 };
enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

enum class OptionSource { kDefault, kEnvironment, kFallback };

struct Options {
  std::array<std::string, kOptionCount> value;  // normalised (trimmed; enums lower-case)
  std::array<OptionSource, kOptionCount> source{};
  Policy policy = Policy::kRecord;
  LogLevel log_level = LogLevel::kInfo;
  std::vector<std::string> errors;    // bad values: each forces pass-through
  std::vector<std::string> warnings;  // unknown VCUDNN_* names

  const std::string& get(OptionId id) const { return value[id]; }
};

// Parses from a getenv-like lookup; `names` lists the VCUDNN_* variables present (for typos).
Options parse_options(const std::function<const char*(const char*)>& lookup, const std::vector<std::string>& names);
// The process's options, parsed from the environment once.
const Options& options();

// "%p" -> process id, so that several processes (ranks) can share one setting.
std::string expand_path(const std::string& pattern);

}  // namespace vcudnn
