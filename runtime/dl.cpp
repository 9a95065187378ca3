// real_dlsym (dl.h).
#include "runtime/dl.h"

#include <dlfcn.h>

#include <initializer_list>


namespace vcudnn {
namespace {

void* find_nothing(void*, const char*) { return nullptr; }

__attribute__((no_sanitize_thread, no_sanitize_address)) DlsymFn resolve() noexcept {
  // glibc 2.34 moved dlsym into libc (GLIBC_2.34); before, libdl's GLIBC_2.2.5 (x86_64) or
  // GLIBC_2.17 (aarch64).
  // RTLD_NEXT first (the libraries after libvcudnn); then the whole process, which finds only
  // glibc's versioned definition (vcudnn's own is unversioned).
  for (void* where : {RTLD_NEXT, RTLD_DEFAULT}) {
    for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
      if (void* p = dlvsym(where, "dlsym", version)) return reinterpret_cast<DlsymFn>(p);
    }
  }
  return &find_nothing;
}

}  // namespace

// Not instrumented: a sanitizer's runtime may reach this through the dlsym hook while it starts.
// Atomic builtins on a plain pointer, not std::atomic: its member functions are separate,
// instrumented functions when not inlined.
__attribute__((no_sanitize_thread, no_sanitize_address)) DlsymFn real_dlsym_fn() noexcept {
  static DlsymFn real = nullptr;  // constant-initialised: usable before constructors
  DlsymFn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
  if (!f) {
    f = resolve();  // idempotent: racing threads find the same function
    __atomic_store_n(&real, f, __ATOMIC_RELEASE);
  }
  return f;
}

}  // namespace vcudnn
