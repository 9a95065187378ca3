// benchmark_kernel (see header). Every CUDA and cuDNN status is checked; vcudnn's own failures
// are cleared from CUDA's last-error slot so the framework never sees them.
#include "runtime/benchmarker.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "runtime/conv_descriptors.h"
#include "runtime/decode_conv.h"
#include "runtime/log.h"
#include "runtime/no_destroy.h"
#include "runtime/own_memory.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

using DeviceInfo = BenchDevice;

Result<DeviceInfo> device_info() {
  const RealCudart& rt = real_cudart();
  if (!rt.cudaGetDevice || !rt.cudaGetDeviceProperties) return Error{"the CUDA runtime is not available"};
  int dev = 0;
  if (rt.cudaGetDevice(&dev) != cudaSuccess) {
    rt.cudaGetLastError();
    return Error{"cudaGetDevice failed"};
  }
  struct Cache {
    std::mutex mu;
    std::map<int, DeviceInfo> by_device;
  };
  static NoDestroy<Cache> cache;
  std::lock_guard<std::mutex> lock(cache->mu);
  if (auto it = cache->by_device.find(dev); it != cache->by_device.end()) return it->second;
  cudaDeviceProp prop{};
  if (rt.cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    rt.cudaGetLastError();
    return Error{"cudaGetDeviceProperties failed"};
  }
  DeviceInfo info{prop.name, prop.multiProcessorCount};
  cache->by_device[dev] = info;
  return info;
}

// A device buffer of vcudnn's own for the duration of one benchmark (cudaMalloc / cudaFree
// semantics; from the arena when the process's memory is owned: runtime/own_memory.h).
class DeviceBuffer {
 public:
  bool allocate(uint64_t bytes) {
    if (bytes == 0) return true;
    ptr_ = allocate_own(bytes, std::nullopt);
    return ptr_ != nullptr;
  }
  ~DeviceBuffer() { free_own(ptr_, std::nullopt); }
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

uint64_t output_bytes(const ConvLayer& layer, ConvKind kind) {
  switch (kind) {
    case ConvKind::kForward:
      return tensor_span_bytes(layer.y);
    case ConvKind::kBackwardData:
      return tensor_span_bytes(layer.x);
    case ConvKind::kBackwardFilter: {
      uint64_t n = element_bytes(layer.w.dtype);
      for (int i = 0; i < layer.w.nb_dims; ++i) n *= static_cast<uint64_t>(layer.w.dims[i]);
      return n;
    }
  }
  return 0;
}

int max_algorithms(const ConvCall& call) {
  MaxCountQuery q{call.kind, call.handle, nullptr};
  int count = 0;
  q.count = &count;
  if (call_real(q) != CUDNN_STATUS_SUCCESS || count <= 0) return 8;
  return std::min(count, 64);
}

}  // namespace

Result<BenchDevice> bench_device() { return device_info(); }

