// main() of the [gpu] test program: without a usable CUDA device it prints why and exits 77,
// which CTest reports as skipped (CI has no GPU).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "count is 0");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
