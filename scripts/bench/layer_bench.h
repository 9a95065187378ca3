// The harness of the per-layer micro-batching benchmarks (microbatch_layers.cpp on cuDNN's legacy API,
// graph_layers.cpp on its graph API), so that both take the same command line, time the same way and write rows
// the driver (scripts/bench/microbatch) reads alike: errors, buffers, the alternating timed rounds, the common
// fields of a row, the header row and the progress line.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "conv_nets.h"

namespace vcudnn::bench {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------------------------
// Errors: every CUDA / cuDNN status is checked; a failure throws, and the (layer, kind) being measured records it.

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Failure(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
inline void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Failure(std::string(what) + ": " + cudnnGetErrorString(s));
}
#define CUDA_OK(e) ::vcudnn::bench::check_cuda((e), #e)
#define CUDNN_OK(e) ::vcudnn::bench::check_cudnn((e), #e)

// The program's name in its messages (parse_options sets it).
inline std::string& program_name() {
  static std::string name = "vcudnn_bench";
  return name;
}

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", program_name().c_str(), msg.c_str());
  std::exit(1);
}

// ---------------------------------------------------------------------------------------------------------------
// Resources (RAII, so that a failure in the middle of a layer frees what it had).

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, int fill_byte = -1) : bytes(n) {
    if (n == 0) return;
    CUDA_OK(cudaMalloc(&p, n));
    if (fill_byte >= 0) CUDA_OK(cudaMemset(p, fill_byte, n));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

// libvcudnn.so, loaded RTLD_LOCAL: its exported cudnn* hooks stay invisible to this program's own cudnn* calls.
inline void* open_vcudnn(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("cannot load " + path + ": " + dlerror());
  return lib;
}

template <typename F>
void load_symbol(void* lib, const char* name, F& f, bool required = true) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && required) die(std::string("libvcudnn.so lacks ") + name);
}

// ---------------------------------------------------------------------------------------------------------------
// Convolution kinds.

enum Kind { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };
inline const char* const kKindNames[] = {"fwd", "bwd_data", "bwd_filter"};

// ---------------------------------------------------------------------------------------------------------------
// Timing: one stream for every side, K back-to-back calls per round timed with events, the side that goes first
// rotating between rounds.

struct BenchCtx {
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  void* ws = nullptr;  // the baseline's workspace: `limit` bytes
  size_t limit = 0;
  int rounds = 5, reps = 10;
  void (*iteration_boundary)() = nullptr;  // libvcudnn.so's vcudnnIterationBoundary (optional)
  bool iteration_marked = false;
};

// vcudnn records every call of the program's first iteration (about 12 us more per convolution) until it has seen
// one, and a benchmark has none of its own: the first vcudnn call of the run, between two marks, is that iteration,
// so that no timed call is recorded. `call` is a vcudnn call (the one that plans).
template <typename F>
auto first_call_as_iteration(BenchCtx& c, F&& call) {
  const bool mark = c.iteration_boundary && !c.iteration_marked;
  if (mark) c.iteration_boundary();
  auto r = call();
  if (mark) {
    c.iteration_boundary();
    c.iteration_marked = true;
  }
  return r;
}

using Call = std::function<cudnnStatus_t()>;

// Milliseconds per call of K back-to-back calls on the stream; throws (after draining the stream) on a failed call.
inline double time_reps(BenchCtx& c, const Call& call, const char* who) {
  CUDA_OK(cudaEventRecord(c.e0, c.s));
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  for (int i = 0; i < c.reps && st == CUDNN_STATUS_SUCCESS; ++i) st = call();
  CUDA_OK(cudaEventRecord(c.e1, c.s));
  CUDA_OK(cudaEventSynchronize(c.e1));
  if (st != CUDNN_STATUS_SUCCESS) throw Failure(std::string(who) + " call failed: " + cudnnGetErrorString(st));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, c.e0, c.e1));
  return static_cast<double>(ms) / c.reps;
}

