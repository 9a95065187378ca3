// The exported lookups of driver entry points (runtime/entry_points.h): dlsym (on x86-64, through
// dlsym_x86_64.S), cuGetProcAddress in both forms, and the runtime's cudaGetDriverEntryPoint and
// cudaGetDriverEntryPointByVersion (with their per-thread-default-stream forms). Each calls the
// real lookup, then hands out vcudnn's hook in place of a libcuda function vcudnn hooks.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "runtime/dl.h"
#include "runtime/entry_points.h"
#include "runtime/real_api.h"

namespace {

namespace ep = vcudnn::entry_points;
using vcudnn::Library;

template <typename Fn>
Fn real_fn(Library lib, const char* name) {
  return reinterpret_cast<Fn>(vcudnn::real_symbol(lib, name));
}

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the library exports both.
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using EntryPoint = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using EntryPointByVersion = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                            cudaDriverEntryPointQueryResult*);

template <typename Status>
Status answer(Status status, Status ok, const char* symbol, void** pfn, const void* caller, ep::Via via) {
  if (status == ok && pfn && *pfn) *pfn = ep::substitute(symbol, *pfn, caller, via);
  return status;
}

}  // namespace

extern "C" {

// What dlsym_x86_64.S jumps to when vcudnn does not answer: glibc's dlsym.
__attribute__((visibility("hidden"))) vcudnn::DlsymFn vcudnn_dlsym_next = nullptr;

// A lookup of a cu* name on an explicit handle: vcudnn's hook, or nullptr.
__attribute__((visibility("hidden"), noinline)) void* vcudnn_dlsym_answer(void* handle, const char* name,
                                                                           const void* caller) noexcept {
  if (!ep::is_hooked_name(name)) return nullptr;
  void* real = vcudnn_dlsym_next(handle, name);
  void* answer = ep::substitute(name, real, caller, ep::Via::kDlsym);
  return answer != real ? answer : nullptr;
}

// nullptr: the real dlsym answers (vcudnn_dlsym_next is set before returning). Only explicit
// handles can name libcuda: RTLD_DEFAULT finds vcudnn's exports anyway, RTLD_NEXT is left to glibc.
// Must work before any constructor of vcudnn ran (a sanitizer's runtime looks up the functions it
// wraps with dlsym(RTLD_NEXT) while it starts: that path is not instrumented), and never throw.
__attribute__((visibility("hidden"), no_sanitize_thread, no_sanitize_address)) void* vcudnn_dlsym_decide(
    void* handle, const char* name, const void* caller) noexcept {
  if (!__atomic_load_n(&vcudnn_dlsym_next, __ATOMIC_ACQUIRE))
    __atomic_store_n(&vcudnn_dlsym_next, vcudnn::real_dlsym_fn(), __ATOMIC_RELEASE);
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || !name || name[0] != 'c' || name[1] != 'u') return nullptr;
  return vcudnn_dlsym_answer(handle, name, caller);
}

}  // extern "C"

#pragma GCC visibility push(default)
extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  static const auto real = real_fn<GetProcV2>(Library::kDriver, "cuGetProcAddress_v2");
  if (!real) return CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
  return answer(real(symbol, pfn, cudaVersion, flags, symbolStatus), CUDA_SUCCESS, symbol, pfn,
                __builtin_return_address(0), ep::Via::kGetProcAddress);
}

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  static const auto real = real_fn<GetProcV1>(Library::kDriver, "cuGetProcAddress");
  if (!real) return CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
  return answer(real(symbol, pfn, cudaVersion, flags), CUDA_SUCCESS, symbol, pfn, __builtin_return_address(0),
                ep::Via::kGetProcAddress);
}

#define VCUDNN_ENTRY_POINT_HOOK(name)                                                                         \
  cudaError_t name(const char* symbol, void** funcPtr, unsigned long long flags,                              \
                   cudaDriverEntryPointQueryResult* driverStatus) {                                           \
    static const auto real = real_fn<EntryPoint>(Library::kCudart, #name);                                    \
    if (!real) return cudaErrorSharedObjectSymbolNotFound;                                                    \
    return answer(real(symbol, funcPtr, flags, driverStatus), cudaSuccess, symbol, funcPtr,                   \
                  __builtin_return_address(0), ep::Via::kDriverEntryPoint);                                   \
  }
#define VCUDNN_ENTRY_POINT_BY_VERSION_HOOK(name)                                                              \
  cudaError_t name(const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,    \
                   cudaDriverEntryPointQueryResult* driverStatus) {                                           \
    static const auto real = real_fn<EntryPointByVersion>(Library::kCudart, #name);                           \
    if (!real) return cudaErrorSharedObjectSymbolNotFound;                                                    \
    return answer(real(symbol, funcPtr, cudaVersion, flags, driverStatus), cudaSuccess, symbol, funcPtr,      \
                  __builtin_return_address(0), ep::Via::kDriverEntryPoint);                                   \
  }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
VCUDNN_ENTRY_POINT_HOOK(cudaGetDriverEntryPoint)
VCUDNN_ENTRY_POINT_HOOK(cudaGetDriverEntryPoint_ptsz)
VCUDNN_ENTRY_POINT_BY_VERSION_HOOK(cudaGetDriverEntryPointByVersion)
VCUDNN_ENTRY_POINT_BY_VERSION_HOOK(cudaGetDriverEntryPointByVersion_ptsz)
#pragma GCC diagnostic pop

}  // extern "C"
#pragma GCC visibility pop
