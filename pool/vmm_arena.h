// VmmArena: the bookkeeping of a device arena on the CUDA virtual-memory API. One virtual address
// range is reserved up front; physical memory is mapped into it one granule (2 MiB on the H100)
// at a time, from a pool of created-but-unmapped chunks, so that nothing is created or released on
// the hot path once the pool is warm. Buffers keep their address for life: evict() unmaps a large
// buffer's granules (the runtime copies the data out first) and restore() maps fresh ones at the
// same addresses (the runtime copies the data back after).
//
// Freed memory stays mapped ("idle") and is reused by later allocations of any size: a large
// request takes the best-fitting idle run of granules, else grows an idle run into the unmapped
// space beside it, else maps fresh granules. So in a training loop, whose allocations repeat,
// nothing is mapped after the first iteration and the mapped total stays near the live peak
// (replayed PyTorch allocation traces: within 2% of it). Idle memory is unmapped only by trim(),
// which the runtime calls under pressure, once the frees that left it are settled.
//
// Freed memory carries the free's tags (free_tags.h); an allocation that reuses it reports them,
// and the runtime orders the new owner's stream after them.
//
// Small buffers (below one granule after rounding to 512 B) are carved, best fit, out of slabs of
// one granule each; an empty slab becomes an idle granule again. A large buffer never shares a
// granule, so evicting it unmaps only its own memory.
//
// Extents (optional, `extent_min` granules or more): a stretch of that many fresh granules is
// mapped as one extent, and unmapped only whole, so huge one-off buffers (cudnn.benchmark's
// workspaces, PyTorch's probe of the free memory) cost a few calls instead of one per granule.
// Because CUDA cannot unmap part of a mapping, trim() and end_interval() leave alone an extent
// that a live buffer still holds part of, and evict() refuses a buffer whose extent reaches beyond
// it.
//
// Note [Extents under a budget]
// Measured on the H100 (driver 580; scripts/bench/vmm_map.cpp, results/vmm_map.json): when each
// 2 MiB granule is its own allocation, cuMemSetAccess costs ~31 us and cuMemUnmap ~21 us per
// granule; one allocation of 64 granules 65 us and 32 us, of 256 granules 158 us and 50 us;
// cuMemCreate of an extent 13-85 us. cuMemUnmap does not wait for queued device work. Under a
// budget every evicted buffer is unmapped and mapped again, and idle memory is unmapped to make
// room: granule by granule, ResNet-50 at 60% spent ~250 ms a step on it. With `exact_extents`, a
// large buffer covers whole extents only (it takes a window of whole idle extents anywhere in an
// idle run, else maps fresh memory), so eviction unmaps its extents whole, restore() maps it as one
// new extent, and trim() unmaps idle extents whole. The driver's cost is per mapping, not per call:
// 2 MiB chunks mapped one by one and made accessible by one cuMemSetAccess over the whole range
// cost ~44 us per chunk in that call (cuMemUnmap takes such a range too, ~25 us per chunk), so
// granules under a budget were 1.5-2x slower than extents (README, "Tried and rejected").
//
// Knows nothing of CUDA: the backend (a CUDA one in runtime/, or a fake in tests) reserves,
// creates, maps and unmaps. No exception leaves a public function; one mutex guards everything.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/budget.h"
#include "pool/free_tags.h"

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
  // Extents: `granules` granules created, mapped and made accessible by one call each. On the
  // H100 that costs about what one granule does (granule by granule: ~80 us per 2 MiB mapped and
  // unmapped again, so 75 GiB take 3 s). CUDA unmaps a mapping only whole: unmap_extent() takes
  // the extent's first address and its size; release it with release_chunk() once unmapped.
  virtual Handle create_extent(uint64_t granules) = 0;  // 0 on failure
  virtual bool map_extent(uint64_t va, Handle extent, uint64_t granules) = 0;
  virtual bool unmap_extent(uint64_t va, uint64_t granules) = 0;
  // Maps an extent of `granules` granules, whole, at one more range `va` and makes it accessible:
  // one allocation may be mapped at several ranges at once, each showing the same bytes
  // (PlacedPool; the driver does not map part of one). Unmap with unmap_extent(va, granules).
  virtual bool map_alias(uint64_t va, Handle extent, uint64_t granules) = 0;
  // What the calls above cost so far, for the exit line ("" when not measured).
  virtual std::string costs() const { return ""; }
  // The same as totals: calls made and host time inside them (zeros when not measured).
  struct CallTotals {
    uint64_t calls = 0;
    uint64_t ns = 0;
  };
  virtual CallTotals totals() const { return {}; }
};