// Linear-interpolated quantile.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

inline double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// The median, quartiles and every round of one side, into `out`.
inline void put_rounds(json& out, const std::vector<double>& t) {
  out["ms"] = quantile(t, 0.5);
  out["p25"] = quantile(t, 0.25);
  out["p75"] = quantile(t, 0.75);
  out["rounds_ms"] = t;
}

// A third side timed in the same rounds as the baseline and vcudnn (the graph bench's caller's plan): its call, and
// the object its times go to. A failure lands in out["error"].
struct ThirdSide {
  Call call;
  json* out = nullptr;
};

// The R rounds of the baseline, vcudnn and an optional third side: each side's ms / p25 / p75 / rounds_ms and the
// row's ratio. The order rotates between rounds, so that no side always runs first. vcudnn's side runs only while
// `v_ok`; its failure lands in vc["error"]. A baseline failure throws.
inline void time_rounds(BenchCtx& c, const Call& baseline_call, const Call& vcudnn_call, bool v_ok, json& row,
                        json& base, json& vc, ThirdSide* third = nullptr) {
  std::vector<double> tb, tv, tt;
  bool t_ok = third != nullptr;
  const int sides = third ? 3 : 2;
  for (int r = 0; r < c.rounds; ++r) {
    for (int k = 0; k < sides; ++k) {
      const int side = (r + k) % sides;  // 0 baseline, 1 vcudnn, 2 third
      if (side == 0) {
        tb.push_back(time_reps(c, baseline_call, "baseline"));
      } else if (side == 1 && v_ok) {
        try {
          tv.push_back(time_reps(c, vcudnn_call, "vcudnn"));
        } catch (const Failure& e) {
          vc["error"] = e.what();
          v_ok = false;
        }
      } else if (side == 2 && t_ok) {
        try {
          tt.push_back(time_reps(c, third->call, "third side"));
        } catch (const Failure& e) {
          (*third->out)["error"] = e.what();
          t_ok = false;
        }
      }
    }
  }
  put_rounds(base, tb);
  if (v_ok && !tv.empty()) {
    put_rounds(vc, tv);
    if (quantile(tb, 0.5) > 0) row["ratio"] = quantile(tv, 0.5) / quantile(tb, 0.5);
  }
  if (t_ok && !tt.empty()) put_rounds(*third->out, tt);
}

// ---------------------------------------------------------------------------------------------------------------
// Rows.

// The fields every row starts with; "ratio" stays null until both sides are timed.
inline json row_start(const Net& net, const Layer& l, Kind kind, bool bf16, size_t limit) {
  json row = {{"net", net.name},
              {"layer", l.name},
              {"kind", kKindNames[kind]},
              {"dtype", bf16 ? "bf16" : "fp32"},
              {"limit", limit},
              {"batch", net.batch},
              {"count", l.count},
              {"shape", {{"c", l.c}, {"k", l.k}, {"r", l.r}, {"stride", l.stride}, {"pad", l.pad}, {"hw", l.hw}}}};
  row["ratio"] = nullptr;
  return row;
}

// An object with these fields, all null (the ones a reader may look for even when the measurement failed).
inline json null_fields(std::initializer_list<const char*> names) {
  json o = json::object();
  for (const char* n : names) o[n] = nullptr;
  return o;
}

// Attaches both sides to the row. A failure that broke the CUDA context makes every later measurement meaningless:
// the row says so ("fatal") and the program stops after writing it.
inline void finish_row(json& row, json base, json vc) {
  row["baseline"] = std::move(base);
  row["vcudnn"] = std::move(vc);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    row["fatal"] = std::string("CUDA context unusable: ") + cudaGetErrorString(e);
  }
}

inline std::string fmt_ms(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v.get<double>());
  return buf;
}

