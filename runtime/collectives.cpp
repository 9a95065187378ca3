// Per-thread NCCL groups and the collectives waiting in them (Note [Collectives queue their work at
// the group's end], collectives.h).
#include "runtime/collectives.h"

#include <atomic>
#include <vector>

#include "runtime/log.h"

namespace vcudnn::collectives {
namespace {

struct Waiting {
  Buffers buffers;
  memory::StreamRef stream;
  const char* api = nullptr;
};

struct ThreadGroups {
  int depth = 0;
  std::vector<Waiting> waiting;  // the open group's collectives
  std::vector<Waiting> ended;    // the last group ended, for queued_later()
};

std::atomic<uint64_t> g_reported{0};
std::atomic<uint64_t> g_at_group_ends{0};

ThreadGroups& groups() {
  static thread_local ThreadGroups g;
  return g;
}

}  // namespace

bool Reporter::touch(const Buffers& b, memory::StreamRef stream, const char* api) const {
  return memory::touch(b.words, b.n, memory::Access::kUnknown, stream, api);
}

void Reporter::pin(const Buffers& b, const char* api) const { memory::pin(b.words, b.n, api); }

const Reporter& process_reporter() {
  static const Reporter r;
  return r;
}

void group_started() noexcept { ++groups().depth; }

bool collective(const Buffers& buffers, memory::StreamRef stream, const char* api, const Reporter& to) {
  ThreadGroups& g = groups();
  if (g.depth == 0) {
    g_reported.fetch_add(1, std::memory_order_relaxed);
    return to.touch(buffers, stream, api);
  }
  g.waiting.push_back({buffers, stream, api});
  return true;
}

bool group_ending(const Reporter& to) {
  ThreadGroups& g = groups();
  if (g.depth == 0) {  // an end without a start: NCCL answers it
    g.ended.clear();
    return true;
  }
  if (--g.depth > 0) return true;
  g.ended.swap(g.waiting);
  g.waiting.clear();
  g_reported.fetch_add(g.ended.size(), std::memory_order_relaxed);
  g_at_group_ends.fetch_add(g.ended.size(), std::memory_order_relaxed);
  for (const Waiting& w : g.ended)
    if (!to.touch(w.buffers, w.stream, w.api)) return false;
  return true;
}

void queued_later(const Buffers* buffers, const char* api, const Reporter& to) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    VCUDNN_LOG_WARN(
        "{} returned ncclInProgress (a nonblocking NCCL communicator): its work may be queued after the call, "
        "so the buffers of such collectives stay on the device from now on (pinned until freed)",
        api);
  if (buffers) {
    to.pin(*buffers, api);
    return;
  }
  for (const Waiting& w : groups().ended) to.pin(w.buffers, w.api);
}

uint64_t reported() noexcept { return g_reported.load(std::memory_order_relaxed); }
uint64_t reported_at_group_ends() noexcept { return g_at_group_ends.load(std::memory_order_relaxed); }

int open_groups() noexcept { return groups().depth; }
size_t waiting() noexcept { return groups().waiting.size(); }

}  // namespace vcudnn::collectives
