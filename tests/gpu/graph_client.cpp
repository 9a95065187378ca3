// GPU test client for graph-API (backend) convolutions: builds one convolution the way PyTorch's
// default path does (cudnn-frontend under Conv_v8.cpp): x, w, y tensors with unique ids and
// 16-byte alignment, a convolution, one operation, an operation graph, heuristics (mode A, then
// FALLBACK), and the first engine configuration whose execution plan finalizes; then a variant
// pack and cudnnBackendExecute. Plain cuDNN and CUDA runtime: vcudnn only ever comes in through
// LD_PRELOAD (graph_test.cpp runs it both ways and compares the raw outputs).
//   usage: vcudnn_graph_client --kind fwd|bwd-data|bwd-filter --out FILE [--n N --c C --k K --h H --w W
//          --r R --s S --pad P --stride U --dilation D --groups G --layout nchw|nhwc --dtype f32|bf16
//          --repeat R --threads T --seed S --allow-tf32 --allow-nondeterministic --exact]
// Inputs are random (fixed seed, the same in every thread); the output is filled with 0xFF bytes
// (NaN) before every execution, then written raw (its own data type) to FILE, or FILE.<thread>
// with --threads > 1. With T threads, each builds and finalizes its own plan on its own handle at
// the same time, then executes it R times on its own stream. One JSON line per thread on stdout:
//   {"status":"ok","thread":0,"kind":"fwd",...,"engine":E,"workspace":B,"elements":n,"nan":0}
// Any failure prints {"status":"error","message":...} and exits 1. By default engines with TF32
// (fp32 data only), down-converting or non-deterministic numerics are skipped, so that two runs give
// the same bytes; --exact also skips FFT and Winograd engines (direct or GEMM-based sums only). The
// workspace printed is what the plan reported, and exactly that is allocated (0: a null pointer).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <barrier>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "graph_conv_build.h"

namespace {

namespace graph = vcudnn::test::graph;
using graph::cudnn_message;

std::mutex g_out_mu;  // one JSON line at a time

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Reports the failure on stdout (JSON) and stderr and ends the process at once: other threads may
// be inside CUDA, so no destructors run.
[[noreturn]] void fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_out_mu);
    std::printf("{\"status\":\"error\",\"message\":%s}\n", json_string(message).c_str());
    std::fprintf(stderr, "vcudnn_graph_client: %s\n", message.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
  }
  std::_Exit(1);
}

std::string where(const char* file, int line) { return std::string(" at ") + file + ":" + std::to_string(line); }

#define CK_CUDA(expr)                                                                                            \
  do {                                                                                                           \
    const cudaError_t e_ = (expr);                                                                               \
    if (e_ != cudaSuccess) fail(std::string(#expr) + ": " + cudaGetErrorString(e_) + where(__FILE__, __LINE__)); \
  } while (0)
#define CK_CUDNN(expr)                                                                                               \
  do {                                                                                                               \
    const cudnnStatus_t s_ = (expr);                                                                                 \
    if (s_ != CUDNN_STATUS_SUCCESS) fail(std::string(#expr) + ": " + cudnn_message(s_) + where(__FILE__, __LINE__)); \
  } while (0)

// ---- Options

using Kind = graph::ConvKind;

struct Options {
  Kind kind = Kind::kFwd;
  std::string kind_name = "fwd";
  int64_t n = 8, c = 16, k = 32, h = 14, w = 14, r = 3, s = 3;
  int64_t pad = 1, stride = 1, dilation = 1, groups = 1;
  bool nhwc = false;
  bool bf16 = false;
  int repeat = 1, threads = 1;
  uint32_t seed = 1234;
  bool allow_tf32 = false, allow_nondeterministic = false, exact = false;
  std::string out;
};

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr,
               "%s\nusage: vcudnn_graph_client --kind fwd|bwd-data|bwd-filter --out FILE [--n N --c C --k K --h H "
               "--w W --r R --s S --pad P --stride U --dilation D --groups G --layout nchw|nhwc --dtype f32|bf16 "
               "--repeat R --threads T --seed S --allow-tf32 --allow-nondeterministic --exact]\n",
               message.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const char* text, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno || !end || *end || v < min) usage(flag + " needs an integer >= " + std::to_string(min));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--allow-tf32") {
      o.allow_tf32 = true;
      continue;
    }
    if (a == "--allow-nondeterministic") {
      o.allow_nondeterministic = true;
      continue;
    }
    if (a == "--exact") {
      o.exact = true;
      continue;
    }
    if (i + 1 >= argc) usage("missing value or unknown argument: " + a);
    const char* v = argv[++i];
    const std::pair<const char*, int64_t*> ints[] = {
        {"--n", &o.n}, {"--c", &o.c}, {"--k", &o.k},           {"--h", &o.h},           {"--w", &o.w},
        {"--r", &o.r}, {"--s", &o.s}, {"--stride", &o.stride}, {"--groups", &o.groups}, {"--dilation", &o.dilation}};
    bool done = false;
    for (const auto& [flag, field] : ints) {
      if (a == flag) {
        *field = parse_int(a, v, 1);
        done = true;
      }
    }
    if (done) continue;
    if (a == "--pad") {
      o.pad = parse_int(a, v, 0);
    } else if (a == "--repeat") {
      o.repeat = static_cast<int>(parse_int(a, v, 1));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, v, 1));
    } else if (a == "--seed") {
      o.seed = static_cast<uint32_t>(parse_int(a, v, 0));
    } else if (a == "--out") {
      o.out = v;
    } else if (a == "--kind") {
      o.kind_name = v;
      if (o.kind_name == "fwd")
        o.kind = Kind::kFwd;
      else if (o.kind_name == "bwd-data")
        o.kind = Kind::kBwdData;
      else if (o.kind_name == "bwd-filter")
        o.kind = Kind::kBwdFilter;
      else
        usage("unknown --kind " + o.kind_name);
    } else if (a == "--layout") {
      const std::string l = v;
      if (l != "nchw" && l != "nhwc") usage("unknown --layout " + l);
      o.nhwc = l == "nhwc";
    } else if (a == "--dtype") {
      const std::string d = v;
      if (d != "f32" && d != "bf16") usage("unknown --dtype " + d);
      o.bf16 = d == "bf16";
    } else {
      usage("unknown argument: " + a);
    }
  }
  if (o.out.empty()) usage("--out is required");
  if (o.c % o.groups || o.k % o.groups) usage("--groups must divide --c and --k");
  if (o.threads > 64) usage("--threads is at most 64");
  return o;
}

