// VmmArena: the bookkeeping of a device arena on the CUDA virtual-memory API. One virtual address
// range is reserved up front; physical memory is mapped into it one granule (2 MiB on the H100)
// at a time, from a pool of created-but-unmapped chunks, so that nothing is created or released on
// the hot path once the pool is warm. Buffers keep their address for life: evict() unmaps a large
// buffer's granules (the runtime copies the data out first) and restore() maps fresh ones at the
// same addresses (the runtime copies the data back after).
//
// Placement (vDNN++, research/seed-vdnn.md §2): long-lived buffers (weights, optimizer state) are
// placed from the low end of the range and short-lived ones (activations, workspaces) from the
// high end, so the holes short-lived buffers leave never get pinned by a long-lived one.
//
// Knows nothing of CUDA: the backend (a CUDA one in runtime/, or a fake in tests) reserves,
// creates, maps and unmaps. No exception leaves a public function; one mutex guards everything.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace vcudnn::pool {

class PhysicalBackend {
 public:
  using Handle = uint64_t;  // CUmemGenericAllocationHandle; 0 = none
  virtual ~PhysicalBackend() = default;
  virtual uint64_t granularity() = 0;  // bytes of one chunk (cuMemGetAllocationGranularity)
  // A virtual address range of `bytes` (a multiple of granularity) at *base (cuMemAddressReserve).
  virtual bool reserve(uint64_t bytes, uint64_t* base) = 0;
  virtual void unreserve(uint64_t base, uint64_t bytes) = 0;  // cuMemAddressFree
  virtual Handle create_chunk() = 0;                          // one granule (cuMemCreate); 0 on failure
  virtual void release_chunk(Handle chunk) = 0;               // cuMemRelease; never while mapped
  // Maps one granule at `va` and makes it accessible (cuMemMap + cuMemSetAccess).
  virtual bool map(uint64_t va, Handle chunk) = 0;
  virtual bool unmap(uint64_t va) = 0;  // one granule (cuMemUnmap)
};

enum class Lifetime { kLong, kShort };

struct Allocation {
  uint64_t address = 0;
  uint64_t bytes = 0;  // the VA bytes it occupies: the request rounded up to 512 B or to granules
};

class VmmArena {
 public:
  struct Stats {
    uint64_t reserved_bytes = 0;     // the VA range
    uint64_t mapped_bytes = 0;       // granules mapped now
    uint64_t peak_mapped_bytes = 0;  // most ever mapped at once
    uint64_t live_bytes = 0;         // sum of the requested sizes of buffers not freed (evicted included)
    uint64_t evicted_bytes = 0;      // bytes of granules of live buffers that are unmapped now
    uint64_t chunks_created = 0;     // create_chunk() successes, ever
    uint64_t chunks_free = 0;        // created and unmapped now (the free list)
    uint64_t allocations = 0;        // allocate() successes
    uint64_t failures = 0;           // allocate() calls that returned nothing
    // 1 - resident live bytes / mapped bytes, where resident means not evicted; 0 when nothing
    // is mapped. The share of mapped memory that holds no requested byte.
    double fragmentation = 0;
  };

  // `reserve_bytes` is rounded up to the granularity. `physical_budget`: at most
  // physical_budget / granularity granules are mapped at once. If the granularity is 0 or not a
  // multiple of 512, or the reservation fails, the arena is unusable: ok() is false and every
  // allocate() fails.
  VmmArena(PhysicalBackend& backend, uint64_t reserve_bytes, uint64_t physical_budget);
  ~VmmArena();  // unmaps everything, releases every chunk, unreserves the range
  VmmArena(const VmmArena&) = delete;
  VmmArena& operator=(const VmmArena&) = delete;

  bool ok() const { return reserved_ != 0; }
  uint64_t granularity() const { return granularity_; }
  uint64_t base() const { return base_; }

  // A buffer of at least `bytes`. Below one granule (after rounding to 512 B) it is sub-allocated
  // inside mapped granules, which it may share with other small buffers; from one granule up it
  // gets whole granules of its own. nullopt (counted in failures) when no VA fits, the mapped
  // granules would exceed the budget, or the backend fails (the arena is left as before).
  // bytes == 0 gives {0, 0} and tracks nothing.
  std::optional<Allocation> allocate(uint64_t bytes, Lifetime lifetime);
  // false for an address allocate() did not return, or one already freed. Frees evicted buffers too.
  bool free(uint64_t address);
  // Large buffers (whole granules) only. evict() unmaps the buffer's mapped granules (their chunks
  // go to the free list); false if unknown, small, already evicted, or an unmap failed (the
  // granules unmapped so far stay unmapped; evicting again finishes). restore() maps chunks on
  // every unmapped granule of the buffer, at the same addresses; false if unknown, small, not
  // evicted, beyond the budget (nothing mapped) or the backend failed (what was mapped stays mapped;
  // the buffer stays evicted until a restore() completes).
  bool evict(uint64_t address);
  bool restore(uint64_t address);
  bool is_evicted(uint64_t address) const;
  // Releases every chunk of the free list.
  void trim();
  Stats stats() const;  // walks every buffer: not for hot paths
  // Cheap (one lock): granules mapped now, and the most that may be, in bytes.
  uint64_t mapped_bytes() const;
  uint64_t budget_bytes() const { return max_granules_ * granularity_; }

 private:
  using Handle = PhysicalBackend::Handle;
  struct Buffer {
    uint64_t bytes = 0;      // occupied, rounded
    uint64_t requested = 0;  // as asked
    bool large = false;
  };
  struct Granule {
    Handle chunk = 0;    // 0: unmapped
    uint32_t users = 0;  // live buffers (evicted ones included) that overlap it
  };

  // All below run with mu_ held. Offsets are relative to base_.
  // First fit from the lifetime's end; mapped_only (small buffers): only spots needing no new granule.
  std::optional<uint64_t> place(uint64_t size, bool large, Lifetime lifetime, bool mapped_only) const;
  uint64_t unmapped_in(uint64_t offset, uint64_t size) const;
  bool map_span(uint64_t offset, uint64_t size);  // maps every unmapped granule; all or nothing
  bool map_granule(uint64_t index);
  bool unmap_granule(uint64_t index);  // chunk to the free list; false (still mapped) on failure
  void carve(uint64_t offset, uint64_t size);
  void give_back_range(uint64_t offset, uint64_t size);  // coalescing
  bool buffer_evicted(uint64_t offset, const Buffer& buffer) const;
  // The granules [first, first + count) of the large buffer at `address`; nullopt otherwise.
  std::optional<std::pair<uint64_t, uint64_t>> large_buffer_granules(uint64_t address) const;

  PhysicalBackend& backend_;
  uint64_t granularity_ = 0;
  uint64_t reserved_ = 0;  // 0: unusable
  uint64_t base_ = 0;
  uint64_t max_granules_ = 0;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_ranges_;  // offset -> size, coalesced
  std::map<uint64_t, Buffer> buffers_;        // by offset
  std::map<uint64_t, Granule> granules_;      // by index; present while mapped or used
  std::vector<Handle> free_chunks_;
  uint64_t mapped_granules_ = 0;
  Stats stats_;
};

// A memory budget: bytes with an optional K/M/G/T suffix (powers of 1024; "B", "KB", "KiB", any
// case), or a percentage of `device_total` ("60%", "62.5%"; 0 < p <= 100). nullopt for anything
// else: empty, negative, junk, zero, over 100%, overflow.
std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total);

}  // namespace vcudnn::pool
