// libvcudnn.so preloaded into a real process (no GPU needed): statuses are the real library's,
// the resolution order works when cuDNN is loaded RTLD_LOCAL, bad settings fall back to
// pass-through with one clear error, and the load/exit lines say what happened.
#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cudnn.h>

#include <cstdlib>
#include <filesystem>

#include "planner/trace.h"
#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

std::string client() { return exe_dir() + "/vcudnn_preload_client"; }

ProcessResult run_client(const std::string& mode, std::map<std::string, std::optional<std::string>> env,
                         std::vector<std::string> extra = {}) {
  env.emplace("LD_PRELOAD", libvcudnn_path());
  // The suite's own VCUDNN_BUILD_DIR is no vcudnn setting: vcudnn would warn about it.
  env.emplace("VCUDNN_BUILD_DIR", std::nullopt);
  std::vector<std::string> argv{client(), mode};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_process(argv, env);
}

}  // namespace

TEST_CASE("interposed calls return exactly what the real cuDNN returns", "[preload]") {
  TempDir tmp;
  auto r = run_client("statuses", {{"VCUDNN_LOG_FILE", tmp.file("log")}});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(grep(r.out, "interposed=yes").size() == 1);
  CHECK(grep(r.out, "hooked=").size() == 16);
  CHECK(grep(r.out, "all_equal=yes").size() == 1);

  const std::string log = read_file(tmp.file("log"));
  INFO(log);
  // cuDNN was loaded RTLD_LOCAL: RTLD_NEXT misses it, RTLD_NOLOAD finds it.
  auto active = grep(log, "active: policy=record");
  REQUIRE(active.size() == 1);
  CHECK(active[0].find("already loaded as libcudnn.so.9") != std::string::npos);
  auto exit_line = grep(log, "exit: ");
  REQUIRE(exit_line.size() == 1);
  for (const char* k : {"create", "destroy", "set_stream", "get_stream", "conv_fwd", "conv_bwd_data", "conv_bwd_filter",
                        "find_algo_ex_fwd", "find_algo_ex_bwd_filter", "ws_size_bwd_data", "max_count_fwd"})
    CHECK(counter_value(exit_line[0], k) == 1);
  CHECK(exit_line[0].find("exit: 16 calls") != std::string::npos);
  CHECK(counter_value(exit_line[0], "get_algo_v7_fwd") == -1);  // never called: not listed
}

TEST_CASE("pointer-tracking hooks of cuDNN, cuBLAS and cuBLASLt return the real statuses", "[preload]") {
  SECTION("preloaded") {
    auto r = run_client("tracked", {});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(grep(r.out, "global_symbols=yes").size() == 1);
    CHECK(grep(r.out, "all_interposed=yes").size() == 1);  // every global symbol was vcudnn's
    CHECK(grep(r.out, "hooked=").size() == 18);
    CHECK(grep(r.out, "all_equal=yes").size() == 1);
    // The calls were rejected (or, for a real descriptor, accepted) by the real libraries.
    CHECK(grep(r.out, "cudnnBackendExecute hooked=" + std::to_string(CUDNN_STATUS_BAD_PARAM)).size() == 2);
    CHECK(grep(r.out, "cudnnBackendSetAttribute hooked=0 ").size() == 3);
    CHECK(grep(r.out, "cublasSgemm_v2 hooked=" + std::to_string(CUBLAS_STATUS_NOT_INITIALIZED)).size() == 1);
    CHECK(grep(r.out, "cublasLtMatmulDescSetAttribute hooked=0 ").size() == 1);
  }
  SECTION("not preloaded") {
    auto r = run_process({client(), "tracked"}, {{"LD_PRELOAD", std::nullopt}});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(grep(r.out, "global_symbols=no").size() == 1);
    CHECK(grep(r.out, "all_equal=yes").size() == 1);
  }
}

// interpose/nccl_hooks.cpp forwards to the NCCL the process loaded RTLD_LOCAL, with its statuses,
// alone and inside groups (whose collectives it reports at the group's end).
TEST_CASE("NCCL's hooked functions return the real NCCL's statuses", "[preload][nccl]") {
  const auto hooked = run_client("nccl", {});
  const auto real = run_process({client(), "nccl-real"}, {{"LD_PRELOAD", std::nullopt}});
  INFO(hooked.out << hooked.err << "\n--- without vcudnn:\n" << real.out << real.err);
  if (real.exit_code == 3) {
    WARN("no libnccl.so.2 on this machine: NCCL's hooks not checked");
    return;
  }
  REQUIRE(real.exit_code == 0);
  REQUIRE(hooked.exit_code == 0);
  CHECK(grep(hooked.out, "interposed=yes").size() == 1);
  CHECK(grep(real.out, "interposed=no").size() == 1);
  const auto statuses = [](const std::string& out) {
    std::string s;
    for (const std::string& line : grep(out, "="))
      if (line.rfind("interposed=", 0) != 0) s += line + "\n";
    return s;
  };
  CHECK(statuses(hooked.out) == statuses(real.out));
  // A null communicator is NCCL's invalid argument (4); an empty group succeeds.
  CHECK(grep(hooked.out, "ncclAllReduce=4").size() == 1);
  CHECK(grep(hooked.out, "empty group=0,0").size() == 1);
  CHECK(grep(hooked.out, "nested empty groups=0,0,0,0").size() == 1);
  CHECK(grep(hooked.out, "group of ncclAllReduce=0,4,").size() == 1);
}