bool math_type_compatible(int32_t layer, int32_t row) {
  if (row == layer || layer == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return true;
  const auto tensor_core_ok = [](int32_t m) { return m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH; };
  return tensor_core_ok(layer) && tensor_core_ok(row);
}

Result<BenchOutcome> benchmark_kernel(const ConvCall& call, const ConvLayer& layer, const std::vector<int32_t>& batches,
                                      uint64_t cap, BenchCache* cache) {
  auto dev = device_info();
  if (!dev) return dev.error();
  BenchOutcome out;
  out.measurements.mini_batch = static_cast<int32_t>(layer.x.dims[0]);
  out.cap = cap;
  BenchKey key{
      dev->name, dev->sm_count, static_cast<int32_t>(real().cudnnGetVersion()), "", static_cast<int32_t>(call.kind), 0};

  std::vector<int32_t> todo;
  std::vector<int32_t> sizes = batches;
  std::sort(sizes.rbegin(), sizes.rend());  // largest first: one scratch allocation serves all
  for (int32_t b : sizes) {
    key.layer = nlohmann::json(micro_layer(layer, b)).dump();
    key.micro_batch = b;
    if (cache) {
      // Exactly this cap: cuDNN 9's legacy algorithms adapt their workspace to what is offered
      // (measured on H100: bf16 backward-filter ALGO_1 takes 17 MiB when offered 512 MiB, 2 MiB
      // when offered 8 MiB), so a search under a larger cap does not answer a smaller one.
      if (auto rows = cache->lookup(key, cap, /*exact=*/true)) {
        auto& kernels = out.measurements.by_batch[b];
        for (const auto& r : *rows) kernels.push_back({r.algo, b, r.time_ms, r.workspace, r.math_type});
        ++out.cache_hits;
        continue;
      }
    }
    todo.push_back(b);
  }
  if (todo.empty()) return out;

  // Scratch: the output at the largest size, and a workspace of the cap (less if memory is short).
  DeviceBuffer scratch, workspace;
  void* output = nullptr;
  if (scratch.allocate(output_bytes(layer, call.kind))) {
    output = scratch.get();
  } else {
    const int32_t dtype = call.kind == ConvKind::kBackwardFilter ? layer.w.dtype : layer.x.dtype;
    if (read_scaling(call.beta, dtype) != 0.0)
      return Error{"no device memory for a scratch output, and the caller's output holds data (beta != 0)"};
    // beta == 0: the caller's output is overwritten by the real call right after; search into it.
    output = call.kind == ConvKind::kForward ? call.y : call.kind == ConvKind::kBackwardData ? call.x : call.w;
  }
  uint64_t ws_cap = cap;
  while (ws_cap > 0 && !workspace.allocate(ws_cap)) ws_cap /= 2;
  if (ws_cap < cap) {
    VCUDNN_WARN_LIMITED(
        "micro-batch benchmark: only {} of {} bytes of workspace could be allocated; "
        "algorithms needing more are not considered",
        ws_cap, cap);
    out.cap = ws_cap;
  }

  auto filter = OwnedFilter::make(layer.w);
  auto conv = OwnedConvolution::make(layer.conv, -1);
  if (!filter) return filter.error();
  if (!conv) return conv.error();
  const int requested = max_algorithms(call);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(requested));

  for (int32_t b : todo) {
    auto x = OwnedTensor::make(layer.x, b);
    auto y = OwnedTensor::make(layer.y, b);
    if (!x) return x.error();
    if (!y) return y.error();
    AlgoQuery q;
    q.kind = call.kind;
    q.variant = QueryVariant::kFindEx;
    q.handle = call.handle;
    q.desc = {x.value()->get(), filter.value()->get(), conv.value()->get(), y.value()->get()};
    q.x = call.kind == ConvKind::kBackwardData ? output : call.x;
    q.w = call.kind == ConvKind::kBackwardFilter ? output : call.w;
    q.y = call.kind == ConvKind::kForward ? output : call.y;
    q.requested = requested;
    q.perf = perf.data();
    q.workspace = workspace.get();
    q.workspace_bytes = ws_cap;
    // Two searches; the faster time of each (algorithm, math type) is kept, so that one noisy
    // run cannot make the DP pick a split.
    std::map<std::pair<int32_t, int32_t>, BenchRow> best;
    for (int run = 0; run < 2; ++run) {
      int returned = 0;
      q.returned = &returned;
      cudnnStatus_t st = call_real(q);
      if (st != CUDNN_STATUS_SUCCESS)
        return Error{std::string("cudnnFind*AlgorithmEx at micro-batch ") + std::to_string(b) +
                     " failed: " + cudnn_status_name(st)};
      for (const AlgoPerf& p : read_perf(q, returned)) {
        if (p.status != CUDNN_STATUS_SUCCESS || p.memory > ws_cap || p.time_ms < 0) continue;
        if (!math_type_compatible(layer.conv.math_type, p.math_type)) continue;
        BenchRow row{p.algo, p.math_type, p.determinism, p.time_ms, p.memory};
        auto [it, inserted] = best.try_emplace({p.algo, p.math_type}, row);
        if (!inserted && row.time_ms < it->second.time_ms) it->second = row;
      }
    }
    std::vector<BenchRow> rows;
    for (auto& [k, r] : best) rows.push_back(r);
    std::sort(rows.begin(), rows.end(), [](const BenchRow& a, const BenchRow& c) { return a.time_ms < c.time_ms; });
    auto& kernels = out.measurements.by_batch[b];
    for (const auto& r : rows) kernels.push_back({r.algo, b, r.time_ms, r.workspace, r.math_type});
    ++out.measured;
    if (cache) {
      key.layer = nlohmann::json(micro_layer(layer, b)).dump();
      key.micro_batch = b;
      std::string error;
      if (!cache->store(key, out.cap, rows, &error)) VCUDNN_WARN_LIMITED("benchmark cache: {}", error);
    }
  }
  return out;
}

}  // namespace vcudnn
