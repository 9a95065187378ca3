// NCCL's collectives as accesses (interpose/nccl_hooks.cpp): the buffers a collective reads and
// writes are reported like any other call's (memory_access.h), on the communicator's stream, at the
// moment its work is queued, so that a moved buffer comes back first, the recorded iteration holds
// the collective and the plan never takes a buffer away while NCCL still works on it.
//
// Note [Collectives queue their work at the group's end]
// Inside ncclGroupStart() .. ncclGroupEnd() a collective call only describes its work; NCCL queues
// the kernels of the whole group on their streams in the outermost ncclGroupEnd() (PyTorch's
// ProcessGroupNCCL wraps its collectives in such groups). Reported at the call, a collective's
// buffers would be fenced, and could be copied out and unmapped, before its kernel exists: a copy
// out ordered after "everything queued on the stream so far" would not wait for it. So inside a
// group the buffers are kept per thread and reported at the outermost end, within the end's call
// scope, before the real ncclGroupEnd() queues the work. A communicator made nonblocking
// (ncclCommInitRankConfig with blocking = 0) may queue the work after the call has returned
// ncclInProgress: then no scope covers it, and the buffers are pinned (never moved again until
// freed), which costs memory and never a byte.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/memory_access.h"

namespace vcudnn::collectives {

// The device buffers one collective uses (send and receive; the same pointer twice in place).
struct Buffers {
  uint64_t words[2] = {0, 0};
  size_t n = 0;
};

// Where the buffers go: the process's memory manager (memory::touch, memory::pin), or a test's.
class Reporter {
 public:
  virtual ~Reporter() = default;
  // false: a buffer could not be brought back.
  virtual bool touch(const Buffers& buffers, memory::StreamRef stream, const char* api) const;
  virtual void pin(const Buffers& buffers, const char* api) const;
};
const Reporter& process_reporter();

// ncclGroupStart() succeeded on this thread.
void group_started() noexcept;

// A collective is about to be handed to NCCL (the hook holds a memory::CallScope). Inside a group
// its buffers wait for the group's end (and true); outside one they are reported now: false when
// one could not be brought back (the hook returns an error without the real call).
bool collective(const Buffers& buffers, memory::StreamRef stream, const char* api,
                const Reporter& to = process_reporter());

// ncclGroupEnd() is about to run (inside the hook's CallScope). The outermost end reports the
// buffers of the group's collectives, in their order: false when one could not be brought back.
// Every end closes one level, whatever it returns.
bool group_ending(const Reporter& to = process_reporter());

// The real call returned ncclInProgress (a nonblocking communicator): the collective, or every
// collective of the group just ended, may be queued later, outside any scope: their buffers are
// pinned. `buffers` is null for a group's end.
void queued_later(const Buffers* buffers, const char* api, const Reporter& to = process_reporter());

// Collectives reported in this process, and of them those reported at a group's end: the exit line,
// and whether the placement may stay beside NCCL (placement_beside_collectives, offload_replay.h).
uint64_t reported() noexcept;
uint64_t reported_at_group_ends() noexcept;

// How many groups are open on this thread, and how many collectives wait in them (tests).
int open_groups() noexcept;
size_t waiting() noexcept;

}  // namespace vcudnn::collectives