TEST_CASE("without the preload nothing is interposed", "[preload]") {
  auto r = run_process({client(), "statuses"}, {{"LD_PRELOAD", std::nullopt}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(grep(r.out, "interposed=no").size() == 1);
  CHECK(r.err.find("vcudnn") == std::string::npos);
}

TEST_CASE("a bad setting gives one error naming it and vcudnn passes through", "[preload][options]") {
  TempDir tmp;
  auto r = run_client(
      "statuses",
      {{"VCUDNN_POLICY", "sometimes"}, {"VCUDNN_LOG_FILE", tmp.file("log")}, {"VCUDNN_TRACE", tmp.file("t.json")}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(grep(r.out, "all_equal=yes").size() == 1);
  const std::string log = read_file(tmp.file("log"));
  INFO(log);
  auto errors = grep(log, "VCUDNN_POLICY=\"");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].find("error") != std::string::npos);
  CHECK(errors[0].find("sometimes") != std::string::npos);
  CHECK(errors[0].find("passthrough, record") != std::string::npos);
  CHECK(grep(log, "active: policy=passthrough").size() == 1);
  CHECK(grep(log, "conv_fwd=1").size() == 1);                // still counted
  CHECK_FALSE(std::filesystem::exists(tmp.file("t.json")));  // pass-through records nothing
}

TEST_CASE("the recorder writes a trace even when no iteration completes", "[preload][trace]") {
  TempDir tmp;
  auto r = run_client("statuses", {{"VCUDNN_TRACE", tmp.file("trace-%p.json")}, {"VCUDNN_LOG_FILE", tmp.file("log")}});
  INFO(r.out << r.err << read_file(tmp.file("log")));
  REQUIRE(r.exit_code == 0);
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path()))
    if (e.path().filename().string().rfind("trace-", 0) == 0) path = e.path().string();
  REQUIRE_FALSE(path.empty());  // %p expanded to the pid
  auto trace = vcudnn::read_trace(path);
  REQUIRE(trace.ok());
  const vcudnn::Trace& t = trace.value();
  CHECK_FALSE(t.complete);
  CHECK(t.detected_by == "none");
  CHECK(t.calls.size() == 16);
  int convs = 0;
  for (const auto& c : t.calls) {
    if (c.kind != vcudnn::CallKind::kConvolution) continue;
    ++convs;
    CHECK(c.status != 0);  // null handle: rejected by cuDNN, recorded as such
    CHECK(c.layer == 0);   // all three calls are the same layer
    CHECK_FALSE(c.gpu_ms.has_value());
  }
  CHECK(convs == 3);
  REQUIRE(t.layers.size() == 1);
  CHECK(t.layers[0].x.dims[1] == 3);
  CHECK(t.layers[0].w.dims[0] == 4);
  CHECK(grep(read_file(tmp.file("log")), "complete=false").size() == 1);
}

TEST_CASE("VCUDNN_CUDNN_LIBRARY is used only when the process has no cuDNN", "[preload][options]") {
  TempDir tmp;
  SECTION("unset: the soname") {
    auto r = run_client("self", {{"VCUDNN_LOG_FILE", tmp.file("log")}});
    INFO(r.out << r.err << read_file(tmp.file("log")));
    CHECK(r.exit_code == 0);
    CHECK(grep(read_file(tmp.file("log")), "(dlopen(libcudnn.so.9))").size() == 1);
    CHECK(grep(r.out, "status=" + std::to_string(CUDNN_STATUS_BAD_PARAM)).size() == 1);  // the real cuDNN answered
  }
  SECTION("pointing at vcudnn itself is refused") {
    auto r = run_client("self", {{"VCUDNN_LOG_FILE", tmp.file("log")}, {"VCUDNN_CUDNN_LIBRARY", libvcudnn_path()}});
    const std::string log = read_file(tmp.file("log"));
    INFO(r.out << r.err << log);
    CHECK(r.exit_code == 0);
    CHECK(grep(log, "is vcudnn itself").size() >= 1);
    CHECK(grep(r.out, "status=" + std::to_string(CUDNN_STATUS_NOT_INITIALIZED)).size() == 1);  // no crash
  }
  SECTION("a missing file gives a clear error, no crash") {
    auto r = run_client("self",
                        {{"VCUDNN_LOG_FILE", tmp.file("log")}, {"VCUDNN_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9"}});
    const std::string log = read_file(tmp.file("log"));
    INFO(r.out << r.err << log);
    CHECK(r.exit_code == 0);
    CHECK(grep(log, "dlopen(/nonexistent/libcudnn.so.9) failed").size() >= 1);
    CHECK(grep(r.out, "status=" + std::to_string(CUDNN_STATUS_NOT_INITIALIZED)).size() == 1);
  }
}

