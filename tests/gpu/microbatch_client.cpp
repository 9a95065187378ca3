// GPU test client for micro-batching: runs a few convolutions (fp32, TF32, bf16, fp16, grouped, 3-D,
// batch 1) forward, backward-data and backward-filter with beta 0 and 1, and writes every output as
// raw float32 so that microbatch_test.cpp can compare a run under VCUDNN_POLICY=microbatch with one
// without vcudnn. Plain cuDNN and CUDA runtime; vcudnn only ever comes in through LD_PRELOAD.
//   usage: vcudnn_microbatch_client --out DIR [--iters N] [--case NAME]
// Prints "ws <case> <kind> <bytes>" per workspace query, "out <case> <kind> beta=<b> n=<n> nan=<n>"
// per output, and "done". Inputs are random (fixed seeds); outputs are refilled before every call
// (NaN for beta 0, random for beta 1) so that a convolution that skips elements shows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "tests/gpu/client_util.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using vcudnn::test::packed_strides;

namespace {

struct CaseSpec {
  const char* name;
  cudnnDataType_t dtype;
  cudnnTensorFormat_t format;
  std::vector<int> x;  // N, C, spatial...
  int k;               // output channels
  std::vector<int> kernel, pad, stride, dilation;
  int groups;
  cudnnMathType_t math;
};

// The batch sizes are chosen against a micro-batch of 5 (VCUDNN_TEST_FORCE_SPLIT=5 in the test):
// 13 is prime, the others leave remainders or (batch 1) cannot be split at all.
std::vector<CaseSpec> case_specs() {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, f16 = CUDNN_DATA_HALF, bf16 = CUDNN_DATA_BFLOAT16;
  const cudnnTensorFormat_t nchw = CUDNN_TENSOR_NCHW, nhwc = CUDNN_TENSOR_NHWC;
  return {
      {"f32_nchw", f32, nchw, {13, 16, 20, 20}, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, CUDNN_FMA_MATH},
      {"f32_nhwc_tf32", f32, nhwc, {32, 32, 14, 14}, 64, {3, 3}, {1, 1}, {2, 2}, {1, 1}, 1, CUDNN_DEFAULT_MATH},
      {"bf16_nhwc", bf16, nhwc, {24, 64, 16, 16}, 64, {1, 1}, {0, 0}, {1, 1}, {1, 1}, 1, CUDNN_TENSOR_OP_MATH},
      {"f16_nchw", f16, nchw, {16, 32, 16, 16}, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, CUDNN_TENSOR_OP_MATH},
      {"f32_grouped", f32, nchw, {12, 32, 12, 12}, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, CUDNN_FMA_MATH},
      {"f32_3d", f32, nchw, {8, 8, 8, 8, 8}, 16, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1, CUDNN_FMA_MATH},
      {"f32_batch1", f32, nchw, {1, 16, 20, 20}, 16, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, CUDNN_FMA_MATH},
  };
}

enum Kind { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };
constexpr int kKinds = 3;
const char* const kKindNames[kKinds] = {"fwd", "bwd_data", "bwd_filter"};
constexpr float kAlpha = 0.75f;
constexpr float kBetas[2] = {0.f, 1.f};

size_t elem_size(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }

size_t count(const std::vector<int>& dims) {
  size_t n = 1;
  for (int d : dims) n *= static_cast<size_t>(d);
  return n;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

// Host conversions; __float2half and __float2bfloat16 round to nearest even.
std::vector<unsigned char> to_dtype(const std::vector<float>& v, cudnnDataType_t t) {
  std::vector<unsigned char> bytes(v.size() * elem_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == CUDNN_DATA_FLOAT) {
      std::memcpy(&bytes[4 * i], &v[i], 4);
    } else if (t == CUDNN_DATA_HALF) {
      const __half h = __float2half(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    } else {
      const __nv_bfloat16 h = __float2bfloat16(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

std::vector<float> to_float(const std::vector<unsigned char>& bytes, cudnnDataType_t t) {
  const size_t n = bytes.size() / elem_size(t);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == CUDNN_DATA_FLOAT) {
      std::memcpy(&v[i], &bytes[4 * i], 4);
    } else if (t == CUDNN_DATA_HALF) {
      __half h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = __half2float(h);
    } else {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = __bfloat162float(h);
    }
  }
  return v;
}

// The dtype's quiet NaN in every element.
std::vector<unsigned char> nan_fill(size_t n, cudnnDataType_t t) {
  std::vector<unsigned char> bytes(n * elem_size(t));
  const uint32_t f32 = 0x7fc00000u;
  const uint16_t f16 = 0x7e00u, bf16 = 0x7fc0u;
  for (size_t i = 0; i < n; ++i) {
    if (t == CUDNN_DATA_FLOAT)
      std::memcpy(&bytes[4 * i], &f32, 4);
    else
      std::memcpy(&bytes[2 * i], t == CUDNN_DATA_HALF ? &f16 : &bf16, 2);
  }
  return bytes;
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

DevicePtr device_alloc(size_t bytes) {
  if (bytes == 0) return DevicePtr(nullptr);
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  return DevicePtr(p);
}

DevicePtr device_copy(const std::vector<unsigned char>& host) {
  DevicePtr d = device_alloc(host.size());
  CHECK_CUDA(cudaMemcpy(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
  return d;
}

struct TensorDeleter {
  void operator()(cudnnTensorDescriptor_t d) const { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDeleter {
  void operator()(cudnnFilterDescriptor_t d) const { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDeleter {
  void operator()(cudnnConvolutionDescriptor_t d) const { cudnnDestroyConvolutionDescriptor(d); }
};
using TensorDesc = std::unique_ptr<std::remove_pointer_t<cudnnTensorDescriptor_t>, TensorDeleter>;
using FilterDesc = std::unique_ptr<std::remove_pointer_t<cudnnFilterDescriptor_t>, FilterDeleter>;
using ConvDesc = std::unique_ptr<std::remove_pointer_t<cudnnConvolutionDescriptor_t>, ConvDeleter>;

// One output buffer of one kind and beta, with what it is refilled with before every call.
struct Output {
  std::vector<unsigned char> prefill;
  DevicePtr dev;
};

struct Conv {
  const CaseSpec* spec = nullptr;
  TensorDesc xd, yd;
  FilterDesc wd;
  ConvDesc cd[kKinds];  // one per kind: each carries the math type of its own algorithm
  std::vector<int> ydims, wdims;
  DevicePtr x, w, dy;
  int algo[kKinds] = {0, 0, 0};
  size_t ws_bytes[kKinds] = {0, 0, 0};
  DevicePtr ws[kKinds];
  Output out[kKinds][2];  // [kind][beta]
};

void describe(Conv& c) {
  const CaseSpec& s = *c.spec;
  const int nb = static_cast<int>(s.x.size());
  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&xd));
  c.xd.reset(xd);
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&yd));
  c.yd.reset(yd);
  CHECK_CUDNN(cudnnCreateFilterDescriptor(&wd));
  c.wd.reset(wd);
  const auto xs = packed_strides(s.x, s.format);
  CHECK_CUDNN(cudnnSetTensorNdDescriptor(xd, s.dtype, nb, s.x.data(), xs.data()));
  c.wdims = {s.k, s.x[1] / s.groups};
  c.wdims.insert(c.wdims.end(), s.kernel.begin(), s.kernel.end());
  CHECK_CUDNN(cudnnSetFilterNdDescriptor(wd, s.dtype, s.format, nb, c.wdims.data()));
  for (auto& cd_slot : c.cd) {
    cudnnConvolutionDescriptor_t cd = nullptr;
    CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&cd));
    cd_slot.reset(cd);
    CHECK_CUDNN(cudnnSetConvolutionNdDescriptor(cd, nb - 2, s.pad.data(), s.stride.data(), s.dilation.data(),
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CHECK_CUDNN(cudnnSetConvolutionGroupCount(cd, s.groups));
    CHECK_CUDNN(cudnnSetConvolutionMathType(cd, s.math));
  }
  c.ydims.resize(nb);
  CHECK_CUDNN(cudnnGetConvolutionNdForwardOutputDim(c.cd[0].get(), xd, wd, nb, c.ydims.data()));
  const auto ys = packed_strides(c.ydims, s.format);
  CHECK_CUDNN(cudnnSetTensorNdDescriptor(yd, s.dtype, nb, c.ydims.data(), ys.data()));
}

// The first heuristic row that cuDNN can run. A case that asks for FMA math takes only FMA rows:
// the reference of a 1e-5 tolerance must not silently use TF32.
template <typename Perf>
const Perf& pick(const std::vector<Perf>& rows, int n, const CaseSpec& s, Kind kind) {
  for (int i = 0; i < n; ++i)
    if (rows[i].status == CUDNN_STATUS_SUCCESS && (s.math != CUDNN_FMA_MATH || rows[i].mathType == CUDNN_FMA_MATH))
      return rows[i];
  std::fprintf(stderr, "%s %s: no usable algorithm among %d heuristic rows\n", s.name, kKindNames[kind], n);
  std::exit(1);
}

void choose_algorithms(cudnnHandle_t h, Conv& c) {
  const CaseSpec& s = *c.spec;
  int max_fwd = 0, max_bd = 0, max_bf = 0, n = 0;
  CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_fwd));
  CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_bd));
  CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_bf));
  cudnnConvolutionDescriptor_t fcd = c.cd[kFwd].get(), dcd = c.cd[kBwdData].get(), wcd = c.cd[kBwdFilter].get();

  std::vector<cudnnConvolutionFwdAlgoPerf_t> fp(max_fwd);
  CHECK_CUDNN(
      cudnnGetConvolutionForwardAlgorithm_v7(h, c.xd.get(), c.wd.get(), fcd, c.yd.get(), max_fwd, &n, fp.data()));
  const auto& f = pick(fp, n, s, kFwd);
  c.algo[kFwd] = f.algo;
  CHECK_CUDNN(cudnnSetConvolutionMathType(fcd, f.mathType));
  CHECK_CUDNN(
      cudnnGetConvolutionForwardWorkspaceSize(h, c.xd.get(), c.wd.get(), fcd, c.yd.get(), f.algo, &c.ws_bytes[kFwd]));

  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> dp(max_bd);
  CHECK_CUDNN(
      cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.wd.get(), c.yd.get(), dcd, c.xd.get(), max_bd, &n, dp.data()));
  const auto& d = pick(dp, n, s, kBwdData);
  c.algo[kBwdData] = d.algo;
  CHECK_CUDNN(cudnnSetConvolutionMathType(dcd, d.mathType));
  CHECK_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.wd.get(), c.yd.get(), dcd, c.xd.get(), d.algo,
                                                           &c.ws_bytes[kBwdData]));

  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> wp(max_bf);
  CHECK_CUDNN(
      cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.xd.get(), c.yd.get(), wcd, c.wd.get(), max_bf, &n, wp.data()));
  const auto& w = pick(wp, n, s, kBwdFilter);
  c.algo[kBwdFilter] = w.algo;
  CHECK_CUDNN(cudnnSetConvolutionMathType(wcd, w.mathType));
  CHECK_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.xd.get(), c.yd.get(), wcd, c.wd.get(), w.algo,
                                                             &c.ws_bytes[kBwdFilter]));

  for (int k = 0; k < kKinds; ++k) {
    std::printf("ws %s %s %zu\n", s.name, kKindNames[k], c.ws_bytes[k]);
    c.ws[k] = device_alloc(c.ws_bytes[k]);
  }
}

