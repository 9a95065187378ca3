// Replayer: follows a ReplayScript (planner/replay_script.h) through the iterations after the
// recorded one and says which planned copies are due: the copy out of a buffer after its last use
// before a long gap, the copy back ahead of its next use. It only counts and names; MemoryManager
// moves the bytes (the same Residency mechanism as on-demand eviction). While the program does not
// repeat the recorded iteration (a mismatch at an allocation or free), nothing is due and eviction
// is on demand; the start of a later iteration is found again by the script's anchor. See
// Note [Replaying an offload plan]. Thread-safe: one mutex, taken after the manager's when both are.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/replay_script.h"
#include "runtime/memory/buffer.h"
#include "runtime/memory/eviction_policy.h"

namespace vcudnn::memory {

struct ReplayStats {
  uint64_t iterations = 0;     // iterations followed to their end
  uint64_t syncs = 0;          // times the start of an iteration was found
  uint64_t mismatches = 0;     // allocations or frees that differed from the script (then on demand)
  uint64_t skipped_steps = 0;  // steps of the script that did not come (a few in a row are passed over)
  uint64_t extra_steps = 0;    // steps the script does not have (a few in a row are passed over)
  uint64_t offloads_due = 0;
  uint64_t prefetches_due = 0;
  uint64_t late_prefetches = 0;  // copies back not done when their buffer was used (moved earlier)
  uint64_t moved_earlier = 0;    // prefetches moved earlier by the lateness feedback
  std::string first_mismatch;    // where the program first strayed from the script, for the log
};

class Replayer {
 public:
  explicit Replayer(ReplayScript script);

  struct Due {
    ReplayAction::Kind kind = ReplayAction::kOffload;
    Buffer* buffer = nullptr;
    uint64_t serial = 0;  // the buffer's serial when it was named: the object may be recycled since
    uint32_t action = 0;  // index of the action (lateness feedback)
  };
  // The memory events, in the order the program makes them; each appends what is due before the
  // event is handled (an allocation's before its memory is found: they make room for it). The
  // manager calls on_alloc and on_free under its lock, and bind() with the buffer the allocation
  // returned before it lets the lock go, so no other allocation or free comes between.
  void on_alloc(uint64_t bytes, std::vector<Due>& due);
  // The index among the iteration's allocations of the one on_alloc() just placed, while the script
  // is followed; -1 otherwise (the static placement's slot: Note [A static placement]).
  int64_t pending_allocation() const;
  void bind(Buffer* b);
  void on_free(uint64_t bytes, std::vector<Due>& due);
  void on_use(std::vector<Due>& due);
  // A persistent target's buffer, when the script is installed (live buffers by serial).
  void bind_persistent(Buffer* b);
  // A prefetch was not done when its buffer was used: from the next iteration on, it is queued
  // earlier (a quarter of its window, never before its buffer's copy out is due).
  void late(uint32_t action);

  // On-demand eviction while the script is followed: the candidates whose next use is farthest
  // ahead first (a buffer the script does not name counts as used half an iteration ahead), until
  // `bytes`. The manager calls it with its lock held.
  std::vector<Buffer*> choose(std::vector<EvictionCandidate> candidates, uint64_t bytes);

  bool synced() const;
  // Iterations followed to their end so far (stats().iterations), without the lock.
  uint64_t iterations_done() const { return iterations_done_.load(std::memory_order_acquire); }
  ReplayStats stats() const;
  const ReplayScript& script() const { return script_; }

 private:
  struct Seen {
    bool alloc = false;
    uint64_t bytes = 0;
    Buffer* buffer = nullptr;
    uint64_t serial = 0;
  };
  // All with mu_ held.
  void on_event(const Seen* step, std::vector<Due>& due);
  bool matches(size_t step, const Seen& s) const;
  enum class Place { kExpected, kExtra, kLost };
  static constexpr size_t kLookahead = 8;
  Place place(const Seen& s);
  std::string describe_mismatch(const Seen& seen) const;
  void look_for_start(const Seen& s);
  void lose();
  void begin_iteration();
  void fire(std::vector<Due>& due);
  void bind_allocation(uint32_t index, Buffer* b);

  ReplayScript script_;
  std::vector<std::vector<uint32_t>> targets_of_alloc_;  // alloc_index -> targets
  std::vector<uint32_t> offload_of_;                     // target -> its offload action
  std::vector<uint32_t> order_;                          // action indexes by event (actions keep their index)
  mutable std::mutex mu_;
  bool synced_ = false;
  size_t step_ = 0;               // the next step expected
  uint32_t event_ = 0;            // the next event's index
  size_t next_action_ = 0;        // the first of order_ not fired this iteration
  uint32_t allocs_ = 0;           // allocations this iteration
  int64_t last_alloc_ = -1;       // the latest allocation's index this iteration, until bind(); -1 none
  int after_first_mismatch_ = 0;  // steps still to add to stats_.first_mismatch
  size_t extras_in_row_ = 0;      // steps not in the script seen in a row
  bool reorder_ = false;          // an action's event changed: sort at the next iteration
  std::vector<Buffer*> slot_;
  std::vector<uint64_t> slot_serial_;
  struct Named {
    const std::vector<uint32_t>* uses = nullptr;  // events, ascending
    uint64_t serial = 0;
    bool persistent = false;
  };
  std::unordered_map<const Buffer*, Named> named_;  // this iteration's buffers and the persistent ones
  uint64_t next_use_distance(const Buffer* b) const;
  std::vector<Seen> recent_;  // the last `anchor` steps seen while not synced (ring)
  size_t recent_next_ = 0;
  ReplayStats stats_;
  std::atomic<uint64_t> iterations_done_{0};
};

}  // namespace vcudnn::memory
