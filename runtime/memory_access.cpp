// The memory_access.h functions the hooks call: each forwards to the process's MemoryManager
// (runtime/process.h), or does nothing when vcudnn does not own memory.
#include "runtime/memory_access.h"

#include "runtime/barrier.h"
#include "runtime/memory_manager.h"
#include "runtime/process.h"

namespace vcudnn::memory {

MemoryManager* manager() { return Process::get().memory(); }
int manager_device() { return Process::get().memory_device(); }

bool touch(const uint64_t* words, size_t n, Access mode, StreamRef stream, const char* api) {
  MemoryManager* m = manager();
  return !m || m->touch(words, n, mode, stream, api);
}

bool touch_params(const std::vector<pool::ParamSlot>& layout, void** args, StreamRef stream, const char* api) {
  MemoryManager* m = manager();
  return !m || m->touch_params(layout, args, stream, api);
}

bool touch_block(const void* data, size_t bytes, StreamRef stream, const char* api) {
  MemoryManager* m = manager();
  return !m || m->touch_block(data, bytes, stream, api);
}

bool touch_everything(StreamRef stream, const char* api) {
  MemoryManager* m = manager();
  return !m || m->touch_everything(stream, api);
}

void pin(const uint64_t* words, size_t n, const char* api) {
  if (MemoryManager* m = manager()) m->pin(words, n, api);
}

void remember(const void* owner, const uint64_t* words, size_t n) {
  if (MemoryManager* m = manager()) m->remember(owner, words, n);
}

void forget(const void* owner) {
  if (MemoryManager* m = manager()) m->forget(owner);
}

bool touch_remembered(const void* owner, StreamRef stream, const char* api) {
  MemoryManager* m = manager();
  return !m || m->touch_remembered(owner, stream, api);
}

void capture_begins(const char* api) {
  if (MemoryManager* m = manager()) m->capture_begins(api);
}

void capture_ends(const char* api) {
  if (MemoryManager* m = manager()) m->capture_ends(api);
}

void graph_launched(const char* api) {
  if (MemoryManager* m = manager()) m->graph_launched(api);
}

void opaque_graph(const char* api) {
  if (MemoryManager* m = manager()) m->opaque_graph(api);
}

void pin_remembered(const void* owner, const char* api) {
  if (MemoryManager* m = manager()) m->pin_remembered(owner, api);
}

void prepare_query(uint64_t pointer, const char* api) {
  if (MemoryManager* m = manager()) m->prepare_query(pointer, api);
}

void count_foreign_allocation(const char* api, uint64_t bytes) {
  if (MemoryManager* m = manager()) m->count_foreign(api, bytes);
}

void stream_destroyed(cudaStream_t stream) {
  if (MemoryManager* m = manager()) m->stream_destroyed(stream);
}

SyncPoint::SyncPoint(Kind kind, cudaStream_t stream) {
  MemoryManager* m = manager();
  if (!m) return;
  armed_ = true;
  try {
    marks_ = m->stream_marks(kind == kStream ? std::optional<Stream>(stream) : std::nullopt);
  } catch (...) {
    note_exception("a synchronisation");
    armed_ = false;
  }
}

void SyncPoint::done() noexcept {
  if (!armed_) return;
  try {
    if (MemoryManager* m = manager()) m->synchronized(marks_);
  } catch (...) {
    note_exception("a synchronisation");
  }
}

bool device_out_of_memory(const char* api) noexcept {
  try {
    MemoryManager* m = manager();
    return m && m->device_out_of_memory(api);
  } catch (...) {
    note_exception(api);
    return false;
  }
}

}  // namespace vcudnn::memory