TEST_CASE("a process that never calls cuDNN prints nothing", "[preload]") {
  auto r = run_client("none", {});
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.empty());
}

// (No ';' in test names: CTest's test discovery splits names there and then runs nothing.)
// Issue "Hardening": with logging off (or going to a file) a bad setting fell back to pass-through
// without a word on stderr; a value with a newline was echoed raw.
TEST_CASE("a bad setting is reported once on stderr even with logging off, quoted and escaped", "[preload][options]") {
  TempDir tmp;
  for (const auto& [level, file] : {std::pair<const char*, bool>{"off", false}, {"info", true}}) {
    std::map<std::string, std::optional<std::string>> env = {{"VCUDNN_POLICY", "offload\nrm -rf /"},
                                                              {"VCUDNN_LOG_LEVEL", level}};
    if (file) env["VCUDNN_LOG_FILE"] = tmp.file("log");
    auto r = run_client("statuses", env);
    INFO("level " << level << (file ? ", to a file" : "") << ": " << r.err);
    CHECK(r.exit_code == 0);
    const auto errors = grep(r.err, "VCUDNN_POLICY=");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].find("\"offload\\nrm -rf /\"") != std::string::npos);  // escaped, on one line
    CHECK(grep(r.err, "rm -rf").size() == 1);
  }
}

TEST_CASE("VCUDNN_LOG_LEVEL=off silences vcudnn, and by default it prints two lines", "[preload][options]") {
  auto quiet = run_client("statuses", {{"VCUDNN_LOG_LEVEL", "OFF"}});
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.err.find("vcudnn") == std::string::npos);
  auto normal = run_client("statuses", {});
  INFO(normal.err);
  CHECK(grep(normal.err, "vcudnn[").size() == 2);  // load line and exit line, nothing per call
}

TEST_CASE("children inherit none of the caller's VCUDNN_* settings, only the suite's own", "[process]") {
  // As if the shell running the tests had exported them.
  ScopedEnv so("VCUDNN_SO", "x"), policy("VCUDNN_POLICY", "bogus"), mark("VCUDNN_TEST_MARK", "kept"),
      build("VCUDNN_BUILD_DIR", "/some/build"), other("VCUDNN_PROCESS_TEST_OTHER", "1");
  auto r = run_process({"env"}, {{"VCUDNN_LOG_LEVEL", "debug"}});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto env = parse_env_output(r.out);
  CHECK(env.count("VCUDNN_SO") == 0);
  CHECK(env.count("VCUDNN_POLICY") == 0);
  CHECK(env.count("VCUDNN_PROCESS_TEST_OTHER") == 0);
  CHECK(env.count("VCUDNN_TEST_MARK") == 1);
  CHECK(env.count("VCUDNN_BUILD_DIR") == 1);
  CHECK(env.count("PATH") == 1);                                // everything else is inherited
  CHECK(env.count("VCUDNN_LOG_LEVEL") == 1);                    // what the test sets still reaches the child
  CHECK(std::string(std::getenv("VCUDNN_POLICY")) == "bogus");  // the test process itself is untouched
}

TEST_CASE("a preloaded child runs with the defaults whatever VCUDNN_* the caller exports", "[preload][process]") {
  ScopedEnv so("VCUDNN_SO", "/tmp/x"), policy("VCUDNN_POLICY", "passthrough"), level("VCUDNN_LOG_LEVEL", "off");
  TempDir tmp;
  auto r = run_client("statuses", {{"VCUDNN_LOG_FILE", tmp.file("log")}});
  const std::string log = read_file(tmp.file("log"));
  INFO(r.out << r.err << log);
  REQUIRE(r.exit_code == 0);
  CHECK(grep(log, "active: policy=record").size() == 1);  // not passthrough, and logged despite level off
  CHECK(grep(log, "VCUDNN_SO").empty());                  // no warning about an unknown name
}

#if defined(__x86_64__)
// Triton's launcher and PyTorch's lazy NVRTC stub take cuLaunchKernelEx, cuPointerGetAttribute & co.
// from dlsym on a libcuda handle, not from the dynamic linker: vcudnn's dlsym hands out its hooks
// there, and nothing else changes (the toolkit's stub libcuda.so stands in for the driver).
TEST_CASE("dlsym on a libcuda handle gives vcudnn's driver hooks, every other lookup unchanged", "[preload]") {
  const std::string stub = VCUDNN_CUDA_STUB_DIR "/libcuda.so";
  if (!std::filesystem::exists(stub)) {
    WARN("skipped: no " << stub);
    return;
  }
  const auto r = run_client("dlsym", {}, {stub});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* line : {"hook_found=1", "launch_is_hook=1", "query_is_hook=1", "unhooked_is_driver=1",
                           "proc_is_driver=1", "rtld_next_is_hook=1", "missing_sets_error=1"})
    CHECK(r.out.find(line) != std::string::npos);
}
#endif
