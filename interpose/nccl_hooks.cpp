// NCCL's functions that carry device pointers: the collectives and point-to-point calls report the
// buffers they use on their stream (runtime/collectives.h: inside a group, at its end), and the
// functions that hand NCCL a pointer for later (a device-resident scalar of a reduction, a
// registered buffer or window) pin it. Everything else of NCCL is not interposed.
//
// NCCL's types are declared here, not taken from nccl.h, so that vcudnn builds where the CUDA
// toolkit comes without NCCL: every enum NCCL passes is an int in the C ABI, and a communicator is an
// opaque pointer. The prototypes below are NCCL 2.28's (nccl.h of CUDA 13.0); a hooked function the
// process's NCCL lacks (an older one) is never called by a program built against that NCCL, and
// would be answered with ncclInternalError.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "interpose/tracked_hook.h"
#include "runtime/collectives.h"
#include "runtime/real_api.h"

using namespace vcudnn;
using namespace vcudnn::interpose;

extern "C" {
typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
}

namespace {

// ncclResult_t, ncclDataType_t, ncclRedOp_t and ncclScalarResidence_t: ints in the C ABI.
using Result = int;
constexpr Result kSuccess = 0;
constexpr Result kUnhandledCudaError = 1;  // answered when a buffer could not be brought back
constexpr Result kInternalError = 3;       // answered when no real NCCL was found
constexpr Result kInProgress = 7;          // a nonblocking communicator: the work may be queued later
constexpr int kScalarDevice = 0;           // ncclScalarDevice: the scalar stays in device memory

// The barrier's fallback: vcudnn's work failed (Note [Exception barrier]).
constexpr auto kFailed = [] { return false; };

template <typename Fn>
Fn real_nccl(const char* name) {
  return reinterpret_cast<Fn>(real_symbol(Library::kNccl, name));
}

collectives::Buffers buffers(const void* a, const void* b = nullptr) {
  collectives::Buffers out;
  out.words[out.n++] = tracked_word(a);
  if (b && b != a) out.words[out.n++] = tracked_word(b);
  return out;
}

// vcudnn's own work where the hook goes on whatever it does: an exception is logged and counted
// (Note [Exception barrier]).
template <typename F>
void after(const char* name, F&& f) {
  const auto run = [&] {
    f();
    return true;
  };
  barrier(name, run, kFailed, false);
}

// The body of every collective and point-to-point hook: report the buffers on the stream among
// `args` (Note [Collectives queue their work at the group's end]), then forward.
template <typename Fn, typename... Args>
Result collective(Fn fn, const char* name, const collectives::Buffers& b, Args... args) {
  if (!fn) return kInternalError;
  if (!memory::active()) return fn(args...);
  memory::CallScope scope;  // the buffers stay put until the work is queued
  // An exception counts as "could not bring the memory back" (Note [Exception barrier]).
  const auto report = [&] { return collectives::collective(b, stream_of(args...), name); };
  if (!barrier(name, report, kFailed, false)) return kUnhandledCudaError;
  const Result r = fn(args...);
  if (r == kInProgress) after(name, [&] { collectives::queued_later(&b, name); });
  return r;
}

// A pointer NCCL keeps beyond the call (used by later collectives, or mapped for its peers).
template <typename Fn, typename... Args>
Result keeps(Fn fn, const char* name, const void* pointer, Args... args) {
  if (!fn) return kInternalError;
  if (memory::active()) {
    const uint64_t word = tracked_word(pointer);
    after(name, [&] { memory::pin(&word, 1, name); });
  }
  return fn(args...);
}

}  // namespace

// The real `fn`, resolved once per hook.
#define VCUDNN_NCCL(fn)                                  \
  [] {                                                   \
    static const auto r = real_nccl<decltype(&fn)>(#fn); \
    return r;                                            \
  }()

#pragma GCC visibility push(default)
extern "C" {

Result ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, int datatype, int op, ncclComm_t comm,
                     cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclAllReduce), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count,
                    datatype, op, comm, stream);
}

Result ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, int datatype, int root, ncclComm_t comm,
                     cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclBroadcast), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count,
                    datatype, root, comm, stream);
}

Result ncclBcast(void* buff, size_t count, int datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclBcast), __func__, buffers(buff), buff, count, datatype, root, comm, stream);
}

Result ncclReduce(const void* sendbuff, void* recvbuff, size_t count, int datatype, int op, int root, ncclComm_t comm,
                  cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclReduce), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count, datatype,
                    op, root, comm, stream);
}

Result ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, ncclComm_t comm,
                     cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclAllGather), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, sendcount,
                    datatype, comm, stream);
}

Result ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op, ncclComm_t comm,
                         cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclReduceScatter), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff,
                    recvcount, datatype, op, comm, stream);
}

Result ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, int datatype, ncclComm_t comm,
                    cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclAlltoAll), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count,
                    datatype, comm, stream);
}

Result ncclGather(const void* sendbuff, void* recvbuff, size_t count, int datatype, int root, ncclComm_t comm,
                  cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclGather), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count, datatype,
                    root, comm, stream);
}

Result ncclScatter(const void* sendbuff, void* recvbuff, size_t count, int datatype, int root, ncclComm_t comm,
                   cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclScatter), __func__, buffers(sendbuff, recvbuff), sendbuff, recvbuff, count,
                    datatype, root, comm, stream);
}

Result ncclSend(const void* sendbuff, size_t count, int datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclSend), __func__, buffers(sendbuff), sendbuff, count, datatype, peer, comm, stream);
}

Result ncclRecv(void* recvbuff, size_t count, int datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return collective(VCUDNN_NCCL(ncclRecv), __func__, buffers(recvbuff), recvbuff, count, datatype, peer, comm, stream);
}

Result ncclGroupStart() {
  const auto fn = VCUDNN_NCCL(ncclGroupStart);
  if (!fn) return kInternalError;
  const Result r = fn();
  if (r == kSuccess) collectives::group_started();
  return r;
}

Result ncclGroupEnd() {
  const auto fn = VCUDNN_NCCL(ncclGroupEnd);
  if (!fn) return kInternalError;
  memory::CallScope scope;  // armed only while vcudnn owns memory
  const auto report = [] { return collectives::group_ending(); };
  if (!barrier(__func__, report, kFailed, false)) return kUnhandledCudaError;
  const Result r = fn();
  if (r == kInProgress) after(__func__, [] { collectives::queued_later(nullptr, "ncclGroupEnd"); });
  return r;
}

Result ncclRedOpCreatePreMulSum(int* op, void* scalar, int datatype, int residence, ncclComm_t comm) {
  const auto fn = VCUDNN_NCCL(ncclRedOpCreatePreMulSum);
  // A device-resident scalar is read by every collective that uses the operation.
  return keeps(fn, __func__, residence == kScalarDevice ? scalar : nullptr, op, scalar, datatype, residence, comm);
}

Result ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return keeps(VCUDNN_NCCL(ncclCommRegister), __func__, buff, comm, buff, size, handle);
}

Result ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  return keeps(VCUDNN_NCCL(ncclCommWindowRegister), __func__, buff, comm, buff, size, win, winFlags);
}

}  // extern "C"
#pragma GCC visibility pop
