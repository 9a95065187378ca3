// Starting memory ownership in a process (VCUDNN_POLICY=offload or microbatch+offload): the
// checks (PyTorch's expandable segments, a usable CUDA runtime, virtual-memory support), the
// settings (VCUDNN_DEVICE_BUDGET, VCUDNN_HOST_BUDGET), the CUDA backends and the manager, and the
// access log written at exit. runtime/process.cpp calls these once.
#include "runtime/memory/startup.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/output_file.h"
#include "runtime/barrier.h"
#include "runtime/cuda_driver.h"
#include "runtime/log.h"
#include "runtime/memory/cuda_device.h"
#include "runtime/memory/link_probe.h"
#include "runtime/no_destroy.h"
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

}  // namespace

namespace {

Started start_unguarded(const Options& o) {
  Started p;
  if (!features_of(o.policy).own_memory) return p;
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
  config.access_log = !o.get(kTrace).empty();  // written next to the trace (write_access_log)
  config.log_iterations = o.get(kLogIterations) == "on";
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
  // Note [Measuring the host link]: for the traces and plans of this process.
  if (const auto link = measure_link(static_cast<cudaStream_t>(cuda_device->out_stream()),
                                     static_cast<cudaStream_t>(cuda_device->in_stream())))
    set_measured_link(*link);
  detail::g_active.store(true, std::memory_order_seq_cst);
  return p;
}

}  // namespace

Started start(const Options& o) {
  try {
    return start_unguarded(o);
  } catch (...) {
    note_exception("starting memory ownership");
    return Started{};  // the hooks pass through
  }
}

// With VCUDNN_TRACE=path, the recorded accesses go to path.memory.json (schema vcudnn.memory/1):
// one [call, buffer, mode] triple per access of an owned buffer, in call order, for the first
// MemoryManager::kAccessLogCap accesses; `buffer` is the allocation's sequence number.
void write_access_log(const MemoryManager& m) {
  const std::string& pattern = options().get(kTrace);
  if (pattern.empty()) return;
  const std::string path = expand_path(pattern) + ".memory.json";
  nlohmann::json j;
  j["schema"] = "vcudnn.memory/1";
  j["modes"] = {"unknown", "read", "write", "readwrite"};
  nlohmann::json& accesses = j["accesses"] = nlohmann::json::array();
  for (const auto& a : m.access_log()) accesses.push_back({a.call, a.buffer, static_cast<int>(a.mode)});
  const Status written = write_output_file(path, j.dump() + "\n");
  if (!written) VCUDNN_LOG_WARN("offload: cannot write the access log: {}", written.error().message);
}


}  // namespace vcudnn::memory
