// The exported CUDA runtime and driver hooks of access tracking (runtime/memory_access.h): kernel
// launches, copies and sets report the device pointers they carry before the real call; stream
// capture, its end and graph launches are announced; pointer queries map evicted buffers first; texture and surface objects pin their memory; the
// allocation paths vcudnn does not serve are counted. While memory::active() is false every hook
// only forwards (one relaxed load).
//
// Each hook is one VCUDNN_HOOK* line: the real signature, the arguments, and the expression that
// reports the accesses. The _ptds/_ptsz forms (per-thread default stream) share their body with
// the plain form; in them stream 0 means cudaStreamPerThread.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "runtime/barrier.h"
#include "runtime/cuda_driver.h"
#include "runtime/memory_access.h"
#include "runtime/real_api.h"

// What nvcc 13's launch stubs call (crt/device_functions.h declares it for nvcc only).
extern "C" cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                                    size_t sharedMem, cudaStream_t stream);

namespace {

using vcudnn::Library;
using vcudnn::memory::Access;
using vcudnn::memory::StreamRef;
namespace cuda = vcudnn::cuda;
namespace memory = vcudnn::memory;

// ---- forwarding -------------------------------------------------------------------------------

template <typename Fn>
struct FunctionTraits;
template <typename R, typename... Args>
struct FunctionTraits<R (*)(Args...)> {
  using Result = R;
};
template <typename Fn>
using ResultOf = typename FunctionTraits<Fn>::Result;

// The library and status codes of each API, told apart by its status type.
template <typename Status, Library kLib, Status kOk, Status kNotFound, Status kNoMemory>
struct ApiCodes {
  static constexpr Library kLibrary = kLib;
  static constexpr Status kSuccess = kOk;
  static constexpr Status kMissing = kNotFound;
  static constexpr Status kOutOfMemory = kNoMemory;
};
template <typename Status>
struct Api;
template <>
struct Api<cudaError_t> : ApiCodes<cudaError_t, Library::kCudart, cudaSuccess, cudaErrorSharedObjectSymbolNotFound,
                                   cudaErrorMemoryAllocation> {};
template <>
struct Api<CUresult> : ApiCodes<CUresult, Library::kDriver, CUDA_SUCCESS, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
                                CUDA_ERROR_OUT_OF_MEMORY> {};

template <typename Fn>
Fn resolve(const char* name) {
  return reinterpret_cast<Fn>(vcudnn::real_symbol(Api<ResultOf<Fn>>::kLibrary, name));
}

// Reports the accesses, then makes the real call. touch() false: the memory could not be brought
// back; the API's out-of-memory status is returned and the real call is not made.
// vcudnn's failures and the runtime's "out of memory" must not stick to the framework.
inline void clear_last_error() {
  if (const auto get = vcudnn::real_cudart().cudaGetLastError) get();
}

// An exception inside touch() counts as "could not bring the memory back" (Note [Exception barrier]).
// A call that ran out of device memory for allocations of its own (a kernel's code loaded lazily,
// its local memory) is retried once after vcudnn gave back the memory it held unused.
template <typename Fn, typename Touch, typename... Args>
ResultOf<Fn> forward(Fn real, const char* api, Touch&& touch, Args... args) {
  using A = Api<ResultOf<Fn>>;
  if (!real) return A::kMissing;
  if (!memory::active()) return real(args...);
  memory::CallScope scope;  // the touched buffers stay put until the work is queued
  if (!vcudnn::barrier(api, touch, [] { return false; }, false)) return A::kOutOfMemory;
  const ResultOf<Fn> status = real(args...);
  if (status != A::kOutOfMemory || !memory::device_out_of_memory(api)) return status;
  if constexpr (A::kLibrary == Library::kCudart) clear_last_error();
  return real(args...);
}

// The program waits for a stream or the whole device (the expression gives which: sync_of(stream)
// or kAll). Idle memory unused for a whole interval between two waits goes back. Event waits are
// not interval ends: PyTorch's cudnn.benchmark search times every candidate with one, and would
// see its workspaces given back between two candidates.
template <typename Fn, typename Target, typename... Args>
ResultOf<Fn> forward_sync(Fn real, const char* /*api*/, Target&& target, Args... args) {
  using A = Api<ResultOf<Fn>>;
  if (!real) return A::kMissing;
  if (!memory::active()) return real(args...);
  const auto [kind, stream] = target();
  memory::SyncPoint point(kind, stream);
  const ResultOf<Fn> status = real(args...);
  if (status == A::kSuccess) point.done();
  return status;
}

using SyncTarget = std::pair<memory::SyncPoint::Kind, cudaStream_t>;
SyncTarget sync_of(StreamRef stream) { return {memory::SyncPoint::kStream, stream.value_or(nullptr)}; }
constexpr SyncTarget kAll{memory::SyncPoint::kAllStreams, nullptr};

// An allocation vcudnn does not serve: the real call, then bytes() counted if it succeeded.
template <typename Fn, typename Bytes, typename... Args>
ResultOf<Fn> forward_foreign(Fn real, const char* api, Bytes&& bytes, Args... args) {
  using A = Api<ResultOf<Fn>>;
  if (!real) return A::kMissing;
  const ResultOf<Fn> status = real(args...);
  if (status == A::kSuccess && memory::active()) {
    vcudnn::barrier(
        api,
        [&] {
          memory::count_foreign_allocation(api, bytes());
          return 0;
        },
        [] { return 0; }, 0);
  }
  return status;
}


StreamRef stream_ref(cudaStream_t stream, bool per_thread) {
  return per_thread && stream == nullptr ? cudaStreamPerThread : stream;
}

// ---- what the hooks report --------------------------------------------------------------------

template <typename P>
uint64_t word(P pointer) {
  if constexpr (std::is_pointer_v<P>)
    return reinterpret_cast<uintptr_t>(pointer);
  else
    return static_cast<uint64_t>(pointer);  // CUdeviceptr
}

template <typename P>
bool touch_one(P pointer, Access mode, StreamRef stream, const char* api) {
  const uint64_t w = word(pointer);
  return w == 0 || memory::touch(&w, 1, mode, stream, api);
}

template <typename P>
bool touch_read(P src, StreamRef stream, const char* api) {
  return touch_one(src, Access::kRead, stream, api);
}

template <typename P>
bool touch_write(P dst, StreamRef stream, const char* api) {
  return touch_one(dst, Access::kWrite, stream, api);
}

template <typename D, typename S>
bool touch_copy(D dst, S src, StreamRef stream, const char* api) {
  return touch_read(src, stream, api) && touch_write(dst, stream, api);
}

// cudaMemcpy3DParms and cudaMemcpy3DPeerParms: pitched pointers (null for array operands).
template <typename Parms>
bool touch_3d(const Parms* p, StreamRef stream, const char* api) {
  return !p || touch_copy(p->dstPtr.ptr, p->srcPtr.ptr, stream, api);
}

const void* operand_pointer(const cudaMemcpy3DOperand& operand) {
  return operand.type == cudaMemcpyOperandTypePointer ? operand.op.ptr.ptr : nullptr;
}

bool touch_3d_batch(const cudaMemcpy3DBatchOp* ops, size_t count, StreamRef stream, const char* api) {
  for (size_t i = 0; ops && i < count; ++i)
    if (!touch_copy(operand_pointer(ops[i].dst), operand_pointer(ops[i].src), stream, api)) return false;
  return true;
}

// A pointer array of any length, copied to the stack in chunks: no allocation.
bool touch_array(const void* const* pointers, size_t count, Access mode, StreamRef stream, const char* api) {
  constexpr size_t kChunk = 64;
  uint64_t words[kChunk];
  for (size_t i = 0; pointers && i < count; i += kChunk) {
    const size_t n = std::min(kChunk, count - i);
    for (size_t k = 0; k < n; ++k) words[k] = word(pointers[i + k]);
    if (!memory::touch(words, n, mode, stream, api)) return false;
  }
  return true;
}

// A launch without a layout (counted, warned once per kernel) may touch any buffer: all of them
// are brought back and held for it.
bool touch_launch(const std::vector<vcudnn::pool::ParamSlot>* layout, const void* kernel, void** args, StreamRef stream,
                  const char* api) {
  if (!layout) {
    cuda::count_untracked_launch(kernel, api);
    return memory::touch_everything(stream, api);
  }
  return memory::touch_params(*layout, args, stream, api);
}

// cuLaunchKernel's `extra`: {CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n,
// CU_LAUNCH_PARAM_END}, in any order; an unknown key ends the walk.
bool touch_extra(void** extra, const void* kernel, StreamRef stream, const char* api) {
  constexpr size_t kMaxEntries = 16;
  const void* block = nullptr;
  const size_t* bytes = nullptr;
  for (size_t i = 0; i + 1 < kMaxEntries && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
      block = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
      bytes = static_cast<const size_t*>(extra[i + 1]);
    else
      break;
  }
  if (!block || !bytes) return touch_launch(nullptr, kernel, nullptr, stream, api);
  return memory::touch_block(block, *bytes, stream, api);
}

bool touch_cu_launch(CUfunction function, void** params, void** extra, StreamRef stream, const char* api) {
  if (!params && extra) return touch_extra(extra, function, stream, api);
  return touch_launch(cuda::layout_of_cufunction(function), function, params, stream, api);
}

template <typename P>
bool pin_one(P pointer, const char* api) {
  const uint64_t w = word(pointer);
  if (w) memory::pin(&w, 1, api);
  return true;
}

// Texture and surface objects keep their linear or pitch-2D memory beyond the call.
bool pin_resource(const cudaResourceDesc* desc, const char* api) {
  if (!desc) return true;
  if (desc->resType == cudaResourceTypeLinear) return pin_one(desc->res.linear.devPtr, api);
  if (desc->resType == cudaResourceTypePitch2D) return pin_one(desc->res.pitch2D.devPtr, api);
  return true;
}

bool pin_resource(const CUDA_RESOURCE_DESC* desc, const char* api) {
  if (!desc) return true;
  if (desc->resType == CU_RESOURCE_TYPE_LINEAR) return pin_one(desc->res.linear.devPtr, api);
  if (desc->resType == CU_RESOURCE_TYPE_PITCH2D) return pin_one(desc->res.pitch2D.devPtr, api);
  return true;
}

bool capture_begins(const char* api) {
  memory::capture_begins(api);
  return true;
}

bool capture_ends(const char* api) {
  memory::capture_ends(api);
  return true;
}

bool graph_launched(const char* api) {
  memory::graph_launched(api);
  return true;
}

bool opaque_graph(const char* api) {
  memory::opaque_graph(api);
  return true;
}

template <typename P>
bool prepare_query(P pointer, const char* api) {
  memory::prepare_query(word(pointer), api);
  return true;
}

template <typename S>
bool retire(S stream) {
  memory::stream_destroyed(reinterpret_cast<cudaStream_t>(stream));
  return true;
}

uint64_t array_bytes(const cudaChannelFormatDesc* desc, size_t width, size_t height) {
  const uint64_t element = desc ? static_cast<uint64_t>(desc->x + desc->y + desc->z + desc->w) / 8 : 0;
  return element * width * std::max<size_t>(height, 1);
}

}  // namespace

