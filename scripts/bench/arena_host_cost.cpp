// The host cost of serving memory without a budget: a PyTorch allocation sequence recorded on the
// GPU machine (tests/data/alloc_NAME.trace) replayed through vcudnn's memory manager on the CPU
// tests' simulated device, with `trash` bytes of other memory written between two calls (a
// training program's own work evicts the caches between its allocations), accesses tracked or not
// (Note [Tracking without a budget]). It reports the manager's own clock of allocate() and free()
// (`served=` in the exit line) over the second half of the sequence, per call. Runs anywhere: no
// GPU. On the H100's host vcudnn served mobilenet_v3_small at 2.71 us a call, against ~0.35 us for
// cudaMallocAsync's own (README, "Where mobilenet's time goes").
//
//   vcudnn_bench_arena_host [--trace NAME] [--trash 0,1M,8M] [--reps 3] [--json PATH]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "runtime/memory/call_scope.h"
#include "runtime/memory_manager.h"
#include "tests/cpu/alloc_trace.h"
#include "tests/cpu/manager_fixture.h"
#include "tests/cpu/sim_device.h"

using namespace vcudnn;
using namespace vcudnn::memory;

namespace {

constexpr uint64_t kGranule = 2ull << 20;  // as on the H100

// A recorder whose iteration is taken: the manager may stop tracking accesses.
struct FinishedSink final : OpSink {
  bool recording() const noexcept override { return false; }
  void allocated(const BufferRef&, std::optional<cudaStream_t>) noexcept override {}
  void freed(const BufferRef&, std::optional<cudaStream_t>) noexcept override {}
  void used(const char*, std::optional<cudaStream_t>, const BufferUse*, size_t) noexcept override {}
  bool finished() const noexcept override { return true; }
};

struct Replay {
  double ns_per_call = 0;
  uint64_t calls = 0;
  bool tracking = false;
  uint64_t peak_mapped = 0;
  uint64_t kept_hits = 0;  // allocations served by a buffer kept on its stream (untracked only)
  uint64_t kept_flushes = 0;
};

Replay replay(const test::AllocTrace& trace, bool track, uint64_t trash_bytes) {
  test::SimDevice dev(kGranule, UINT64_MAX);
  const test::MemoryActive active;
  ManagerConfig config = test::manager_config(std::nullopt, kGranule);
  config.device_total = 80ull << 30;
  config.reserve_bytes = 4 * config.device_total;
  MemoryManager m(dev, dev, dev, config);
  FinishedSink finished;
  std::vector<uint64_t> trash(trash_bytes / sizeof(uint64_t));
  std::map<uint64_t, uint64_t> address_of;
  uint64_t checksum = 0, half_ns = 0, half_calls = 0;
  const size_t half = trace.events.size() / 2;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const test::AllocEvent& e = trace.events[i];
    if (i == half) {
      const ManagerStats s = m.stats();
      half_ns = s.serve_ns;
      half_calls = s.serve_calls;
    }
    for (size_t k = 0; k < trash.size(); k += 8) checksum += ++trash[k];  // one write per cache line
    const StreamRef stream = e.stream_ordered ? StreamRef(test::SimDevice::stream(1 + e.stream)) : std::nullopt;
    if (e.allocate) {
      const std::optional<uint64_t> a = m.allocate(e.bytes, stream, Origin::kFramework);
      if (!a) {
        const ManagerStats f = m.stats();
        throw std::runtime_error(fmt::format("allocation {} of {} bytes failed: {} MiB mapped, {} MiB idle, {} MiB kept",
                                             e.id, e.bytes, f.mapped >> 20, f.idle >> 20, f.cached >> 20));
      }
      address_of[e.id] = *a;
      if (!track && m.tracking()) {  // the first access after the recorder finished stops tracking
        m.set_sink(&finished);
        const CallScope scope;
        m.touch(&*a, 1, Access::kWrite, stream, "kernel");
      }
    } else {
      const auto it = address_of.find(e.id);
      if (it == address_of.end() || !m.free(it->second, stream)) throw std::runtime_error("a free of nothing");
      address_of.erase(it);
    }
    if ((i & 1023) == 0) dev.run_all();  // the device keeps up: fences pass, nothing piles up
  }
  const ManagerStats s = m.stats();
  Replay r;
  r.calls = s.serve_calls - half_calls;
  r.ns_per_call = r.calls ? double(s.serve_ns - half_ns) / double(r.calls) : 0;
  r.tracking = m.tracking();
  r.peak_mapped = s.peak_mapped;
  r.kept_hits = s.cache_hits;
  r.kept_flushes = s.cache_flushes;
  if (checksum == 42) std::puts("");  // keeps the trash loop
  return r;
}

