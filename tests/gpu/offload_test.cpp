// [gpu][offload] Memory ownership (VCUDNN_POLICY=offload): each sub-command of vcudnn_offload_client
// runs in its own process under the preloaded libvcudnn.so, with the budget it needs, and every check
// it makes must pass (the client names each check on a "RESULT <command>/<check> PASS|FAIL" line;
// what they assert is written next to them in offload_client.cpp).
#include <catch2/catch.hpp>

#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

using Env = std::map<std::string, std::optional<std::string>>;

constexpr int kChildTimeoutS = 300;
// Large enough that nothing is evicted unless the client asks (roundtrip and faultin evict by hand).
constexpr const char* kRoomyBudget = "4G";
// Pinned host memory for evicted buffers: more than any sub-command evicts at once (~700 MiB).
constexpr const char* kHostBudget = "2G";

// The settings the client depends on (run_process drops the caller's VCUDNN_* settings); at level
// info vcudnn's exit summary goes to stderr.
Env offload_env(const std::optional<std::string>& device_budget) {
  Env env{{"LD_PRELOAD", libvcudnn_path()}, {"VCUDNN_POLICY", "offload"}, {"VCUDNN_LOG_LEVEL", "info"}};
  if (device_budget) {
    env["VCUDNN_DEVICE_BUDGET"] = *device_budget;
    env["VCUDNN_HOST_BUDGET"] = kHostBudget;
  }
  return env;
}

ProcessResult run_client(const std::string& command, const Env& env) {
  return run_process({exe_dir() + "/vcudnn_offload_client", command}, env, kChildTimeoutS);
}

// The sub-command ran to its end, every check passed, and vcudnn printed its exit summary.
void check_passed(const std::string& command, const ProcessResult& r) {
  INFO("vcudnn_offload_client " << command << ": exit " << r.exit_code << "\n" << r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(grep(r.out, "RESULT " + command + " PASS ").size() == 1);
  CHECK(grep(r.out, "RESULT " + command + "/").size() > 1);  // it checked something
  CHECK(grep(r.out, " FAIL").empty());                       // a check, or the whole command
  CHECK(!grep(r.err, "offload:").empty());
}

}  // namespace

TEST_CASE("offload: evicted and restored buffers read back bitwise at unchanged addresses", "[gpu][offload]") {
  check_passed("roundtrip", run_client("roundtrip", offload_env(kRoomyBudget)));
}

TEST_CASE("offload: launches (runtime, driver, ExC), memcpy and memset fault evicted buffers back in",
          "[gpu][offload]") {
  check_passed("faultin", run_client("faultin", offload_env(kRoomyBudget)));
}

TEST_CASE("offload: four streams allocating 4x a 96 MiB budget evict on demand and lose nothing", "[gpu][offload]") {
  check_passed("streams", run_client("streams", offload_env("96M")));
}

TEST_CASE("offload: over a 64 MiB budget allocations fail with cudaErrorMemoryAllocation, then work again",
          "[gpu][offload]") {
  check_passed("oom", run_client("oom", offload_env("64M")));
}

TEST_CASE("offload: without a budget every allocation is owned, counted and released", "[gpu][offload]") {
  check_passed("own", run_client("own", offload_env(std::nullopt)));
}

TEST_CASE("offload: the client skips without vcudnn, and other policies own nothing", "[gpu][offload]") {
  {  // not preloaded: the client runs plain and says so
    const auto r = run_client("own", {{"LD_PRELOAD", std::nullopt}});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(grep(r.out, "RESULT own SKIP not preloaded").size() == 1);
  }
  {  // preloaded under another policy: vcudnnGetMemoryStats reports active = 0, so the client refuses
    Env env = offload_env(std::nullopt);
    env["VCUDNN_POLICY"] = "record";
    const auto r = run_client("own", env);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK(grep(r.out, "RESULT own FAIL vcudnn is preloaded but does not own memory").size() == 1);
  }
}
