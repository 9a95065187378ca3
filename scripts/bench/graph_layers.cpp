// Micro-batching per layer on cuDNN's graph (backend) API, PyTorch's default path: cuDNN's best engine under a
// workspace limit vs the plan vcudnn makes of the caller's. The graph-API twin of microbatch_layers.cpp, with the
// same command line and rows (scripts/bench/microbatch --path default reads them).
// The program links real cuDNN and dlopen()s libvcudnn.so RTLD_LOCAL; every convolution is built the way PyTorch's
// Conv_v8 path builds it (tests/gpu/graph_conv_build.h) through one of two tables of backend entry points: the linked
// cuDNN's, or libvcudnn.so's interposers of the same names, so that only the vcudnn side's descriptors, handle and
// executions go through vcudnn, whose policy comes from the environment (VCUDNN_POLICY=microbatch
// VCUDNN_WORKSPACE_LIMIT=<limit>, set by the driver). Per (layer, kind):
//  - caller: the plan PyTorch builds with cudnn.benchmark=False (heuristics mode A then FALLBACK, the first
//    configuration without DOWN_CONVERT_INPUTS that finalizes), on real cuDNN with its own workspace.
//  - baseline: every configuration of modes A and FALLBACK (the same engine and knob choices counted once) that
//    finalizes, needs at most `limit` bytes and stays in the caller's numerics class (no numerical note the caller's
//    engine does not carry, tensor cores aside for bf16; never DOWN_CONVERT_INPUTS), each timed (1 warm-up, median of
//    3); the fastest.
//  - vcudnn: the caller's plan built through vcudnn; its workspace size read through vcudnn (0 when vcudnn takes the
//    plan over), exactly that allocated; its first execution plans (timed as plan_ms); vcudnnGetExecutionPlanInfo
//    says what runs.
// Then R rounds, each K back-to-back executions of the baseline, the vcudnn side and the caller's plan timed with
// events on one stream, the order rotating between rounds (a plan vcudnn leaves alone is checked against the
// caller's plan on real cuDNN, measured in the same rounds). Writes one JSON object per line: a header, then one per
// (net, layer, kind).
//   usage: vcudnn_bench_graph_layers [--net alexnet|resnet50|vgg16|all] [--dtype fp32|bf16] [--limit BYTES]
//          [--rounds R] [--reps K] [--batch N] [--json FILE] [--vcudnn PATH] [--quick] [--list]
#include <cuda_runtime_api.h>
#include <cudnn.h>

#define VCUDNN_C_API_ONLY
#include <vcudnn/vcudnn.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "conv_nets.h"
#include "layer_bench.h"
#include "tests/gpu/graph_conv_build.h"

namespace {

using namespace vcudnn::bench;
namespace graph = vcudnn::test::graph;

// ---------------------------------------------------------------------------------------------------------------
// vcudnn: its interposers of the backend API and of the handle calls, looked up by cuDNN's names.

struct Vcudnn {
  graph::BackendApi backend;
  decltype(&::cudnnCreate) create = nullptr;
  decltype(&::cudnnDestroy) destroy = nullptr;
  decltype(&::cudnnSetStream) set_stream = nullptr;
  decltype(&::vcudnnGetExecutionPlanInfo) plan_info = nullptr;  // optional: the fields it fills stay null
  decltype(&::vcudnnGetVersionString) version = nullptr;        // optional
  decltype(&::vcudnnIterationBoundary) boundary = nullptr;      // optional
  bool finalize_interposed = false;
};

Vcudnn load_library(const std::string& path) {
  void* lib = open_vcudnn(path);
  Vcudnn v;
  load_symbol(lib, "cudnnBackendCreateDescriptor", v.backend.create);
  load_symbol(lib, "cudnnBackendDestroyDescriptor", v.backend.destroy);
  load_symbol(lib, "cudnnBackendSetAttribute", v.backend.set);
  load_symbol(lib, "cudnnBackendGetAttribute", v.backend.get);
  // libvcudnn.so need not interpose finalizing (it does not now): a preloaded program then finalizes on real cuDNN,
  // and so does this one.
  load_symbol(lib, "cudnnBackendFinalize", v.backend.finalize, false);
  v.finalize_interposed = v.backend.finalize != nullptr;
  if (!v.finalize_interposed) v.backend.finalize = &::cudnnBackendFinalize;
  load_symbol(lib, "cudnnBackendExecute", v.backend.execute);
  load_symbol(lib, "cudnnCreate", v.create);
  load_symbol(lib, "cudnnDestroy", v.destroy);
  load_symbol(lib, "cudnnSetStream", v.set_stream);
  load_symbol(lib, "vcudnnGetExecutionPlanInfo", v.plan_info, false);
  load_symbol(lib, "vcudnnGetVersionString", v.version, false);
  load_symbol(lib, "vcudnnIterationBoundary", v.boundary, false);
  return v;
}

// One measurement context: real cuDNN's handle and vcudnn's on the same stream.
struct Ctx : BenchCtx {
  graph::BackendApi real;  // the linked cuDNN
  cudnnHandle_t h = nullptr;
  cudnnHandle_t vh = nullptr;  // created by vcudnn's cudnnCreate
  Vcudnn v;

