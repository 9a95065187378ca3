// The access clock and the call slots behind Note [Never unmap under a queued access]
// (call_scope.cpp): every access gets a tick; a hook holds its thread's slot from before it
// reports its pointers until its real call has queued the work, and an eviction spares every
// buffer used at or after the oldest tick held in any slot.
#pragma once

#include <cstdint>

namespace vcudnn::memory {

uint64_t next_tick();     // a new tick (the clock advances)
uint64_t current_tick();  // the tick the next access will get
// The oldest tick at which a scope still in progress began; UINT64_MAX when none is.
uint64_t oldest_active_tick();

// Holds the thread's slot for one touch when the hook opened no CallScope (memory_access.h);
// nests inside one at no cost.
class TouchScope {
 public:
  TouchScope();
  ~TouchScope();
  TouchScope(const TouchScope&) = delete;
  TouchScope& operator=(const TouchScope&) = delete;
};

}  // namespace vcudnn::memory