// ---- Shapes and data

struct Shape {
  std::array<int64_t, 4> x, w, y;     // NCHW order
  std::array<int64_t, 4> xs, ws, ys;  // strides of the layout
  int64_t x_count = 0, w_count = 0, y_count = 0;
};

Shape shape_of(const Options& o) {
  Shape s;
  const int64_t p = (o.h + 2 * o.pad - o.dilation * (o.r - 1) - 1) / o.stride + 1;
  const int64_t q = (o.w + 2 * o.pad - o.dilation * (o.s - 1) - 1) / o.stride + 1;
  if (p < 1 || q < 1) usage("the filter does not fit the padded input");
  s.x = {o.n, o.c, o.h, o.w};
  s.w = {o.k, o.c / o.groups, o.r, o.s};
  s.y = {o.n, o.k, p, q};
  s.xs = graph::strides_of(s.x, o.nhwc);
  s.ws = graph::strides_of(s.w, o.nhwc);
  s.ys = graph::strides_of(s.y, o.nhwc);
  s.x_count = s.x[0] * s.x[1] * s.x[2] * s.x[3];
  s.w_count = s.w[0] * s.w[1] * s.w[2] * s.w[3];
  s.y_count = s.y[0] * s.y[1] * s.y[2] * s.y[3];
  return s;
}

size_t elem_size(const Options& o) { return o.bf16 ? 2 : 4; }

// Uniform in [-1, 1), never all zeros; stored in the data type.
std::vector<unsigned char> random_bytes(int64_t count, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<unsigned char> bytes(static_cast<size_t>(count) * (bf16 ? 2 : 4));
  for (int64_t i = 0; i < count; ++i) {
    const float f = dist(rng);
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16(f);
      std::memcpy(&bytes[2 * i], &b, 2);
    } else {
      std::memcpy(&bytes[4 * i], &f, 4);
    }
  }
  return bytes;
}

size_t count_nan(const std::vector<unsigned char>& bytes, bool bf16) {
  size_t nan = 0;
  const size_t es = bf16 ? 2 : 4;
  for (size_t i = 0; i + es <= bytes.size(); i += es) {
    float f = 0;
    if (bf16) {
      __nv_bfloat16 b;
      std::memcpy(&b, &bytes[i], 2);
      f = __bfloat162float(b);
    } else {
      std::memcpy(&f, &bytes[i], 4);
    }
    nan += std::isnan(f) ? 1 : 0;
  }
  return nan;
}

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) CK_CUDA(cudaMalloc(&p, n));
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// ---- Engines

graph::ConvSpec spec_of(const Options& o, const Shape& s) {
  graph::ConvSpec spec;
  spec.kind = o.kind;
  spec.x = s.x, spec.w = s.w, spec.y = s.y;
  spec.xs = s.xs, spec.ws = s.ws, spec.ys = s.ys;
  spec.io = o.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  spec.pad = o.pad, spec.stride = o.stride, spec.dilation = o.dilation;
  return spec;
}

// Whether an engine's numerics are acceptable to the options.
bool acceptable(const graph::EngineInfo& engine, const Options& o) {
  bool ok = true;
  for (const cudnnBackendNumericalNote_t note : engine.notes) {
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) ok = false;  // PyTorch refuses these too
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && !o.bf16 && !o.allow_tf32) ok = false;
    if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && !o.allow_nondeterministic) ok = false;
    const bool transform = note == CUDNN_NUMERICAL_NOTE_FFT || note == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13;
    if (transform && o.exact) ok = false;
  }
  return ok;
}

// ---- Running

