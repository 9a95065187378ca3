// The CUDA driver seen from vcudnn: the few driver entry points it calls (resolved at run time,
// never linked), the pool backends built on them, and the kernel parameter layouts that the launch
// hooks scan for pointers. Nothing here throws; every failure is logged and returned.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "pool/buffer_index.h"
#include "pool/host_pool.h"
#include "pool/vmm_arena.h"

namespace vcudnn::cuda {

// X(exported name): the driver entry points vcudnn calls, by the exact names the driver exports
// (the _v2 forms where cuda.h maps the plain name to one), typed from cuda.h's declarations.
#define VCUDNN_DRIVER_FUNCTIONS(X) \
  X(cuInit)                        \
  X(cuGetErrorString)              \
  X(cuCtxGetDevice)                \
  X(cuDeviceGetAttribute)          \
  X(cuDeviceTotalMem_v2)           \
  X(cuMemGetInfo_v2)               \
  X(cuMemAddressReserve)           \
  X(cuMemAddressFree)              \
  X(cuMemCreate)                   \
  X(cuMemRelease)                  \
  X(cuMemMap)                      \
  X(cuMemUnmap)                    \
  X(cuMemSetAccess)                \
  X(cuMemGetAllocationGranularity) \
  X(cuKernelGetParamInfo)          \
  X(cuFuncGetParamInfo)
// X(name, type): the runtime entry points the code below needs, typed by hand because
// cuda_runtime.h overloads some of these names with templates (checked in cuda_driver.cpp).
#define VCUDNN_DRIVER_RUNTIME_FUNCTIONS(X)                              \
  X(cudaGetFuncBySymbol, cudaError_t (*)(cudaFunction_t*, const void*)) \
  X(cudaHostAlloc, cudaError_t (*)(void**, size_t, unsigned int))       \
  X(cudaFreeHost, cudaError_t (*)(void*))

struct Driver {
#define VCUDNN_DRIVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
#define VCUDNN_DRIVER_RUNTIME_MEMBER(fn, type) std::type_identity_t<type> fn = nullptr;
  VCUDNN_DRIVER_FUNCTIONS(VCUDNN_DRIVER_MEMBER)
  VCUDNN_DRIVER_RUNTIME_FUNCTIONS(VCUDNN_DRIVER_RUNTIME_MEMBER)
#undef VCUDNN_DRIVER_MEMBER
#undef VCUDNN_DRIVER_RUNTIME_MEMBER
  std::string missing;  // the names not found, comma-separated; empty when all were
};

// Resolved once, on first use (thread-safe); a missing entry stays null.
const Driver& driver();

// The text of a driver status ("CUDA_ERROR_OUT_OF_MEMORY: out of memory"); never null.
std::string error_text(CUresult status);

// The physical backend of the device arena on one device: the CUDA virtual-memory API, one
// granule (cuMemGetAllocationGranularity, MINIMUM, pinned device memory) per chunk. Call with the
// device's primary context current (the runtime made it so before the first allocation hook).
class VmmBackend final : public pool::PhysicalBackend {
 public:
  explicit VmmBackend(int device) : device_(device) {}
  uint64_t granularity() override;  // 0 on failure
  bool reserve(uint64_t bytes, uint64_t* base) override;
  void unreserve(uint64_t base, uint64_t bytes) override;
  Handle create_chunk() override;
  void release_chunk(Handle chunk) override;
  bool map(uint64_t va, Handle chunk) override;  // read/write for `device`; nothing stays mapped on failure
  bool unmap(uint64_t va) override;
  Handle create_extent(uint64_t granules) override;
  bool map_extent(uint64_t va, Handle extent, uint64_t granules) override;
  bool unmap_extent(uint64_t va, uint64_t granules) override;
  bool map_alias(uint64_t va, Handle extent, uint64_t granules) override;
  // Calls and host time per driver function: "cuMemCreate 12 in 0.3 ms, ...".
  std::string costs() const override;
  CallTotals totals() const override;

 private:
  enum Op { kCreate, kRelease, kMap, kSetAccess, kUnmap, kOps };
  struct Cost {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> ns{0};
  };
  // Times one driver call (two clock reads: ~40 ns against the call's tens of microseconds).
  class Timed {
   public:
    explicit Timed(Cost& c);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    Cost& c_;
    uint64_t t0_;
  };
  Cost cost_[kOps];
  CUmemAllocationProp properties() const;
  Handle create(uint64_t bytes);
  bool map_bytes(uint64_t va, Handle chunk, uint64_t bytes);
  int device_;
  std::atomic<uint64_t> granularity_{0};  // cached after the first successful query
};

// Whether the driver offers what VmmBackend needs on `device` (calls cuInit(0) first); if not,
// `why` (when given) says what is missing.
bool vmm_supported(int device, std::string* why);

// Slabs of pinned host memory for the host pool: the real cudaHostAlloc (portable) / cudaFreeHost.
// A failure also clears the runtime's last error, so the framework never sees vcudnn's failures.
class PinnedHostBackend final : public pool::HostBackend {
 public:
  void* allocate_pinned(uint64_t bytes) override;
  void free_pinned(void* ptr) override;
};

// The parameter layout of a kernel (offset and size of each parameter, in order), cached per
// kernel for the life of the process: the pointer stays valid and a later call returns the same
// one. nullptr when the driver cannot tell (also cached, logged once per kernel at debug level).
// A cache hit takes a shared lock only.
const std::vector<pool::ParamSlot>* layout_of_kernel(cudaKernel_t kernel);  // __cudaLaunchKernel
// cudaLaunchKernel & co.: a host stub (cudaGetFuncBySymbol) or a cudaKernel_t.
const std::vector<pool::ParamSlot>* layout_of_function(const void* func);
// cuLaunchKernel & co.: a CUfunction or a CUkernel passed as one.
const std::vector<pool::ParamSlot>* layout_of_cufunction(CUfunction function);

// A launch whose parameters could not be scanned (no layout): counted, and logged at warn level
// once per kernel. The launch itself goes ahead.
void count_untracked_launch(const void* kernel, const char* api);
uint64_t untracked_launches();

}  // namespace vcudnn::cuda
