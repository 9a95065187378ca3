// PlacedPool: the physical memory of a static placement (planner/placement.h, Note [A static
// placement]) and the virtual ranges that show it. The pool is blocks of physical memory (one
// allocation handle each, created when first needed), laid end to end in pool offsets; each placed
// allocation of the iteration (a slot, by its index among the iteration's allocations) has a
// virtual range of its own, mapped onto its part of the pool the first time it is served and left
// mapped. The driver maps whole allocations only (CUDA 13 refuses cuMemMap's offset: scripts/bench/
// vmm_map.cpp), so a slot's range shows every block its granules lie in, whole, and the buffer's
// address is where its first granule falls in that window; blocks are cut at both ends of every
// moving part and of every piece of a slot in pieces (Slot::kept, Slot::segments), so that a
// moving part is its own blocks exactly and a slot's pieces follow one another in its range. Two slots that share pool
// bytes are never meant to hold live bytes at once; the pool checks it at run time: every pool granule has an owner
// (the buffer whose bytes it holds now) and the tags of whoever gave it back last, so that a slot whose bytes are still
// another buffer's is refused (the runtime then serves the allocation elsewhere) and a new owner is ordered after the
// last one's work.
//
// A moved buffer's range is unmapped when its copy out has finished (evict) and mapped again when it
// comes back (restore), onto the same pool bytes if no one holds them, else onto a fresh extent of
// its own ("detached", released once the buffer is freed and its work settled). A buffer that is
// being copied out may hand its pool bytes over before the copy ends: the new owner's stream waits
// for the copy (the caller adds that wait).
//
// Knows nothing of CUDA (PhysicalBackend, as VmmArena) nor of streams (tags are opaque, `settled`
// says which are done). Not thread-safe: the memory manager's lock guards it. No exception leaves
// a public function.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "pool/free_tags.h"
#include "pool/vmm_arena.h"

namespace vcudnn::pool {

class PlacedPool {
 public:
  struct Segment {
    uint64_t offset = 0, granules = 0;  // pool granules
  };
  struct Slot {
    uint64_t offset = 0;    // first pool granule
    uint64_t granules = 0;  // 0: this allocation is not placed
    // Its first `kept` granules never leave (Note [Moving part of a buffer], planner/offload_plan.h):
    // evict, restore, reclaim, holders and restore_detached concern the rest, its moving part, and
    // the block boundaries include the one between the two.
    uint64_t kept = 0;
    // Where its granules lie in the pool, in its order (Note [Buffers in pieces], planner/
    // placement.h); empty: [offset, offset + granules). Block boundaries lie at every joint between
    // two (a slot whose joints are not is not placed).
    std::vector<Segment> segments;
    // The buffer's range is its own, made elsewhere (a buffer alive through the iteration, in the
    // arena at the address the program holds: Note [Across the iteration's end], planner/
    // offload_plan.h): the pool reserves none for it, and adopt() gives the address. Its granules are
    // whole blocks (each segment's ends are cuts) and it moves whole, else it is not placed.
    bool external = false;
  };
  // `cuts`: block boundaries in pool granules, ascending, from 0 to the pool's granules.
  // `slots`: by allocation index. ok() is false when the arguments are inconsistent or the
  // virtual range cannot be reserved.
  PlacedPool(PhysicalBackend& backend, uint64_t granularity, std::vector<uint64_t> cuts, std::vector<Slot> slots);
  ~PlacedPool();  // unmaps every range, releases every block and extent, gives the range back
  PlacedPool(const PlacedPool&) = delete;
  PlacedPool& operator=(const PlacedPool&) = delete;

  bool ok() const { return ok_; }
  size_t slots() const { return slots_.size(); }
  bool placed(uint32_t slot) const { return slot < slots_.size() && slots_[slot].granules > 0; }
  uint64_t address(uint32_t slot) const { return slots_[slot].va; }
  uint64_t span(uint32_t slot) const { return slots_[slot].granules * g_; }
  uint64_t kept_bytes(uint32_t slot) const { return placed(slot) ? slots_[slot].kept * g_ : 0; }
  // The slot whose buffer address is `address`, or -1.
  int64_t slot_at(uint64_t address) const;
  // Physical memory the pool holds: blocks created and detached extents.
  uint64_t held_bytes() const { return held_granules_ * g_; }
  // Blocks the slot needs that are not created yet, in bytes: room the caller makes first.
  uint64_t missing_bytes(uint32_t slot) const;

