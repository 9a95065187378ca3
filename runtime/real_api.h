// The real cuDNN and CUDA runtime entry points, resolved lazily on first use (Note [Resolving the
// real libraries] in real_api.cpp). vcudnn's own calls go through real() / real_cudart() only:
// calling an exported name from inside vcudnn would re-enter a hook.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

namespace vcudnn {

struct RealCudnn {
#define VCUDNN_CUDNN_HOOK(short_name, fn) decltype(&::fn) fn = nullptr;
#define VCUDNN_CUDNN_USED(fn) decltype(&::fn) fn = nullptr;
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
#undef VCUDNN_CUDNN_USED
};

struct RealCudart {
#define VCUDNN_CUDART_USED(fn) decltype(&::fn) fn = nullptr;
#include "runtime/cudart_api.def"
#undef VCUDNN_CUDART_USED
};

// Where a library was found, for logs and `vcudnn info`.
struct LibraryInfo {
  bool found = false;
  std::string path;   // file the entry points live in
  std::string how;    // "RTLD_NEXT", "already loaded as libcudnn.so.9", "dlopen(...)"
  std::string error;  // why nothing was found
  int missing = 0;    // symbols not found in it
  std::string missing_names;
};

// Libraries whose entry points hooks resolve one by one (real_symbol).
enum class Library { kCudnn, kCudart, kCublas, kCublasLt, kDriver, kNccl };
// The real entry point `name` of `lib` (same resolution order as above; for kDriver:
// libcuda.so.1; for kNccl: libnccl.so.2), nullptr when the library or the symbol is missing.
// Thread-safe; callers cache the result in a function-local static.
void* real_symbol(Library lib, const char* name);
const LibraryInfo& library_info(Library lib);

const RealCudnn& real();
const RealCudart& real_cudart();
const LibraryInfo& cudnn_library();
const LibraryInfo& cudart_library();

}  // namespace vcudnn
