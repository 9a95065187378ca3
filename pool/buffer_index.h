// BufferIndex: the CUDA-free core of access tracking (issue 4, item 3). An index of the device
// buffers vcudnn tracks, keyed by address, that answers "which buffer holds this pointer?" for
// any pointer inside a buffer (interior pointers count: kernels get offset pointers), and the scan
// of a kernel's parameters for such pointers.
//
// Kernel launches (`__cudaLaunchKernel`, `cudaLaunchKernel*`, `cuLaunchKernel*`) pass an array of
// pointers to each parameter's value; the layout (offset and size of each parameter) comes from
// cuKernelGetParamInfo / cuFuncGetParamInfo, cached per kernel by the runtime. scan_params reads
// every 8-byte-aligned word of each parameter of 8 bytes or more, so a struct parameter carrying
// several pointers (PyTorch's offset calculators, arrays of pointers) is seen whole.
//
// Thread safety: one std::shared_mutex; find() and the scans take it shared (many readers on the
// launch path), add() and remove() exclusive (rare). A prefilter (the lowest address and the
// highest end covered, read without the lock) rejects pointers outside every buffer cheaply; it
// never rejects a pointer inside a buffer that is in the index for the whole of the call. No
// exception leaves a public function. Writers take precedence: a reader arriving while a writer
// waits yields until it is done.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "pool/hit_list.h"

namespace vcudnn::pool {


// A kernel parameter's place in the argument layout, as cuKernelGetParamInfo gives it.
struct ParamSlot {
  uint32_t offset = 0;
  uint32_t size = 0;
};

class BufferIndex {
 public:
  BufferIndex() = default;
  BufferIndex(const BufferIndex&) = delete;
  BufferIndex& operator=(const BufferIndex&) = delete;

  // Tracks [address, address + bytes). False (and nothing changes) if bytes is 0, the range wraps
  // past 2^64, or it overlaps a tracked buffer.
  bool add(uint64_t address, uint64_t bytes, uint64_t id);
  // Stops tracking the buffer that starts at `address`; false if none does.
  bool remove(uint64_t address);
  // The buffer holding `pointer`, if any: base <= pointer < base + bytes.
  std::optional<Hit> find(uint64_t pointer) const;
  size_t size() const;

  // The prefilter: a pointer outside [min, max) is in no buffer. Empty index: min > max.
  // Exact after every add() and remove().
  uint64_t prefilter_min() const { return min_.load(std::memory_order_acquire); }
  uint64_t prefilter_max() const { return max_.load(std::memory_order_acquire); }

 private:
  struct Entry {
    uint64_t bytes;
    uint64_t id;
  };
  std::optional<Hit> find_locked(uint64_t pointer) const;  // shared lock held
  void update_range_locked();                              // exclusive lock held

  // Readers wait while a writer waits: glibc's rwlock prefers readers, and launch-path readers
  // on several threads could otherwise starve add() and remove() indefinitely.
  std::shared_lock<std::shared_mutex> read_lock() const;

  mutable std::shared_mutex mutex_;
  std::atomic<uint32_t> writers_waiting_{0};
  std::map<uint64_t, Entry> buffers_;  // by address; never overlapping
  std::atomic<uint64_t> min_{UINT64_MAX};
  std::atomic<uint64_t> max_{0};

  // The scans take the lock once for a whole launch.
  friend HitList scan_params(const BufferIndex&, const std::vector<ParamSlot>&, void**);
  friend HitList scan_words(const BufferIndex&, const void*, size_t);
};

// The largest parameter scanned: CUDA's limit on a kernel's whole parameter block (32764 bytes).
// A slot claiming more is taken as a broken layout and skipped.
inline constexpr uint32_t kMaxParamBytes = 32764;

// The buffers a launch's parameters point into. `args[i]` points at parameter i's value
// (cudaLaunchKernel convention). Each parameter of 8 bytes or more is read word by word (memcpy,
// no alignment assumed of args[i]) at every offset inside it that is 8-aligned in the layout
// (offset + k ≡ 0 mod 8); smaller parameters, null args[i] and slots over kMaxParamBytes are
// skipped; null args gives nothing. Each buffer is reported once, at its first hit, in parameter
// order.
HitList scan_params(const BufferIndex& index, const std::vector<ParamSlot>& layout, void** args);

// The same over a raw block (cuLaunchKernel's `extra` packed buffer): every 8-byte word at
// data + 8k that lies wholly inside `bytes`.
HitList scan_words(const BufferIndex& index, const void* data, size_t bytes);

}  // namespace vcudnn::pool
