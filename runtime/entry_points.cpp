// entry_points.h.
#include "runtime/entry_points.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "runtime/dl.h"
#include "runtime/log.h"

namespace vcudnn::entry_points {
namespace {

// Sorted (binary search). Kept equal to libvcudnn.so's cu[A-Z]* exports by a test.
constexpr std::array kHooked = {
    "cuCtxSynchronize",
    "cuGraphAddKernelNode_v2",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchKernel_ptsz",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocHost_v2",
    "cuMemAllocManaged",
    "cuMemAllocPitch_v2",
    "cuMemAlloc_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoDAsync_v2_ptsz",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoD_v2_ptds",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoHAsync_v2_ptsz",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2_ptsz",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoD_v2_ptds",
    "cuMemsetD32Async",
    "cuMemsetD32Async_ptsz",
    "cuMemsetD32_v2",
    "cuMemsetD32_v2_ptds",
    "cuMemsetD8Async",
    "cuMemsetD8Async_ptsz",
    "cuMemsetD8_v2",
    "cuMemsetD8_v2_ptds",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuStreamBeginCaptureToGraph",
    "cuStreamBeginCaptureToGraph_ptsz",
    "cuStreamBeginCapture_v2",
    "cuStreamBeginCapture_v2_ptsz",
    "cuStreamDestroy_v2",
    "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuTexObjectCreate",
};
constexpr size_t kCount = kHooked.size();

constexpr bool sorted() {
  for (size_t i = 1; i < kCount; ++i)
    if (!(std::string_view(kHooked[i - 1]) < std::string_view(kHooked[i]))) return false;
  return true;
}
static_assert(sorted(), "kHooked must be sorted and without duplicates");

// Per hooked name: libcuda's own function and vcudnn's, found once (nullptr: not yet; kNone: none).
// Plain atomics, constant-initialised: dlsym may be called before any constructor ran.
void* const kNone = reinterpret_cast<void*>(~uintptr_t{0});
std::array<std::atomic<void*>, kCount> g_real{};
std::array<std::atomic<void*>, kCount> g_ours{};
std::array<std::atomic<uint8_t>, kCount> g_logged{};  // one bit per Via
std::array<std::atomic<uint64_t>, static_cast<size_t>(Via::kCount)> g_counts{};

const char* via_name(Via via) {
  switch (via) {
    case Via::kDlsym:
      return "dlsym";
    case Via::kGetProcAddress:
      return "cuGetProcAddress";
    case Via::kDriverEntryPoint:
      return "cudaGetDriverEntryPoint";
    default:
      return "?";
  }
}

const char* base_name(const char* path) {
  const char* slash = path ? std::strrchr(path, '/') : nullptr;
  return slash ? slash + 1 : (path ? path : "?");
}

const void* self_base() {
  static std::atomic<const void*> base{nullptr};
  const void* b = base.load(std::memory_order_acquire);
  if (!b) {
    Dl_info info{};
    b = dladdr(reinterpret_cast<const void*>(&self_base), &info) ? info.dli_fbase : nullptr;
    base.store(b, std::memory_order_release);
  }
  return b;
}

// The object that holds `address`: its base and file name.
bool object_of(const void* address, const void** base, const char** file) {
  Dl_info info{};
  if (!address || !dladdr(address, &info)) return false;
  *base = info.dli_fbase;
  *file = info.dli_fname;
  return true;
}

bool is_libcuda(const char* file) { return std::strncmp(base_name(file), "libcuda.so", 10) == 0; }

// A handle on the object whose file is `file` (already loaded), or nullptr. Each call holds a
// reference: callers keep the handle.
void* handle_of(const char* file) { return file ? dlopen(file, RTLD_LAZY | RTLD_NOLOAD) : nullptr; }

// libcuda's handle, taken once from the file an answer came from.
void* libcuda_handle(const char* file) {
  static std::atomic<void*> handle{nullptr};
  void* h = handle.load(std::memory_order_acquire);
  if (h) return h;
  h = handle_of(file);
  void* expected = nullptr;
  if (h && !handle.compare_exchange_strong(expected, h, std::memory_order_acq_rel)) {
    dlclose(h);  // another thread was first
    h = expected;
  }
  return h;
}

void* resolved(std::atomic<void*>& slot, void* handle, const char* name) {
  void* p = slot.load(std::memory_order_acquire);
  if (p) return p == kNone ? nullptr : p;
  if (!handle) return nullptr;  // cannot tell now; try again next time
  p = real_dlsym(handle, name);
  slot.store(p ? p : kNone, std::memory_order_release);
  return p;
}

void* our_hook(size_t i) {
  static std::atomic<void*> self{nullptr};
  void* h = self.load(std::memory_order_acquire);
  if (!h) {
    const void* base = nullptr;
    const char* file = nullptr;
    if (!object_of(reinterpret_cast<const void*>(&our_hook), &base, &file)) return nullptr;
    h = handle_of(file);
    if (!h) return nullptr;
    self.store(h, std::memory_order_release);
  }
  void* p = resolved(g_ours[i], h, kHooked[i]);
  // A hook that lives in libcuda (vcudnn linked into a program, not preloaded, found libcuda's
  // first) would be no hook at all.
  const void* base = nullptr;
  const char* file = nullptr;
  if (p && (!object_of(p, &base, &file) || base != self_base())) return nullptr;
  return p;
}

size_t index_of(std::string_view name) {
  const auto it = std::lower_bound(kHooked.begin(), kHooked.end(), name,
                                   [](const char* a, std::string_view b) { return std::string_view(a) < b; });
  return it != kHooked.end() && std::string_view(*it) == name ? static_cast<size_t>(it - kHooked.begin()) : kCount;
}

void note(size_t i, Via via, const char* caller_file) {
  g_counts[static_cast<size_t>(via)].fetch_add(1, std::memory_order_relaxed);
  const uint8_t bit = static_cast<uint8_t>(1u << static_cast<unsigned>(via));
  if (g_logged[i].fetch_or(bit, std::memory_order_relaxed) & bit) return;
  try {
    VCUDNN_LOG_INFO("entry points: {} asked {} for libcuda's {}: given vcudnn's hook", base_name(caller_file),
                    via_name(via), kHooked[i]);
  } catch (...) {  // out of memory while formatting: the hook is handed out all the same
  }
}

}  // namespace

bool is_nvidia_library(const char* path) noexcept {
  const char* base = base_name(path);
  for (const char* prefix : {"libcudnn", "libcublas", "libcufft", "libcurand", "libcusparse", "libcusolver", "libnccl",
                             "libnvrtc", "libnvJitLink", "libcudart", "libcuda.", "libnvidia", "libcupti"}) {
    if (std::strncmp(base, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

const char* const* hooked_names(size_t* count) {
  *count = kCount;
  return kHooked.data();
}

bool is_hooked_name(const char* name) { return name && index_of(name) < kCount; }

void* substitute(const char* symbol, void* real, const void* caller, Via via) noexcept {
  if (!symbol || !real || symbol[0] != 'c' || symbol[1] != 'u') return real;
  const void* real_base = nullptr;
  const char* real_file = nullptr;
  if (!object_of(real, &real_base, &real_file) || !is_libcuda(real_file)) return real;
  const void* caller_base = nullptr;
  const char* caller_file = nullptr;
  if (caller && object_of(caller, &caller_base, &caller_file) &&
      (caller_base == self_base() || is_nvidia_library(caller_file)))
    return real;
  const std::string_view name(symbol);
  if (via == Via::kDlsym) {
    const size_t i = index_of(name);
    if (i == kCount) return real;
    void* ours = our_hook(i);
    if (!ours) return real;
    resolved(g_real[i], libcuda_handle(real_file), kHooked[i]);  // remembered for the other paths
    note(i, via, caller_file);
    return ours;
  }
  // A base name: the hooked names equal to it or extending it with "_...".
  auto it = std::lower_bound(kHooked.begin(), kHooked.end(), name,
                             [](const char* a, std::string_view b) { return std::string_view(a) < b; });
  for (; it != kHooked.end() && std::string_view(*it).starts_with(name); ++it) {
    const std::string_view candidate(*it);
    if (candidate.size() > name.size() && candidate[name.size()] != '_') continue;
    const size_t i = static_cast<size_t>(it - kHooked.begin());
    if (resolved(g_real[i], libcuda_handle(real_file), kHooked[i]) != real) continue;
    void* ours = our_hook(i);
    if (!ours) return real;
    note(i, via, caller_file);
    return ours;
  }
  if (index_of(name) == kCount) {
    // Not hooked at all, or an answer that is none of libcuda's exported functions: say so once
    // per name when it is a name vcudnn hooks some form of.
    bool known = false;
    for (const char* h : kHooked) known = known || std::string_view(h).starts_with(name);
    try {
      if (known)
        VCUDNN_LOG_DEBUG("entry points: {} for {} answered a function vcudnn does not hook", via_name(via), symbol);
    } catch (...) {
    }
  }
  return real;
}

Counts counts() noexcept {
  Counts c;
  for (size_t i = 0; i < g_counts.size(); ++i) c.substituted[i] = g_counts[i].load(std::memory_order_relaxed);
  return c;
}

std::string summary() {
  const Counts c = counts();
  return fmt::format("entry_points=dlsym:{},cuGetProcAddress:{},cudaGetDriverEntryPoint:{}",
                     c.substituted[0], c.substituted[1], c.substituted[2]);
}

}  // namespace vcudnn::entry_points