  enum class Result { kOk, kBusy, kFailed };
  // A buffer being copied out whose pool granules a new buffer took, and how far into its moving
  // part (bytes from its start, in its range's order) they reach: the new buffer writes once its
  // copy out has read that far (Note [Copies out in pieces], planner/offload_plan.h).
  struct HandOver {
    const void* owner = nullptr;
    uint64_t reach = 0;
  };
  // The slot for a new buffer `owner`. kBusy (nothing changes) when its range is in use or detached,
  // or a pool granule of it is held by a buffer `may_hand_over` refuses; kFailed when a block could
  // not be created or the range not mapped (nothing held). On kOk: the granules are `owner`'s,
  // `waits` gets the tags of those who gave them back, `handed_over` the buffers whose granules it
  // took (the caller orders the owner after their copies out).
  Result take(uint32_t slot, const void* owner, TagSet* waits, const std::function<bool(const void*)>& may_hand_over,
              std::vector<HandOver>* handed_over);
  // The buffer in the slot is freed with `tags`: its granules (those still its) are free carrying
  // them; a detached extent goes once they are settled (reap). true when some of them belong to a
  // buffer away on the host (evicted, or handed them over while leaving) that comes back onto them:
  // its copy back waits for `tags`, and the caller fences them exactly (Note [Copies back in
  // pieces], runtime/memory/residency.h).
  bool release(uint32_t slot, const void* owner, const TagSet& tags);
  // Its copy out has finished: the range is unmapped, its granules (if still its) free with `tags`.
  // false when an unmap failed (the range stays as it was).
  bool evict(uint32_t slot, const void* owner, const TagSet& tags);
  // Maps an evicted slot's range onto its pool bytes again: kBusy when another buffer holds some
  // (nothing changes), else `waits` gets the tags of those who gave them back. With `by_piece`,
  // those tags split by piece of `piece_bytes` of its moving part, in its byte order (piece k: its
  // bytes [k * piece_bytes, (k + 1) * piece_bytes)), so that each piece's copy back waits for the
  // holders of its own bytes alone (Note [Copies back in pieces], runtime/memory/residency.h).
  Result restore(uint32_t slot, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece = nullptr,
                 uint64_t piece_bytes = 0);
  // A slot whose range is still mapped (its buffer's copy out may still be reading it) takes its
  // pool bytes back from the buffers it handed them to, once they gave them back: kBusy while one
  // still holds some (nothing changes), else `waits` gets the tags of those who gave them back (and
  // `by_piece` the same by piece, as restore() gives them). No driver call.
  Result reclaim(uint32_t slot, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece = nullptr,
                 uint64_t piece_bytes = 0);
  // An external slot (Slot::external) takes `owner`, away on the host, whose range is [va, va +
  // span(slot)), unmapped: the slot is then as a placed buffer's that was evicted, and restore() (or
  // restore_detached()) brings it back. Its range stays the owner's: the pool unmaps it when the
  // owner leaves and when the pool goes, and never gives it back. false when the slot is not
  // external or already has a buffer.
  bool adopt(uint32_t slot, const void* owner, uint64_t va);
  bool external(uint32_t slot) const { return placed(slot) && slots_[slot].external; }
  // The buffers holding pool bytes of the slot now, other than `owner`.
  std::vector<const void*> holders(uint32_t slot, const void* owner) const;
  // Maps an evicted slot's range onto a fresh extent of its own (the caller made room).
  bool restore_detached(uint32_t slot);
  // Its moving part is mapped (onto the pool, or onto an extent of its own).
  bool is_mapped(uint32_t slot) const { return slot < slots_.size() && (slots_[slot].mapped || slots_[slot].detached); }
  // Releases the detached extents of freed slots whose tags `settled` accepts; returns the bytes.
  uint64_t reap(const std::function<bool(const FreeTag&)>& settled);
  // Gives physical memory back: blocks no buffer holds a granule of, whose tags `settled` accepts,
  // once the ranges showing them are unmapped (only ranges of freed slots whose work is settled);
  // until about `want` bytes. Returns the bytes released. A slot needing a released block later
  // creates it again.
  uint64_t shrink(uint64_t want, const std::function<bool(const FreeTag&)>& settled);
  // No slot holds a buffer and every tag is settled: the pool may go (a script replaced it).
  bool drained(const std::function<bool(const FreeTag&)>& settled);