// Where fresh granules go: long-lived buffers (cudaMalloc: weights, library state) low, short-lived
// ones (stream-ordered: activations, workspaces) high, so that the two seldom interleave.
enum class Lifetime { kLong, kShort };

struct Allocation {
  uint64_t address = 0;
  uint64_t bytes = 0;  // the VA bytes it occupies: the request rounded up to 512 B or to granules
  uint64_t fresh = 0;  // granules it had to map anew (0: it reused idle memory)
};

class VmmArena {
 public:
  struct Stats {
    uint64_t reserved_bytes = 0;     // the VA range
    uint64_t mapped_bytes = 0;       // granules mapped now (idle ones included)
    uint64_t peak_mapped_bytes = 0;  // most ever mapped at once
    uint64_t peak_held_bytes = 0;    // most physical memory ever held at once (mapped + free chunks)
    uint64_t idle_bytes = 0;         // mapped granules holding no live buffer (slabs count as used)
    uint64_t live_bytes = 0;         // sum of the requested sizes of buffers not freed (evicted included)
    uint64_t evicted_bytes = 0;      // bytes of granules of live buffers that are unmapped now
    uint64_t chunks_created = 0;     // create_chunk() successes, ever
    uint64_t extents_created = 0;    // create_extent() successes that were mapped, ever
    uint64_t extents = 0;            // extents mapped now
    uint64_t chunks_free = 0;        // created and unmapped now (the free list)
    uint64_t allocations = 0;        // allocate() successes
    uint64_t failures = 0;           // allocate() calls that returned nothing
    uint64_t fresh_granules = 0;     // granules mapped by allocate() (not restore), ever
    uint64_t slabs = 0;              // granules carved into small buffers now
    // 1 - resident live bytes / mapped bytes (0 when nothing is mapped): the share of mapped
    // memory that holds no requested byte, idle memory included.
    double fragmentation = 0;
  };

  // `reserve_bytes` is rounded up to the granularity. `physical_budget`: at most
  // physical_budget / granularity granules are mapped at once. If the granularity is 0 or not a
  // multiple of 512, or the reservation fails, the arena is unusable: ok() is false and every
  // allocate() fails.
  // `extent_min`: fresh stretches of at least this many granules are mapped as one extent (0: never).
  // `exact_extents` (under a budget): a large buffer never takes part of an extent, so that each
  // can be evicted alone, and restore() maps a wholly evicted buffer as one extent again (Note
  // [Extents under a budget]).
  VmmArena(PhysicalBackend& backend, uint64_t reserve_bytes, uint64_t physical_budget, uint64_t extent_min = 0,
           bool exact_extents = false);
  ~VmmArena();  // unmaps everything, releases every chunk, unreserves the range
  VmmArena(const VmmArena&) = delete;
  VmmArena& operator=(const VmmArena&) = delete;

  bool ok() const { return reserved_ != 0; }
  uint64_t granularity() const { return granularity_; }
  uint64_t base() const { return base_; }

