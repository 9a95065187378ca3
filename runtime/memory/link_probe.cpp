// measure_link (link_probe.h).
//
// Note [Measuring the host link]
// Once, when memory ownership starts, before the program has queued much: 8 MiB copied four times
// each way between a device buffer and pinned host memory, timed with events on vcudnn's own copy
// streams (out for device-to-host, in for host-to-device), after one untimed copy each way; then
// both directions at once (the sum of bytes over the longer of the two). The host waits for the
// copies here, at start only (the hot path never does). The buffers are CUDA's own (real
// cudaMalloc and cudaMallocHost, freed at once), outside the arena and budget.
// With 32 MiB copied twice (64 MiB pinned) the H100 took 38, 43 and 128 ms in three runs and found
// 54-55 GB/s each way and 90-100 GB/s both at once; most of that time is pinning the host buffer,
// not copying (32 MiB at 55 GB/s is 0.6 ms), so the buffers are now a quarter of that size and
// the log line splits the time into setting up and copying. An 8 MiB copy is long enough for the
// link's rate (a copy's fixed cost is a few microseconds against 150 us of transfer).
// The measurement is done three times and each direction keeps its best: one process of nine in a
// benchmark run on the H100 (2026-11-25) measured 28.6, 24.7 and 42.9 GB/s in a single round while
// the others found 54, 54 and 98, and its trace's plans and lower bounds took twice the time the
// link needs. Three rounds copy for about 6 ms.
#include "runtime/memory/link_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "runtime/cuda_check.h"
#include "runtime/log.h"
#include "runtime/real_api.h"

namespace vcudnn::memory {
namespace {

constexpr size_t kBytes = 8ull << 20;
constexpr int kCopies = 4;
constexpr int kRounds = 3;

std::mutex g_mu;
std::optional<LinkBandwidth> g_link;

bool ok(cudaError_t e, const char* what) { return cuda_ok(e, "offload: measuring the host link", what); }

// Everything the probe allocates, released whatever happens.
struct Probe {
  const RealCudart& rt = real_cudart();
  void* device = nullptr;
  void* host = nullptr;
  cudaEvent_t start = nullptr, out_end = nullptr, in_end = nullptr;
  ~Probe() {
    for (cudaEvent_t e : {start, out_end, in_end})
      if (e) rt.cudaEventDestroy(e);
    if (device) rt.cudaFree(device);
    if (host) rt.cudaFreeHost(host);
  }

  bool copies(cudaStream_t stream, cudaMemcpyKind kind, int n) {
    char* d = static_cast<char*>(device);
    char* h = static_cast<char*>(host);
    for (int i = 0; i < n; ++i) {
      // Each direction its own halves, so that both at once never touch the same bytes.
      const cudaError_t e = kind == cudaMemcpyDeviceToHost
                                ? rt.cudaMemcpyAsync(h, d, kBytes, kind, stream)
                                : rt.cudaMemcpyAsync(d + kBytes, h + kBytes, kBytes, kind, stream);
      if (!ok(e, "cudaMemcpyAsync")) return false;
    }
    return true;
  }

  // One direction alone: GB/s, or 0 when a call failed.
  double alone(cudaStream_t stream, cudaMemcpyKind kind) {
    float ms = 0;
    if (!ok(rt.cudaEventRecord(start, stream), "cudaEventRecord") || !copies(stream, kind, kCopies) ||
        !ok(rt.cudaEventRecord(out_end, stream), "cudaEventRecord") ||
        !ok(rt.cudaEventSynchronize(out_end), "cudaEventSynchronize") ||
        !ok(rt.cudaEventElapsedTime(&ms, start, out_end), "cudaEventElapsedTime") || ms <= 0)
      return 0;
    return static_cast<double>(kCopies * kBytes) / (ms * 1e6);
  }

