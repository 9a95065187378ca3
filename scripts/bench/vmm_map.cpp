// What the CUDA virtual-memory calls cost that vcudnn's arena makes for every eviction and restore
// (Note [Extents under a budget], pool/vmm_arena.h): cuMemCreate, cuMemMap, cuMemSetAccess and
// cuMemUnmap for N granules, once as one allocation (an extent) and once as N allocations of one
// granule mapped side by side, and whether cuMemUnmap waits for work queued on the device.
//   vcudnn_bench_vmm_map [--out FILE.json]
// Prints a table (microseconds per call sequence, median of 5) and writes it as JSON.
#include <cuda.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "vmm_map: %s failed: %s\n", what, name ? name : "?");
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  uint64_t granules = 0;
  double extent_map = 0, extent_access = 0, extent_unmap = 0, extent_create = 0;
  double granules_map = 0, granules_access = 0, granules_unmap = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (!ok(cuInit(0), "cuInit") || !ok(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
      !ok(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
      !ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
    return 1;
  char name[256] = {};
  cuDeviceGetName(name, sizeof name, dev);
  int driver = 0;
  cuDriverGetVersion(&driver);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  if (!ok(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")) return 1;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va = 0;
  const size_t range = 1024 * g;
  if (!ok(cuMemAddressReserve(&va, range, 0, 0, 0), "cuMemAddressReserve")) return 1;

  // What a static placement (planner/placement.h) may ask of the driver: one allocation mapped whole
  // at two ranges at once (the same bytes through both), and part of an allocation (cuMemMap's offset).
  nlohmann::json aliasing;
  {
    CUmemGenericAllocationHandle h = 0;
    bool whole_twice = false, bytes_shared = false, part = false;
    if (ok(cuMemCreate(&h, 2 * g, &prop, 0), "cuMemCreate (aliasing)")) {
      const CUdeviceptr a = va, b = va + 4 * g, c = va + 8 * g;
      const bool first = ok(cuMemMap(a, 2 * g, 0, h, 0), "cuMemMap (first range)") &&
                         ok(cuMemSetAccess(a, 2 * g, &access, 1), "cuMemSetAccess (first range)");
      whole_twice = first && ok(cuMemMap(b, 2 * g, 0, h, 0), "cuMemMap (the same allocation, second range)") &&
                    ok(cuMemSetAccess(b, 2 * g, &access, 1), "cuMemSetAccess (second range)");
      if (whole_twice) {
        std::vector<unsigned char> got(16, 0);
        bytes_shared = ok(cuMemsetD8(a, 0x5a, 2 * g), "cuMemsetD8") && ok(cuCtxSynchronize(), "sync") &&
                       ok(cuMemcpyDtoH(got.data(), b + g, got.size()), "cuMemcpyDtoH") &&
                       std::all_of(got.begin(), got.end(), [](unsigned char x) { return x == 0x5a; });
      }
      part = cuMemMap(c, g, g, h, 0) == CUDA_SUCCESS;  // its second granule alone
      if (part) cuMemUnmap(c, g);
      if (whole_twice) cuMemUnmap(b, 2 * g);
      if (first) cuMemUnmap(a, 2 * g);
      cuMemRelease(h);
    }
    aliasing = {{"whole_at_two_ranges", whole_twice}, {"bytes_shared", bytes_shared}, {"part_with_offset", part}};
    std::printf(
        "aliasing: one allocation mapped whole at two ranges: %s (bytes shared: %s); part of one (offset): %s\n",
        whole_twice ? "yes" : "no", bytes_shared ? "yes" : "no", part ? "yes" : "no");
  }

  std::vector<Row> rows;
  for (uint64_t n : {1, 4, 16, 64, 256}) {
    const size_t bytes = n * g;
    std::vector<double> ec, em, ea, eu, gm, ga, gu;
    for (int rep = 0; rep < 6; ++rep) {
      CUmemGenericAllocationHandle h = 0;
      double t0 = now_us();
      if (!ok(cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate")) return 1;
      double t1 = now_us();
      if (!ok(cuMemMap(va, bytes, 0, h, 0), "cuMemMap")) return 1;
      double t2 = now_us();
      if (!ok(cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess")) return 1;
      double t3 = now_us();
      if (!ok(cuMemUnmap(va, bytes), "cuMemUnmap")) return 1;
      double t4 = now_us();
      cuMemRelease(h);
      std::vector<CUmemGenericAllocationHandle> hs(n);
      for (auto& x : hs)
        if (!ok(cuMemCreate(&x, g, &prop, 0), "cuMemCreate")) return 1;
      double u0 = now_us();
      for (uint64_t i = 0; i < n; ++i)
        if (!ok(cuMemMap(va + i * g, g, 0, hs[i], 0), "cuMemMap")) return 1;
      double u1 = now_us();
      if (!ok(cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess")) return 1;
      double u2 = now_us();
      for (uint64_t i = 0; i < n; ++i)
        if (!ok(cuMemUnmap(va + i * g, g), "cuMemUnmap")) return 1;
      double u3 = now_us();
      for (auto x : hs) cuMemRelease(x);
      if (rep == 0) continue;  // warm-up
      ec.push_back(t1 - t0), em.push_back(t2 - t1), ea.push_back(t3 - t2), eu.push_back(t4 - t3);
      gm.push_back(u1 - u0), ga.push_back(u2 - u1), gu.push_back(u3 - u2);
    }
    rows.push_back({n, median(em), median(ea), median(eu), median(ec), median(gm), median(ga), median(gu)});
  }

  // Does cuMemUnmap wait for queued device work? 64 granules unmapped while a long memset runs.
  CUstream s = nullptr;
  CUdeviceptr big = 0;
  const size_t big_bytes = size_t{8} << 30;
  bool busy_after_unmap = false;
  double unmap_busy_us = 0, busy_ms = 0;
  if (ok(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate") &&
      ok(cuMemAlloc(&big, big_bytes), "cuMemAlloc")) {
    std::vector<CUmemGenericAllocationHandle> hs(64);
    for (uint64_t i = 0; i < 64; ++i) {
      cuMemCreate(&hs[i], g, &prop, 0);
      cuMemMap(va + i * g, g, 0, hs[i], 0);
    }
    cuMemSetAccess(va, 64 * g, &access, 1);
    cuCtxSynchronize();
    const double t0 = now_us();
    for (int k = 0; k < 8; ++k) cuMemsetD8Async(big, static_cast<unsigned char>(k), big_bytes, s);
    const double t1 = now_us();
    for (uint64_t i = 0; i < 64; ++i) cuMemUnmap(va + i * g, g);
    const double t2 = now_us();
    busy_after_unmap = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    cuStreamSynchronize(s);
    const double t3 = now_us();
    unmap_busy_us = t2 - t1;
    busy_ms = (t3 - t0) / 1e3;
    for (auto x : hs) cuMemRelease(x);
    cuMemFree(big);
  }

  std::printf("%s, driver %d, granularity %zu KiB; microseconds, median of 5\n", name, driver, g >> 10);
  std::printf(
      "| granules | one allocation: create | map | set access | unmap | one per granule: map | set access | unmap |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  nlohmann::json j = {{"schema", "vcudnn.bench.vmm_map/1"},
                      {"gpu", name},
                      {"driver", driver},
                      {"granularity", g},
                      {"command", "vcudnn_bench_vmm_map"},
                      {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) {
    std::printf("| %lu | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", static_cast<unsigned long>(r.granules),
                r.extent_create, r.extent_map, r.extent_access, r.extent_unmap, r.granules_map, r.granules_access,
                r.granules_unmap);
    j["rows"].push_back({{"granules", r.granules},
                         {"extent_create_us", r.extent_create},
                         {"extent_map_us", r.extent_map},
                         {"extent_set_access_us", r.extent_access},
                         {"extent_unmap_us", r.extent_unmap},
                         {"granules_map_us", r.granules_map},
                         {"granules_set_access_us", r.granules_access},
                         {"granules_unmap_us", r.granules_unmap}});
  }
  std::printf("64 granules unmapped one by one while %.0f ms of memsets run: %.0f us; device still busy after: %s\n",
              busy_ms, unmap_busy_us, busy_after_unmap ? "yes (cuMemUnmap did not wait for it)" : "no");
  j["unmap_while_busy"] = {{"us", unmap_busy_us}, {"device_busy_after", busy_after_unmap}, {"work_ms", busy_ms}};
  j["aliasing"] = aliasing;
  if (!out.empty()) std::ofstream(out) << j.dump(1) << "\n";
  return 0;
}
