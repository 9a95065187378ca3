// The access clock, the per-thread scope, hold(), CallScope and TouchScope.
//
// Note [Never unmap under a queued access]
// A hook runs touch() and then its real call, which queues work using the buffers. An eviction on
// another thread must not take a buffer's memory in between. touch() holds each buffer it finds
// (its in-use count goes up) before it reads the buffer's state; the count goes down when the
// hook's outermost scope ends, after the real call has queued its work. An eviction marks its
// victims kEvicting first and then reads their counts, sparing any that is held. Both sides are
// sequentially consistent, so either the hook sees the mark (and takes the manager's lock to
// cancel the eviction or restore the buffer) or the eviction sees the hold. Work queued by scopes
// that have ended is covered by the fences the eviction copy waits for, and the memory is unmapped
// only after that copy has finished.
#include "runtime/memory/call_scope.h"

#include <vector>

#include "runtime/memory_access.h"

namespace vcudnn::memory {
namespace {

struct ThreadScope {
  int depth = 0;
  int calls = 0;  // CallScopes open (TouchScopes not counted)
  std::vector<std::atomic<uint32_t>*> held;
  void (*end_fn)(void*) = nullptr;  // at_call_end
  void* end_arg = nullptr;
};

ThreadScope& my_scope() {
  thread_local ThreadScope scope;
  return scope;
}

std::atomic<uint64_t> g_tick{1};

void enter() { ++my_scope().depth; }

void leave() {
  ThreadScope& s = my_scope();
  if (--s.depth > 0) return;
  for (std::atomic<uint32_t>* c : s.held) {
    // Never below zero: a buffer freed (and its object reused) under a racing call.
    uint32_t n = c->load(std::memory_order_relaxed);
    while (n > 0 && !c->compare_exchange_weak(n, n - 1, std::memory_order_seq_cst)) {
    }
  }
  s.held.clear();
  if (void (*fn)(void*) = s.end_fn) {
    s.end_fn = nullptr;
    fn(s.end_arg);
  }
}

}  // namespace

uint64_t next_tick() { return g_tick.fetch_add(1, std::memory_order_relaxed); }

void hold(std::atomic<uint32_t>& in_use) {
  in_use.fetch_add(1, std::memory_order_seq_cst);
  my_scope().held.push_back(&in_use);
}

bool at_call_end(void (*fn)(void*), void* arg) {
  ThreadScope& s = my_scope();
  if (s.calls == 0 || s.end_fn) return false;
  s.end_fn = fn;
  s.end_arg = arg;
  return true;
}

TouchScope::TouchScope() { enter(); }
TouchScope::~TouchScope() { leave(); }

CallScope::CallScope() {
  if (!active()) return;
  enter();
  ++my_scope().calls;
  armed_ = true;
}

CallScope::~CallScope() {
  if (!armed_) return;
  --my_scope().calls;
  leave();
}

}  // namespace vcudnn::memory
