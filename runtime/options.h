// Options: every VCUDNN_* environment variable, from one table (options.def). A bad value gives
// one error naming the variable and the accepted values, and vcudnn runs in pass-through.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vcudnn {

enum class OptionType { kEnum, kPath, kBytes, kBudget };

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
enum class Policy { kPassthrough = 0, kRecord = 1, kMicrobatch = 2, kOffload = 3, kMicrobatchOffload = 4 };

// What a policy turns on. The features are independent and work together in one process
// (runtime/process.h); VCUDNN_POLICY is the user's shorthand for a set of them.
struct Features {
  bool record = false;      // record the first complete iteration (the trace)
  bool microbatch = false;  // split convolutions under a workspace limit
  bool own_memory = false;  // serve the process's device memory; evict under a budget
};
Features features_of(Policy policy);
enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

enum class OptionSource { kDefault, kEnvironment, kFallback };

struct Options {
  std::array<std::string, kOptionCount> value;  // normalised (trimmed; enums lower-case)
  std::array<OptionSource, kOptionCount> source{};
  Policy policy = Policy::kRecord;
  LogLevel log_level = LogLevel::kInfo;
  uint64_t workspace_limit = 64ull << 20;   // VCUDNN_WORKSPACE_LIMIT
  std::optional<uint64_t> total_workspace;  // VCUDNN_TOTAL_WORKSPACE
  int batch_policy = 1;                     // VCUDNN_BATCH_POLICY, index into its accepted list
  std::vector<std::string> errors;          // bad values: each forces pass-through
  std::vector<std::string> warnings;        // unknown VCUDNN_* names

  const std::string& get(OptionId id) const { return value[id]; }
};

// Parses from a getenv-like lookup; `names` lists the VCUDNN_* variables present (for typos).
Options parse_options(const std::function<const char*(const char*)>& lookup, const std::vector<std::string>& names);
// The process's options, parsed from the environment once.
const Options& options();

// "123", "64K", "64 M", "1G", "2T" (also "64MiB", "64mb"; powers of 1024) -> bytes; nullopt if not
// a whole non-negative byte count that fits in 64 bits. The same parser as the budgets'
// (pool::parse_byte_count); 0 is zero bytes (a workspace limit of 0 allows only algorithms
// without workspace; a budget of 0 is refused).
std::optional<uint64_t> parse_bytes(std::string_view text);

// What to say when a workspace setting is more than the card holds (it then limits nothing), or
// nullopt. `card`: the device's memory in bytes.
std::optional<std::string> workspace_limit_warning(uint64_t limit, const std::optional<uint64_t>& total, uint64_t card);

// A value as messages show it: in quotes, control characters escaped, cut after 80 bytes.
std::string quoted(std::string_view value);

// "%p" -> process id, so that several processes (ranks) can share one setting.
std::string expand_path(const std::string& pattern);

}  // namespace vcudnn
