// The access clock, thread slots, CallScope and TouchScope.
//
// Note [Never unmap under a queued access]
// A hook runs touch() and then its real call, which queues work reading the buffer. An eviction
// on another thread must not take the buffer's memory in between. Each thread has a slot holding
// the global tick at which its outermost scope began (0: none). An eviction first marks its
// victims kEvicting, then reads every slot and each victim's last use, and keeps only victims
// last used before the oldest active scope. A hook stores its slot tick and the buffer's last use
// before it reads the buffer's residency. All of these are sequentially consistent, so either the
// hook sees the mark (and takes the manager's lock to cancel the eviction or restore the buffer)
// or the eviction sees the hook's tick and spares the buffer. Work queued by scopes that have
// ended is covered by the fences the eviction copy waits for, and the memory is unmapped only
// after that copy has finished.
#include "runtime/memory/call_scope.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <vector>

#include "runtime/memory_access.h"
#include "runtime/no_destroy.h"

namespace vcudnn::memory {
namespace {

struct ThreadSlot {
  std::atomic<uint64_t> tick{0};
  int depth = 0;
};

struct SlotRegistry {
  std::mutex mu;
  std::vector<ThreadSlot*> slots;  // never freed: a thread's slot outlives it (a few bytes)
};

SlotRegistry& registry() {
  static NoDestroy<SlotRegistry> r;
  return r.get();
}

ThreadSlot& my_slot() {
  thread_local ThreadSlot* slot = [] {
    auto* s = new ThreadSlot();
    SlotRegistry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.slots.push_back(s);
    return s;
  }();
  return *slot;
}

std::atomic<uint64_t> g_tick{1};

void enter(ThreadSlot& slot) {
  if (slot.depth++ == 0) slot.tick.store(g_tick.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
}

void leave(ThreadSlot& slot) {
  if (--slot.depth == 0) slot.tick.store(0, std::memory_order_seq_cst);
}

}  // namespace

uint64_t next_tick() { return g_tick.fetch_add(1, std::memory_order_seq_cst); }
uint64_t current_tick() { return g_tick.load(std::memory_order_seq_cst); }

uint64_t oldest_active_tick() {
  SlotRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  for (const ThreadSlot* s : r.slots) {
    const uint64_t t = s->tick.load(std::memory_order_seq_cst);
    if (t != 0) oldest = std::min(oldest, t);
  }
  return oldest;
}

TouchScope::TouchScope() { enter(my_slot()); }
TouchScope::~TouchScope() { leave(my_slot()); }

CallScope::CallScope() {
  if (!active()) return;
  enter(my_slot());
  armed_ = true;
}

CallScope::~CallScope() {
  if (armed_) leave(my_slot());
}

}  // namespace vcudnn::memory
