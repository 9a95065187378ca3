// The CUDA driver entry points, the VMM and pinned-host pool backends, and the per-kernel
// parameter-layout cache (see header). The layout cache sits on the launch path: a hit takes a
// shared lock only; the driver is asked once per kernel, outside any lock.
#include "runtime/cuda_driver.h"

#include <chrono>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "runtime/log.h"
#include "runtime/no_destroy.h"
#include "runtime/real_api.h"

namespace vcudnn::cuda {

// ---- entry points ----------------------------------------------------------------------------

const Driver& driver() {
  // NoDestroy: hooks may run after static destructors.
  static NoDestroy<Driver> holder;
  static std::once_flag once;
  Driver& d = holder.get();
  std::call_once(once, [&d] {
    const auto bind = [&d](auto& slot, Library library, const char* name) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(real_symbol(library, name));
      if (!slot) d.missing += (d.missing.empty() ? "" : ", ") + std::string(name);
    };
#define VCUDNN_DRIVER_BIND(fn) bind(d.fn, Library::kDriver, #fn);
#define VCUDNN_DRIVER_RUNTIME_BIND(fn, type)                                                          \
  static_assert(std::is_same_v<type, decltype(&::fn)>, #fn ": type differs from cuda_runtime_api.h"); \
  bind(d.fn, Library::kCudart, #fn);
    VCUDNN_DRIVER_FUNCTIONS(VCUDNN_DRIVER_BIND)
    VCUDNN_DRIVER_RUNTIME_FUNCTIONS(VCUDNN_DRIVER_RUNTIME_BIND)
#undef VCUDNN_DRIVER_BIND
#undef VCUDNN_DRIVER_RUNTIME_BIND
    if (!d.missing.empty()) VCUDNN_LOG_DEBUG("CUDA entry points not found: {}", d.missing);
  });
  return d;
}

std::string error_text(CUresult status) {
  const char* text = nullptr;
  const Driver& d = driver();
  if (d.cuGetErrorString && d.cuGetErrorString(status, &text) == CUDA_SUCCESS && text) return text;
  return "CUresult " + std::to_string(static_cast<int>(status));
}

namespace {

// One checked driver call of the VMM backend: false (logged, rate-limited) when the entry point is
// missing or the call fails.
template <typename Fn, typename... Args>
bool call(Fn fn, const char* what, int device, Args... args) {
  if (!fn) {
    VCUDNN_WARN_LIMITED("CUDA driver: {} not found; device memory cannot be managed on device {}", what, device);
    return false;
  }
  const CUresult status = fn(args...);
  if (status == CUDA_SUCCESS) return true;
  VCUDNN_WARN_LIMITED("CUDA driver: {} failed on device {}: {}", what, device, error_text(status));
  return false;
}

// The same for the runtime calls of the host backend. A failure is cleared from the runtime's
// per-thread last error, where the framework's next cudaGetLastError would find it.
template <typename Fn, typename... Args>
bool call_runtime(Fn fn, const char* what, Args... args) {
  if (!fn) {
    VCUDNN_WARN_LIMITED("CUDA runtime: {} not found", what);
    return false;
  }
  const cudaError_t status = fn(args...);
  if (status == cudaSuccess) return true;
  const RealCudart& rt = real_cudart();
  if (rt.cudaGetLastError) rt.cudaGetLastError();
  VCUDNN_WARN_LIMITED("CUDA runtime: {} failed: {}", what,
                      rt.cudaGetErrorString ? rt.cudaGetErrorString(status) : std::to_string(static_cast<int>(status)));
  return false;
}

}  // namespace

// ---- VmmBackend -------------------------------------------------------------------------------

CUmemAllocationProp VmmBackend::properties() const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  return prop;
}

uint64_t VmmBackend::granularity() {
  if (const uint64_t known = granularity_.load(std::memory_order_relaxed)) return known;
  const CUmemAllocationProp prop = properties();
  size_t bytes = 0;
  if (!call(driver().cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", device_, &bytes, &prop,
            CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    return 0;
  granularity_.store(bytes, std::memory_order_relaxed);
  return bytes;
}

bool VmmBackend::reserve(uint64_t bytes, uint64_t* base) {
  const uint64_t alignment = granularity();
  CUdeviceptr va = 0;
  if (alignment == 0 ||
      !call(driver().cuMemAddressReserve, "cuMemAddressReserve", device_, &va, bytes, alignment, CUdeviceptr{0}, 0ULL))
    return false;
  *base = va;
  return true;
}

void VmmBackend::unreserve(uint64_t base, uint64_t bytes) {
  call(driver().cuMemAddressFree, "cuMemAddressFree", device_, CUdeviceptr{base}, bytes);
}

namespace {
uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
}  // namespace

VmmBackend::Timed::Timed(Cost& c) : c_(c), t0_(now_ns()) {}

VmmBackend::Timed::~Timed() {
  c_.calls.fetch_add(1, std::memory_order_relaxed);
  c_.ns.fetch_add(now_ns() - t0_, std::memory_order_relaxed);
}

std::string VmmBackend::costs() const {
  static constexpr const char* kNames[kOps] = {"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess",
                                               "cuMemUnmap"};
  std::string out;
  for (int i = 0; i < kOps; ++i) {
    out += fmt::format("{}{} {} in {:.1f} ms", i ? ", " : "", kNames[i], cost_[i].calls.load(),
                       static_cast<double>(cost_[i].ns.load()) / 1e6);
  }
  return out;
}

pool::PhysicalBackend::CallTotals VmmBackend::totals() const {
  CallTotals t;
  for (const Cost& c : cost_) {
    t.calls += c.calls.load(std::memory_order_relaxed);
    t.ns += c.ns.load(std::memory_order_relaxed);
  }
  return t;
}

pool::PhysicalBackend::Handle VmmBackend::create(uint64_t bytes) {
  const CUmemAllocationProp prop = properties();
  CUmemGenericAllocationHandle chunk = 0;
  const auto create = driver().cuMemCreate;
  if (bytes == 0 || !create) return 0;
  Timed timed(cost_[kCreate]);
  // Out of memory is an answer, not a fault: the caller makes room or fails the allocation, and
  // PyTorch probes the free memory by allocating until it succeeds.
  if (const CUresult status = create(&chunk, bytes, &prop, 0ULL); status == CUDA_ERROR_OUT_OF_MEMORY) {
    VCUDNN_LOG_DEBUG("CUDA driver: cuMemCreate of {} bytes: out of memory on device {}", bytes, device_);
    return 0;
  } else if (status != CUDA_SUCCESS) {
    VCUDNN_WARN_LIMITED("CUDA driver: cuMemCreate failed on device {}: {}", device_, error_text(status));
    return 0;
  }
  return chunk;
}

pool::PhysicalBackend::Handle VmmBackend::create_chunk() { return create(granularity()); }

pool::PhysicalBackend::Handle VmmBackend::create_extent(uint64_t granules) { return create(granules * granularity()); }

void VmmBackend::release_chunk(Handle chunk) {
  Timed timed(cost_[kRelease]);
  call(driver().cuMemRelease, "cuMemRelease", device_, chunk);
}

bool VmmBackend::map_bytes(uint64_t va, Handle chunk, uint64_t bytes) {
  const Driver& d = driver();
  if (bytes == 0) return false;
  {
    Timed timed(cost_[kMap]);
    if (!call(d.cuMemMap, "cuMemMap", device_, CUdeviceptr{va}, bytes, size_t{0}, chunk, 0ULL)) return false;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Timed timed(cost_[kSetAccess]);
  if (call(d.cuMemSetAccess, "cuMemSetAccess", device_, CUdeviceptr{va}, bytes, &access, size_t{1})) return true;
  call(d.cuMemUnmap, "cuMemUnmap", device_, CUdeviceptr{va}, bytes);  // the caller sees nothing mapped
  return false;
}

bool VmmBackend::map(uint64_t va, Handle chunk) { return map_bytes(va, chunk, granularity()); }

bool VmmBackend::map_extent(uint64_t va, Handle extent, uint64_t granules) {
  return map_bytes(va, extent, granules * granularity());
}

bool VmmBackend::map_alias(uint64_t va, Handle extent, uint64_t granules) {
  return map_bytes(va, extent, granules * granularity());
}

bool VmmBackend::unmap(uint64_t va) { return unmap_extent(va, 1); }

bool VmmBackend::unmap_extent(uint64_t va, uint64_t granules) {
  const uint64_t bytes = granules * granularity();
  if (bytes == 0) return false;
  Timed timed(cost_[kUnmap]);
  return call(driver().cuMemUnmap, "cuMemUnmap", device_, CUdeviceptr{va}, bytes);
}

bool vmm_supported(int device, std::string* why) {
  const auto fail = [why](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  const LibraryInfo& library = library_info(Library::kDriver);
  if (!library.found)
    return fail(library.error.empty() ? "the CUDA driver (libcuda.so.1) was not found" : library.error);
  const Driver& d = driver();
  if (!d.cuInit || !d.cuDeviceGetAttribute || !d.cuMemAddressReserve || !d.cuMemAddressFree || !d.cuMemCreate ||
      !d.cuMemRelease || !d.cuMemMap || !d.cuMemUnmap || !d.cuMemSetAccess || !d.cuMemGetAllocationGranularity)
    return fail("the CUDA driver lacks virtual-memory entry points (missing: " + d.missing + ")");
  if (const CUresult status = d.cuInit(0); status != CUDA_SUCCESS) return fail("cuInit failed: " + error_text(status));
  int supported = 0;
  if (const CUresult status =
          d.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
      status != CUDA_SUCCESS)
    return fail("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) failed on device " + std::to_string(device) +
                ": " + error_text(status));
  if (!supported) return fail("device " + std::to_string(device) + " does not support virtual memory management");
  return true;
}

// ---- PinnedHostBackend ------------------------------------------------------------------------

void* PinnedHostBackend::allocate_pinned(uint64_t bytes) {
  void* ptr = nullptr;
  if (!call_runtime(driver().cudaHostAlloc, "cudaHostAlloc", &ptr, bytes, cudaHostAllocPortable)) return nullptr;
  return ptr;
}

void PinnedHostBackend::free_pinned(void* ptr) {
  if (ptr) call_runtime(driver().cudaFreeHost, "cudaFreeHost", ptr);
}

// ---- parameter layouts ------------------------------------------------------------------------

namespace {

using Layout = std::vector<pool::ParamSlot>;

// Parameters 0, 1, 2... until the driver says the index is past the last one
// (CUDA_ERROR_INVALID_VALUE). nullopt: the getter is missing or refused the handle.
template <typename Handle>
std::optional<Layout> query_params(CUresult (*get)(Handle, size_t, size_t*, size_t*), Handle handle, CUresult* status) {
  *status = CUDA_ERROR_NOT_FOUND;
  if (!get) return std::nullopt;
  Layout layout;
  for (size_t index = 0; index < pool::kMaxParamBytes; ++index) {
    size_t offset = 0;
    size_t size = 0;
    *status = get(handle, index, &offset, &size);
    if (*status == CUDA_ERROR_INVALID_VALUE) return layout;
    if (*status != CUDA_SUCCESS) return std::nullopt;
    if (offset > pool::kMaxParamBytes || size > pool::kMaxParamBytes) return std::nullopt;
    layout.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(size)});
  }
  return std::nullopt;  // more parameters than a kernel can have: not a layout to trust
}

std::optional<Layout> kernel_params(CUkernel kernel, CUresult* status) {
  return query_params(driver().cuKernelGetParamInfo, kernel, status);
}

std::optional<Layout> function_params(CUfunction function, CUresult* status) {
  return query_params(driver().cuFuncGetParamInfo, function, status);
}

std::optional<Layout> logged(std::optional<Layout> layout, const char* kind, const void* key, CUresult status) {
  if (!layout)
    VCUDNN_LOG_DEBUG("no parameter layout for {} {}: {}; its launches are not tracked", kind, key, error_text(status));
  return layout;
}

enum class KeyKind : uint8_t { kKernel, kFunction, kCuFunction };

// Layouts by kernel, never freed. Negative results are kept too (nullptr).
class LayoutCache {
 public:
  // Every launch asks: a small per-thread cache in front of the shared map (entries are never
  // freed, so a cached pointer stays valid) keeps the map's lock off the launch path.
  template <typename Query>
  const Layout* get(KeyKind kind, const void* handle, Query&& query) noexcept {
    const Key key{reinterpret_cast<uintptr_t>(handle), kind};
    Recent& recent = recent_slot(key);
    if (recent.valid && recent.key == key) return recent.layout;
    const Layout* found = nullptr;
    bool known = false;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (const auto it = layouts_.find(key); it != layouts_.end()) {
        found = it->second.get();
        known = true;
      }
    }
    if (!known) {
      try {
        std::optional<Layout> layout = query();  // driver calls: outside the lock
        std::unique_ptr<const Layout> entry = layout ? std::make_unique<const Layout>(std::move(*layout)) : nullptr;
        std::unique_lock<std::shared_mutex> lock(mu_);
        found = layouts_.try_emplace(key, std::move(entry)).first->second.get();  // a racing first insert wins
      } catch (...) {
        return nullptr;  // out of host memory: this launch goes untracked (and is asked again)
      }
    }
    recent = {key, found, true};
    return found;
  }

 private:
  struct Key {
    uintptr_t handle;
    KeyKind kind;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const noexcept {
      return std::hash<uintptr_t>{}(key.handle) ^ static_cast<size_t>(key.kind);
    }
  };
  struct Recent {
    Key key{};
    const Layout* layout = nullptr;
    bool valid = false;
  };
  static Recent& recent_slot(const Key& key) {
    static thread_local Recent recent[64];
    return recent[(KeyHash{}(key) >> 4) % 64];
  }

  std::shared_mutex mu_;
  std::unordered_map<Key, std::unique_ptr<const Layout>, KeyHash> layouts_;
};

LayoutCache& layouts() {
  static NoDestroy<LayoutCache> cache;
  return cache.get();
}

}  // namespace

const std::vector<pool::ParamSlot>* layout_of_kernel(cudaKernel_t kernel) {
  return layouts().get(KeyKind::kKernel, kernel, [kernel] {
    CUresult status = CUDA_SUCCESS;
    return logged(kernel_params(reinterpret_cast<CUkernel>(kernel), &status), "kernel", kernel, status);
  });
}

const std::vector<pool::ParamSlot>* layout_of_function(const void* func) {
  return layouts().get(KeyKind::kFunction, func, [func] {
    const Driver& d = driver();
    CUresult status = CUDA_ERROR_NOT_FOUND;
    cudaFunction_t function = nullptr;
    if (d.cudaGetFuncBySymbol && d.cudaGetFuncBySymbol(&function, func) == cudaSuccess && function)
      return logged(function_params(reinterpret_cast<CUfunction>(function), &status), "function", func, status);
    // Not a registered host stub: since CUDA 12 `func` may be a cudaKernel_t. The failed lookup
    // must not stay in the framework's last error.
    const RealCudart& rt = real_cudart();
    if (rt.cudaGetLastError) rt.cudaGetLastError();
    return logged(kernel_params(static_cast<CUkernel>(const_cast<void*>(func)), &status), "function", func, status);
  });
}

const std::vector<pool::ParamSlot>* layout_of_cufunction(CUfunction function) {
  return layouts().get(KeyKind::kCuFunction, function, [function] {
    // cuLaunchKernel takes a CUkernel cast to CUfunction too. An empty answer may be the wrong
    // kind of handle refused as an invalid index, so the other kind is asked before trusting it.
    CUresult status = CUDA_SUCCESS;
    std::optional<Layout> layout = function_params(function, &status);
    if (!layout || layout->empty()) {
      CUresult kernel_status = CUDA_SUCCESS;
      std::optional<Layout> as_kernel = kernel_params(reinterpret_cast<CUkernel>(function), &kernel_status);
      if (as_kernel && (!as_kernel->empty() || !layout)) layout = std::move(as_kernel);
    }
    return logged(std::move(layout), "CUfunction", function, status);
  });
}

// ---- untracked launches -----------------------------------------------------------------------

namespace {

struct Untracked {
  std::atomic<uint64_t> launches{0};
  std::shared_mutex mu;
  std::unordered_set<uintptr_t> warned;  // kernels already reported

  // True the first time `kernel` is seen.
  bool first(uintptr_t kernel) noexcept {
    {
      std::shared_lock<std::shared_mutex> lock(mu);
      if (warned.contains(kernel)) return false;
    }
    try {
      std::unique_lock<std::shared_mutex> lock(mu);
      return warned.insert(kernel).second;
    } catch (...) {
      return false;
    }
  }
};

Untracked& untracked() {
  static NoDestroy<Untracked> state;
  return state.get();
}

}  // namespace

void count_untracked_launch(const void* kernel, const char* api) {
  Untracked& u = untracked();
  u.launches.fetch_add(1, std::memory_order_relaxed);
  if (u.first(reinterpret_cast<uintptr_t>(kernel)))
    VCUDNN_LOG_WARN("{}: kernel {} has no known parameter layout; its launches are not tracked", api, kernel);
}

uint64_t untracked_launches() { return untracked().launches.load(std::memory_order_relaxed); }

}  // namespace vcudnn::cuda
