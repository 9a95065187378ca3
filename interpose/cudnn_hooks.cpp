// The exported cuDNN hooks: same names and signatures as cudnn.h. Each decodes its arguments
// (call_builders.h) and makes one Engine call. Only these and the vcudnn* API are exported
// (exports.map); every other cuDNN function resolves to the real library untouched.
#include <cudnn.h>

#include "interpose/call_builders.h"
#include "runtime/real_api.h"

using namespace vcudnn;
using namespace vcudnn::interpose;

namespace {

// cudnnCreate/Destroy/SetStream/GetStream: nested calls go straight to the real library.
template <typename Real, typename... Args>
cudnnStatus_t forward_nested(Real fn, const char* name, Args... args) {
  return fn ? fn(args...) : unresolved(name);
}

}  // namespace

// The hooks keep cudnn.h's declarations, which carry no visibility: export them explicitly.
#pragma GCC visibility push(default)
extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  HookScope scope(HookId::create);
  if (scope.nested()) return forward_nested(real().cudnnCreate, "cudnnCreate", handle);
  return guarded(
      scope, "cudnnCreate", [&] { return forward_nested(real().cudnnCreate, "cudnnCreate", handle); },
      [&] { return Engine::get().create(scope, handle); });
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  HookScope scope(HookId::destroy);
  if (scope.nested()) return forward_nested(real().cudnnDestroy, "cudnnDestroy", handle);
  return guarded(
      scope, "cudnnDestroy", [&] { return forward_nested(real().cudnnDestroy, "cudnnDestroy", handle); },
      [&] { return Engine::get().destroy(scope, handle); });
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  HookScope scope(HookId::set_stream);
  if (scope.nested()) return forward_nested(real().cudnnSetStream, "cudnnSetStream", handle, stream);
  return guarded(
      scope, "cudnnSetStream", [&] { return forward_nested(real().cudnnSetStream, "cudnnSetStream", handle, stream); },
      [&] { return Engine::get().set_stream(scope, handle, stream); });
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  HookScope scope(HookId::get_stream);
  if (scope.nested()) return forward_nested(real().cudnnGetStream, "cudnnGetStream", handle, stream);
  return guarded(
      scope, "cudnnGetStream", [&] { return forward_nested(real().cudnnGetStream, "cudnnGetStream", handle, stream); },
      [&] { return Engine::get().get_stream(scope, handle, stream); });
}

// The convolution family: one row each in runtime/cudnn_api.def.
#define VCUDNN_UNPAREN(...) __VA_ARGS__
#define VCUDNN_HANDLE h
#define VCUDNN_LAYER 0
#define VCUDNN_CUDNN_HOOK(short_name, fn)
#define VCUDNN_CUDNN_CONV(short_name, fn, params, call, layered) \
  cudnnStatus_t fn(cudnnHandle_t h, VCUDNN_UNPAREN params) { return run(HookId::short_name, false, call); }
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_CONV
#undef VCUDNN_CUDNN_HOOK
#undef VCUDNN_LAYER
#undef VCUDNN_HANDLE
#undef VCUDNN_UNPAREN

}  // extern "C"
#pragma GCC visibility pop