inline void progress(int i, int total, const json& row) {
  const json& b = row["baseline"];
  const json& v = row["vcudnn"];
  std::string line;
  for (const std::string& part :
       {std::string("["), std::to_string(i), std::string("/"), std::to_string(total), std::string("] "),
        row["net"].get<std::string>(), std::string(" "), row["layer"].get<std::string>(), std::string(" "),
        row["kind"].get<std::string>(), std::string(": ")})
    line.append(part);
  if (row.contains("error")) {
    line += "ERROR " + row["error"].get<std::string>();
  } else {
    char buf[256];
    std::snprintf(buf, sizeof buf, "cuDNN %s %.1f MiB %s ms | vcudnn ", b.value("algo_name", "?").c_str(),
                  mib(b["workspace"].get<size_t>()), fmt_ms(b["ms"]).c_str());
    line += buf;
    if (v.contains("error")) {
      line += "ERROR " + v["error"].get<std::string>();
    } else {
      line += (v["description"].is_string() ? v["description"].get<std::string>() : std::string("(no plan info)")) +
              " " + fmt_ms(v["ms"]) + " ms";
      if (row["ratio"].is_number()) {
        std::snprintf(buf, sizeof buf, " ratio %.3f", row["ratio"].get<double>());
        line += buf;
      }
      line += " (plan " + fmt_ms(v["plan_ms"]) + " ms)";
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

// ---------------------------------------------------------------------------------------------------------------
// Command line.

inline size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) die("bad byte count: " + s);
  double mul = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mul = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mul = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    die("bad byte count: " + s);
  return static_cast<size_t>(v * mul);
}

inline std::string self_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string p(buf);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

struct Options {
  std::string net_arg = "all", dtype = "fp32", json_path, vcudnn_path;
  size_t limit = 64ull << 20;
  int rounds = 5, reps = 10;
  int batch = 0;  // --batch: every net's batch (0: each net's own)
  bool quick = false, list = false;  // --list: print the layers and exit (no GPU needed)
  bool bf16 = false;
  std::string cmdline;
};

[[noreturn]] inline void usage() {
  std::fprintf(stderr,
               "usage: %s [--net alexnet|resnet50|vgg16|all] [--dtype fp32|bf16] [--limit BYTES]\n"
               "       [--rounds R] [--reps K] [--batch N] [--json FILE] [--vcudnn PATH] [--quick] [--list]\n",
               program_name().c_str());
  std::exit(2);
}

inline Options parse_options(int argc, char** argv, const char* program) {
  program_name() = program;
  Options o;
  o.vcudnn_path = self_dir() + "/libvcudnn.so";
  for (int i = 0; i < argc; ++i) {
    if (i) o.cmdline.push_back(' ');
    o.cmdline.append(argv[i]);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--net")
      o.net_arg = value();
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--limit")
      o.limit = parse_bytes(value());
    else if (a == "--rounds")
      o.rounds = std::atoi(value().c_str());
    else if (a == "--reps")
      o.reps = std::atoi(value().c_str());
    else if (a == "--batch")
      o.batch = std::atoi(value().c_str());
    else if (a == "--json")
      o.json_path = value();
    else if (a == "--vcudnn")
      o.vcudnn_path = value();
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--list")
      o.list = true;
    else
      usage();
  }
  if (o.dtype != "fp32" && o.dtype != "bf16") usage();
  if (o.rounds < 1 || o.reps < 1 || o.batch < 0) usage();
  o.bf16 = o.dtype == "bf16";
  return o;
}

// --quick: AlexNet's first two layers; otherwise the nets --net names.
inline std::vector<Net> select_nets(const Options& o) {
  std::vector<Net> nets;
  if (o.quick) {
    Net a = alexnet();
    a.layers.resize(2);
    nets.push_back(a);
  } else {
    if (o.net_arg == "alexnet" || o.net_arg == "all") nets.push_back(alexnet());
    if (o.net_arg == "resnet50" || o.net_arg == "all") nets.push_back(resnet50());
    if (o.net_arg == "vgg16" || o.net_arg == "all") nets.push_back(vgg16());
    if (nets.empty()) usage();
  }
  if (o.batch > 0)
    for (Net& n : nets) n.batch = o.batch;
  return nets;
}

inline void print_list(const std::vector<Net>& nets) {
  for (const auto& n : nets)
    for (const auto& l : n.layers)
      std::printf("%s\n",
                  json({{"net", n.name}, {"batch", n.batch}, {"layer", l.name}, {"count", l.count}, {"first", l.first}})
                      .dump()
                      .c_str());
}

// ---------------------------------------------------------------------------------------------------------------
// Output and the run's frame.

// JSON lines to --json FILE (appended) or stdout, flushed line by line so that a crash keeps the rows before it.
class JsonLines {
 public:
  explicit JsonLines(const std::string& path) {
    if (path.empty()) return;
    out_ = std::fopen(path.c_str(), "a");
    if (!out_) die("cannot open " + path + ": " + std::strerror(errno));
  }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  ~JsonLines() {
    if (out_ != stdout) std::fclose(out_);
  }
  void emit(const json& j) {
    std::fprintf(out_, "%s\n", j.dump().c_str());
    std::fflush(out_);
  }

 private:
  std::FILE* out_ = stdout;
};

// vcudnn's policy comes from the environment (the driver sets it): say when it cannot be what --limit measures.
inline void warn_environment(size_t limit) {
  const char* policy = std::getenv("VCUDNN_POLICY");
  if (!policy || std::string(policy) != "microbatch")
    std::fprintf(stderr, "warning: VCUDNN_POLICY is %s, not microbatch: vcudnn will make no plans\n",
                 policy ? policy : "unset");
  if (const char* env_limit = std::getenv("VCUDNN_WORKSPACE_LIMIT"); env_limit && parse_bytes(env_limit) != limit)
    std::fprintf(stderr, "warning: VCUDNN_WORKSPACE_LIMIT=%s differs from --limit %zu\n", env_limit, limit);
}

// (layer, kind) pairs: a net's first layer has no backward-data.
inline int count_measurements(const std::vector<Net>& nets) {
  int total = 0;
  for (const auto& n : nets)
    for (const auto& l : n.layers) total += l.first ? 2 : 3;
  return total;
}

// The header row (vcudnn_version is added once libvcudnn.so is loaded). Queries the device: throws Failure.
inline json header_row(const Options& o, const std::vector<Net>& nets) {
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  int driver = 0, runtime = 0;
  CUDA_OK(cudaDriverGetVersion(&driver));
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&cudnnGetVersion), &info);
  const std::string cudnn_path = info.dli_fname ? info.dli_fname : "?";
  json layers = json::object();
  for (const auto& n : nets) layers[n.name] = n.layers.size();
  auto env = [](const char* k) -> json {
    const char* v = std::getenv(k);
    return v ? json(v) : json(nullptr);
  };
  return {{"header", true},
          {"gpu", prop.name},
          {"sm_count", prop.multiProcessorCount},
          {"cc", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"memory_bytes", prop.totalGlobalMem},
          {"driver_version", driver},
          {"runtime_version", runtime},
          {"cudnn_version", cudnnGetVersion()},
          {"cudnn_cudart_version", cudnnGetCudartVersion()},
          {"cudnn_library", cudnn_path},
          {"vcudnn_library", o.vcudnn_path},
          {"env",
           {{"VCUDNN_POLICY", env("VCUDNN_POLICY")},
            {"VCUDNN_WORKSPACE_LIMIT", env("VCUDNN_WORKSPACE_LIMIT")},
            {"VCUDNN_BATCH_POLICY", env("VCUDNN_BATCH_POLICY")},
            {"VCUDNN_CACHE", env("VCUDNN_CACHE")}}},
          {"limit", o.limit},
          {"dtype", o.dtype},
          {"rounds", o.rounds},
          {"reps", o.reps},
          {"layers", layers},
          {"measurements", count_measurements(nets)},
          {"command", o.cmdline}};
}

