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

namespace {

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

std::string cudnn_message(cudnnStatus_t s) {
  std::string m = cudnnGetErrorString(s);
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0]) m += std::string(" (") + last + ")";
  return m;
}

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

enum class Kind { kFwd, kBwdData, kBwdFilter };

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

std::array<int64_t, 4> strides_of(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

Shape shape_of(const Options& o) {
  Shape s;
  const int64_t p = (o.h + 2 * o.pad - o.dilation * (o.r - 1) - 1) / o.stride + 1;
  const int64_t q = (o.w + 2 * o.pad - o.dilation * (o.s - 1) - 1) / o.stride + 1;
  if (p < 1 || q < 1) usage("the filter does not fit the padded input");
  s.x = {o.n, o.c, o.h, o.w};
  s.w = {o.k, o.c / o.groups, o.r, o.s};
  s.y = {o.n, o.k, p, q};
  s.xs = strides_of(s.x, o.nhwc);
  s.ws = strides_of(s.w, o.nhwc);
  s.ys = strides_of(s.y, o.nhwc);
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

// ---- Backend descriptors

class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) { CK_CUDNN(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void* values, const char* what) {
  const cudnnStatus_t s = cudnnBackendSetAttribute(d.get(), name, type, count, values);
  if (s != CUDNN_STATUS_SUCCESS) fail(std::string("setting ") + what + ": " + cudnn_message(s));
}

void set_desc(const Desc& d, cudnnBackendAttributeName_t name, const Desc& value, const char* what) {
  const cudnnBackendDescriptor_t v = value.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

void finalize(const Desc& d, const char* what) {
  const cudnnStatus_t s = cudnnBackendFinalize(d.get());
  if (s != CUDNN_STATUS_SUCCESS) fail(std::string("finalizing ") + what + ": " + cudnn_message(s));
}

constexpr int64_t kXUid = 'x', kWUid = 'w', kYUid = 'y';  // as PyTorch names them
constexpr int64_t kAlignment = 16;

Desc tensor(int64_t uid, const std::array<int64_t, 4>& dims, const std::array<int64_t, 4>& strides,
            cudnnDataType_t dtype, const char* what) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, what);
  set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), what);
  set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), what);
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, what);
  finalize(t, what);
  return t;
}

// What one thread builds: every descriptor stays alive as long as the plan.
struct Plan {
  std::vector<Desc> keep;  // tensors, convolution, operation, graph, configuration
  Desc plan;
  int64_t engine = -1;
  int64_t workspace = 0;
  const char* mode = "";
  int64_t configs = 0;  // configurations the heuristics offered before one was taken
};

Desc operation_graph(cudnnHandle_t handle, const Options& o, const Shape& s, std::vector<Desc>& keep) {
  const cudnnDataType_t io = o.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  Desc x = tensor(kXUid, s.x, s.xs, io, "x tensor");
  Desc w = tensor(kWUid, s.w, s.ws, io, "w tensor");
  Desc y = tensor(kYUid, s.y, s.ys, io, "y tensor");

  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t pad[2] = {o.pad, o.pad}, stride[2] = {o.stride, o.stride}, dilation[2] = {o.dilation, o.dilation};
  set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "convolution spatial dims");
  set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "convolution compute type");
  set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "convolution mode");
  set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution pre-paddings");
  set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution post-paddings");
  set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "convolution strides");
  set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation, "convolution dilations");
  finalize(conv, "convolution");

  cudnnBackendDescriptorType_t type = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
  cudnnBackendAttributeName_t ax = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              aw = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                              ay = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                              ac = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                              aa = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                              ab = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA;
  if (o.kind == Kind::kBwdData) {
    type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
    ax = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX;
    aw = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W;
    ay = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY;
    ac = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC;
    aa = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA;
    ab = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA;
  } else if (o.kind == Kind::kBwdFilter) {
    type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
    ax = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X;
    aw = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW;
    ay = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY;
    ac = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC;
    aa = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
    ab = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
  }
  Desc op(type);
  set_desc(op, ax, x, "operation x");
  set_desc(op, aw, w, "operation w");
  set_desc(op, ay, y, "operation y");
  set_desc(op, ac, conv, "operation convolution");
  const float alpha = 1.f, beta = 0.f;  // PyTorch's
  set(op, aa, CUDNN_TYPE_FLOAT, 1, &alpha, "operation alpha");
  set(op, ab, CUDNN_TYPE_FLOAT, 1, &beta, "operation beta");
  finalize(op, "operation");

  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops[] = {op.get()};
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops, "graph operations");
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  finalize(graph, "operation graph");
  for (Desc* d : {&x, &w, &y, &conv, &op}) keep.push_back(std::move(*d));
  return graph;
}