  // Both at once: the in stream starts with the out stream (it waits for the start event).
  double both(cudaStream_t out, cudaStream_t in) {
    float out_ms = 0, in_ms = 0;
    if (!ok(rt.cudaEventRecord(start, out), "cudaEventRecord") ||
        !ok(rt.cudaStreamWaitEvent(in, start, 0), "cudaStreamWaitEvent") ||
        !copies(out, cudaMemcpyDeviceToHost, kCopies) || !copies(in, cudaMemcpyHostToDevice, kCopies) ||
        !ok(rt.cudaEventRecord(out_end, out), "cudaEventRecord") ||
        !ok(rt.cudaEventRecord(in_end, in), "cudaEventRecord") ||
        !ok(rt.cudaEventSynchronize(out_end), "cudaEventSynchronize") ||
        !ok(rt.cudaEventSynchronize(in_end), "cudaEventSynchronize") ||
        !ok(rt.cudaEventElapsedTime(&out_ms, start, out_end), "cudaEventElapsedTime") ||
        !ok(rt.cudaEventElapsedTime(&in_ms, start, in_end), "cudaEventElapsedTime"))
      return 0;
    const double ms = std::max(out_ms, in_ms);
    return ms > 0 ? static_cast<double>(2 * kCopies * kBytes) / (ms * 1e6) : 0;
  }
};

}  // namespace

std::optional<LinkBandwidth> measure_link(cudaStream_t out, cudaStream_t in) {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    Probe p;
    const RealCudart& rt = p.rt;
    if (!rt.cudaMalloc || !rt.cudaFree || !rt.cudaMallocHost || !rt.cudaFreeHost || !rt.cudaMemcpyAsync ||
        !rt.cudaEventCreateWithFlags || !rt.cudaEventRecord || !rt.cudaEventSynchronize || !rt.cudaEventElapsedTime ||
        !rt.cudaStreamWaitEvent || !rt.cudaEventDestroy)
      return std::nullopt;
    if (!ok(rt.cudaMalloc(&p.device, 2 * kBytes), "cudaMalloc") ||
        !ok(rt.cudaMallocHost(&p.host, 2 * kBytes), "cudaMallocHost") ||
        !ok(rt.cudaEventCreateWithFlags(&p.start, cudaEventDefault), "cudaEventCreateWithFlags") ||
        !ok(rt.cudaEventCreateWithFlags(&p.out_end, cudaEventDefault), "cudaEventCreateWithFlags") ||
        !ok(rt.cudaEventCreateWithFlags(&p.in_end, cudaEventDefault), "cudaEventCreateWithFlags"))
      return std::nullopt;
    // Untimed first copies (the driver maps the pinned pages for the device on first use).
    if (!p.copies(out, cudaMemcpyDeviceToHost, 1) || !p.copies(in, cudaMemcpyHostToDevice, 1)) return std::nullopt;
    const auto t1 = std::chrono::steady_clock::now();
    // The best of a few rounds: a link only seems slower than it is (another process copying, the
    // host busy at the program's start), never faster.
    LinkBandwidth link;
    for (int round = 0; round < kRounds; ++round) {
      const double out_gbs = p.alone(out, cudaMemcpyDeviceToHost);
      const double in_gbs = p.alone(in, cudaMemcpyHostToDevice);
      const double both_gbs = p.both(out, in);
      if (out_gbs <= 0 || in_gbs <= 0 || both_gbs <= 0) return std::nullopt;
      link.device_to_host = std::max(link.device_to_host, out_gbs);
      link.host_to_device = std::max(link.host_to_device, in_gbs);
      link.both = std::max(link.both, both_gbs);
    }
    const auto t2 = std::chrono::steady_clock::now();
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    VCUDNN_LOG_INFO(
        "offload: host link measured in {:.1f} ms ({:.1f} setting up, {:.1f} copying): {:.1f} GB/s device to "
        "host, {:.1f} GB/s host to device, {:.1f} GB/s both at once (pinned)",
        ms(t0, t2), ms(t0, t1), ms(t1, t2), link.device_to_host, link.host_to_device, link.both);
    return link;
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<LinkBandwidth> measured_link() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_link;
}

void set_measured_link(const LinkBandwidth& link) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_link = link;
}

}  // namespace vcudnn::memory