  struct Stats {
    uint64_t blocks_created = 0;
    uint64_t mappings = 0;  // ranges (pieces) mapped, ever
    uint64_t unmappings = 0;
    uint64_t detached = 0;  // restores onto an extent of their own
    uint64_t handovers = 0;
    uint64_t busy = 0;  // take() or restore() refused
  };
  const Stats& stats() const { return stats_; }

 private:
  using Handle = PhysicalBackend::Handle;
  struct Block {
    uint64_t first = 0, count = 0;  // pool granules
    Handle handle = 0;              // 0: not created
  };
  struct SlotState {
    uint64_t va = 0;    // the buffer's address
    uint64_t base = 0;  // its range: the whole blocks its granules lie in, segment after segment
    std::vector<Segment> segs;
    uint64_t granules = 0, kept = 0;
    bool mapped = false;       // its moving part, onto the pool
    bool kept_mapped = false;  // its kept part (none: kept == 0), onto the pool
    Handle detached = 0;       // its moving part, onto an extent of its own
    const void* owner = nullptr;
    TagSet freed;  // the last release's tags (a detached extent goes once they settle)
    bool release_pending = false;
    bool external = false;  // Slot::external: va is 0 until adopt()
  };
  enum class Part { kAll, kKept, kMoving };
  // The pieces of a slot's range (of its kept or moving part): each whole block its granules lie in,
  // at its place in the range.
  template <typename F>
  bool each_piece(const SlotState& s, Part part, F&& f) const;
  template <typename F>
  void each_granule(const SlotState& s, Part part, F&& f) const;  // its pool granules
  bool map_part(SlotState& s, Part part);                         // all pieces or none
  bool unmap_part(SlotState& s, Part part);                       // false on the first failure
  bool map_slot(SlotState& s);                                 // what of it is not mapped: both parts, or none of them
  bool unmap_slot(SlotState& s);                               // what of it is mapped onto the pool
  bool create_blocks(const SlotState& s);
  // Some granule of its moving part (counted busy).
  bool held_by_another(const SlotState& s, const void* owner);
  // Its moving part's granules; their tags into `waits`, and by piece into `by_piece` (restore()).
  void own_granules(const SlotState& s, const void* owner, TagSet* waits, std::vector<TagSet>* by_piece = nullptr,
                    uint64_t piece_bytes = 0);
  const SlotState* slot_owned_by(const void* owner) const;  // the slot `owner` holds, or nullptr
  // Pool granule `g`'s place in the moving part of slot `s` (granules from its start), or nullopt.
  static std::optional<uint64_t> moving_rank(const SlotState& s, uint64_t g);

  PhysicalBackend& backend_;
  uint64_t g_ = 0;
  uint64_t base_ = 0, reserved_ = 0;
  bool ok_ = false;
  std::vector<Block> blocks_;
  std::vector<SlotState> slots_;
  std::unordered_map<uint64_t, uint32_t> slot_of_va_;
  std::vector<const void*> owner_;  // per pool granule
  std::vector<TagSet> tags_;        // per pool granule: whoever gave it back last
  std::vector<uint8_t> away_;       // per pool granule: its buffer is away on the host (release())
  std::vector<uint32_t> pending_;   // slots whose detached extent goes once settled
  uint64_t held_granules_ = 0;
  Stats stats_;
};

}  // namespace vcudnn::pool