  // bench_main's hooks.
  void load_vcudnn(const std::string& path) {
    v = load_library(path);
    iteration_boundary = v.boundary;
  }
  void describe(json& header) const {
    header["api"] = "graph";
    header["plan_info"] = v.plan_info != nullptr;
    header["finalize_interposed"] = v.finalize_interposed;
  }
  json measure(const std::vector<Net>& nets, size_t ni, size_t li, Kind kind, bool bf16);
};

// ---------------------------------------------------------------------------------------------------------------
// The convolution and its data.

graph::ConvSpec conv_spec(const Layer& l, int batch, Kind kind, bool bf16) {
  graph::ConvSpec s;
  s.kind = kind == kFwd       ? graph::ConvKind::kFwd
           : kind == kBwdData ? graph::ConvKind::kBwdData
                              : graph::ConvKind::kBwdFilter;
  const int64_t out = out_dim(l.hw, l.r, l.stride, l.pad);
  s.x = {batch, l.c, l.hw, l.hw};
  s.w = {l.k, l.c, l.r, l.r};
  s.y = {batch, l.k, out, out};
  // fp32: NCHW, as PyTorch's default; bf16: channels_last, as autocast with channels_last models.
  s.xs = graph::strides_of(s.x, bf16);
  s.ws = graph::strides_of(s.w, bf16);
  s.ys = graph::strides_of(s.y, bf16);
  s.io = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  s.pad = l.pad;
  s.stride = l.stride;
  return s;
}

size_t elements(const std::array<int64_t, 4>& d) { return static_cast<size_t>(d[0] * d[1] * d[2] * d[3]); }

// bf16 of a float, rounded to nearest even (the inputs are finite).
uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Small random values (uniform in [-0.5, 0.5), fixed seed) so that no engine sees a degenerate input: up to 1 Mi
// elements made on the host, repeated through the buffer by device copies.
void fill_random(const DeviceBuffer& b, size_t elem, uint32_t seed) {
  const size_t block = std::min<size_t>(b.bytes / elem, size_t{1} << 20);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<unsigned char> host(block * elem);
  for (size_t i = 0; i < block; ++i) {
    const float f = dist(rng);
    if (elem == 2) {
      const uint16_t h = to_bf16(f);
      std::memcpy(&host[2 * i], &h, 2);
    } else {
      std::memcpy(&host[4 * i], &f, 4);
    }
  }
  CUDA_OK(cudaMemcpy(b.p, host.data(), host.size(), cudaMemcpyHostToDevice));
  for (size_t done = host.size(); done < b.bytes;) {
    const size_t n = std::min(done, b.bytes - done);
    CUDA_OK(cudaMemcpy(static_cast<char*>(b.p) + done, b.p, n, cudaMemcpyDeviceToDevice));
    done += n;
  }
}

// The buffers of one (layer, kind): its two inputs, written once, and its output, which both sides write.
struct Buffers {
  DeviceBuffer in1, in2, out;
  void *x = nullptr, *w = nullptr, *y = nullptr;  // in the operation's terms (x: dx, w: dw, y: dy where they apply)

