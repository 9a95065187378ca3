// Resolution of the real cuDNN and CUDA runtime.
//
// Note [Resolving the real libraries]
// PyTorch loads libcudnn.so.9 as a dependency of a library opened RTLD_LOCAL, so real_dlsym(RTLD_NEXT)
// finds nothing there. Order, per library, decided once for all its symbols:
//   1. real_dlsym(RTLD_NEXT, probe): the next object after libvcudnn in the global scope (a program
//      linked against cuDNN, or the library after us in link order);
//   2. dlopen(soname, RTLD_NOLOAD): a copy the process already loaded, whatever its path;
//   3. dlopen(VCUDNN_CUDNN_LIBRARY or the soname): load one ourselves.
// Resolution happens at the first hook, never at load time: loading our own cuDNN before the
// framework loads its copy would hand the framework the wrong one. A result inside libvcudnn
// itself (VCUDNN_CUDNN_LIBRARY pointing at us) is refused.
#include "runtime/real_api.h"

#include <dlfcn.h>

#include <array>
#include <mutex>
#include <vector>

#include "runtime/dl.h"
#include "runtime/no_destroy.h"
#include "runtime/options.h"

namespace vcudnn {
namespace {

struct LibrarySpec {
  const char* what;
  std::vector<const char*> sonames;
  const char* probe;
  std::string override_path;
};

struct Source {
  void* handle = nullptr;  // RTLD_NEXT or a dlopen handle
  LibraryInfo info;
};

void* self_base() {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&self_base), &self);
  return self.dli_fbase;
}

std::string file_of(void* sym) {
  Dl_info di{};
  if (sym && dladdr(sym, &di) && di.dli_fname) return di.dli_fname;
  return "?";
}

bool in_self(void* sym) {
  Dl_info di{};
  return sym && dladdr(sym, &di) && di.dli_fbase == self_base();
}

Source find_source(const LibrarySpec& spec) {
  Source s;
  if (void* p = real_dlsym(RTLD_NEXT, spec.probe); p && !in_self(p)) {
    s.handle = RTLD_NEXT;
    s.info = {true, file_of(p), "RTLD_NEXT", "", 0, ""};
    return s;
  }
  for (const char* soname : spec.sonames) {
    if (void* h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
      void* p = real_dlsym(h, spec.probe);
      if (p && !in_self(p)) {
        s.handle = h;
        s.info = {true, file_of(p), std::string("already loaded as ") + soname, "", 0, ""};
        return s;
      }
      dlclose(h);
    }
  }
  const std::string path = spec.override_path.empty() ? spec.sonames.front() : spec.override_path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = dlerror();
    s.info.error = std::string(spec.what) + ": dlopen(" + path + ") failed: " + (err ? err : "?");
    return s;
  }
  void* p = real_dlsym(h, spec.probe);
  const bool is_vcudnn = real_dlsym(h, "vcudnnGetVersionString") != nullptr || in_self(p);
  if (!p || is_vcudnn) {
    s.info.error =
        std::string(spec.what) + ": " + path +
        (is_vcudnn ? " is vcudnn itself, not the real library" : " does not export " + std::string(spec.probe));
    dlclose(h);
    return s;
  }
  s.handle = h;
  s.info = {true, file_of(p), "dlopen(" + path + ")", "", 0, ""};
  return s;
}

template <typename Fn>
void bind(const Source& s, LibraryInfo& info, Fn& slot, const char* name) {
  void* p = s.handle ? real_dlsym(s.handle, name) : nullptr;
  if (p && in_self(p)) p = nullptr;
  slot = reinterpret_cast<Fn>(p);
  if (!p && s.handle) {
    ++info.missing;
    info.missing_names += (info.missing_names.empty() ? "" : ", ") + std::string(name);
  }
}

// One Source per library, found once (Note [Resolving the real libraries]): the typed tables below,
// the hooks' own lookups (real_symbol) and the driver table (cuda_driver.cpp) all bind from it.
Source& source(Library lib) {
  static NoDestroy<std::array<Source, 6>> holder;
  static std::array<std::once_flag, 6> once;
  const auto i = static_cast<size_t>(lib);
  std::call_once(once[i], [lib, i] {
    Source& s = holder.get()[i];
    switch (lib) {
      case Library::kCudnn:
        s = find_source({"cuDNN", {"libcudnn.so.9"}, "cudnnGetVersion", options().get(kCudnnLibrary)});
        break;
      case Library::kCudart:
        s = find_source(
            {"CUDA runtime", {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}, "cudaRuntimeGetVersion", ""});
        break;
      case Library::kCublas:
        s = find_source({"cuBLAS", {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, "cublasGetVersion_v2", ""});
        break;
      case Library::kCublasLt:
        s = find_source(
            {"cuBLASLt", {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}, "cublasLtGetVersion", ""});
        break;
      case Library::kDriver:
        s = find_source({"CUDA driver", {"libcuda.so.1", "libcuda.so"}, "cuDriverGetVersion", ""});
        break;
      case Library::kNccl:
        s = find_source({"NCCL", {"libnccl.so.2", "libnccl.so"}, "ncclGetVersion", ""});
        break;
    }
  });
  return holder.get()[i];
}

// The typed tables: the library's Source, and its info counting the names that table missed.
struct CudnnState {
  RealCudnn fns;
  LibraryInfo info;
};

struct CudartState {
  RealCudart fns;
  LibraryInfo info;
};

// NoDestroy: hooks and the exit handler may run after static destructors.
CudnnState& cudnn_state() {
  static NoDestroy<CudnnState> holder;
  CudnnState& st = holder.get();
  static std::once_flag once;
  std::call_once(once, [&st] {
    const Source& s = source(Library::kCudnn);
    st.info = s.info;
#define VCUDNN_CUDNN_HOOK(short_name, fn) bind(s, st.info, st.fns.fn, #fn);
#define VCUDNN_CUDNN_USED(fn) bind(s, st.info, st.fns.fn, #fn);
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
#undef VCUDNN_CUDNN_USED
  });
  return st;
}

CudartState& cudart_state() {
  static NoDestroy<CudartState> holder;
  CudartState& st = holder.get();
  static std::once_flag once;
  std::call_once(once, [&st] {
    const Source& s = source(Library::kCudart);
    st.info = s.info;
#define VCUDNN_CUDART_USED(fn) bind(s, st.info, st.fns.fn, #fn);
#include "runtime/cudart_api.def"
#undef VCUDNN_CUDART_USED
  });
  return st;
}

}  // namespace

void* real_symbol(Library lib, const char* name) {
  const Source& s = source(lib);
  if (!s.handle) return nullptr;
  void* p = real_dlsym(s.handle, name);
  return p && !in_self(p) ? p : nullptr;
}

const LibraryInfo& library_info(Library lib) { return source(lib).info; }

const RealCudnn& real() { return cudnn_state().fns; }
const RealCudart& real_cudart() { return cudart_state().fns; }
const LibraryInfo& cudnn_library() { return cudnn_state().info; }
const LibraryInfo& cudart_library() { return cudart_state().info; }

}  // namespace vcudnn