void setup(cudnnHandle_t h, Conv& c, uint32_t seed) {
  const CaseSpec& s = *c.spec;
  describe(c);
  const size_t nx = count(s.x), nw = count(c.wdims), ny = count(c.ydims);
  c.x = device_copy(to_dtype(random_floats(nx, seed + 1), s.dtype));
  c.w = device_copy(to_dtype(random_floats(nw, seed + 2), s.dtype));
  c.dy = device_copy(to_dtype(random_floats(ny, seed + 3), s.dtype));
  const size_t out_count[kKinds] = {ny, nx, nw};  // y, dx, dw
  for (int k = 0; k < kKinds; ++k) {
    c.out[k][0].prefill = nan_fill(out_count[k], s.dtype);
    c.out[k][1].prefill = to_dtype(random_floats(out_count[k], seed + 4 + k), s.dtype);
    for (auto& o : c.out[k]) o.dev = device_alloc(o.prefill.size());
  }
  choose_algorithms(h, c);
}

void run_once(cudnnHandle_t h, cudaStream_t stream, Conv& c) {
  for (int k = 0; k < kKinds; ++k) {
    for (int b = 0; b < 2; ++b) {
      Output& o = c.out[k][b];
      // The host buffers outlive the program's use of them; a pageable copy is staged before it returns.
      CHECK_CUDA(cudaMemcpyAsync(o.dev.get(), o.prefill.data(), o.prefill.size(), cudaMemcpyHostToDevice, stream));
      const float beta = kBetas[b];
      cudnnConvolutionDescriptor_t cd = c.cd[k].get();
      if (k == kFwd)
        CHECK_CUDNN(cudnnConvolutionForward(h, &kAlpha, c.xd.get(), c.x.get(), c.wd.get(), c.w.get(), cd,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(c.algo[k]), c.ws[k].get(),
                                            c.ws_bytes[k], &beta, c.yd.get(), o.dev.get()));
      else if (k == kBwdData)
        CHECK_CUDNN(cudnnConvolutionBackwardData(h, &kAlpha, c.wd.get(), c.w.get(), c.yd.get(), c.dy.get(), cd,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo[k]), c.ws[k].get(),
                                                 c.ws_bytes[k], &beta, c.xd.get(), o.dev.get()));
      else
        CHECK_CUDNN(cudnnConvolutionBackwardFilter(h, &kAlpha, c.xd.get(), c.x.get(), c.yd.get(), c.dy.get(), cd,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo[k]),
                                                   c.ws[k].get(), c.ws_bytes[k], &beta, c.wd.get(), o.dev.get()));
    }
  }
}

