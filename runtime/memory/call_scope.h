// The access clock and the in-use counts behind Note [Never unmap under a queued access]
// (call_scope.cpp): a hook holds every buffer it touches from its touch until its real call has
// queued the work; an eviction never takes a held buffer.
#pragma once

#include <atomic>
#include <cstdint>

namespace vcudnn::memory {

uint64_t next_tick();  // a new tick of the access clock (least-recently-used order)

// Inside a CallScope or TouchScope: counts the buffer in use (`in_use`, sequentially consistent)
// until the outermost scope on this thread ends.
void hold(std::atomic<uint32_t>& in_use);

// Runs fn(arg) once, on this thread, when the hook's outermost CallScope ends: its real call has
// queued its work (the recorder times a call with an event recorded there). False, and nothing is
// kept, when no CallScope is open on this thread (a touch outside a hook's call), or when another
// function is already waiting for this call's end.
bool at_call_end(void (*fn)(void*), void* arg);

// Holds the thread's scope for one touch when the hook opened no CallScope (memory_access.h);
// nests inside one at no cost.
class TouchScope {
 public:
  TouchScope();
  ~TouchScope();
  TouchScope(const TouchScope&) = delete;
  TouchScope& operator=(const TouchScope&) = delete;
};

}  // namespace vcudnn::memory