inline void announce(const json& header) {
  std::fprintf(stderr, "%s, cuDNN %zu, %s, limit %.0f MiB: %d measurements\n", header["gpu"].get<std::string>().c_str(),
               cudnnGetVersion(), header["dtype"].get<std::string>().c_str(), mib(header["limit"].get<size_t>()),
               header["measurements"].get<int>());
}

// Measures every (net, layer, kind) in order, writes each row and its progress line; stops the program at a fatal
// row. `measure(net index, layer index, kind)` never throws.
inline void measure_all(const std::vector<Net>& nets, JsonLines& out,
                        const std::function<json(size_t, size_t, Kind)>& measure) {
  const int total = count_measurements(nets);
  int i = 0;
  for (size_t ni = 0; ni < nets.size(); ++ni) {
    for (size_t li = 0; li < nets[ni].layers.size(); ++li) {
      for (Kind kind : {kFwd, kBwdData, kBwdFilter}) {
        if (kind == kBwdData && nets[ni].layers[li].first) continue;
        json row = measure(ni, li, kind);
        out.emit(row);
        progress(++i, total, row);
        if (row.contains("fatal")) die(row["fatal"].get<std::string>());
      }
    }
  }
}

// The stream and events both sides are timed on, and the baseline's workspace of `limit` bytes.
inline void open_timing(BenchCtx& c) {
  CUDA_OK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreate(&c.e0));
  CUDA_OK(cudaEventCreate(&c.e1));
}

