// `vcudnn run` (tools/launcher.cpp), run as a real process: the child (`env`, `sh`) sees libvcudnn.so
// first in LD_PRELOAD, one VCUDNN_* variable per option given, PyTorch's allocator switched to
// cudaMallocAsync when the policy owns memory; bad settings and allocator settings vcudnn cannot
// work under stop the launch (exit 2, nothing run); exit statuses and signals are the command's.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/options.h"
#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

using Env = std::map<std::string, std::optional<std::string>>;

constexpr const char* kCudaConf = "PYTORCH_CUDA_ALLOC_CONF";
constexpr const char* kConf = "PYTORCH_ALLOC_CONF";
constexpr const char* kAsync = "backend:cudaMallocAsync";

// `vcudnn run ARGS` with no preload and no PyTorch allocator setting unless `env` gives them
// (run_process already drops the caller's VCUDNN_* settings).
ProcessResult launch(const std::vector<std::string>& args, const Env& env = {}) {
  std::vector<std::string> argv{exe_dir() + "/vcudnn", "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  Env e{{"LD_PRELOAD", std::nullopt}, {kCudaConf, std::nullopt}, {kConf, std::nullopt}};
  for (const auto& [k, v] : env) e[k] = v;
  return run_process(argv, e, 60);
}

// The child's environment, as printed by `env` under `vcudnn run ARGS -- env`.
std::map<std::string, std::string> child_env(const std::vector<std::string>& args, const Env& env = {}) {
  std::vector<std::string> all = args;
  all.insert(all.end(), {"--", "env"});
  auto r = launch(all, env);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return parse_env_output(r.out);
}

std::optional<std::string> value_of(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// A valid value of each kind, different from the defaults.
std::string sample_value(const vcudnn::OptionSpec& spec) {
  switch (spec.type) {
    case vcudnn::OptionType::kEnum: {
      const std::string accepted = spec.accepted;
      return accepted.substr(0, accepted.find('|'));
    }
    case vcudnn::OptionType::kPath:
      return "/nonexistent/vcudnn-launcher-test/" + std::string(spec.env);
    case vcudnn::OptionType::kBytes:
      return "48M";
    case vcudnn::OptionType::kBudget:
      return "60%";
  }
  return "";
}

std::string flag(const vcudnn::OptionSpec& spec) {
  std::string name = std::string(spec.env).substr(std::string("VCUDNN_").size());
  for (char& c : name) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return "--" + name;
}

// A command that leaves a trace when it runs.
std::vector<std::string> touch(const std::string& path) { return {"--", "sh", "-c", "touch '" + path + "'"}; }

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every policy value that owns device memory: "offload" and any later one containing it.
std::vector<std::string> offload_policies() {
  std::vector<std::string> out;
  std::string accepted = vcudnn::option_specs()[vcudnn::kPolicy].accepted;
  for (size_t start = 0; start <= accepted.size();) {
    size_t bar = accepted.find('|', start);
    if (bar == std::string::npos) bar = accepted.size();
    const std::string v = accepted.substr(start, bar - start);
    if (v.find("offload") != std::string::npos) out.push_back(v);
    start = bar + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("launcher: one option per row of options.def sets its variable, and --budget is --device-budget",
          "[launcher]") {
  std::vector<std::string> args;
  for (const auto& spec : vcudnn::option_specs())
    if (spec.id != vcudnn::kPolicy)  // a policy owning memory would also change PyTorch's settings
      args.insert(args.end(), {flag(spec), sample_value(spec)});
  const auto env = child_env(args);
  for (const auto& spec : vcudnn::option_specs()) {
    INFO(spec.env);
    if (spec.id != vcudnn::kPolicy) CHECK(value_of(env, spec.env) == sample_value(spec));
  }
  CHECK(value_of(env, "VCUDNN_POLICY") == std::nullopt);  // not given: not set
  CHECK(value_of(env, "LD_PRELOAD") == libvcudnn_path());
  CHECK(value_of(env, kCudaConf) == std::nullopt);  // the default policy owns no memory

  CHECK(value_of(child_env({"--budget", "40G"}), "VCUDNN_DEVICE_BUDGET") == "40G");
  CHECK(value_of(child_env({"--policy", "passthrough"}), "VCUDNN_POLICY") == "passthrough");
}

TEST_CASE("launcher: --help names every option of options.def", "[launcher]") {
  auto r = launch({"--help"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  for (const auto& spec : vcudnn::option_specs()) CHECK(r.out.find(flag(spec)) != std::string::npos);
  CHECK(r.out.find("--budget") != std::string::npos);
}

TEST_CASE("launcher: LD_PRELOAD gets vcudnn first, once, and keeps the user's entries", "[launcher]") {
  const std::string lib = libvcudnn_path();
  SECTION("user entries after vcudnn") {
    const auto env = child_env({}, {{"LD_PRELOAD", "/nonexistent/liba.so /nonexistent/libb.so"}});
    CHECK(value_of(env, "LD_PRELOAD") == lib + ":/nonexistent/liba.so:/nonexistent/libb.so");
  }
  SECTION("vcudnn already listed: not added twice") {
    const auto env = child_env({}, {{"LD_PRELOAD", "/nonexistent/liba.so:" + lib}});
    CHECK(value_of(env, "LD_PRELOAD") == lib + ":/nonexistent/liba.so");
  }
  SECTION("--library, made absolute and normal") {
    const auto env = child_env({"--library", exe_dir() + "/../bin/./libvcudnn.so"});
    CHECK(value_of(env, "LD_PRELOAD") == lib);
  }
  SECTION("--library that does not exist: refused") {
    TempDir tmp;
    auto r = launch(concat({"--library", "/nonexistent/libvcudnn.so"}, touch(tmp.file("ran"))));
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("/nonexistent/libvcudnn.so not found") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(tmp.file("ran")));
  }
}

TEST_CASE("launcher: settings not given are left as the caller has them", "[launcher]") {
  auto r = launch({"--", "env"}, {{"VCUDNN_LOG_LEVEL", "debug"}, {"VCUDNN_WORKSPACE_LIMIT", "8M"}});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto env = parse_env_output(r.out);
  CHECK(value_of(env, "VCUDNN_LOG_LEVEL") == "debug");
  CHECK(value_of(env, "VCUDNN_WORKSPACE_LIMIT") == "8M");
  CHECK(r.err.find("VCUDNN_LOG_LEVEL") == std::string::npos);  // not named as set
}

TEST_CASE("launcher: a policy owning memory merges backend:cudaMallocAsync into PyTorch's settings", "[launcher]") {
  REQUIRE_FALSE(offload_policies().empty());
  for (const auto& policy : offload_policies()) {
    INFO("--policy " << policy);
    const std::vector<std::string> args{"--policy", policy};
    CHECK(value_of(child_env(args), kCudaConf) == kAsync);
    CHECK(value_of(child_env(args, {{kCudaConf, ""}}), kCudaConf) == kAsync);
    const std::string others = "max_split_size_mb:128, roundup_power2_divisions:[256:1,512:2]";
    CHECK(value_of(child_env(args, {{kCudaConf, others}}), kCudaConf) == others + "," + kAsync);
    const std::string already = "garbage_collection_threshold:0.6,backend:cudaMallocAsync";
    CHECK(value_of(child_env(args, {{kCudaConf, already}}), kCudaConf) == already);
    CHECK(value_of(child_env(args, {{kCudaConf, "expandable_segments:False"}}), kCudaConf) ==
          std::string("expandable_segments:False,") + kAsync);
  }
  SECTION("the policy inherited from the caller counts too") {
    CHECK(value_of(child_env({}, {{"VCUDNN_POLICY", " Offload "}}), kCudaConf) == kAsync);
  }
  SECTION("PYTORCH_ALLOC_CONF, which some PyTorch versions read first, gets the backend where it is set") {
    const auto env = child_env({"--policy", "offload"}, {{kConf, "garbage_collection_threshold:0.6"}});
    CHECK(value_of(env, kConf) == std::string("garbage_collection_threshold:0.6,") + kAsync);
    CHECK(value_of(env, kCudaConf) == std::nullopt);
  }
  SECTION("other policies leave PyTorch's settings alone") {
    CHECK(value_of(child_env({"--policy", "record"}), kCudaConf) == std::nullopt);
    const auto env = child_env({"--policy", "microbatch"}, {{kCudaConf, "expandable_segments:True"}});
    CHECK(value_of(env, kCudaConf) == "expandable_segments:True");
  }
}

TEST_CASE("launcher: expandable segments or another allocator backend are refused under offload", "[launcher]") {
  TempDir tmp;
  const auto refused = [&](const Env& env, const std::string& why) {
    auto r = launch(concat({"--policy", "offload"}, touch(tmp.file("ran"))), env);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(why) != std::string::npos);
    CHECK(r.err.find("vcudnn must see each allocation") != std::string::npos);  // says why
    CHECK(r.err.find("not starting") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(tmp.file("ran")));
  };
  refused({{kCudaConf, "max_split_size_mb:128,expandable_segments:True"}}, "expandable_segments");
  refused({{kConf, " Expandable_Segments : TRUE "}}, "PYTORCH_ALLOC_CONF");
  refused({{kCudaConf, "backend:other"}}, "backend:other");
  refused({{kCudaConf, kAsync}, {kConf, "backend:other"}}, "backend:other");
}

TEST_CASE("launcher: backend:native asked for under offload is kept (vcudnn owns the caching allocator's segments)",
          "[launcher]") {
  const auto env = child_env({"--policy", "offload"}, {{kCudaConf, "backend:native"}});
  CHECK(value_of(env, kCudaConf) == "backend:native");
}

TEST_CASE("launcher: a bad value is vcudnn's own error, exit 2, and nothing runs", "[launcher]") {
  TempDir tmp;
  const auto expected = [](const std::string& name, const std::string& value) {
    const auto o = vcudnn::parse_options([&](const char* n) { return name == n ? value.c_str() : nullptr; }, {name});
    REQUIRE(o.errors.size() == 1);
    return o.errors[0];
  };
  SECTION("from an option") {
    auto r = launch(concat({"--budget", "64X"}, touch(tmp.file("ran"))));
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(expected("VCUDNN_DEVICE_BUDGET", "64X")) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(tmp.file("ran")));
  }
  SECTION("from the caller's environment") {
    auto r = launch(touch(tmp.file("ran")), {{"VCUDNN_POLICY", "recrod"}});
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(expected("VCUDNN_POLICY", "recrod")) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(tmp.file("ran")));
  }
  SECTION("no command") {
    CHECK(launch({"--policy", "record"}).exit_code == 2);
    CHECK(launch({"--policy", "record", "--"}).exit_code == 2);
  }
}

TEST_CASE("launcher: the command's exit status and signals are its own", "[launcher]") {
  CHECK(launch({"--", "sh", "-c", "exit 3"}).exit_code == 3);
  CHECK(launch({"--", "true"}).exit_code == 0);
  const auto plain = run_process({"sh", "-c", "kill -TERM $$"});
  REQUIRE(plain.exit_code == 128 + 15);
  CHECK(launch({"--", "sh", "-c", "kill -TERM $$"}).exit_code == plain.exit_code);
  // The command's own arguments are not vcudnn's, even when they look like its options.
  auto r = launch({"--", "sh", "-c", "echo \"$@\"", "sh", "--quiet", "--policy", "x"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "--quiet --policy x\n");
}

TEST_CASE("launcher: a missing command exits 127, one that cannot run 126", "[launcher]") {
  auto missing = launch({"--", "vcudnn-no-such-command-here", "arg"});
  CHECK(missing.exit_code == 127);
  CHECK(missing.err.find("vcudnn-no-such-command-here: command not found") != std::string::npos);
  TempDir tmp;
  { std::ofstream(tmp.file("script")) << "#!/bin/sh\nexit 0\n"; }
  ::chmod(tmp.file("script").c_str(), 0644);
  auto not_executable = launch({"--", tmp.file("script")});
  INFO(not_executable.err);
  CHECK(not_executable.exit_code == 126);
}

TEST_CASE("launcher: --dry-run prints the changed variables and the command, and runs nothing", "[launcher]") {
  TempDir tmp;
  auto r = launch(
      concat({"--dry-run", "--policy", "offload", "--budget", "60%", "--log-level", "debug"}, touch(tmp.file("ran"))),
      {{"VCUDNN_LOG_LEVEL", "debug"}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(tmp.file("ran")));
  const std::string expected = "LD_PRELOAD=" + libvcudnn_path() +
                               "\nVCUDNN_POLICY=offload\nVCUDNN_DEVICE_BUDGET=60%\n"
                               "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync\n"
                               "sh -c 'touch '\\''" +
                               tmp.file("ran") + "'\\'''\n";
  CHECK(r.out == expected);  // VCUDNN_LOG_LEVEL was debug already: unchanged, not printed
  CHECK(r.err.empty());
}

TEST_CASE("launcher: one line on stderr names what was set, unless --quiet", "[launcher]") {
  auto r = launch({"--policy", "offload", "--budget", "60%", "--", "true"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err ==
        "vcudnn run: LD_PRELOAD=" + libvcudnn_path() +
            ", VCUDNN_POLICY=offload, VCUDNN_DEVICE_BUDGET=60%, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync\n");
  auto quiet = launch({"--quiet", "--policy", "offload", "--", "true"});
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.err.empty());
}

// Issue "Hardening": on a machine without a GPU driver, `vcudnn info` said "CUDA driver version is
// insufficient for CUDA runtime version" (what the runtime answers when libcuda is missing).
TEST_CASE("vcudnn info says when there is no GPU driver", "[launcher]") {
  const ProcessResult r = run_process({exe_dir() + "/vcudnn", "info"}, {});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto gpu = grep(r.out, "GPU ");
  REQUIRE(gpu.size() >= 1);
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver) {
    dlclose(driver);
    CHECK(gpu[0].find("no GPU driver") == std::string::npos);
  } else {
    CHECK(gpu[0].find("none (no GPU driver: libcuda.so.1 was not found)") != std::string::npos);
    CHECK(r.out.find("insufficient") == std::string::npos);
  }
}