  // A buffer of at least `bytes`. nullopt (counted in failures; the arena is left as before) when
  // the granules it needs would exceed the budget, no VA fits, or the backend fails. `waits`
  // (when given) receives the tags of the freed memory it reuses. bytes == 0 gives {0, 0}.
  std::optional<Allocation> allocate(uint64_t bytes, Lifetime lifetime, TagSet* waits = nullptr);
  // The VA bytes allocate(bytes) occupies: 512-byte multiples below a granule, whole granules above.
  uint64_t span_of(uint64_t bytes) const;
  // The buffer's memory becomes idle (still mapped) and carries `tags`. false for an address
  // allocate() did not return, or one already freed. Frees evicted buffers too.
  bool free(uint64_t address, const TagSet& tags = {});
  // Large buffers (whole granules) only. evict() unmaps the buffer's mapped granules (their chunks
  // go to the free list); false if unknown, small, already evicted, held in part by an extent that
  // reaches beyond the buffer (nothing unmapped), or an unmap failed (the
  // granules unmapped so far stay unmapped; evicting again finishes). restore() maps chunks on
  // every unmapped granule of the buffer, at the same addresses; false if unknown, small, not
  // evicted, beyond the budget (nothing mapped) or the backend failed (what was mapped stays
  // mapped; the buffer stays evicted until a restore() completes).
  bool evict(uint64_t address);
  bool restore(uint64_t address);
  bool is_evicted(uint64_t address) const;
  // Unmaps up to `max_granules` idle granules whose tags `settled` accepts (tags it accepts are
  // dropped); their chunks go to the free list (extents: released). Returns how many were
  // unmapped: more than `max_granules` when the last one cut into an extent, which goes whole.
  uint64_t trim(uint64_t max_granules, const std::function<bool(const FreeTag&)>& settled);
  // The end of a synchronisation interval of the program (it waited for the device): unmaps the
  // idle granules that were already idle when the previous interval began, not reused since,
  // whose tags `settled` accepts; and releases the free chunks (beyond `keep`) that no mapping
  // used during the interval. An interval in which nothing was allocated (the wait before a step, right after
  // the wait after the last one) gave idle memory no chance to be reused: it ends nothing. Memory a training loop
  // reuses every step stays; memory a one-off peak left (cudnn.benchmark's search workspaces) goes back to the device
  // two intervals after its last use, its chunks one interval later. Returns the granules unmapped.
  uint64_t end_interval(const std::function<bool(const FreeTag&)>& settled, uint64_t keep);
  // The tags that keep idle memory from being trimmed now (every idle run's, merged).
  TagSet idle_tags() const;
  // Releases chunks of the free list (cuMemRelease) until at most `keep` remain.
  void release_free_chunks(uint64_t keep = 0);
  Stats stats() const;  // walks the buffers: not for hot paths
  void reset_peak();    // peak_mapped_bytes = mapped_bytes now
  // Cheap (one lock each).
  uint64_t mapped_bytes() const;
  uint64_t idle_bytes() const;
  uint64_t free_chunk_bytes() const;  // created and unmapped now
  uint64_t budget_bytes() const;
  // A new budget (physical memory the arena may map): the caller makes sure what is mapped fits.
  void set_budget(uint64_t physical_budget);

 private:
  using Handle = PhysicalBackend::Handle;
  static constexpr uint64_t kNoSlab = UINT64_MAX;

  struct Buffer {
    uint64_t bytes = 0;       // occupied, rounded
    uint64_t requested = 0;   // as asked
    uint64_t slab = kNoSlab;  // the slab's granule for a small buffer
    bool evicted = false;     // at least one granule unmapped by evict()
  };
  // A maximal run of free granules of one kind: mapped (idle) or not. Two runs of one kind are
  // never adjacent (insert_run merges them).
  struct Run {
    uint64_t count = 0;
    bool mapped = false;
    TagSet tags;  // mapped runs: the frees that left the memory idle
  };
  struct Slab {
    std::map<uint64_t, uint64_t> free;  // offset in the granule -> size, coalesced
    uint64_t used = 0;                  // bytes of live small buffers
    TagSet tags;
  };
  using RunKey = std::pair<uint64_t, uint64_t>;               // (count, first)
  using SmallKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // (size, slab granule, offset)