inline void close_timing(BenchCtx& c) {
  if (c.ws) cudaFree(c.ws);
  cudaEventDestroy(c.e0);
  cudaEventDestroy(c.e1);
  cudaStreamDestroy(c.s);
}

// A program's frame: options, --list, the output, the environment check, the header row, every measurement and the
// teardown. `Ctx` derives from BenchCtx and holds the real cuDNN handle `h`, vcudnn's handle `vh` and vcudnn's entry
// points `v` (create, set_stream, destroy, version: optional), and supplies
//   void load_vcudnn(const std::string& path);  dlopen()s libvcudnn.so and fills `v` (dies if it cannot)
//   void describe(json& header);                its own fields of the header
//   json measure(const std::vector<Net>&, size_t net, size_t layer, Kind, bool bf16);   one row; never throws
template <typename Ctx>
int bench_main(int argc, char** argv, const char* program) {
  const Options o = parse_options(argc, argv, program);
  const std::vector<Net> nets = select_nets(o);
  if (o.list) {
    print_list(nets);
    return 0;
  }
  JsonLines out(o.json_path);
  warn_environment(o.limit);

  Ctx c;
  c.limit = o.limit;
  c.rounds = o.rounds;
  c.reps = o.reps;
  try {
    json header = header_row(o, nets);
    c.load_vcudnn(o.vcudnn_path);
    open_timing(c);
    CUDNN_OK(cudnnCreate(&c.h));
    CUDNN_OK(cudnnSetStream(c.h, c.s));
    CUDNN_OK(c.v.create(&c.vh));
    CUDNN_OK(c.v.set_stream(c.vh, c.s));
    header["vcudnn_version"] = c.v.version ? c.v.version() : "?";
    c.describe(header);
    if (c.limit) CUDA_OK(cudaMalloc(&c.ws, c.limit));
    out.emit(header);
    announce(header);
    measure_all(nets, out, [&](size_t ni, size_t li, Kind kind) { return c.measure(nets, ni, li, kind, o.bf16); });
    check_cudnn(c.v.destroy(c.vh), "vcudnn's destroy");
    CUDNN_OK(cudnnDestroy(c.h));
    close_timing(c);
  } catch (const Failure& e) {
    die(e.what());
  }
  return 0;
}

}  // namespace vcudnn::bench