// ---- hook definitions -------------------------------------------------------------------------

#define VCUDNN_UNPAREN(...) __VA_ARGS__

// The exported `name`, with the signature of `proto` in the CUDA headers (the same function, or the
// plain form of a _ptds/_ptsz variant). It resolves the real `name` once and returns
// helper(real, "name", [&] { return expression; }, call_args...). In the expression the parameters
// are in scope, with `api` (the exported name) and `on(stream)` (the stream an access is ordered on).
#define VCUDNN_HOOK_AS(helper, proto, name, per_thread, params, call_args, ...)                               \
  ResultOf<decltype(&::proto)> name params {                                                                  \
    static_assert(std::is_same_v<decltype(&name), decltype(&::proto)>, #name " must be declared as " #proto); \
    static const auto real = resolve<decltype(&::proto)>(#name);                                              \
    [[maybe_unused]] constexpr const char* api = #name;                                                       \
    /* a synchronous call runs on its default stream: on(nullptr) */                                        \
    [[maybe_unused]] const auto on = [](cudaStream_t s) { return stream_ref(s, per_thread); };                \
    return helper(                                                                                            \
        real, api, [&] { return __VA_ARGS__; }, VCUDNN_UNPAREN call_args);                                    \
  }

// The hook and its per-thread-default-stream form name##suffix, one body.
#define VCUDNN_HOOK_PAIR(helper, name, suffix, params, call_args, ...)      \
  VCUDNN_HOOK_AS(helper, name, name, false, params, call_args, __VA_ARGS__) \
  VCUDNN_HOOK_AS(helper, name, name##suffix, true, params, call_args, __VA_ARGS__)

#define VCUDNN_HOOK(name, params, call_args, ...) \
  VCUDNN_HOOK_AS(forward, name, name, false, params, call_args, __VA_ARGS__)
#define VCUDNN_HOOK_PT(name, suffix, params, call_args, ...) \
  VCUDNN_HOOK_PAIR(forward, name, suffix, params, call_args, __VA_ARGS__)
// An allocation path vcudnn does not serve; the expression gives the bytes, after success.
#define VCUDNN_FOREIGN(name, params, call_args, ...) \
  VCUDNN_HOOK_AS(forward_foreign, name, name, false, params, call_args, __VA_ARGS__)

// cudaLaunchKernel and cudaLaunchCooperativeKernel: a host stub or a cudaKernel_t.
#define VCUDNN_FUNC_LAUNCH_HOOK(name)                                                                        \
  VCUDNN_HOOK_PT(name, _ptsz,                                                                                \
                 (const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream), \
                 (func, grid, block, args, shared, stream),                                                  \
                 touch_launch(cuda::layout_of_function(func), func, args, on(stream), api))

// The hooks keep the CUDA headers' declarations, which carry no visibility: export them explicitly.
#pragma GCC visibility push(default)
extern "C" {

// ---- kernel launches: runtime -----------------------------------------------------------------

VCUDNN_HOOK_PT(__cudaLaunchKernel, _ptsz,
               (cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream),
               (kernel, grid, block, args, shared, stream),
               touch_launch(cuda::layout_of_kernel(kernel), kernel, args, on(stream), api))
VCUDNN_FUNC_LAUNCH_HOOK(cudaLaunchKernel)
VCUDNN_FUNC_LAUNCH_HOOK(cudaLaunchCooperativeKernel)
VCUDNN_HOOK_PT(cudaLaunchKernelExC, _ptsz, (const cudaLaunchConfig_t* config, const void* func, void** args),
               (config, func, args),
               !config || touch_launch(cuda::layout_of_function(func), func, args, on(config->stream), api))

// ---- kernel launches: driver ------------------------------------------------------------------

VCUDNN_HOOK_PT(cuLaunchKernel, _ptsz,
               (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, CUstream stream, void** params, void** extra),
               (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra),
               touch_cu_launch(f, params, extra, on(stream), api))
VCUDNN_HOOK_PT(cuLaunchKernelEx, _ptsz, (const CUlaunchConfig* config, CUfunction f, void** params, void** extra),
               (config, f, params, extra), !config || touch_cu_launch(f, params, extra, on(config->hStream), api))
VCUDNN_HOOK_PT(cuLaunchCooperativeKernel, _ptsz,
               (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, CUstream stream, void** params),
               (f, gx, gy, gz, bx, by, bz, shared, stream, params),
               touch_cu_launch(f, params, nullptr, on(stream), api))

// ---- copies: runtime --------------------------------------------------------------------------

VCUDNN_HOOK_PT(cudaMemcpy, _ptds, (void* dst, const void* src, size_t count, cudaMemcpyKind kind),
               (dst, src, count, kind), touch_copy(dst, src, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpyAsync, _ptsz,
               (void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream),
               (dst, src, count, kind, stream), touch_copy(dst, src, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy2D, _ptds,
               (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                cudaMemcpyKind kind),
               (dst, dpitch, src, spitch, width, height, kind), touch_copy(dst, src, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpy2DAsync, _ptsz,
               (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                cudaMemcpyKind kind, cudaStream_t stream),
               (dst, dpitch, src, spitch, width, height, kind, stream), touch_copy(dst, src, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy3D, _ptds, (const cudaMemcpy3DParms* p), (p), touch_3d(p, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpy3DAsync, _ptsz, (const cudaMemcpy3DParms* p, cudaStream_t stream), (p, stream),
               touch_3d(p, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy3DPeer, _ptds, (const cudaMemcpy3DPeerParms* p), (p), touch_3d(p, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpy3DPeerAsync, _ptsz, (const cudaMemcpy3DPeerParms* p, cudaStream_t stream), (p, stream),
               touch_3d(p, on(stream), api))
VCUDNN_HOOK(cudaMemcpyPeer, (void* dst, int dst_device, const void* src, int src_device, size_t count),
            (dst, dst_device, src, src_device, count), touch_copy(dst, src, on(nullptr), api))
VCUDNN_HOOK(cudaMemcpyPeerAsync,
            (void* dst, int dst_device, const void* src, int src_device, size_t count, cudaStream_t stream),
            (dst, dst_device, src, src_device, count, stream), touch_copy(dst, src, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpyToSymbol, _ptds,
               (const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind kind),
               (symbol, src, count, offset, kind), touch_read(src, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpyToSymbolAsync, _ptsz,
               (const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind kind,
                cudaStream_t stream),
               (symbol, src, count, offset, kind, stream), touch_read(src, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpyFromSymbol, _ptds,
               (void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind kind),
               (dst, symbol, count, offset, kind), touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpyFromSymbolAsync, _ptsz,
               (void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind kind, cudaStream_t stream),
               (dst, symbol, count, offset, kind, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy2DToArray, _ptds,
               (cudaArray_t dst, size_t w_offset, size_t h_offset, const void* src, size_t spitch, size_t width,
                size_t height, cudaMemcpyKind kind),
               (dst, w_offset, h_offset, src, spitch, width, height, kind), touch_read(src, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpy2DToArrayAsync, _ptsz,
               (cudaArray_t dst, size_t w_offset, size_t h_offset, const void* src, size_t spitch, size_t width,
                size_t height, cudaMemcpyKind kind, cudaStream_t stream),
               (dst, w_offset, h_offset, src, spitch, width, height, kind, stream), touch_read(src, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy2DFromArray, _ptds,
               (void* dst, size_t dpitch, cudaArray_const_t src, size_t w_offset, size_t h_offset, size_t width,
                size_t height, cudaMemcpyKind kind),
               (dst, dpitch, src, w_offset, h_offset, width, height, kind), touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemcpy2DFromArrayAsync, _ptsz,
               (void* dst, size_t dpitch, cudaArray_const_t src, size_t w_offset, size_t h_offset, size_t width,
                size_t height, cudaMemcpyKind kind, cudaStream_t stream),
               (dst, dpitch, src, w_offset, h_offset, width, height, kind, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpyBatchAsync, _ptsz,
               (void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                cudaMemcpyAttributes* attrs, size_t* attrs_idxs, size_t num_attrs, cudaStream_t stream),
               (dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream),
               touch_array(srcs, count, Access::kRead, on(stream), api) &&
                   touch_array(dsts, count, Access::kWrite, on(stream), api))
VCUDNN_HOOK_PT(cudaMemcpy3DBatchAsync, _ptsz,
               (size_t count, cudaMemcpy3DBatchOp* ops, unsigned long long flags, cudaStream_t stream),
               (count, ops, flags, stream), touch_3d_batch(ops, count, on(stream), api))

// ---- sets: runtime ----------------------------------------------------------------------------

VCUDNN_HOOK_PT(cudaMemset, _ptds, (void* dst, int value, size_t count), (dst, value, count),
               touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemsetAsync, _ptsz, (void* dst, int value, size_t count, cudaStream_t stream),
               (dst, value, count, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cudaMemset2D, _ptds, (void* dst, size_t pitch, int value, size_t width, size_t height),
               (dst, pitch, value, width, height), touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemset2DAsync, _ptsz,
               (void* dst, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream),
               (dst, pitch, value, width, height, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cudaMemset3D, _ptds, (cudaPitchedPtr dst, int value, cudaExtent extent), (dst, value, extent),
               touch_write(dst.ptr, on(nullptr), api))
VCUDNN_HOOK_PT(cudaMemset3DAsync, _ptsz, (cudaPitchedPtr dst, int value, cudaExtent extent, cudaStream_t stream),
               (dst, value, extent, stream), touch_write(dst.ptr, on(stream), api))

// ---- copies and sets: driver ------------------------------------------------------------------

VCUDNN_HOOK_PT(cuMemcpyHtoD_v2, _ptds, (CUdeviceptr dst, const void* src, size_t bytes), (dst, src, bytes),
               touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cuMemcpyDtoH_v2, _ptds, (void* dst, CUdeviceptr src, size_t bytes), (dst, src, bytes),
               touch_read(src, on(nullptr), api))
VCUDNN_HOOK_PT(cuMemcpyDtoD_v2, _ptds, (CUdeviceptr dst, CUdeviceptr src, size_t bytes), (dst, src, bytes),
               touch_copy(dst, src, on(nullptr), api))
VCUDNN_HOOK_PT(cuMemcpyHtoDAsync_v2, _ptsz, (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream),
               (dst, src, bytes, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cuMemcpyDtoHAsync_v2, _ptsz, (void* dst, CUdeviceptr src, size_t bytes, CUstream stream),
               (dst, src, bytes, stream), touch_read(src, on(stream), api))
VCUDNN_HOOK_PT(cuMemcpyDtoDAsync_v2, _ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream),
               (dst, src, bytes, stream), touch_copy(dst, src, on(stream), api))
VCUDNN_HOOK_PT(cuMemsetD8_v2, _ptds, (CUdeviceptr dst, unsigned char value, size_t count), (dst, value, count),
               touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cuMemsetD32_v2, _ptds, (CUdeviceptr dst, unsigned int value, size_t count), (dst, value, count),
               touch_write(dst, on(nullptr), api))
VCUDNN_HOOK_PT(cuMemsetD8Async, _ptsz, (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream),
               (dst, value, count, stream), touch_write(dst, on(stream), api))
VCUDNN_HOOK_PT(cuMemsetD32Async, _ptsz, (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream),
               (dst, value, count, stream), touch_write(dst, on(stream), api))

// ---- graphs -----------------------------------------------------------------------------------

VCUDNN_HOOK_PT(cudaStreamBeginCapture, _ptsz, (cudaStream_t stream, cudaStreamCaptureMode mode), (stream, mode),
               capture_begins(api))
VCUDNN_HOOK_PT(cudaStreamBeginCaptureToGraph, _ptsz,
               (cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
                const cudaGraphEdgeData* edge_data, size_t count, cudaStreamCaptureMode mode),
               (stream, graph, dependencies, edge_data, count, mode), capture_begins(api))
VCUDNN_HOOK_PT(cudaStreamEndCapture, _ptsz, (cudaStream_t stream, cudaGraph_t* graph), (stream, graph),
               capture_ends(api))
VCUDNN_HOOK_PT(cudaGraphLaunch, _ptsz, (cudaGraphExec_t exec, cudaStream_t stream), (exec, stream),
               graph_launched(api))
VCUDNN_HOOK(cudaGraphAddKernelNode,
            (cudaGraphNode_t * node, cudaGraph_t graph, const cudaGraphNode_t* dependencies, size_t count,
             const cudaKernelNodeParams* params),
            (node, graph, dependencies, count, params), opaque_graph(api))
VCUDNN_HOOK_PT(cuStreamBeginCapture_v2, _ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode),
               capture_begins(api))
VCUDNN_HOOK_PT(cuStreamBeginCaptureToGraph, _ptsz,
               (CUstream stream, CUgraph graph, const CUgraphNode* dependencies, const CUgraphEdgeData* edge_data,
                size_t count, CUstreamCaptureMode mode),
               (stream, graph, dependencies, edge_data, count, mode), capture_begins(api))
VCUDNN_HOOK_PT(cuStreamEndCapture, _ptsz, (CUstream stream, CUgraph* graph), (stream, graph), capture_ends(api))
VCUDNN_HOOK_PT(cuGraphLaunch, _ptsz, (CUgraphExec exec, CUstream stream), (exec, stream), graph_launched(api))
VCUDNN_HOOK(cuGraphAddKernelNode_v2,
            (CUgraphNode * node, CUgraph graph, const CUgraphNode* dependencies, size_t count,
             const CUDA_KERNEL_NODE_PARAMS* params),
            (node, graph, dependencies, count, params), opaque_graph(api))

// ---- pointer queries: an evicted buffer is mapped again before the driver answers --------------

VCUDNN_HOOK(cuPointerGetAttribute, (void* data, CUpointer_attribute attribute, CUdeviceptr ptr), (data, attribute, ptr),
            prepare_query(ptr, api))
VCUDNN_HOOK(cuPointerGetAttributes,
            (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr),
            (count, attributes, data, ptr), prepare_query(ptr, api))
VCUDNN_HOOK(cudaPointerGetAttributes, (cudaPointerAttributes * attributes, const void* ptr), (attributes, ptr),
            prepare_query(ptr, api))

// ---- synchronisation: idle memory unused since the previous one goes back to the device --------

#define VCUDNN_SYNC(name, params, call_args, ...) \
  VCUDNN_HOOK_AS(forward_sync, name, name, false, params, call_args, __VA_ARGS__)
#define VCUDNN_SYNC_PT(name, suffix, params, call_args, ...) \
  VCUDNN_HOOK_PAIR(forward_sync, name, suffix, params, call_args, __VA_ARGS__)

cudaError_t cudaDeviceSynchronize() {
  static const auto real = resolve<decltype(&::cudaDeviceSynchronize)>("cudaDeviceSynchronize");
  return forward_sync(real, "cudaDeviceSynchronize", [] { return kAll; });
}
CUresult cuCtxSynchronize() {
  static const auto real = resolve<decltype(&::cuCtxSynchronize)>("cuCtxSynchronize");
  return forward_sync(real, "cuCtxSynchronize", [] { return kAll; });
}
VCUDNN_SYNC_PT(cudaStreamSynchronize, _ptsz, (cudaStream_t stream), (stream), sync_of(on(stream)))
VCUDNN_SYNC_PT(cuStreamSynchronize, _ptsz, (CUstream stream), (stream), sync_of(on(stream)))

// ---- streams ----------------------------------------------------------------------------------

VCUDNN_HOOK(cudaStreamDestroy, (cudaStream_t stream), (stream), retire(stream))
VCUDNN_HOOK(cuStreamDestroy_v2, (CUstream stream), (stream), retire(stream))

// ---- texture and surface objects --------------------------------------------------------------

VCUDNN_HOOK(cudaCreateTextureObject,
            (cudaTextureObject_t * object, const cudaResourceDesc* resource, const cudaTextureDesc* texture,
             const cudaResourceViewDesc* view),
            (object, resource, texture, view), pin_resource(resource, api))
VCUDNN_HOOK(cudaCreateSurfaceObject, (cudaSurfaceObject_t * object, const cudaResourceDesc* resource),
            (object, resource), pin_resource(resource, api))
VCUDNN_HOOK(cuTexObjectCreate,
            (CUtexObject * object, const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
             const CUDA_RESOURCE_VIEW_DESC* view),
            (object, resource, texture, view), pin_resource(resource, api))

// ---- allocations vcudnn does not serve --------------------------------------------------------

VCUDNN_FOREIGN(cudaMallocManaged, (void** ptr, size_t bytes, unsigned int flags), (ptr, bytes, flags), bytes)
VCUDNN_FOREIGN(cudaMallocHost, (void** ptr, size_t bytes), (ptr, bytes), bytes)
VCUDNN_FOREIGN(cudaHostAlloc, (void** ptr, size_t bytes, unsigned int flags), (ptr, bytes, flags), bytes)
VCUDNN_FOREIGN(cudaMallocPitch, (void** ptr, size_t* pitch, size_t width, size_t height), (ptr, pitch, width, height),
               *pitch* height)
VCUDNN_FOREIGN(cudaMalloc3D, (cudaPitchedPtr * ptr, cudaExtent extent), (ptr, extent),
               ptr->pitch* std::max<size_t>(extent.height, 1) * std::max<size_t>(extent.depth, 1))
VCUDNN_FOREIGN(cudaMallocArray,
               (cudaArray_t * array, const cudaChannelFormatDesc* desc, size_t width, size_t height,
                unsigned int flags),
               (array, desc, width, height, flags), array_bytes(desc, width, height))
VCUDNN_FOREIGN(cuMemAlloc_v2, (CUdeviceptr * ptr, size_t bytes), (ptr, bytes), bytes)
VCUDNN_FOREIGN(cuMemAllocManaged, (CUdeviceptr * ptr, size_t bytes, unsigned int flags), (ptr, bytes, flags), bytes)
VCUDNN_FOREIGN(cuMemAllocPitch_v2,
               (CUdeviceptr * ptr, size_t* pitch, size_t width, size_t height, unsigned int element_bytes),
               (ptr, pitch, width, height, element_bytes), *pitch* height)
VCUDNN_HOOK_PAIR(forward_foreign, cuMemAllocAsync, _ptsz, (CUdeviceptr * ptr, size_t bytes, CUstream stream),
                 (ptr, bytes, stream), bytes)
VCUDNN_FOREIGN(cuMemAllocHost_v2, (void** ptr, size_t bytes), (ptr, bytes), bytes)

}  // extern "C"
#pragma GCC visibility pop
