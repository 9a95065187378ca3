// parse_options() over a fake environment: defaults, enum normalisation, bad values (one error,
// forced pass-through), empty values, unknown VCUDNN_* names; option_specs() order; expand_path.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "pool/budget.h"
#include "runtime/options.h"
#include "tests/common/test_util.h"

namespace {

using vcudnn::LogLevel;
using vcudnn::OptionSource;
using vcudnn::Policy;

// A fake environment: only the variables in `env` are set.
vcudnn::Options parse(const std::map<std::string, std::string>& env, const std::vector<std::string>& names = {}) {
  return vcudnn::parse_options(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      names);
}

std::vector<std::string> split_bars(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t bar = s.find('|', start);
    out.push_back(s.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

const vcudnn::OptionSpec& spec(vcudnn::OptionId id) { return vcudnn::option_specs()[id]; }

}  // namespace

TEST_CASE("options: defaults when nothing is set", "[options]") {
  const auto o = parse({});
  CHECK(o.errors.empty());
  CHECK(o.warnings.empty());
  CHECK(o.policy == Policy::kRecord);
  CHECK(o.log_level == LogLevel::kInfo);
  for (const auto& s : vcudnn::option_specs()) {
    INFO(s.env);
    CHECK(o.get(s.id) == s.default_value);
    CHECK(o.source[s.id] == OptionSource::kDefault);
  }
  CHECK(o.get(vcudnn::kPolicy) == "record");
  CHECK(o.get(vcudnn::kLogLevel) == "info");
  CHECK(o.get(vcudnn::kTrace).empty());
}

TEST_CASE("options: specs table is consistent", "[options]") {
  const auto& specs = vcudnn::option_specs();
  REQUIRE(specs.size() == static_cast<size_t>(vcudnn::kOptionCount));
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO(specs[i].env);
    CHECK(static_cast<size_t>(specs[i].id) == i);
    CHECK(std::string(specs[i].env).rfind("VCUDNN_", 0) == 0);
    if (specs[i].type == vcudnn::OptionType::kEnum) {
      auto accepted = split_bars(specs[i].accepted);
      CHECK(std::find(accepted.begin(), accepted.end(), specs[i].default_value) != accepted.end());
    }
  }
}

TEST_CASE("options: accepted lists follow the Policy and LogLevel enum order", "[options]") {
  const auto policies = split_bars(spec(vcudnn::kPolicy).accepted);
  REQUIRE(policies.size() == 5);
  CHECK(policies[static_cast<int>(Policy::kPassthrough)] == "passthrough");
  CHECK(policies[static_cast<int>(Policy::kRecord)] == "record");
  CHECK(policies[static_cast<int>(Policy::kMicrobatch)] == "microbatch");
  CHECK(policies[static_cast<int>(Policy::kOffload)] == "offload");
  CHECK(policies[static_cast<int>(Policy::kMicrobatchOffload)] == "microbatch+offload");

  const auto levels = split_bars(spec(vcudnn::kLogLevel).accepted);
  REQUIRE(levels.size() == 6);
  CHECK(levels[static_cast<int>(LogLevel::kTrace)] == "trace");
  CHECK(levels[static_cast<int>(LogLevel::kDebug)] == "debug");
  CHECK(levels[static_cast<int>(LogLevel::kInfo)] == "info");
  CHECK(levels[static_cast<int>(LogLevel::kWarn)] == "warn");
  CHECK(levels[static_cast<int>(LogLevel::kError)] == "error");
  CHECK(levels[static_cast<int>(LogLevel::kOff)] == "off");

  // And the parser maps the i-th accepted value to the i-th enumerator.
  for (size_t i = 0; i < policies.size(); ++i) {
    auto o = parse({{"VCUDNN_POLICY", policies[i]}});
    CHECK(static_cast<size_t>(o.policy) == i);
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    auto o = parse({{"VCUDNN_LOG_LEVEL", levels[i]}});
    CHECK(static_cast<size_t>(o.log_level) == i);
  }
}

TEST_CASE("options: each policy is a set of features that work together", "[options]") {
  const auto on = [](Policy p) {
    const vcudnn::Features f = vcudnn::features_of(p);
    return std::string(f.record ? "r" : "") + (f.microbatch ? "m" : "") + (f.own_memory ? "o" : "");
  };
  CHECK(on(Policy::kPassthrough).empty());
  CHECK(on(Policy::kRecord) == "r");
  CHECK(on(Policy::kMicrobatch) == "rm");
  CHECK(on(Policy::kOffload) == "ro");
  CHECK(on(Policy::kMicrobatchOffload) == "rmo");
  const vcudnn::Options o = parse({{"VCUDNN_POLICY", " Microbatch+Offload "}});
  CHECK(o.errors.empty());
  CHECK(o.policy == Policy::kMicrobatchOffload);
}

TEST_CASE("options: enums are case-insensitive and trimmed", "[options]") {
  for (const auto& s : vcudnn::option_specs()) {
    if (s.type != vcudnn::OptionType::kEnum) continue;
    const auto accepted = split_bars(s.accepted);
    for (size_t i = 0; i < accepted.size(); ++i) {
      for (const std::string& raw :
           {upper(accepted[i]), " \t" + accepted[i] + "  \n", "  " + upper(accepted[i]) + " "}) {
        INFO(s.env << "=\"" << raw << "\"");
        auto o = parse({{s.env, raw}});
        CHECK(o.errors.empty());
        CHECK(o.get(s.id) == accepted[i]);
        CHECK(o.source[s.id] == OptionSource::kEnvironment);
        if (s.id == vcudnn::kPolicy) CHECK(static_cast<size_t>(o.policy) == i);
        if (s.id == vcudnn::kLogLevel) CHECK(static_cast<size_t>(o.log_level) == i);
      }
    }
  }
  auto mixed = parse({{"VCUDNN_POLICY", " PassThrough "}, {"VCUDNN_LOG_LEVEL", "DeBuG"}});
  CHECK(mixed.policy == Policy::kPassthrough);
  CHECK(mixed.log_level == LogLevel::kDebug);
  CHECK(mixed.source[vcudnn::kPolicy] == OptionSource::kEnvironment);
}

TEST_CASE("options: paths are trimmed but keep their case", "[options]") {
  auto o = parse({{"VCUDNN_TRACE", "  /tmp/My Trace-%p.JSON\t"}, {"VCUDNN_LOG_FILE", "/Var/Log/X.log"}});
  CHECK(o.errors.empty());
  CHECK(o.get(vcudnn::kTrace) == "/tmp/My Trace-%p.JSON");
  CHECK(o.source[vcudnn::kTrace] == OptionSource::kEnvironment);
  CHECK(o.get(vcudnn::kLogFile) == "/Var/Log/X.log");
  CHECK(o.policy == Policy::kRecord);
}

TEST_CASE("options: a bad enum value is one error naming the variable, the value and the accepted values",
          "[options]") {
  for (auto id : {vcudnn::kPolicy, vcudnn::kLogLevel}) {
    const auto& s = spec(id);
    INFO(s.env);
    const std::string bad = "Recrod-Bogus";
    // Another valid setting alongside: the bad value still forces pass-through.
    std::map<std::string, std::string> env = {{s.env, bad}};
    if (id != vcudnn::kPolicy) env["VCUDNN_POLICY"] = "record";
    auto o = parse(env);
    REQUIRE(o.errors.size() == 1);
    const std::string& e = o.errors[0];
    CHECK_THAT(e, Catch::Contains(s.env));
    CHECK_THAT(e, Catch::Contains(bad));
    for (const auto& a : split_bars(s.accepted)) CHECK_THAT(e, Catch::Contains(a));
    CHECK(o.warnings.empty());
    CHECK(o.policy == Policy::kPassthrough);
    CHECK(o.get(vcudnn::kPolicy) == "passthrough");
    CHECK(o.source[vcudnn::kPolicy] == OptionSource::kFallback);
    if (id == vcudnn::kLogLevel) {
      CHECK(o.log_level == LogLevel::kInfo);  // the bad value is not used
      CHECK(o.get(vcudnn::kLogLevel) == "info");
    }
  }
  // Two bad values: two errors, still pass-through.
  auto both = parse({{"VCUDNN_POLICY", "x"}, {"VCUDNN_LOG_LEVEL", "y"}});
  CHECK(both.errors.size() == 2);
  CHECK(both.policy == Policy::kPassthrough);
  CHECK(both.source[vcudnn::kPolicy] == OptionSource::kFallback);
}

TEST_CASE("options: an empty or blank value means unset", "[options]") {
  for (const std::string v : {"", "   ", "\t\n"}) {
    INFO("value \"" << v << "\"");
    auto o = parse({{"VCUDNN_POLICY", v}, {"VCUDNN_LOG_LEVEL", v}, {"VCUDNN_TRACE", v}});
    CHECK(o.errors.empty());
    CHECK(o.policy == Policy::kRecord);
    CHECK(o.log_level == LogLevel::kInfo);
    CHECK(o.source[vcudnn::kPolicy] == OptionSource::kDefault);
    CHECK(o.source[vcudnn::kLogLevel] == OptionSource::kDefault);
    CHECK(o.source[vcudnn::kTrace] == OptionSource::kDefault);
    CHECK(o.get(vcudnn::kTrace).empty());
  }
}

TEST_CASE("options: unknown VCUDNN_* names are warnings, not errors", "[options]") {
  std::vector<std::string> names = {"VCUDNN_POLICY", "VCUDNN_POLCY", "VCUDNN_TRACE"};
  auto o = parse({{"VCUDNN_POLICY", "passthrough"}, {"VCUDNN_POLCY", "record"}}, names);
  REQUIRE(o.warnings.size() == 1);
  CHECK_THAT(o.warnings[0], Catch::Contains("VCUDNN_POLCY"));
  CHECK(o.errors.empty());
  CHECK(o.policy == Policy::kPassthrough);
  CHECK(o.source[vcudnn::kPolicy] == OptionSource::kEnvironment);

  auto unchanged = parse({}, {"VCUDNN_FOO", "VCUDNN_BAR", "VCUDNN_TEST_PYTHON", "VCUDNN_BUILD_DIR"});
  REQUIRE(unchanged.warnings.size() == 2);  // the suite's and the scripts' own variables are not typos
  CHECK_THAT(unchanged.warnings[0], Catch::Contains("VCUDNN_FOO"));
  CHECK_THAT(unchanged.warnings[1], Catch::Contains("VCUDNN_BAR"));
  CHECK(unchanged.errors.empty());
  CHECK(unchanged.policy == Policy::kRecord);
  CHECK(unchanged.source[vcudnn::kPolicy] == OptionSource::kDefault);

  // Every known name is accepted silently.
  std::vector<std::string> known;
  for (const auto& s : vcudnn::option_specs()) known.emplace_back(s.env);
  CHECK(parse({}, known).warnings.empty());
}

TEST_CASE("options: expand_path replaces %p with the process id", "[options]") {
  const std::string pid = std::to_string(::getpid());
  CHECK(vcudnn::expand_path("/tmp/trace-%p.json") == "/tmp/trace-" + pid + ".json");
  CHECK(vcudnn::expand_path("%p") == pid);
  CHECK(vcudnn::expand_path("a%pb%pc") == "a" + pid + "b" + pid + "c");
  CHECK(vcudnn::expand_path("") == "");
  CHECK(vcudnn::expand_path("/plain/path.json") == "/plain/path.json");
  CHECK(vcudnn::expand_path("100% %d %s %P p%") == "100% %d %s %P p%");
}

TEST_CASE("options: byte counts take K/M/G/T suffixes (powers of 1024), nothing else", "[options]") {
  using vcudnn::parse_bytes;
  CHECK(parse_bytes("0") == 0u);
  CHECK(parse_bytes("123") == 123u);
  CHECK(parse_bytes("64K") == 64u << 10);
  CHECK(parse_bytes("64m") == 64u << 20);
  CHECK(parse_bytes(" 64MiB ") == 64u << 20);
  CHECK(parse_bytes("64MB") == 64u << 20);
  CHECK(parse_bytes("2G") == 2ull << 30);
  CHECK(parse_bytes("3T") == 3ull << 40);
  CHECK(parse_bytes("17b") == 17u);
  CHECK(parse_bytes("64 M") == 64u << 20);  // as the budgets: one parser
  CHECK(parse_bytes("64\tGiB") == 64ull << 30);
  CHECK(parse_bytes("18446744073709551615") == UINT64_MAX);
  for (const char* bad : {"", "M", "-1", "1.5G", "64X", "64 M M", "0x10", "18446744073709551616", "16777216T", "6 4M", "64M\n1",
                          "99999999999999999999999", "64Mi", "1e9"}) {
    INFO(bad);
    CHECK_FALSE(parse_bytes(bad).has_value());
  }
}

TEST_CASE("options: micro-batching settings are parsed, and a bad one forces pass-through", "[options]") {
  const auto d = parse({});
  CHECK(d.workspace_limit == 64u << 20);
  CHECK_FALSE(d.total_workspace.has_value());
  CHECK(d.batch_policy == 1);  // poweroftwo

  const auto o = parse({{"VCUDNN_POLICY", "microbatch"},
                        {"VCUDNN_WORKSPACE_LIMIT", "8M"},
                        {"VCUDNN_TOTAL_WORKSPACE", "0"},
                        {"VCUDNN_BATCH_POLICY", "powerOfTwo"}});
  CHECK(o.errors.empty());
  CHECK(o.policy == Policy::kMicrobatch);
  CHECK(o.workspace_limit == 8u << 20);
  REQUIRE(o.total_workspace.has_value());
  CHECK(*o.total_workspace == 0u);  // a zero budget is a budget, not "unset"
  CHECK(o.get(vcudnn::kBatchPolicy) == "poweroftwo");
  CHECK(parse({{"VCUDNN_BATCH_POLICY", "ALL"}}).batch_policy == 2);

  for (const char* var : {"VCUDNN_WORKSPACE_LIMIT", "VCUDNN_TOTAL_WORKSPACE"}) {
    const auto bad = parse({{"VCUDNN_POLICY", "microbatch"}, {var, "64 megs"}});
    REQUIRE(bad.errors.size() == 1);
    CHECK_THAT(bad.errors[0], Catch::Contains(var) && Catch::Contains("64 megs") && Catch::Contains("K/M/G"));
    CHECK(bad.policy == Policy::kPassthrough);
    CHECK(bad.source[vcudnn::kPolicy] == OptionSource::kFallback);
  }
}

TEST_CASE("options: offload policy and memory budgets", "[options]") {
  const auto d = parse({{"VCUDNN_POLICY", "offload"}});
  CHECK(d.errors.empty());
  CHECK(d.policy == Policy::kOffload);
  CHECK(d.get(vcudnn::kDeviceBudget).empty());  // no budget: ownership without eviction
  CHECK(d.get(vcudnn::kHostBudget) == "8G");

  for (const char* good : {"60%", "62.5%", "40G", "512MiB", "1073741824"}) {
    const auto o = parse({{"VCUDNN_POLICY", "offload"}, {"VCUDNN_DEVICE_BUDGET", good}, {"VCUDNN_HOST_BUDGET", good}});
    INFO(good);
    CHECK(o.errors.empty());
    CHECK(o.policy == Policy::kOffload);
    CHECK(o.get(vcudnn::kDeviceBudget) == good);
  }
  for (const char* var : {"VCUDNN_DEVICE_BUDGET", "VCUDNN_HOST_BUDGET"}) {
    for (const char* bad_value : {"0", "150%", "0%", "lots", "-1G", "1.5G"}) {
      const auto bad = parse({{"VCUDNN_POLICY", "offload"}, {var, bad_value}});
      INFO(var << "=" << bad_value);
      REQUIRE(bad.errors.size() == 1);
      CHECK_THAT(bad.errors[0], Catch::Contains(var) && Catch::Contains(bad_value) && Catch::Contains("percentage"));
      CHECK(bad.policy == Policy::kPassthrough);
    }
  }
}

// The README's environment table holds every option, one row each, in one unbroken table (a blank
// line once cut VCUDNN_DEVICE_BUDGET and VCUDNN_HOST_BUDGET out of it).
TEST_CASE("options: the README's environment table has one row per option, unbroken", "[options]") {
  std::ifstream in(vcudnn::test::source_dir() + "/README.md");
  REQUIRE(in);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const auto heading = std::find(lines.begin(), lines.end(), "## Environment variables");
  REQUIRE(heading != lines.end());
  auto row = std::find_if(heading, lines.end(), [](const std::string& l) { return l.rfind("| variable", 0) == 0; });
  REQUIRE(row != lines.end());
  row += 2;  // the header and its rule
  std::vector<std::string> names;
  for (; row != lines.end() && row->rfind("| `VCUDNN_", 0) == 0; ++row)
    names.push_back(row->substr(3, row->find('`', 3) - 3));
  INFO("the table ends before: " << (row != lines.end() ? *row : "(end of file)"));
  std::vector<std::string> options;
#define VCUDNN_OPTION(id, env, type, def, accepted, doc) options.push_back(env);
#include "runtime/options.def"
#undef VCUDNN_OPTION
  CHECK(names == options);
}

// One parser for every byte count: the budgets read sizes exactly as the workspace limits do
// (before, "64 M" was a workspace limit but not a budget). 0 is zero bytes for both; a budget of
// zero bytes is refused.
TEST_CASE("options: byte counts and budgets share one parser", "[options]") {
  for (const char* text : {"1", "123", "64K", "64 M", " 64MiB ", "64mb", "2G", "3T", "17b", "18446744073709551615",
                           "64\tG", "", "M", "-1", "1.5G", "64X", "6 4M", "0x10", "18446744073709551616", "1e9"}) {
    INFO("\"" << text << "\"");
    CHECK(vcudnn::parse_bytes(text) == vcudnn::pool::parse_budget(text, 80ull << 30));
  }
  CHECK(vcudnn::parse_bytes("0") == 0u);
  CHECK_FALSE(vcudnn::pool::parse_budget("0", 80ull << 30).has_value());
  CHECK_FALSE(vcudnn::pool::parse_budget("0%", 80ull << 30).has_value());
  CHECK(vcudnn::pool::parse_budget(" 50 % ", 80ull << 30) == 40ull << 30);
  const auto o = parse({{"VCUDNN_DEVICE_BUDGET", "64 M"}, {"VCUDNN_WORKSPACE_LIMIT", "64 M"}});
  CHECK(o.errors.empty());
  CHECK(o.workspace_limit == 64u << 20);
}

TEST_CASE("options: values in messages are quoted, escaped and cut", "[options]") {
  CHECK(vcudnn::quoted("plain") == "\"plain\"");
  CHECK(vcudnn::quoted("a\nb\tc\"d\\e\x01") == "\"a\\nb\\tc\\\"d\\\\e\\x01\"");
  const std::string big(100000, 'x');
  const std::string shown = vcudnn::quoted(big);
  CHECK(shown.size() < 150);
  CHECK(shown.find("100000 bytes") != std::string::npos);
  const auto o = parse({{"VCUDNN_POLICY", big}, {"VCUDNN_WORKSPACE_LIMIT", "64M\nX"}});
  REQUIRE(o.errors.size() == 2);
  for (const auto& e : o.errors) {
    INFO(e);
    CHECK(e.size() < 600);
    CHECK(e.find('\n') == std::string::npos);
  }
}

// Upper limits: a workspace setting beyond the card limits nothing, and says so (2^64-1 was
// accepted silently).
TEST_CASE("options: workspace settings beyond the card are warned about", "[options]") {
  constexpr uint64_t kCard = 80ull << 30;
  CHECK_FALSE(vcudnn::workspace_limit_warning(64u << 20, std::nullopt, kCard).has_value());
  CHECK_FALSE(vcudnn::workspace_limit_warning(kCard, kCard, kCard).has_value());
  const auto w = vcudnn::workspace_limit_warning(UINT64_MAX, std::nullopt, kCard);
  REQUIRE(w.has_value());
  CHECK_THAT(*w, Catch::Contains("VCUDNN_WORKSPACE_LIMIT") && Catch::Contains("80.0 GiB") &&
                     Catch::Contains("limits nothing"));
  const auto both = vcudnn::workspace_limit_warning(UINT64_MAX, UINT64_MAX, kCard);
  REQUIRE(both.has_value());
  CHECK_THAT(*both, Catch::Contains("VCUDNN_TOTAL_WORKSPACE") && Catch::Contains(" are more"));
  CHECK_FALSE(vcudnn::workspace_limit_warning(UINT64_MAX, std::nullopt, 0).has_value());  // card unknown
}
