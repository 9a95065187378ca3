// Buffer: one allocation the memory runtime serves, and what it knows about it. Fields read on the
// access path without the manager's lock are atomics; the rest change under the manager's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "pool/free_tags.h"
#include "pool/host_pool.h"

namespace vcudnn::pool {
class PlacedPool;
}

namespace vcudnn::memory {

enum class BufferState : uint8_t {
  kResident,  // mapped, its bytes on the device
  kEvicting,  // still mapped and valid; a copy to the host is in flight
  kEvicted,   // unmapped; its bytes in host blocks
};

struct Buffer {
  uint64_t address = 0;
  uint64_t bytes = 0;               // requested
  uint64_t span = 0;                // occupied in the arena
  uint64_t serial = 0;              // allocation sequence number (the access log's buffer id)
  bool large = false;               // whole granules of its own: evictable
  bool library = false;             // allocated by an NVIDIA library: never evicted
  // vcudnn's own workspace for one call (Note [Workspace that lives for one call], pool/
  // workspace_pool.h): recorded and placed as the framework's buffers are, never evicted.
  bool scratch = false;
  bool indexed = false;             // in the manager's pointer index (not once tracking stopped)
  std::atomic<bool> pinned{false};  // a library keeps a pointer into it: never evicted
  std::atomic<BufferState> state{BufferState::kResident};
  std::atomic<uint64_t> last_use{0};  // global tick of its latest access
  std::atomic<uint32_t> in_use{0};    // calls between their touch and their queued work (call_scope.h)
  // The streams (StreamOrder::bit_of) that accessed it since its last eviction started.
  std::atomic<uint64_t> streams{0};
  // A restore copy may still be in flight: an access must be ordered after `ready` first.
  std::atomic<bool> restoring{false};
  pool::FreeTag ready;                // the restore copy's end on the in stream
  pool::FreeTag copied_out;           // the eviction copy's end on the out stream
  // A placed buffer's copy out in pieces (Note [Copies out in pieces], planner/offload_plan.h): the
  // end of each, in order, piece k its moving part's bytes [k * piece_bytes, (k + 1) * piece_bytes).
  std::vector<pool::FreeTag> copied_pieces;
  uint64_t piece_bytes = 0;
  std::vector<pool::HostBlock> host;  // where its bytes are while evicting / evicted
  int32_t prefetch_action = -1;       // a planned copy back in flight: its action (replay.h)
  // Freed and kept whole for reuse on its stream (reuse_cache.h): not live, still the arena's.
  bool cached = false;
  uint32_t cached_stream = 0;
  uint64_t cached_interval = 0;
  Buffer* next_cached = nullptr;
  // Served from a static placement (pool/placed_pool.h): its pool and slot. `handed_over`: being
  // copied out, it gave its pool bytes to a later buffer (its eviction can no longer be cancelled).
  pool::PlacedPool* placed_pool = nullptr;
  uint32_t placed_slot = 0;
  bool handed_over = false;
  // Its first `kept` bytes stay on the device when it leaves (a placed buffer the plan moves in part:
  // Note [Moving part of a buffer]); what moves is [address + kept, address + bytes).
  uint64_t kept = 0;
  uint64_t moving_address() const { return address + kept; }
  uint64_t moving_bytes() const { return bytes - kept; }
};

// Where in the out stream's order its copy out has read the first `bytes` of its moving part: the
// end of the piece holding its last byte, else of the whole copy.
inline pool::FreeTag copied_up_to(const Buffer& b, uint64_t bytes) {
  if (b.piece_bytes == 0 || bytes == 0) return b.copied_out;
  const uint64_t piece = (bytes - 1) / b.piece_bytes;
  return piece < b.copied_pieces.size() ? b.copied_pieces[piece] : b.copied_out;
}

}  // namespace vcudnn::memory