uint64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string suffix = s.substr(used);
  const uint64_t unit = suffix == "K" ? 1ull << 10 : suffix == "M" ? 1ull << 20 : suffix == "G" ? 1ull << 30 : 1;
  if (!suffix.empty() && unit == 1) throw std::invalid_argument("bad size " + s);
  return static_cast<uint64_t>(v * double(unit));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vcudnn's host cost of serving a recorded PyTorch allocation sequence, on the simulated device"};
  std::string name = "mobilenet_v3_small_benchmark", json_path;
  std::vector<std::string> trash_sizes{"0", "1M", "8M"};
  int reps = 3;
  app.add_option("--trace", name, "tests/data/alloc_NAME.trace");
  app.add_option("--trash", trash_sizes, "bytes written between two calls (K/M/G)")->delimiter(',');
  app.add_option("--reps", reps, "replays per row (the median is reported)")->check(CLI::Range(1, 99));
  app.add_option("--json", json_path, "write the rows as JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    const test::AllocTrace trace = test::read_alloc_trace(name);
    if (trace.events.empty()) throw std::runtime_error("no trace tests/data/alloc_" + name + ".trace");
    nlohmann::json rows = nlohmann::json::array();
    std::printf("%s: %zu events; the second half timed\n", name.c_str(), trace.events.size());
    std::printf("%-9s %-10s %12s %10s %12s %10s %8s\n", "tracking", "trash", "ns/call", "calls", "peak MiB", "kept hits",
                "flushes");
    for (const bool track : {true, false}) {
      for (const std::string& t : trash_sizes) {
        std::vector<double> ns;
        Replay last;
        for (int r = 0; r < reps; ++r) {
          last = replay(trace, track, parse_bytes(t));
          ns.push_back(last.ns_per_call);
        }
        std::sort(ns.begin(), ns.end());
        const double median = ns[ns.size() / 2];
        std::printf("%-9s %-10s %12.0f %10lu %12.1f %10lu %8lu\n", last.tracking ? "on" : "off", t.c_str(), median,
                    static_cast<unsigned long>(last.calls), double(last.peak_mapped) / (1 << 20),
                    static_cast<unsigned long>(last.kept_hits), static_cast<unsigned long>(last.kept_flushes));
        rows.push_back({{"tracking", last.tracking}, {"trash", t}, {"ns_per_call", median}, {"calls", last.calls},
                        {"reps_ns", ns}, {"peak_mapped", last.peak_mapped}, {"kept_hits", last.kept_hits},
                        {"kept_flushes", last.kept_flushes}});
      }
    }
    if (!json_path.empty()) {
      std::string command;
      for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
      std::ifstream cpuinfo("/proc/cpuinfo");
      std::string line, cpu;
      while (cpu.empty() && std::getline(cpuinfo, line))
        if (line.rfind("model name", 0) == 0) cpu = line.substr(line.find(':') + 2);
      std::ofstream(json_path) << nlohmann::json{{"schema", "vcudnn.bench.arena_host/1"}, {"command", command},
                                                 {"cpu", cpu}, {"trace", name}, {"rows", rows}}
                                      .dump(1)
                               << "\n";
      std::printf("wrote %s\n", json_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vcudnn_bench_arena_host: %s\n", e.what());
    return 1;
  }
}