  // 0xFF in every byte: NaN in fp32 and bf16, so that an output a side does not write shows.
  void poison(cudaStream_t s) const { CUDA_OK(cudaMemsetAsync(out.p, 0xFF, out.bytes, s)); }
};

void make_buffers(Buffers& b, const graph::ConvSpec& s, bool bf16) {
  const size_t elem = bf16 ? 2 : 4;
  const size_t xb = elements(s.x) * elem, wb = elements(s.w) * elem, yb = elements(s.y) * elem;
  switch (s.kind) {
    case graph::ConvKind::kFwd:
      b.in1 = DeviceBuffer(xb), b.in2 = DeviceBuffer(wb), b.out = DeviceBuffer(yb);
      b.x = b.in1.p, b.w = b.in2.p, b.y = b.out.p;
      break;
    case graph::ConvKind::kBwdData:
      b.in1 = DeviceBuffer(yb), b.in2 = DeviceBuffer(wb), b.out = DeviceBuffer(xb);
      b.y = b.in1.p, b.w = b.in2.p, b.x = b.out.p;
      break;
    case graph::ConvKind::kBwdFilter:
      b.in1 = DeviceBuffer(xb), b.in2 = DeviceBuffer(yb), b.out = DeviceBuffer(wb);
      b.x = b.in1.p, b.y = b.in2.p, b.w = b.out.p;
      break;
  }
  fill_random(b.in1, elem, 1);
  fill_random(b.in2, elem, 2);
  CUDA_OK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------------------------------------------
// Engines and their numerics.

const char* note_name(cudnnBackendNumericalNote_t n) {
  switch (n) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
      return "TENSOR_CORE";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      return "DOWN_CONVERT_INPUTS";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
      return "REDUCED_PRECISION_REDUCTION";
    case CUDNN_NUMERICAL_NOTE_FFT:
      return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
      return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      return "WINOGRAD_TILE_4x4";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      return "WINOGRAD_TILE_6x6";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
      return "WINOGRAD_TILE_13x13";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP:
      return "STRICT_NAN_PROP";
    default:
      return "?";
  }
}

json note_names(const graph::EngineInfo& e) {
  json a = json::array();
  for (auto n : e.notes) a.push_back(note_name(n));
  return a;
}

// PyTorch (cudnn.benchmark=False, allow_tf32 and non-deterministic engines allowed, its defaults) takes the first
// configuration that finalizes unless it down-converts its inputs.
bool caller_accepts(const graph::EngineInfo& e) { return !e.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS); }

