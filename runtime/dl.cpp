// real_dlsym (dl.h).
#include "runtime/dl.h"

#include <dlfcn.h>

#include <atomic>

namespace vcudnn {
namespace {

void* find_nothing(void*, const char*) { return nullptr; }

__attribute__((no_sanitize_thread, no_sanitize_address)) DlsymFn resolve() noexcept {
  // glibc 2.34 moved dlsym into libc (GLIBC_2.34); before, libdl's GLIBC_2.2.5 (x86_64) or
  // GLIBC_2.17 (aarch64).
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(p);
  }
  return &find_nothing;
}

}  // namespace

// Not instrumented: a sanitizer's runtime may reach this through the dlsym hook while it starts.
__attribute__((no_sanitize_thread, no_sanitize_address)) DlsymFn real_dlsym_fn() noexcept {
  static std::atomic<DlsymFn> real{nullptr};  // constant-initialised: usable before constructors
  DlsymFn f = real.load(std::memory_order_acquire);
  if (!f) {
    f = resolve();  // idempotent: racing threads find the same function
    real.store(f, std::memory_order_release);
  }
  return f;
}

}  // namespace vcudnn
