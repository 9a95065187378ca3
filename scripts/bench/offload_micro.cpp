// Micro-costs of owning memory, as the process sees them: a cudaMallocAsync + cudaFreeAsync pair
// (fixed sizes, and a ring of mixed sizes), the host cost of a kernel launch (4 pointer parameters
// into allocated buffers, or none; runtime and driver API), and a 4-byte cudaMemcpyAsync. A driver
// runs it twice, plain and under LD_PRELOAD=libvcudnn.so with VCUDNN_POLICY=offload, and divides;
// this program only measures. Each figure is the median over 5 batches (after one untimed batch).
//   usage: vcudnn_bench_offload_micro [--json PATH] [--quick]
// Prints a table; --json writes one object (schema vcudnn.bench.offload_micro/1) to PATH.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#define VCUDNN_C_API_ONLY
#include <vcudnn/vcudnn.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#define CHECK_CUDA(e)                                                                         \
  do {                                                                                        \
    cudaError_t s_ = (e);                                                                     \
    if (s_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(s_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CHECK_CU(e)                                                                  \
  do {                                                                               \
    CUresult r_ = (e);                                                               \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* n_ = nullptr;                                                      \
      cuGetErrorName(r_, &n_);                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #e, n_ ? n_ : "?"); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr int kBatches = 5;

// From (nvcc -ptx -arch=compute_80, CUDA 13.0):
//   extern "C" __global__ void empty4(void*, void*, void*, void*) {}
//   extern "C" __global__ void empty0() {}
constexpr char kEmptyKernelsPtx[] = R"ptx(
.version 9.0
.target sm_80
.address_size 64

.visible .entry empty4(
	.param .u64 empty4_param_0,
	.param .u64 empty4_param_1,
	.param .u64 empty4_param_2,
	.param .u64 empty4_param_3
)
{
	ret;
}

.visible .entry empty0()
{
	ret;
}
)ptx";

struct Sample {
  double us = 0, us_min = 0, us_max = 0;  // per call: median, fastest and slowest batch
};

// Times `per_batch` calls of body(i) in each of kBatches batches, after one untimed batch. With
// `timed_sync` the stream is drained inside the timing (so work deferred to the stream counts);
// otherwise after it.
template <typename F>
Sample measure(int per_batch, cudaStream_t stream, bool timed_sync, F&& body) {
  std::vector<double> us;
  for (int b = -1; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) body(i);
    if (timed_sync) CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto t1 = Clock::now();
    if (!timed_sync) CHECK_CUDA(cudaStreamSynchronize(stream));
    if (b >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / per_batch);
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

std::string size_name(size_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " B";
}

struct Bench {
  bool quick = false;
  cudaStream_t stream = nullptr;
  json rows = json::array();

  int scaled(int n) const { return quick ? std::max(1, n / 10) : n; }

  void add(json row, const Sample& s, int per_batch, const char* unit) {
    row["us"] = s.us;
    row["us_min"] = s.us_min;
    row["us_max"] = s.us_max;
    row["batches"] = kBatches;
    row["per_batch"] = per_batch;
    row["unit"] = unit;
    std::printf("%-34s %10.3f %10.3f %10.3f  %s, %d x %d\n", row["name"].get<std::string>().c_str(), s.us, s.us_min,
                s.us_max, unit, kBatches, per_batch);
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }

  // (a) the same size again and again: the allocator's warm path.
  void alloc_free(size_t bytes) {
    const int n = scaled(2000);
    const Sample s = measure(n, stream, true, [&](int) {
      void* p = nullptr;
      CHECK_CUDA(cudaMallocAsync(&p, bytes, stream));
      CHECK_CUDA(cudaFreeAsync(p, stream));
    });
    add({{"name", "alloc_free " + size_name(bytes)}, {"kind", "alloc_free"}, {"size", bytes}}, s, n, "us/pair");
  }

  // (a) a ring of 64 live buffers, log-uniform sizes 512 B - 64 MiB: free the oldest, allocate anew.
  void alloc_free_mixed() {
    constexpr int kLive = 64;
    constexpr size_t kMin = 512, kMax = 64 * kMiB;
    const int n = scaled(2000);
    std::mt19937_64 rng(1234);
    std::uniform_real_distribution<double> log_size(std::log(double(kMin)), std::log(double(kMax)));
    std::vector<size_t> sizes(kLive + static_cast<size_t>(n) * (kBatches + 1));
    for (auto& s : sizes) s = static_cast<size_t>(std::exp(log_size(rng)));
    std::vector<void*> ring(kLive);
    for (int i = 0; i < kLive; ++i) CHECK_CUDA(cudaMallocAsync(&ring[i], sizes[i], stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    size_t next = kLive, head = 0;
    const Sample s = measure(n, stream, true, [&](int) {
      CHECK_CUDA(cudaFreeAsync(ring[head], stream));
      CHECK_CUDA(cudaMallocAsync(&ring[head], sizes[next++], stream));
      head = (head + 1) % kLive;
    });
    for (void* p : ring) CHECK_CUDA(cudaFreeAsync(p, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    add({{"name", "alloc_free mixed"},
         {"kind", "alloc_free_mixed"},
         {"live", kLive},
         {"min_size", kMin},
         {"max_size", kMax},
         {"distribution", "log-uniform"}},
        s, n, "us/pair");
  }

  // (b) host time of the launch loop; the GPU work is empty.
  void launches(cudaKernel_t empty4, cudaKernel_t empty0, CUfunction empty4_driver) {
    void *big1 = nullptr, *big2 = nullptr, *small1 = nullptr, *small2 = nullptr;
    CHECK_CUDA(cudaMalloc(&big1, 32 * kMiB));
    CHECK_CUDA(cudaMalloc(&big2, 32 * kMiB));
    CHECK_CUDA(cudaMalloc(&small1, 4 * kKiB));
    CHECK_CUDA(cudaMalloc(&small2, 64 * kKiB));
    // Interior pointers, as a framework's tensors into its buffers are.
    void* ptrs[4] = {static_cast<char*>(big1) + 4096, static_cast<char*>(big2) + kMiB, static_cast<char*>(small1) + 128,
                     small2};
    void* args[4] = {&ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3]};
    const int n = scaled(4000);  // 5 x 4000 = 20000 timed launches
    const Sample rt4 = measure(n, stream, false, [&](int) {
      CHECK_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(empty4), dim3(1), dim3(32), args, 0, stream));
    });
    add({{"name", "launch cudaLaunchKernel 4 ptr"}, {"kind", "launch"}, {"api", "cudaLaunchKernel"}, {"params", 4}},
        rt4, n, "us/launch");
    const Sample rt0 = measure(n, stream, false, [&](int) {
      CHECK_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(empty0), dim3(1), dim3(32), nullptr, 0, stream));
    });
    add({{"name", "launch cudaLaunchKernel 0 ptr"}, {"kind", "launch"}, {"api", "cudaLaunchKernel"}, {"params", 0}},
        rt0, n, "us/launch");
    const Sample drv4 = measure(n, stream, false, [&](int) {
      CHECK_CU(cuLaunchKernel(empty4_driver, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
    });
    add({{"name", "launch cuLaunchKernel 4 ptr"}, {"kind", "launch"}, {"api", "cuLaunchKernel"}, {"params", 4}}, drv4,
        n, "us/launch");

    // (c) 4 bytes device to device, between the two large buffers.
    const int m = scaled(2000);
    const Sample cp = measure(m, stream, false, [&](int) {
      CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(big1) + 64, static_cast<char*>(big2) + 256, 4,
                                 cudaMemcpyDeviceToDevice, stream));
    });
    add({{"name", "memcpy_async d2d 4 B"}, {"kind", "memcpy"}, {"api", "cudaMemcpyAsync"}, {"size", 4}}, cp, m,
        "us/call");
    for (void* p : {big1, big2, small1, small2}) CHECK_CUDA(cudaFree(p));
  }
};

json env_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? json(v) : json(nullptr);
}

// What the preloaded vcudnn says it did (null when not preloaded): shows that the run under vcudnn
// really owned the memory and checked the launches.
json vcudnn_stats() {
  auto get = reinterpret_cast<decltype(&vcudnnGetMemoryStats)>(dlsym(RTLD_DEFAULT, "vcudnnGetMemoryStats"));
  if (!get) return nullptr;
  vcudnnMemoryStats_t s{};
  if (get(&s) != CUDNN_STATUS_SUCCESS) return "vcudnnGetMemoryStats failed";
  return {{"active", s.active},
          {"budget_bytes", s.budgetBytes},
          {"peak_mapped_bytes", s.peakMappedBytes},
          {"allocations", s.allocations},
          {"frees", s.frees},
          {"cache_hits", s.cacheHits},
          {"failed_allocations", s.failedAllocations},
          {"evictions", s.evictions},
          {"fault_ins", s.faultIns},
          {"tracked_calls", s.trackedCalls},
          {"tracked_hits", s.trackedHits},
          {"foreign_allocations", s.foreignAllocations}};
}

int usage() {
  std::fprintf(stderr, "usage: vcudnn_bench_offload_micro [--json PATH] [--quick]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  Bench bench;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      bench.quick = true;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else
      return usage();
  }

  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CU(cuInit(0));
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));

  cudaLibrary_t lib = nullptr;
  cudaKernel_t empty4 = nullptr, empty0 = nullptr;
  CHECK_CUDA(cudaLibraryLoadData(&lib, kEmptyKernelsPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CHECK_CUDA(cudaLibraryGetKernel(&empty4, lib, "empty4"));
  CHECK_CUDA(cudaLibraryGetKernel(&empty0, lib, "empty0"));
  CUmodule mod = nullptr;
  CUfunction empty4_driver = nullptr;
  CHECK_CU(cuModuleLoadData(&mod, kEmptyKernelsPtx));
  CHECK_CU(cuModuleGetFunction(&empty4_driver, mod, "empty4"));
  CHECK_CUDA(cudaStreamCreateWithFlags(&bench.stream, cudaStreamNonBlocking));

  const json preload_stats = vcudnn_stats();
  std::printf("%s, driver %d, runtime %d, vcudnn %s%s\n", prop.name, driver, runtime,
              preload_stats.is_null() ? "not preloaded" : "preloaded", bench.quick ? ", quick" : "");
  std::printf("%-34s %10s %10s %10s\n", "what", "median", "min", "max");
  for (size_t bytes : {size_t{512}, 64 * kKiB, kMiB, 2 * kMiB, 32 * kMiB, 256 * kMiB}) bench.alloc_free(bytes);
  bench.alloc_free_mixed();
  bench.launches(empty4, empty0, empty4_driver);

  CHECK_CUDA(cudaStreamDestroy(bench.stream));
  CHECK_CU(cuModuleUnload(mod));
  CHECK_CUDA(cudaLibraryUnload(lib));
  if (json_path.empty()) return 0;
  const json out = {{"schema", "vcudnn.bench.offload_micro/1"},
                    {"command", command},
                    {"quick", bench.quick},
                    {"gpu", prop.name},
                    {"cc", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
                    {"memory_bytes", prop.totalGlobalMem},
                    {"driver_version", driver},
                    {"runtime_version", runtime},
                    {"env",
                     {{"LD_PRELOAD", env_value("LD_PRELOAD")},
                      {"VCUDNN_POLICY", env_value("VCUDNN_POLICY")},
                      {"VCUDNN_DEVICE_BUDGET", env_value("VCUDNN_DEVICE_BUDGET")},
                      {"VCUDNN_HOST_BUDGET", env_value("VCUDNN_HOST_BUDGET")}}},
                    {"vcudnn_preloaded", !preload_stats.is_null()},
                    {"vcudnn_stats", vcudnn_stats()},
                    {"rows", bench.rows}};
  std::ofstream f(json_path);
  f << out.dump(1) << "\n";
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", json_path.c_str());
  return 0;
}