// The caller's numerics class, as vcudnn keeps to it (runtime/graph_microbatcher.h, Note [Numerics class]): no note
// the caller's engine does not carry, except tensor cores for 16-bit data; never DOWN_CONVERT_INPUTS.
bool in_class(const graph::EngineInfo& e, const graph::EngineInfo& caller, bool bf16) {
  for (auto n : e.notes) {
    if (n == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (n == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && bf16) continue;
    if (!caller.has(n)) return false;
  }
  return true;
}

using Knobs = std::vector<std::pair<int64_t, int64_t>>;  // (knob type, value), sorted

// A configuration's knob choices; with its engine, what tells two configurations apart. nullopt when cuDNN does not
// answer (the configuration is then never taken for another's duplicate).
std::optional<Knobs> knob_choices(const graph::Desc& config) {
  const graph::BackendApi& api = config.api();
  std::vector<graph::Desc> choices;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    choices.emplace_back(api, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    raw.push_back(choices.back().get());
  }
  int64_t n = 0;
  if (api.get(config.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
              static_cast<int64_t>(raw.size()), &n, raw.data()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  Knobs knobs;
  for (int64_t i = 0; i < std::min<int64_t>(n, static_cast<int64_t>(raw.size())); ++i) {
    cudnnBackendKnobType_t type{};
    int64_t value = 0, got = 0;
    if (api.get(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &got, &type) !=
            CUDNN_STATUS_SUCCESS ||
        api.get(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &got, &value) != CUDNN_STATUS_SUCCESS)
      return std::nullopt;
    knobs.emplace_back(static_cast<int64_t>(type), value);
  }
  std::sort(knobs.begin(), knobs.end());
  return knobs;
}

std::string knobs_text(const std::optional<Knobs>& knobs) {
  if (!knobs) return "?";
  std::string s;
  for (const auto& [type, value] : *knobs)
    s.append(s.empty() ? "" : ",").append(std::to_string(type)).append("=").append(std::to_string(value));
  return s;
}

std::string engine_name(int64_t engine) { return "engine " + std::to_string(engine); }

// Milliseconds of single executions: one warm-up, then the median of `runs`, each timed with events.
double time_single(const BenchCtx& c, const Call& call, int runs, const char* who) {
  BenchCtx once = c;
  once.reps = 1;
  check_cudnn(call(), who);
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) t.push_back(time_reps(once, call, who));
  return quantile(t, 0.5);
}

// ---------------------------------------------------------------------------------------------------------------
// The three plans.

// The caller's plan on real cuDNN with its own workspace (no limit), timed in the same rounds as the two others
// (row["caller"]): what a plan vcudnn leaves alone is checked against.
struct CallerSide {
  DeviceBuffer ws;
  graph::Desc pack;
  Call call;
};

// Builds the caller's side and runs it once (a failure lands in the returned object's "error"; `side.call` stays
// empty); the object is row["caller"], its times added by time_rounds().
json prepare_caller(Ctx& c, const graph::Plan& caller, const Buffers& b, CallerSide& side) {
  json out = {{"engine", caller.engine},         {"workspace", caller.workspace},    {"heuristics", caller.mode},
              {"configs_tried", caller.configs}, {"notes", note_names(caller.info)}, {"ms", nullptr}};
  try {
    side.ws = DeviceBuffer(static_cast<size_t>(caller.workspace));
    side.pack = graph::variant_pack(c.real, b.x, b.w, b.y, side.ws.p);
    Call call = [&c, &caller, &side] { return c.real.execute(c.h, caller.plan.get(), side.pack.get()); };
    b.poison(c.s);
    check_cudnn(call(), "caller warm-up");
    side.call = std::move(call);
  } catch (const std::runtime_error& e) {
    out["error"] = e.what();
  }
  return out;
}

// cuDNN's best engine configuration under the limit, within the caller's numerics class.
struct Baseline {
  std::vector<graph::Desc> keep;  // the graph's descriptors and every configuration
  graph::Desc plan;
  int64_t engine = -1, workspace = 0;
  double ms = 0;
};

// One configuration: finalized, sized and, when it fits the limit, timed (its row in base["find_rows"] says how far
// it got). A down-converting one is not even finalized. `plan` keeps the plan when it was timed.
json try_config(Ctx& c, const graph::Desc& config, const graph::EngineInfo& e, const Buffers& b, graph::Desc& plan) {
  json r = {{"engine", e.index}, {"notes", note_names(e)}, {"workspace", nullptr}, {"ms", nullptr}};
  if (e.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) {
    r["status"] = "down-converts";
    return r;
  }
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  graph::Desc p = graph::finalize_plan(config, &st);
  if (st != CUDNN_STATUS_SUCCESS) {
    r["status"] = cudnnGetErrorString(st);
    return r;
  }
  const int64_t ws = graph::workspace_of(p);
  r["workspace"] = ws;
  if (ws > static_cast<int64_t>(c.limit)) {
    r["status"] = "over the limit";
    return r;
  }
  try {
    const graph::Desc pack = graph::variant_pack(c.real, b.x, b.w, b.y, ws ? c.ws : nullptr);
    r["ms"] = time_single(
        c, [&] { return c.real.execute(c.h, p.get(), pack.get()); }, 3, "candidate");
    r["status"] = "ok";
    plan = std::move(p);
  } catch (const std::runtime_error& f) {
    r["status"] = f.what();
  }
  return r;
}

// Every configuration of modes A and FALLBACK, once each (the same engine and knob choices: the first kept), tried
// (try_config); the fastest in the caller's numerics class is the baseline. The fastest of any class is recorded
// too, to show what the class costs.
void find_baseline(Ctx& c, const graph::ConvSpec& spec, const graph::Plan& caller, const Buffers& b, bool bf16,
                   Baseline& best, json& base) {
  const auto t0 = Clock::now();
  graph::Desc g = graph::operation_graph(c.real, c.h, spec, best.keep);
  std::set<std::pair<int64_t, Knobs>> seen;
  json rows = json::array(), fastest_any = nullptr;
  int timed_in_class = 0, duplicates = 0;
  b.poison(c.s);
  const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {{CUDNN_HEUR_MODE_A, "a"},
                                                                  {CUDNN_HEUR_MODE_FALLBACK, "fallback"}};
  for (const auto& [mode, mode_name] : modes) {
    for (graph::Desc& config : graph::heuristic_configs(g, mode)) {
      const graph::EngineInfo e = graph::engine_of(config);
      const std::optional<Knobs> knobs = knob_choices(config);
      if (knobs && !seen.insert({e.index, *knobs}).second) {
        ++duplicates;
        continue;
      }
      graph::Desc plan;
      json r = try_config(c, config, e, b, plan);
      best.keep.push_back(std::move(config));  // a plan's configuration lives as long as the plan
      r["heuristics"] = mode_name;
      r["knobs"] = knobs_text(knobs);
      r["in_class"] = in_class(e, caller.info, bf16);
      if (plan.get()) {
        const double ms = r["ms"].get<double>();
        if (fastest_any.is_null() || ms < fastest_any["ms"].get<double>()) fastest_any = r;
        if (r["in_class"].get<bool>()) {
          ++timed_in_class;
          if (!best.plan.get() || ms < best.ms) {
            best.plan = std::move(plan);
            best.engine = e.index, best.workspace = r["workspace"].get<int64_t>(), best.ms = ms;
            base["knobs"] = r["knobs"];
            base["notes"] = r["notes"];
          }
        }
      }
      rows.push_back(std::move(r));
    }
  }
  best.keep.push_back(std::move(g));
  base["find_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  base["find_rows"] = std::move(rows);
  base["duplicates"] = duplicates;
  base["fastest_any_class"] = std::move(fastest_any);
  if (!best.plan.get()) throw Failure("no engine configuration in the caller's numerics class runs within the limit");
  base["algo"] = best.engine;
  base["algo_name"] = engine_name(best.engine);
  base["workspace"] = best.workspace;
  base["find_row_ms"] = best.ms;
  base["candidates"] = timed_in_class;
}

// vcudnn's side: the caller's plan through vcudnn, with what vcudnn answers for its workspace. Its first execution
// plans (plan_ms); then the plan info. Throws on a failure.
struct VcudnnSide {
  std::optional<graph::Plan> plan;
  DeviceBuffer ws;
  graph::Desc pack;
};

void prepare_vcudnn(Ctx& c, const graph::ConvSpec& spec, const Buffers& b, VcudnnSide& v, json& vc) {
  v.plan.emplace(graph::build_plan(c.v.backend, c.vh, spec, caller_accepts));
  const graph::Plan& p = *v.plan;
  vc["caller_engine"] = p.engine;
  vc["answered_workspace"] = p.workspace;
  v.ws = DeviceBuffer(static_cast<size_t>(p.workspace));
  v.pack = graph::variant_pack(c.v.backend, b.x, b.w, b.y, v.ws.p);
  b.poison(c.s);
  CUDA_OK(cudaDeviceSynchronize());
  const auto t0 = Clock::now();
  const cudnnStatus_t st =
      first_call_as_iteration(c, [&] { return c.v.backend.execute(c.vh, p.plan.get(), v.pack.get()); });
  const cudaError_t ce = cudaDeviceSynchronize();
  vc["plan_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  check_cuda(ce, "cudaDeviceSynchronize after the first vcudnn execution");
  check_cudnn(st, "first vcudnn execution (plans)");

  if (!c.v.plan_info) {
    vc["plan_info_error"] = "libvcudnn.so lacks vcudnnGetExecutionPlanInfo";
  } else {
    vcudnnPlanInfo_t info{};
    const cudnnStatus_t pst = c.v.plan_info(p.plan.get(), &info);
    if (pst == CUDNN_STATUS_SUCCESS) {
      info.description[sizeof info.description - 1] = '\0';
      vc["taken_over"] = true;
      vc["micro_batches"] = info.microBatches;
      vc["first_algo"] = info.firstAlgo;
      vc["first_algo_name"] = info.firstAlgo >= 0 ? engine_name(info.firstAlgo) : "caller's plan";
      vc["workspace"] = info.workspaceBytes;
      vc["predicted_ms"] = info.predictedMs;
      vc["fallback"] = info.fallback != 0;
      vc["description"] = info.description;
    } else if (pst == CUDNN_STATUS_NOT_SUPPORTED) {
      vc["taken_over"] = false;
      vc["micro_batches"] = 1;
      vc["first_algo"] = p.engine;
      vc["first_algo_name"] = engine_name(p.engine);
      vc["workspace"] = p.workspace;
      vc["fallback"] = false;
      vc["description"] = "caller's plan (fits the limit, not taken over)";
    } else {
      vc["plan_info_error"] = std::string("vcudnnGetExecutionPlanInfo: ") + cudnnGetErrorString(pst);
    }
  }
  check_cudnn(c.v.backend.execute(c.vh, p.plan.get(), v.pack.get()), "vcudnn warm-up execution");
  CUDA_OK(cudaStreamSynchronize(c.s));
}

// Measures one (layer, kind). Never throws: failures land in the row's "error" fields. Every descriptor is destroyed
// before it returns, through the table that made it, so that vcudnn forgets its plans.
json measure(Ctx& c, const Net& net, const Layer& l, Kind kind, bool bf16) {
  json row = row_start(net, l, kind, bf16, c.limit);
  json base = null_fields({"algo", "workspace", "ms", "p25", "p75"});
  json vc = null_fields({"micro_batches", "first_algo", "workspace", "predicted_ms", "fallback", "description", "ms",
                         "p25", "p75", "plan_ms", "taken_over"});
  row["caller"] = nullptr;
  try {
    const graph::ConvSpec spec = conv_spec(l, net.batch, kind, bf16);
    row["shape"]["out_hw"] = spec.y[2];
    Buffers b;
    make_buffers(b, spec, bf16);

    const graph::Plan caller = graph::build_plan(c.real, c.h, spec, caller_accepts);
    CallerSide caller_side;
    row["caller"] = prepare_caller(c, caller, b, caller_side);

    Baseline best;
    find_baseline(c, spec, caller, b, bf16, best, base);
    const graph::Desc base_pack = graph::variant_pack(c.real, b.x, b.w, b.y, best.workspace ? c.ws : nullptr);
    const Call baseline_call = [&] { return c.real.execute(c.h, best.plan.get(), base_pack.get()); };
    CUDNN_OK(baseline_call());  // warm-up
    CUDA_OK(cudaStreamSynchronize(c.s));

    bool v_ok = true;
    VcudnnSide v;
    try {
      prepare_vcudnn(c, spec, b, v, vc);
      if (vc["caller_engine"] != caller.engine) vc["caller_engine_differs"] = true;
    } catch (const std::runtime_error& e) {
      vc["error"] = e.what();
      v_ok = false;
    }
    ThirdSide third{caller_side.call, &row["caller"]};
    time_rounds(
        c, baseline_call, [&] { return c.v.backend.execute(c.vh, v.plan->plan.get(), v.pack.get()); }, v_ok, row, base,
        vc, caller_side.call ? &third : nullptr);
  } catch (const std::runtime_error& e) {
    row["error"] = e.what();
  }
  finish_row(row, std::move(base), std::move(vc));
  return row;
}

json Ctx::measure(const std::vector<Net>& nets, size_t ni, size_t li, Kind kind, bool bf16) {
  return ::measure(*this, nets[ni], nets[ni].layers[li], kind, bf16);
}

}  // namespace

int main(int argc, char** argv) { return bench_main<Ctx>(argc, argv, "vcudnn_bench_graph_layers"); }