struct Inputs {
  DeviceBuffer* x;  // x (fwd, bwd-filter)
  DeviceBuffer* w;  // w (fwd, bwd-data)
  DeviceBuffer* y;  // dy (bwd-data, bwd-filter)
};

std::string dims_json(const std::array<int64_t, 4>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s.append(i ? "," : "").append(std::to_string(d[i]));
  return s.append("]");
}

void run_thread(int tid, const Options& o, const Shape& s, const Inputs& in, std::barrier<>& built) {
  CK_CUDA(cudaSetDevice(0));
  cudnnHandle_t handle = nullptr;
  CK_CUDNN(cudnnCreate(&handle));
  cudaStream_t stream = nullptr;
  CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CK_CUDNN(cudnnSetStream(handle, stream));
  try {
    const graph::BackendApi api;  // the linked cuDNN (vcudnn when preloaded)
    graph::Plan plan =
        graph::build_plan(api, handle, spec_of(o, s), [&](const graph::EngineInfo& e) { return acceptable(e, o); });
    const size_t es = elem_size(o);
    const int64_t out_count = o.kind == Kind::kFwd ? s.y_count : o.kind == Kind::kBwdData ? s.x_count : s.w_count;
    DeviceBuffer out(static_cast<size_t>(out_count) * es);
    DeviceBuffer workspace(static_cast<size_t>(plan.workspace));
    // In the operation's terms: x or dx, w or dw, y or dy.
    void* px = o.kind == Kind::kBwdData ? out.p : in.x->p;
    void* pw = o.kind == Kind::kBwdFilter ? out.p : in.w->p;
    void* py = o.kind == Kind::kFwd ? out.p : in.y->p;
    built.arrive_and_wait();  // every thread has its plan: executions start together

    for (int i = 0; i < o.repeat; ++i) {
      CK_CUDA(cudaMemsetAsync(out.p, 0xFF, out.bytes, stream));  // NaN in every element
      const graph::Desc pack = graph::variant_pack(api, px, pw, py, workspace.p);
      CK_CUDNN(cudnnBackendExecute(handle, plan.plan.get(), pack.get()));
    }
    CK_CUDA(cudaStreamSynchronize(stream));
    CK_CUDA(cudaGetLastError());

    std::vector<unsigned char> host(out.bytes);
    CK_CUDA(cudaMemcpy(host.data(), out.p, out.bytes, cudaMemcpyDeviceToHost));
    const std::string path = o.threads > 1 ? o.out + "." + std::to_string(tid) : o.out;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(host.data(), 1, host.size(), f) != host.size() || std::fclose(f) != 0)
      fail("cannot write " + path + ": " + std::strerror(errno));
    const size_t nan = count_nan(host, o.bf16);

    std::lock_guard<std::mutex> lock(g_out_mu);
    std::printf(
        "{\"status\":\"ok\",\"thread\":%d,\"kind\":\"%s\",\"dtype\":\"%s\",\"layout\":\"%s\",\"x\":%s,\"w\":%s,"
        "\"y\":%s,\"pad\":%lld,\"stride\":%lld,\"dilation\":%lld,\"groups\":%lld,\"engine\":%lld,\"heuristics\":\"%s\","
        "\"configs_tried\":%lld,\"workspace\":%lld,\"repeat\":%d,\"elements\":%lld,\"nan\":%zu,\"out\":%s}\n",
        tid, o.kind_name.c_str(), o.bf16 ? "bf16" : "f32", o.nhwc ? "nhwc" : "nchw", dims_json(s.x).c_str(),
        dims_json(s.w).c_str(), dims_json(s.y).c_str(), static_cast<long long>(o.pad), static_cast<long long>(o.stride),
        static_cast<long long>(o.dilation), static_cast<long long>(o.groups), static_cast<long long>(plan.engine),
        plan.mode, static_cast<long long>(plan.configs), static_cast<long long>(plan.workspace), o.repeat,
        static_cast<long long>(out_count), nan, json_string(path).c_str());
    std::fflush(stdout);
  } catch (const graph::Error& e) {
    fail(e.what());
  }
  CK_CUDNN(cudnnDestroy(handle));
  CK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const Shape s = shape_of(o);
  CK_CUDA(cudaSetDevice(0));
  // The same inputs for every thread; each only reads them.
  const auto upload = [&](int64_t count, uint32_t seed) {
    auto b = std::make_unique<DeviceBuffer>(static_cast<size_t>(count) * elem_size(o));
    const std::vector<unsigned char> host = random_bytes(count, seed, o.bf16);
    CK_CUDA(cudaMemcpy(b->p, host.data(), host.size(), cudaMemcpyHostToDevice));
    return b;
  };
  const auto x = upload(s.x_count, o.seed + 1);
  const auto w = upload(s.w_count, o.seed + 2);
  const auto dy = upload(s.y_count, o.seed + 3);
  const Inputs in{x.get(), w.get(), dy.get()};

  std::barrier<> built(o.threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t)
    threads.emplace_back(run_thread, t, std::cref(o), std::cref(s), std::cref(in), std::ref(built));
  for (auto& t : threads) t.join();
  return 0;
}
