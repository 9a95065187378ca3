// Process: vcudnn in one process. It owns what exists once per process, whatever VCUDNN_POLICY
// turns on: the options and the log, the Engine behind the cuDNN hooks (recording and
// micro-batching), the MemoryManager behind the allocation and access hooks (memory ownership),
// and the single exit line that reports on all of them. Each part starts at its first use, never
// at load time (see real_api.cpp): a process that never calls cuDNN or never allocates device
// memory starts neither, and one that starts neither prints nothing.
#pragma once

#include <atomic>
#include <string>

#include "runtime/options.h"

namespace vcudnn {

class Engine;
namespace memory {
class MemoryManager;
class OpSink;
}

class Process {
 public:
  static Process& get();
  Process();  // use get(); public for NoDestroy

  const Features& features() const { return features_; }

  // The engine; started (with the load line) at the first cuDNN hook.
  Engine& engine();
  // The engine if it has started, else nullptr; never starts it.
  Engine* engine_if_started() const { return engine_.load(std::memory_order_acquire); }
  // The memory manager when this process owns memory (started at the first call that needs it:
  // CUDA is usable then), else nullptr. memory_device(): its GPU, or -1.
  memory::MemoryManager* memory();
  int memory_device();
  // The recorder that takes the memory runtime's allocations, frees and accesses while it records
  // (connected now, or when memory ownership starts).
  void connect_recorder(memory::OpSink* sink);

  // The exit line: "exit: <engine> ; memory: <memory>" for the parts that started.
  std::string exit_line();

 private:
  void started();  // registers the exit handler once
  static void at_exit();

  Features features_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<memory::OpSink*> sink_{nullptr};
  std::atomic<memory::MemoryManager*> manager_{nullptr};  // once started
};

}  // namespace vcudnn
