// The exception barrier (runtime/barrier.h): an exception inside vcudnn never leaves a hook. With
// VCUDNN_TEST_THROW=engine every Engine entry point throws before doing anything; the preloaded
// client must still see exactly the statuses of the real cuDNN, and the log must say what happened.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "runtime/barrier.h"
#include "tests/common/test_util.h"

using namespace vcudnn::test;

TEST_CASE("barrier: an exception runs the fallback, then the last resort", "[barrier]") {
  const uint64_t before = vcudnn::exceptions_caught();
  CHECK(vcudnn::barrier("test", [] { return 1; }, [] { return 2; }, 3) == 1);
  CHECK(vcudnn::barrier("test", []() -> int { throw std::runtime_error("x"); }, [] { return 2; }, 3) == 2);
  CHECK(vcudnn::barrier("test", []() -> int { throw 5; }, []() -> int { throw std::bad_alloc(); }, 3) == 3);
  CHECK(vcudnn::exceptions_caught() == before + 3);
}

TEST_CASE("barrier: cuDNN hooks whose engine throws return the real library's statuses", "[barrier][preload]") {
  TempDir tmp;
  const auto r = run_process({exe_dir() + "/vcudnn_preload_client", "statuses"},
                             {{"LD_PRELOAD", libvcudnn_path()},
                              {"VCUDNN_TEST_THROW", "engine"},
                              {"VCUDNN_LOG_FILE", tmp.file("log")}});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(grep(r.out, "interposed=yes").size() == 1);
  CHECK(grep(r.out, "all_equal=yes").size() == 1);
  const std::string log = read_file(tmp.file("log"));
  INFO(log);
  CHECK(!grep(log, "internal error in ").empty());
  const auto exit_line = grep(log, "exit: ");
  REQUIRE(exit_line.size() == 1);
  CHECK(exit_line[0].find("16 internal errors caught") != std::string::npos);
}