  // All below run with mu_ held. Granule indices are relative to base_.
  std::optional<uint64_t> allocate_granules(uint64_t count, Lifetime lifetime, TagSet* waits, uint64_t* fresh);
  std::optional<std::pair<uint64_t, uint64_t>> choose_window(uint64_t count, Lifetime lifetime) const;
  std::optional<uint64_t> allocate_small(uint64_t size, Lifetime lifetime, TagSet* waits, uint64_t* fresh);
  void free_small(uint64_t offset, const Buffer& buffer, const TagSet& tags);
  void free_granules(uint64_t first, uint64_t count, const TagSet& tags);
  void mark_idle(uint64_t first, uint64_t count);  // idle_since_ = interval_
  void insert_run(uint64_t first, uint64_t count, bool mapped, TagSet tags);
  void erase_run(std::map<uint64_t, Run>::iterator it);
  // Removes [first, first + count) from the free runs (it must lie in them), merging the tags of
  // the mapped parts into *waits.
  void carve_runs(uint64_t first, uint64_t count, TagSet* waits);
  void add_small_range(uint64_t slab, uint64_t offset, uint64_t size);
  void remove_small_range(uint64_t slab, uint64_t offset, uint64_t size);
  uint64_t unmapped_in(uint64_t first, uint64_t count) const;
  bool map_window(uint64_t first, uint64_t count);  // all or nothing
  bool map_granule(uint64_t index);
  bool unmap_granule(uint64_t index);  // chunk to the free list; false (still mapped) on failure or inside an extent
  bool map_extent(uint64_t first, uint64_t count);
  bool unmap_extent(uint64_t first);  // `first` starts an extent; its chunk is released
  // Unmaps [begin, end), which no extent crosses; returns the granules unmapped from `begin` on
  // before a failure (all of them without one).
  uint64_t unmap_span(uint64_t begin, uint64_t end);
  // g moved to the end (up) or the start (down) of an extent it lies strictly inside, so that a
  // range [up(b), down(e)) is crossed by no extent.
  uint64_t extent_up(uint64_t g) const;
  uint64_t extent_down(uint64_t g) const;
  std::optional<std::pair<uint64_t, uint64_t>> large_buffer_granules(uint64_t address) const;

  PhysicalBackend& backend_;
  uint64_t granularity_ = 0;
  uint64_t reserved_ = 0;  // 0: unusable
  uint64_t base_ = 0;
  uint64_t max_granules_ = 0;
  uint64_t extent_min_ = 0;  // 0: no extents
  bool exact_extents_ = false;
  bool cuts_extent(uint64_t first, uint64_t count) const;  // the window holds part of an extent
  // The first (low) or last window of `count` granules in [first, first + size) that cuts no extent.
  std::optional<uint64_t> extent_window(uint64_t first, uint64_t size, uint64_t count, bool low) const;
  mutable std::mutex mu_;
  std::vector<Handle> chunk_;                     // per granule; 0: unmapped
  std::vector<uint32_t> idle_since_;              // per granule: the interval in which it last became idle
  uint32_t interval_ = 0;                         // end_interval() calls so far
  size_t free_low_water_ = 0;                     // fewest free chunks since the last end_interval()
  uint64_t allocations_in_interval_ = 0;          // an interval without allocations ends nothing
  std::map<uint64_t, Run> runs_;                  // free granule runs by first granule
  std::set<RunKey> idle_by_size_;                 // mapped runs
  std::set<RunKey> unmapped_by_size_;             // unmapped runs
  std::unordered_map<uint64_t, Buffer> buffers_;  // by offset from base_
  std::unordered_map<uint64_t, Slab> slabs_;      // by granule
  std::set<SmallKey> small_free_;                 // every slab's free ranges, best fit first
  std::vector<Handle> free_chunks_;
  std::map<uint64_t, uint64_t> extents_;  // first granule -> granules; chunk_ holds the extent's handle on each
  uint64_t mapped_granules_ = 0;
  uint64_t idle_granules_ = 0;
  uint64_t evicted_granules_ = 0;
  Stats stats_;
};

}  // namespace vcudnn::pool
