// Reader of the allocation traces in tests/data/alloc_*.trace (vcudnn.alloc_trace/1): every
// cudaMallocAsync / cudaFreeAsync (and cudaMalloc / cudaFree) a PyTorch training run made, in
// order, recorded on the GPU machine by an LD_PRELOAD shim. The CPU tests replay them through the
// arena and the memory manager.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

namespace vcudnn::test {

struct AllocEvent {
  bool allocate = false;
  bool stream_ordered = false;  // cudaMallocAsync / cudaFreeAsync (else cudaMalloc / cudaFree)
  uint64_t id = 0;              // allocation number
  uint64_t bytes = 0;           // allocations only
  uint32_t stream = 0;
  uint32_t thread = 0;
};

struct AllocTrace {
  std::vector<AllocEvent> events;
  uint64_t torch_max_allocated = 0;
  uint64_t torch_max_reserved = 0;
  uint64_t allocations = 0;
};

inline AllocTrace read_alloc_trace(const std::string& name) {
  AllocTrace t;
  std::ifstream in(source_dir() + "/tests/data/alloc_" + name + ".trace");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# torch", 0) == 0) {
      std::sscanf(line.c_str(), "# torch max_memory_allocated=%lu max_memory_reserved=%lu", &t.torch_max_allocated,
                  &t.torch_max_reserved);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    char op = 0;
    AllocEvent e;
    fields >> op >> e.id;
    e.allocate = op == 'a' || op == 'A';
    e.stream_ordered = op == 'a' || op == 'f';
    if (e.allocate) fields >> e.bytes;
    fields >> e.stream >> e.thread;
    t.allocations += e.allocate;
    t.events.push_back(e);
  }
  return t;
}

}  // namespace vcudnn::test
