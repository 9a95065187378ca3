// main() of the [pytorch] test program: without a Python that imports torch and torchvision and
// sees a GPU, it prints why and exits 77 (CTest: skipped). $VCUDNN_TEST_PYTHON picks the Python.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "tests/common/test_util.h"

int main(int argc, char** argv) {
  using namespace vcudnn::test;
  auto r =
      run_process({python_executable(), "-c", "import torch, torchvision; assert torch.cuda.is_available(), 'no GPU'"},
                  {{"LD_PRELOAD", std::nullopt}}, 120);
  if (r.exit_code != 0) {
    std::printf("SKIPPED: %s cannot run PyTorch on a GPU here (%s)\n", python_executable().c_str(),
                r.err.empty() ? "exit code" : r.err.substr(r.err.size() > 300 ? r.err.size() - 300 : 0).c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
