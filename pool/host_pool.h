// HostPool: the bookkeeping of the pinned host memory that offloaded buffers are copied into.
// Pinned memory is allocated in large slabs up front (reserve()), bounded by the host budget
// (VCUDNN_HOST_BUDGET), because cudaHostAlloc is slow and synchronizing: acquire() and release()
// only carve blocks out of the slabs already held and never call the backend, so there is no
// pinned allocation on the hot path (DESIGN.md: "pinned host memory pre-allocated in slabs").
//
// Blocks are whole multiples of 2 MiB at 2 MiB-aligned offsets within their slab, best fit among
// the free ranges of all slabs; a block never spans two slabs, and a request above one slab is
// refused. Free ranges coalesce within a slab.
//
// Knows nothing of CUDA: the backend (a CUDA one in runtime/, or a fake in tests) allocates and
// frees the slabs. No exception leaves a public function; one mutex guards everything.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace vcudnn::pool {

class HostBackend {
 public:
  virtual ~HostBackend() = default;
  virtual void* allocate_pinned(uint64_t bytes) = 0;  // cudaHostAlloc; nullptr on failure
  virtual void free_pinned(void* ptr) = 0;            // cudaFreeHost
};

// One acquired block. `bytes` is the block's size: the request rounded up to 2 MiB.
struct HostBlock {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

class HostPool {
 public:
  static constexpr uint64_t kAlign = 2ull << 20;  // block offsets and sizes within a slab
  static constexpr uint64_t kDefaultSlabBytes = 256ull << 20;

  struct Stats {
    uint64_t budget = 0;              // most bytes of slabs ever held (VCUDNN_HOST_BUDGET)
    uint64_t slab_bytes = 0;          // size of one slab (0: the pool is unusable)
    uint64_t slabs = 0;               // slabs held now
    uint64_t held_bytes = 0;          // slabs * slab_bytes
    uint64_t in_use_bytes = 0;        // sum of the sizes of blocks acquired and not released
    uint64_t peak_in_use_bytes = 0;   // most in use at once
    uint64_t acquires = 0;            // acquire() successes (bytes == 0 not counted)
    uint64_t failures = 0;            // acquire() calls that returned nothing
    uint64_t largest_free_block = 0;  // largest block an acquire() could get now
  };

  // `slab_bytes` is rounded up to 2 MiB; 0 (or an overflow) makes the pool unusable: ok() is
  // false, reserve() and acquire() fail. At most budget / slab_bytes slabs are ever held.
  HostPool(HostBackend& backend, uint64_t budget, uint64_t slab_bytes = kDefaultSlabBytes);
  ~HostPool();  // frees every slab (blocks still acquired included)
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  bool ok() const { return slab_bytes_ != 0; }

  // Allocates slabs until at least `bytes` (rounded up to whole slabs, capped at the budget) are
  // held; the only place slabs are created. true when that many are held (already, or now), also
  // when `bytes` was capped: held_bytes says how much was had. false when the pool is unusable or
  // the backend fails (the slabs allocated before the failure stay, and are usable).
  bool reserve(uint64_t bytes);
  // A block of at least `bytes` inside the slabs held; never calls the backend. bytes == 0 gives
  // {nullptr, 0} and tracks nothing. nullopt (counted in failures) when `bytes` exceeds one slab or
  // no free range fits.
  std::optional<HostBlock> acquire(uint64_t bytes);
  // false for a pointer acquire() did not return, or one already released.
  bool release(void* ptr);
  Stats stats() const;

 private:
  struct Slab {
    uintptr_t base = 0;                 // the backend's pointer
    std::map<uint64_t, uint64_t> free;  // offset -> size, coalesced
  };
  struct Block {
    size_t slab = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };

  HostBackend& backend_;
  uint64_t budget_ = 0;
  uint64_t slab_bytes_ = 0;  // 0: unusable
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;
  std::map<uintptr_t, Block> blocks_;  // by address
  Stats stats_;
};

}  // namespace vcudnn::pool
