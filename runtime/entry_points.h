// Driver entry points that reach a program without the dynamic linker: dlsym on a libcuda handle
// (Triton's launcher, PyTorch's lazily loaded NVRTC stub), cuGetProcAddress and
// cudaGetDriverEntryPoint(ByVersion) (PyTorch's c10 driver table). The dynamic linker hands a
// preloaded libvcudnn.so's cu* hooks to every program that links libcuda; these paths would hand
// out libcuda's own functions, whose launches and copies vcudnn would never see (an evicted buffer
// read by them would fault on the device). Each answer that is a libcuda function vcudnn hooks is
// replaced by vcudnn's hook (interpose/entry_point_hooks.cpp asks substitute()).
#pragma once

#include <cstdint>
#include <string>

namespace vcudnn::entry_points {

enum class Via : uint8_t { kDlsym, kGetProcAddress, kDriverEntryPoint, kCount };

// The driver functions libvcudnn.so exports (every `cu[A-Z]*` symbol but cuGetProcAddress*, which
// the runtime itself looks up to build its own driver table: it must keep the real one).
// tests/cpu/entry_points_test.cpp checks the list against the library's dynamic symbols.
const char* const* hooked_names(size_t* count);
bool is_hooked_name(const char* name);

// `real` is what the lookup of `symbol` answered. vcudnn's hook when `real` is libcuda's function
// that vcudnn hooks: for kDlsym the exact name; for the other two `symbol` is a base name ("cuMemcpyHtoD")
// whose answer depends on the version and per-thread flag asked for, so every hooked name that
// extends it ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds") is compared by address. `real` otherwise,
// and for callers inside vcudnn or an NVIDIA library (whose own driver calls must stay theirs).
void* substitute(const char* symbol, void* real, const void* caller, Via via) noexcept;

// Whether `path` (a shared object's file) is one of NVIDIA's libraries (cuDNN, cuBLAS, NCCL, the
// CUDA runtime and driver, ...): their driver calls stay theirs, and the memory they allocate for
// their own kernels is never evicted (interpose/memory_hooks.cpp).
bool is_nvidia_library(const char* path) noexcept;

struct Counts {
  uint64_t substituted[static_cast<size_t>(Via::kCount)] = {};
};
Counts counts() noexcept;
// "entry_points=dlsym:3,proc:0,runtime:5" for the exit line.
std::string summary();

}  // namespace vcudnn::entry_points
