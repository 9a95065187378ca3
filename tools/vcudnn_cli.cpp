// `vcudnn`: the project's main command. `vcudnn info` prints the cuDNN and CUDA runtime vcudnn
// resolves, whether a GPU is present, and the configuration table; `vcudnn trace FILE` checks
// and summarises a trace written by VCUDNN_TRACE.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <map>
#include <vector>

#include "planner/trace.h"
#include "runtime/options.h"
#include "runtime/real_api.h"

namespace vcudnn {
namespace {

std::string cudnn_version_text(size_t v) { return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100); }

void print_library(const char* what, const LibraryInfo& lib) {
  if (!lib.found) {
    fmt::print("{:<14} not found: {}\n", what, lib.error);
    return;
  }
  fmt::print("{:<14} {} (found via {})\n", what, lib.path, lib.how);
  if (lib.missing) fmt::print("{:<14} {} entry points missing: {}\n", "", lib.missing, lib.missing_names);
}

void print_gpu() {
  const RealCudart& rt = real_cudart();
  if (!rt.cudaGetDeviceCount) {
    fmt::print("{:<14} unknown (no CUDA runtime)\n", "GPU");
    return;
  }
  int count = 0;
  cudaError_t err = rt.cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    fmt::print("{:<14} none ({})\n", "GPU", err == cudaSuccess ? "no device" : rt.cudaGetErrorString(err));
    return;
  }
  int runtime = 0, driver = 0;
  rt.cudaRuntimeGetVersion(&runtime);
  rt.cudaDriverGetVersion(&driver);
  for (int d = 0; d < count; ++d) {
    // cudaDeviceProp's layout is the one of the headers' CUDA major version; ask only a runtime
    // of that major version for it.
    if (runtime / 1000 == CUDART_VERSION / 1000 && rt.cudaGetDeviceProperties) {
      cudaDeviceProp prop{};
      if (rt.cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        fmt::print("{:<14} {}: {} ({} SMs, {:.1f} GiB, compute {}.{})\n", d == 0 ? "GPU" : "", d, prop.name,
                   prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30), prop.major, prop.minor);
        continue;
      }
    }
    fmt::print("{:<14} {}: present\n", d == 0 ? "GPU" : "", d);
  }
  fmt::print("{:<14} runtime {}.{}, driver {}.{}\n", "CUDA", runtime / 1000, runtime % 1000 / 10, driver / 1000,
             driver % 1000 / 10);
}

int run_info() {
  fmt::print("vcudnn {}\n", VCUDNN_VERSION);
  const LibraryInfo& cudnn = cudnn_library();
  print_library("cuDNN", cudnn);
  if (cudnn.found && real().cudnnGetVersion)
    fmt::print("{:<14} {} (built against {})\n", "cuDNN version", cudnn_version_text(real().cudnnGetVersion()),
               cudnn_version_text(CUDNN_VERSION));
  print_library("CUDA runtime", cudart_library());
  print_gpu();
  const Options& o = options();
  fmt::print("\nconfiguration\n");
  fmt::print("  {:<22} {:<14} {:<11} {}\n", "variable", "value", "source", "meaning");
  for (const auto& spec : option_specs()) {
    const char* source = o.source[spec.id] == OptionSource::kEnvironment ? "environment"
                         : o.source[spec.id] == OptionSource::kFallback  ? "fallback"
                                                                         : "default";
    std::string value = o.get(spec.id).empty() ? "(unset)" : o.get(spec.id);
    std::string doc = spec.doc;
    if (spec.type == OptionType::kEnum) doc = std::string("[") + spec.accepted + "] " + doc;
    fmt::print("  {:<22} {:<14} {:<11} {}\n", spec.env, value, source, doc);
  }
  for (const auto& e : o.errors) fmt::print("error: {}\n", e);
  for (const auto& w : o.warnings) fmt::print("warning: {}\n", w);
  return o.errors.empty() ? 0 : 2;
}

int run_trace(const std::string& path, bool require_complete) {
  auto r = read_trace(path);
  if (!r) {
    fmt::print(stderr, "error: {}\n", r.error().message);
    return 1;
  }
  const Trace& t = r.value();
  std::map<std::string, int> kinds;
  double gpu_ms = 0;
  int convs = 0, timed = 0;
  for (const auto& c : t.calls) {
    std::string k(call_kind_name(c.kind));
    if (call_has_conv_kind(c.kind)) k += "/" + std::string(conv_kind_name(c.conv));
    ++kinds[k];
    if (c.kind == CallKind::kConvolution) {
      ++convs;
      if (c.gpu_ms) {
        ++timed;
        gpu_ms += *c.gpu_ms;
      }
    }
  }
  fmt::print("trace {}: schema {}, vcudnn {}, cuDNN {}\n", path, kTraceSchema, t.vcudnn_version,
             cudnn_version_text(static_cast<size_t>(t.cudnn_version)));
  fmt::print("iteration: {} (detected: {}), calls {}..{}\n", t.complete ? "complete" : "INCOMPLETE", t.detected_by,
             t.first_seq, t.end_seq);
  fmt::print("{} calls, {} convolutions ({} timed, {:.3f} ms GPU), {} layers, {} threads, {} handles, {} streams\n",
             t.calls.size(), convs, timed, gpu_ms, t.layers.size(), t.threads.size(), t.handles.size(),
             t.streams.size());
  for (const auto& [k, n] : kinds) fmt::print("  {:<36} {}\n", k, n);
  return (require_complete && !t.complete) ? 3 : 0;
}

}  // namespace
}  // namespace vcudnn

int main(int argc, char** argv) {
  CLI::App app{"vcudnn: cuDNN interposer for micro-batching and offloading"};
  app.require_subcommand(0, 1);
  auto* info = app.add_subcommand("info", "resolved libraries, GPU and configuration (default)");
  std::string trace_path;
  bool require_complete = false;
  auto* trace = app.add_subcommand("trace", "check and summarise a trace written by VCUDNN_TRACE");
  trace->add_option("file", trace_path, "trace file")->required();
  trace->add_flag("--require-complete", require_complete, "exit 3 when the trace holds no complete iteration");
  CLI11_PARSE(app, argc, argv);
  if (trace->parsed()) return vcudnn::run_trace(trace_path, require_complete);
  (void)info;
  return vcudnn::run_info();
}
