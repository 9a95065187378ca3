// What every access-tracking hook of a cuDNN, cuBLAS or cuBLASLt function does (the generated
// interpose/generated/tracked_*.cpp and the hand-written interpose/library_hooks.cpp): report the
// device pointers the call carries (runtime/memory_access.h), then forward to the real function.
// Without memory ownership (memory::active() false) a hook costs one relaxed load and a call.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <cstdint>
#include <optional>
#include <type_traits>

#include "runtime/barrier.h"
#include "runtime/memory_access.h"
#include "runtime/real_api.h"

namespace vcudnn::interpose {
using memory::StreamRef;
}

namespace vcudnn::interpose {

// The codes a tracked hook answers with itself: no real library (as if never initialised), or a
// buffer the call needs could not be brought back (the library's own out-of-memory code, so that
// the framework frees its cache and retries).
template <typename Status>
struct TrackedStatus;

template <>
struct TrackedStatus<cudnnStatus_t> {
  static constexpr cudnnStatus_t kUnresolved = CUDNN_STATUS_NOT_INITIALIZED;
  static constexpr cudnnStatus_t kOutOfMemory = CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
};

template <>
struct TrackedStatus<cublasStatus_t> {
  static constexpr cublasStatus_t kUnresolved = CUBLAS_STATUS_NOT_INITIALIZED;
  static constexpr cublasStatus_t kOutOfMemory = CUBLAS_STATUS_ALLOC_FAILED;
};

// Counts tracked hooks active on this thread. cuBLAS calls its own and cuBLASLt's exported
// functions, which land in our hooks again: only the outermost call reports, the real call it
// makes runs inside the guard.
class TrackedDepth {
 public:
  TrackedDepth() : nested_(depth()++ > 0) {}
  ~TrackedDepth() { --depth(); }
  TrackedDepth(const TrackedDepth&) = delete;
  TrackedDepth& operator=(const TrackedDepth&) = delete;
  bool nested() const { return nested_; }

 private:
  static int& depth() {
    static thread_local int d = 0;
    return d;
  }
  bool nested_;
};

// One argument as a word for memory::touch: pointers (handles and host pointers included: they
// simply match no buffer) and 8-byte integers (an address passed as int64 or size_t) keep their
// value; everything else (enums, 4-byte integers, floating point) is 0.
template <typename T>
uint64_t tracked_word(T value) {
  if constexpr (std::is_pointer_v<T>) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(value));
  } else if constexpr (std::is_integral_v<T> && sizeof(T) == sizeof(uint64_t)) {
    return static_cast<uint64_t>(value);
  } else {
    return 0;
  }
}

// The stream a library call runs on, so that a buffer it needs back is restored in that stream's
// order (no host wait) and the buffer remembers the stream: a cudaStream_t argument (cuBLASLt's
// matmul), else the stream set in the cuDNN or cuBLAS handle; nullopt when there is neither.
inline StreamRef stream_in(cudnnHandle_t handle) {
  cudaStream_t s = nullptr;
  const auto get = real().cudnnGetStream;
  return handle && get && get(handle, &s) == CUDNN_STATUS_SUCCESS ? StreamRef(s) : std::nullopt;
}
inline StreamRef stream_in(cublasHandle_t handle) {
  using Get = cublasStatus_t (*)(cublasHandle_t, cudaStream_t*);
  static const Get get = reinterpret_cast<Get>(real_symbol(Library::kCublas, "cublasGetStream_v2"));
  cudaStream_t s = nullptr;
  return handle && get && get(handle, &s) == CUBLAS_STATUS_SUCCESS ? StreamRef(s) : std::nullopt;
}
template <typename T>
StreamRef stream_in(T) {
  return std::nullopt;
}

template <typename First, typename... Rest>
StreamRef stream_of(First first, Rest... rest) {
  StreamRef explicit_stream;
  const auto take = [&](auto arg) {
    if constexpr (std::is_same_v<decltype(arg), cudaStream_t>) explicit_stream = arg;
  };
  take(first);
  (take(rest), ...);
  return explicit_stream ? explicit_stream : stream_in(first);
}
inline StreamRef stream_of() { return std::nullopt; }

// Hook is the exported hook itself: its address keys the resolved real entry point, which is one
// per function even where several functions share a signature.
template <auto Hook, typename Fn = decltype(Hook)>
struct Tracked;

template <auto Hook, typename Status, typename... Params>
struct Tracked<Hook, Status (*)(Params...)> {
  using Real = Status (*)(Params...);
  using Codes = TrackedStatus<Status>;

  static Real real(Library lib, const char* name) {
    static const Real fn = reinterpret_cast<Real>(real_symbol(lib, name));
    return fn;
  }

  // Forwards to the real `name`. When vcudnn owns memory and this is the outermost tracked call
  // on the thread, `before(name)` runs first; false means a buffer could not be brought back,
  // and the real function is not called.
  template <typename Before>
  static Status call(Library lib, const char* name, Before&& before, Params... args) {
    const Real fn = real(lib, name);
    if (!fn) return Codes::kUnresolved;
    if (!memory::active()) return fn(args...);
    memory::CallScope scope;  // the touched buffers stay put until the work is queued
    TrackedDepth guard;
    // An exception counts as "could not bring the memory back" (Note [Exception barrier]).
    if (!guard.nested() && !barrier(name, [&] { return before(name); }, [] { return false; }, false))
      return Codes::kOutOfMemory;
    return fn(args...);
  }

  // The generated hooks: every argument may point into a buffer the call reads or writes.
  static Status touch_all(Library lib, const char* name, Params... args) {
    return call(
        lib, name,
        [&](const char* api) {
          const uint64_t words[] = {tracked_word(args)...};
          return memory::touch(words, sizeof...(Params), memory::Access::kUnknown, stream_of(args...), api);
        },
        args...);
  }
};

// The overload of a function whose parameters are P... (cublas_api.h adds C++ overloads of a few
// names): ExactOverload<void(P...)>::of(&::fn).
template <typename Signature>
struct ExactOverload;

template <typename... P>
struct ExactOverload<void(P...)> {
  template <typename Status>
  static constexpr auto of(Status (*fn)(P...)) {
    return fn;
  }
};

}  // namespace vcudnn::interpose

// The whole body of a generated hook: VCUDNN_TRACKED(kCublas, cublasSgemm_v2, handle, ...).
#define VCUDNN_TRACKED(lib, fn, ...) \
  ::vcudnn::interpose::Tracked<&::fn>::touch_all(::vcudnn::Library::lib, #fn, __VA_ARGS__)
// The same for a name the header overloads: `params` is the hook's parenthesised parameter types.
#define VCUDNN_TRACKED_OVERLOADED(lib, fn, params, ...)                                                \
  ::vcudnn::interpose::Tracked<::vcudnn::interpose::ExactOverload<void params>::of(&::fn)>::touch_all( \
      ::vcudnn::Library::lib, #fn, __VA_ARGS__)