// The configurations of one heuristics mode, best first (cuDNN fills descriptors we create).
std::vector<Desc> heuristic_configs(const Desc& graph, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  std::vector<Desc> configs;
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return configs;  // e.g. no fallback for it
  int64_t available = 0;
  CK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                    &available, nullptr));
  if (available <= 0) return configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  CK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, available,
                                    &returned, raw.data()));
  if (returned < 0) returned = 0;
  if (returned < available) configs.resize(static_cast<size_t>(returned));
  return configs;
}

// The engine of a configuration: its global index and whether its numerics are acceptable.
int64_t engine_of(const Desc& config, const Options& o, bool* acceptable) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  CK_CUDNN(
      cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw));
  int64_t index = -1;
  CK_CUDNN(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  CK_CUDNN(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                    static_cast<int64_t>(notes.size()), &count, notes.data()));
  *acceptable = true;
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(notes.size()); ++i) {
    const cudnnBackendNumericalNote_t note = notes[i];
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) *acceptable = false;  // PyTorch refuses these too
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && !o.bf16 && !o.allow_tf32) *acceptable = false;
    if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && !o.allow_nondeterministic) *acceptable = false;
    const bool transform = note == CUDNN_NUMERICAL_NOTE_FFT || note == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
                           note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13;
    if (transform && o.exact) *acceptable = false;
  }
  return index;
}

Plan build_plan(cudnnHandle_t handle, const Options& o, const Shape& s) {
  Plan p;
  Desc graph = operation_graph(handle, o, s, p.keep);
  std::string refused;
  const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {{CUDNN_HEUR_MODE_A, "a"},
                                                                  {CUDNN_HEUR_MODE_FALLBACK, "fallback"}};
  for (const auto& [mode, name] : modes) {
    std::vector<Desc> configs = heuristic_configs(graph, mode);
    for (Desc& config : configs) {
      ++p.configs;
      bool acceptable = false;
      const int64_t engine = engine_of(config, o, &acceptable);
      if (!acceptable) {
        refused.append(" ").append(std::to_string(engine)).append(":notes");
        continue;
      }
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan configuration");
      const cudnnStatus_t st = cudnnBackendFinalize(plan.get());
      if (st != CUDNN_STATUS_SUCCESS) {
        refused.append(" ").append(std::to_string(engine)).append(":").append(cudnnGetErrorString(st));
        continue;
      }
      int64_t n = 0;
      CK_CUDNN(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                        &p.workspace));
      if (p.workspace < 0) fail("negative workspace size for engine " + std::to_string(engine));
      p.plan = std::move(plan);
      p.engine = engine;
      p.mode = name;
      p.keep.push_back(std::move(config));
      p.keep.push_back(std::move(graph));
      return p;
    }
  }
  fail("no engine configuration finalizes (refused:" + refused + ")");
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
  {
    Plan plan = build_plan(handle, o, s);
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
      Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      const int64_t uids[] = {kXUid, kWUid, kYUid};
      void* pointers[] = {px, pw, py};
      void* ws = workspace.p;
      set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids, "variant pack ids");
      set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers, "variant pack pointers");
      set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack workspace");
      finalize(pack, "variant pack");
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