void write_outputs(const Conv& c, const std::string& dir) {
  const CaseSpec& s = *c.spec;
  for (int k = 0; k < kKinds; ++k) {
    for (int b = 0; b < 2; ++b) {
      const Output& o = c.out[k][b];
      std::vector<unsigned char> host(o.prefill.size());
      CHECK_CUDA(cudaMemcpy(host.data(), o.dev.get(), host.size(), cudaMemcpyDeviceToHost));
      const std::vector<float> v = to_float(host, s.dtype);
      size_t nan = 0;
      for (float f : v) nan += std::isnan(f) ? 1 : 0;
      const std::string path = dir + "/" + s.name + "." + kKindNames[k] + ".beta" + std::to_string(b) + ".f32";
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(v.data(), sizeof(float), v.size(), f) != v.size() || std::fclose(f) != 0) {
        std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
        std::exit(1);
      }
      std::printf("out %s %s beta=%d n=%zu nan=%zu\n", s.name, kKindNames[k], b, v.size(), nan);
    }
  }
}

int usage(const char* msg) {
  std::fprintf(stderr, "%s\nusage: vcudnn_microbatch_client --out DIR [--iters N] [--case NAME]\n", msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir, only_case;
  int iters = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value or unknown argument: " + a).c_str());
    if (a == "--out")
      out_dir = argv[++i];
    else if (a == "--iters")
      iters = std::atoi(argv[++i]);
    else if (a == "--case")
      only_case = argv[++i];
    else
      return usage(("unknown argument: " + a).c_str());
  }
  if (out_dir.empty()) return usage("--out is required");
  if (iters < 1) return usage("--iters must be at least 1");

  // Seeds follow a case's place in the full list, so that --case reproduces the same numbers.
  std::vector<CaseSpec> specs;
  std::vector<uint32_t> seeds;
  const std::vector<CaseSpec> all = case_specs();
  for (size_t i = 0; i < all.size(); ++i) {
    if (!only_case.empty() && only_case != all[i].name) continue;
    specs.push_back(all[i]);
    seeds.push_back(100u * static_cast<uint32_t>(i + 1));
  }
  if (specs.empty()) return usage(("unknown case: " + only_case).c_str());

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t h = nullptr;
  CHECK_CUDNN(cudnnCreate(&h));
  CHECK_CUDNN(cudnnSetStream(h, stream));
  {
    std::vector<Conv> convs(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      convs[i].spec = &specs[i];
      setup(h, convs[i], seeds[i]);
    }
    for (int it = 0; it < iters; ++it)
      for (auto& c : convs) run_once(h, stream, c);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    for (const auto& c : convs) write_outputs(c, out_dir);
  }
  CHECK_CUDNN(cudnnDestroy(h));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("done\n");
  return 0;
}
