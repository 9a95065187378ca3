// Starting memory ownership in a process (startup.cpp).
#pragma once

#include "runtime/memory_manager.h"
#include "runtime/options.h"

namespace vcudnn::memory {

struct Started {
  int device = -1;                  // the GPU the arena lives on
  MemoryManager* manager = nullptr;  // never destroyed; nullptr when ownership is off or could not start
};

// Starts memory ownership when the options ask for it (logs why not when it cannot), and turns
// the hooks' tracking on (memory_access.h active()). Never throws.
Started start(const Options& options);

// With VCUDNN_TRACE=path, the recorded accesses go to path.memory.json (schema vcudnn.memory/1).
void write_access_log(const MemoryManager& m);

}  // namespace vcudnn::memory
