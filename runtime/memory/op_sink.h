// OpSink: what the memory runtime reports to the recorder while it records, so that allocations,
// frees and the buffers each call uses share one sequence with cuDNN's calls (trace schema 2).
// MemoryManager calls it only while recording() is true; every call is noexcept and cheap.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace vcudnn::memory {

struct BufferRef {
  uint64_t serial = 0;  // unique in the process
  uint64_t address = 0;
  uint64_t bytes = 0;  // as requested
  bool library = false;
};

struct BufferUse {
  BufferRef buffer;
  uint8_t mode = 0;  // memory::Access
};

class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual bool recording() const noexcept = 0;
  // `stream`: the allocation's or free's stream; nullopt for cudaMalloc / cudaFree.
  virtual void allocated(const BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept = 0;
  virtual void freed(const BufferRef& buffer, std::optional<cudaStream_t> stream) noexcept = 0;
  // A call (`api`: the hook's name) used these buffers.
  virtual void used(const char* api, std::optional<cudaStream_t> stream, const BufferUse* uses, size_t n) noexcept = 0;
  // The buffers just reported for this thread's call in progress were brought back from the host:
  // its stream waits for the copies (or the host waited), so its GPU time starts only now (Note
  // [GPU time without the waits for memory], recorder.cpp).
  virtual void waited() noexcept {}
  // Called on the access path with no lock of the manager's held, also after recording stopped:
  // the recorder finishes its iteration there (and may install an offload plan).
  virtual void poll() noexcept {}
  // Nothing more will be recorded, resolved or planned: the manager may stop tracking accesses
  // (Note [Tracking without a budget] in memory_manager.cpp).
  virtual bool finished() const noexcept { return false; }
};

}  // namespace vcudnn::memory
