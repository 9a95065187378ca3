// The options table and its parser: enums are case-insensitive, surrounding blanks ignored, an
// empty value means unset. Any bad value is an error that forces pass-through.
#include "runtime/options.h"

#include "pool/vmm_arena.h"

#include "runtime/no_destroy.h"

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

extern char** environ;

namespace vcudnn {
namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::vector<std::string> split_accepted(const char* accepted) {
  std::vector<std::string> out;
  std::string_view s(accepted);
  while (!s.empty()) {
    size_t bar = s.find('|');
    out.emplace_back(s.substr(0, bar));
    s = bar == std::string_view::npos ? std::string_view{} : s.substr(bar + 1);
  }
  return out;
}

int enum_index(const OptionSpec& spec, const std::string& value) {
  auto accepted = split_accepted(spec.accepted);
  auto it = std::find(accepted.begin(), accepted.end(), value);
  return it == accepted.end() ? -1 : static_cast<int>(it - accepted.begin());
}

std::string accepted_list(const OptionSpec& spec) {
  std::string s;
  for (const auto& a : split_accepted(spec.accepted)) s += (s.empty() ? "" : ", ") + a;
  return s;
}

}  // namespace

std::optional<uint64_t> parse_bytes(std::string_view text) { return pool::parse_byte_count(text); }

std::optional<std::string> workspace_limit_warning(uint64_t limit, const std::optional<uint64_t>& total,
                                                   uint64_t card) {
  if (card == 0) return std::nullopt;
  std::string what;
  if (limit > card) what = fmt::format("VCUDNN_WORKSPACE_LIMIT ({} bytes)", limit);
  if (total && *total > card)
    what += (what.empty() ? "" : " and ") + fmt::format("VCUDNN_TOTAL_WORKSPACE ({} bytes)", *total);
  if (what.empty()) return std::nullopt;
  return fmt::format("{} {} more than the card's {:.1f} GiB: it limits nothing", what,
                     limit > card && total && *total > card ? "are" : "is", static_cast<double>(card) / (1ull << 30));
}

std::string quoted(std::string_view value) {
  constexpr size_t kShown = 80;
  std::string out = "\"";
  for (size_t i = 0; i < value.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  if (value.size() > kShown) out += fmt::format(" (cut: {} bytes in all)", value.size());
  return out;
}

const std::array<OptionSpec, kOptionCount>& option_specs() {
  static const std::array<OptionSpec, kOptionCount> kSpecs = {{
#define VCUDNN_OPTION(id, env, type, def, accepted, doc) {id, env, OptionType::type, def, accepted, doc},
#include "runtime/options.def"
#undef VCUDNN_OPTION
  }};
  return kSpecs;
}

Options parse_options(const std::function<const char*(const char*)>& lookup, const std::vector<std::string>& names) {
  Options o;
  for (const auto& spec : option_specs()) {
    o.value[spec.id] = spec.default_value;
    const char* raw = lookup(spec.env);
    std::string v = raw ? trim(raw) : "";
    if (v.empty()) continue;
    if (spec.type == OptionType::kEnum) v = lower(v);
    if (spec.type == OptionType::kEnum && enum_index(spec, v) < 0) {
      o.errors.push_back(std::string(spec.env) + "=" + quoted(raw) + " is not valid; accepted values: " +
                         accepted_list(spec) + ". vcudnn continues in pass-through.");
      continue;
    }
    if (spec.type == OptionType::kBytes && !parse_bytes(v)) {
      o.errors.push_back(std::string(spec.env) + "=" + quoted(raw) +
                         " is not a byte count; use bytes or a K/M/G/T suffix (powers of 1024), e.g. 64M. "
                         "vcudnn continues in pass-through.");
      continue;
    }
    // Percentages are checked against a nominal 100 GiB total: the real total is known only
    // once the device is (memory_manager.cpp); here only the form is checked.
    if (spec.type == OptionType::kBudget && !pool::parse_budget(v, 100ull << 30)) {
      o.errors.push_back(std::string(spec.env) + "=" + quoted(raw) +
                         " is not a memory budget; use bytes with an optional K/M/G/T suffix (e.g. 40G) or a "
                         "percentage (e.g. 60%). vcudnn continues in pass-through.");
      continue;
    }
    o.value[spec.id] = v;
    o.source[spec.id] = OptionSource::kEnvironment;
  }
  o.workspace_limit = parse_bytes(o.value[kWorkspaceLimit]).value_or(64ull << 20);
  if (!o.value[kTotalWorkspace].empty()) o.total_workspace = parse_bytes(o.value[kTotalWorkspace]);
  o.batch_policy = enum_index(option_specs()[kBatchPolicy], o.value[kBatchPolicy]);
  o.policy = static_cast<Policy>(enum_index(option_specs()[kPolicy], o.value[kPolicy]));
  o.log_level = static_cast<LogLevel>(enum_index(option_specs()[kLogLevel], o.value[kLogLevel]));
  if (!o.errors.empty()) {
    o.policy = Policy::kPassthrough;
    o.value[kPolicy] = "passthrough";
    o.source[kPolicy] = OptionSource::kFallback;
  }
  for (const auto& name : names) {
    // The test suite's own settings, and the build folder the scripts use.
    if (name.rfind("VCUDNN_TEST_", 0) == 0 || name == "VCUDNN_BUILD_DIR") continue;
    bool known =
        std::any_of(option_specs().begin(), option_specs().end(), [&](const OptionSpec& s) { return name == s.env; });
    if (!known) {
      std::string all;
      for (const auto& s : option_specs()) all += (all.empty() ? "" : ", ") + std::string(s.env);
      o.warnings.push_back("unknown variable " + quoted(name) + " is ignored; known: " + all);
    }
  }
  return o;
}

const Options& options() {
  static NoDestroy<Options> kOptions([] {
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e) {
      std::string_view kv(*e);
      if (kv.rfind("VCUDNN_", 0) == 0) names.emplace_back(kv.substr(0, kv.find('=')));
    }
    return parse_options([](const char* n) { return ::getenv(n); }, names);
  }());
  return kOptions.get();
}

std::string expand_path(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

Features features_of(Policy policy) {
  Features f;
  f.record = policy != Policy::kPassthrough;
  f.microbatch = policy == Policy::kMicrobatch || policy == Policy::kMicrobatchOffload;
  f.own_memory = policy == Policy::kOffload || policy == Policy::kMicrobatchOffload;
  return f;
}

}  // namespace vcudnn
