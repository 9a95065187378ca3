// The process's MemoryManager (VCUDNN_POLICY=offload): its start-up checks, its CUDA side (the
// transfer stream), and the memory_access.h functions the hooks call.
#include "runtime/memory_access.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/cuda_driver.h"
#include "runtime/memory/cuda_device.h"
#include "runtime/log.h"
#include "runtime/memory_manager.h"
#include "runtime/no_destroy.h"
#include "runtime/options.h"
#include "runtime/real_api.h"

namespace vcudnn::memory {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  return s;
}

// PyTorch's expandable segments map memory through the driver API themselves: vcudnn could
// neither serve nor see those allocations.
bool expandable_segments_requested() {
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"}) {
    const char* v = std::getenv(name);
    if (v && lower(v).find("expandable_segments:true") != std::string::npos) return true;
  }
  return false;
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30)); }

struct Process {
  int device = -1;
  MemoryManager* manager = nullptr;
};

void exit_line();

Process start() {
  Process p;
  const Options& o = options();
  if (o.policy != Policy::kOffload) return p;
  log::configure_once(o);
  if (expandable_segments_requested()) {
    VCUDNN_LOG_ERROR(
        "offload: PYTORCH_CUDA_ALLOC_CONF asks for expandable_segments, whose memory PyTorch maps itself through "
        "the driver, out of vcudnn's sight: vcudnn does not own memory in this process (no budget, no eviction). "
        "Use PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync instead.");
    return p;
  }
  const RealCudart& rt = real_cudart();
  int device = 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (!rt.cudaGetDevice || !rt.cudaMemGetInfo || rt.cudaGetDevice(&device) != cudaSuccess ||
      rt.cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    if (rt.cudaGetLastError) rt.cudaGetLastError();
    VCUDNN_LOG_ERROR("offload: the CUDA runtime is not usable ({}); vcudnn does not own memory",
                     cudart_library().found ? "no device" : cudart_library().error);
    return p;
  }
  std::string why;
  if (!cuda::vmm_supported(device, &why)) {
    VCUDNN_LOG_ERROR("offload: GPU {} cannot use CUDA virtual memory ({}); vcudnn does not own memory", device, why);
    return p;
  }
  ManagerConfig config;
  config.device_total = total_bytes;
  if (!o.get(kDeviceBudget).empty()) config.device_budget = pool::parse_budget(o.get(kDeviceBudget), total_bytes);
  const uint64_t host_ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  config.host_budget = pool::parse_budget(o.get(kHostBudget), host_ram).value_or(8ull << 30);
  if (config.device_budget && *config.device_budget > total_bytes) {
    VCUDNN_LOG_WARN("offload: VCUDNN_DEVICE_BUDGET={} exceeds the card ({}); the card is the limit",
                    o.get(kDeviceBudget), gib(total_bytes));
    config.device_budget = total_bytes;
  }
  if (config.host_budget > host_ram / 2) {
    VCUDNN_LOG_WARN("offload: VCUDNN_HOST_BUDGET={} pins more than half of the host's {}", o.get(kHostBudget),
                    gib(host_ram));
  }
  static NoDestroy<cuda::VmmBackend> physical(device);
  static NoDestroy<cuda::PinnedHostBackend> host;
  static NoDestroy<CudaDevice> cuda_device(device);
  if (!cuda_device->ok()) {
    VCUDNN_LOG_ERROR("offload: no transfer stream could be made on GPU {}; vcudnn does not own memory", device);
    return p;
  }
  // The address space: room for every byte on the card and the host budget, several times over
  // (evicted buffers keep their addresses); smaller if the driver refuses that much.
  MemoryManager* m = nullptr;
  for (uint64_t times : {4, 2, 1}) {
    config.reserve_bytes = times * total_bytes + config.host_budget;
    m = new MemoryManager(physical.get(), host.get(), cuda_device.get(), config);  // never destroyed
    if (m->ok()) break;
    delete m;
    m = nullptr;
  }
  if (!m) {
    VCUDNN_LOG_ERROR("offload: no device arena could be set up on GPU {} (virtual address reservation or "
                     "granularity failed); vcudnn does not own memory",
                     device);
    return p;
  }
  p.device = device;
  p.manager = m;
  const ManagerStats s = m->stats();
  VCUDNN_LOG_INFO(
      "offload: vcudnn owns the device memory of GPU {} ({} total): {}; granularity {} KiB; arena {} of address "
      "space{}",
      device, gib(total_bytes),
      config.device_budget ? "budget " + gib(*config.device_budget) + " (" + o.get(kDeviceBudget) +
                                 "), least-recently-used buffers evicted to pinned host memory beyond it"
                           : "no budget (VCUDNN_DEVICE_BUDGET unset): memory is owned and tracked, nothing is evicted",
      m->granularity() >> 10, gib(config.reserve_bytes),
      config.device_budget ? ", " + gib(s.host_reserved) + " of pinned host memory reserved (VCUDNN_HOST_BUDGET=" +
                                 o.get(kHostBudget) + ")"
                           : "");
  detail::g_active.store(true, std::memory_order_seq_cst);
  std::atexit(exit_line);
  return p;
}

Process& process() {
  static NoDestroy<Process> p(start());
  return p.get();
}

// With VCUDNN_TRACE=path, the recorded accesses go to path.memory.json (schema vcudnn.memory/1):
// one [call, buffer, mode] triple per access of an owned buffer, in call order, for the first
// MemoryManager::kAccessLogCap accesses; `buffer` is the allocation's sequence number.
void write_access_log(const MemoryManager& m) {
  const std::string pattern = options().get(kTrace);
  if (pattern.empty()) return;
  const std::string path = expand_path(pattern) + ".memory.json";
  nlohmann::json j;
  j["schema"] = "vcudnn.memory/1";
  j["modes"] = {"unknown", "read", "write", "readwrite"};
  nlohmann::json& accesses = j["accesses"] = nlohmann::json::array();
  for (const auto& a : m.access_log()) accesses.push_back({a.call, a.buffer, static_cast<int>(a.mode)});
  std::ofstream out(path);
  out << j.dump() << "\n";
  if (!out) VCUDNN_LOG_WARN("offload: cannot write the access log {}", path);
}

void exit_line() {
  try {
    if (MemoryManager* m = process().manager) {
      VCUDNN_LOG_INFO("offload exit: {}; untracked_launches={}", m->summary(), cuda::untracked_launches());
      write_access_log(*m);
    }
  } catch (...) {
  }
}

}  // namespace

MemoryManager* manager() { return process().manager; }
int manager_device() { return process().device; }

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

void note_graph_use(const char* api) {
  if (MemoryManager* m = manager()) m->note_graph_use(api);
}

void count_foreign_allocation(const char* api, uint64_t bytes) {
  if (MemoryManager* m = manager()) m->count_foreign(api, bytes);
}

void stream_destroyed(cudaStream_t stream) {
  if (MemoryManager* m = manager()) m->stream_destroyed(stream);
}

}  // namespace vcudnn::memory
