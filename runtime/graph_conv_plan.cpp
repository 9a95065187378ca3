// GraphConvPlan (graph_conv_plan.h): the micro-batch arithmetic, the operation graph of one
// convolution, engine configurations from the heuristics, plans and their execution.
#include "runtime/graph_conv_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "runtime/conv_descriptors.h"

namespace vcudnn {

// Returns the Error of a failed Status or Result from the enclosing function.
#define VCUDNN_GRAPH_TRY(expr)          \
  do {                                  \
    if (auto r_ = (expr); !r_.ok()) {   \
      return Error{r_.error().message}; \
    }                                   \
  } while (0)

namespace {

constexpr size_t kMaxReasons = 8;  // refused candidates named in an error, the rest counted

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The largest power of two dividing v, at most 16; v == 0 counts as divisible by anything.
int64_t power_of_two_dividing(uint64_t v) {
  int64_t a = kMaxTensorAlignment;
  while (a > 1 && v % static_cast<uint64_t>(a) != 0) a >>= 1;
  return a;
}

std::string describe(const ConvLayer& layer, ConvKind kind, int32_t batch) {
  return std::string(conv_kind_name(kind)) + " " + layer.to_string() + " at batch " + std::to_string(batch);
}

Status check_layer(const ConvLayer& l, int32_t batch) {
  const int32_t nb = l.x.nb_dims;
  if (nb < 3 || nb > kMaxDims || l.w.nb_dims != nb || l.y.nb_dims != nb)
    return Error{"x, w and y must have the same rank, 3 to " + std::to_string(kMaxDims)};
  if (l.conv.spatial_dims != nb - 2) return Error{"the convolution's spatial rank does not match the tensors'"};
  for (int32_t i = 0; i < nb; ++i)
    if (l.x.dims[i] <= 0 || l.y.dims[i] <= 0 || l.w.dims[i] <= 0 || l.x.strides[i] <= 0 || l.y.strides[i] <= 0)
      return Error{"dimensions and strides must be positive"};
  if (l.x.dims[0] != l.y.dims[0]) return Error{"x and y have different batch sizes"};
  if (batch <= 0 || batch > l.x.dims[0]) return Error{"micro-batch " + std::to_string(batch) + " is not in 1..N"};
  if (!element_bytes(l.x.dtype) || !element_bytes(l.w.dtype) || !element_bytes(l.y.dtype))
    return Error{"data type not supported (float, double, half, bf16)"};
  if (l.conv.compute_type < 0 || l.conv.mode < 0) return Error{"the convolution has no compute type or mode"};
  return ok_status();
}

Result<BackendDescriptor> make_descriptor(cudnnBackendDescriptorType_t type) { return BackendDescriptor::create(type); }

Result<BackendDescriptor> make_tensor(const char* what, int64_t uid, int32_t dtype, int32_t nb, const int64_t* dims,
                                      const int64_t* strides, int64_t alignment) {
  auto t = make_descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (!t) return t.error();
  const BackendDescriptor& d = t.value();
  const auto type = static_cast<cudnnDataType_t>(dtype);
  const std::string w(what);
  VCUDNN_GRAPH_TRY(d.set((w + " data type").c_str(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  VCUDNN_GRAPH_TRY(d.set((w + " dimensions").c_str(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nb, dims));
  VCUDNN_GRAPH_TRY(d.set((w + " strides").c_str(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nb, strides));
  VCUDNN_GRAPH_TRY(d.set((w + " unique id").c_str(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  VCUDNN_GRAPH_TRY(
      d.set((w + " alignment").c_str(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
  VCUDNN_GRAPH_TRY(d.finalize(what));
  return std::move(t.value());
}

Result<BackendDescriptor> make_convolution(const ConvFingerprint& c) {
  auto d = make_descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  if (!d) return d.error();
  const BackendDescriptor& conv = d.value();
  const int64_t n = c.spatial_dims;
  std::array<int64_t, kMaxDims> pad{}, stride{}, dilation{};
  for (int64_t i = 0; i < n; ++i) {
    pad[i] = c.pad[i];
    stride[i] = c.stride[i];
    dilation[i] = c.dilation[i];
  }
  const auto compute = static_cast<cudnnDataType_t>(c.compute_type);
  const auto mode = static_cast<cudnnConvolutionMode_t>(c.mode);
  VCUDNN_GRAPH_TRY(conv.set("convolution spatial dims", CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &n));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution compute type", CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution mode", CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution pre-paddings", CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, n, pad.data()));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution post-paddings", CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, n, pad.data()));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution strides", CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, n, stride.data()));
  VCUDNN_GRAPH_TRY(
      conv.set("convolution dilations", CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, n, dilation.data()));
  VCUDNN_GRAPH_TRY(conv.finalize("convolution"));
  return std::move(d.value());
}

// The operation's attribute names, in layer terms.
struct OpAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OpAttributes op_attributes(ConvKind kind) {
  switch (kind) {
    case ConvKind::kBackwardData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvKind::kBackwardFilter:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
    case ConvKind::kForward:
    default:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  }
}

// alpha and beta as cudnn-frontend sets them: double for double data, float otherwise.
Status set_scaling(const BackendDescriptor& op, const char* what, cudnnBackendAttributeName_t name, double value,
                   bool as_double) {
  if (as_double) return op.set(what, name, CUDNN_TYPE_DOUBLE, 1, &value);
  const float f = static_cast<float>(value);
  return op.set(what, name, CUDNN_TYPE_FLOAT, 1, &f);
}

// ---- Engine configurations

struct Candidate {
  BackendDescriptor config;
  int64_t engine = -1;
  uint32_t notes = 0;  // note_bit() of each numerical note
};

Result<int64_t> get_int(const BackendDescriptor& d, const char* what, cudnnBackendAttributeName_t name) {
  int64_t value = -1, count = 0;
  const cudnnStatus_t st = real_backend().get(d.get(), name, CUDNN_TYPE_INT64, 1, &count, &value);
  if (st != CUDNN_STATUS_SUCCESS) return backend_error(std::string("reading ") + what, st);
  if (count < 1) return Error{std::string("reading ") + what + ": no value"};
  return value;
}

// The engine a configuration runs: its global index and numerical notes.
Status read_engine(const BackendDescriptor& engine, Candidate& c) {
  auto index = get_int(engine, "the engine's global index", CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
  if (!index) return index.error();
  c.engine = index.value();
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  const cudnnStatus_t st = real_backend().get(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                              notes.size(), &count, notes.data());
  if (st != CUDNN_STATUS_SUCCESS) return backend_error("reading the engine's numerical notes", st);
  c.notes = 0;
  for (int64_t i = 0; i < std::min<int64_t>(count, notes.size()); ++i)
    if (notes[i] < CUDNN_NUMERICAL_NOTE_TYPE_COUNT) c.notes |= note_bit(notes[i]);
  return ok_status();
}

Status read_config_engine(cudnnBackendDescriptor_t config, Candidate& c) {
  auto engine = make_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!engine) return engine.error();
  cudnnBackendDescriptor_t raw = engine.value().get();
  int64_t count = 0;
  // cuDNN fills the engine descriptor we created (as cudnn-frontend reads it).
  const cudnnStatus_t st =
      real_backend().get(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw);
  if (st != CUDNN_STATUS_SUCCESS) return backend_error("reading the configuration's engine", st);
  return read_engine(engine.value(), c);
}

// The heuristics' configurations for `graph`, best first. Configurations whose engine cannot be
// read are left out and named in `reasons`.
Result<std::vector<Candidate>> heuristic_candidates(const BackendDescriptor& graph, cudnnBackendHeurMode_t mode,
                                                    std::vector<std::string>& reasons) {
  auto heur = make_descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur) return heur.error();
  const BackendDescriptor& h = heur.value();
  VCUDNN_GRAPH_TRY(h.set_descriptor("heuristics operation graph", CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
  VCUDNN_GRAPH_TRY(h.set("heuristics mode", CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  VCUDNN_GRAPH_TRY(h.finalize("heuristics"));
  int64_t available = 0;
  cudnnStatus_t st =
      real_backend().get(h.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr);
  if (st != CUDNN_STATUS_SUCCESS) return backend_error("counting the heuristics' results", st);
  std::vector<Candidate> out;
  if (available <= 0) return out;
  std::vector<BackendDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    auto c = make_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (!c) return c.error();
    raw.push_back(c.value().get());
    configs.push_back(std::move(c.value()));
  }
  int64_t returned = 0;
  st = real_backend().get(h.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned,
                          raw.data());
  if (st != CUDNN_STATUS_SUCCESS) return backend_error("reading the heuristics' results", st);
  returned = std::clamp<int64_t>(returned, 0, available);
  for (int64_t i = 0; i < returned; ++i) {
    Candidate c;
    c.config = std::move(configs[i]);
    if (Status s = read_config_engine(c.config.get(), c); !s) {
      reasons.push_back("configuration " + std::to_string(i) + ": " + s.error().message);
      continue;
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The configuration of engine `index` with its default knobs (not offered by the heuristics).
Result<Candidate> engine_candidate(const BackendDescriptor& graph, int64_t index) {
  auto engine = make_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!engine) return engine.error();
  const BackendDescriptor& e = engine.value();
  VCUDNN_GRAPH_TRY(e.set_descriptor("engine operation graph", CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph));
  VCUDNN_GRAPH_TRY(e.set("engine global index", CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index));
  VCUDNN_GRAPH_TRY(e.finalize("engine"));
  auto config = make_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (!config) return config.error();
  VCUDNN_GRAPH_TRY(config.value().set_descriptor("configuration engine", CUDNN_ATTR_ENGINECFG_ENGINE, e));
  VCUDNN_GRAPH_TRY(config.value().finalize("engine configuration"));
  Candidate c;
  c.config = std::move(config.value());
  VCUDNN_GRAPH_TRY(read_engine(e, c));
  return c;
}

struct Finalized {
  BackendDescriptor plan;
  uint64_t workspace = 0;
};

Result<Finalized> finalize_plan(const Candidate& c) {
  auto plan = make_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  if (!plan) return plan.error();
  const BackendDescriptor& p = plan.value();
  VCUDNN_GRAPH_TRY(p.set_descriptor("plan engine configuration", CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, c.config));
  VCUDNN_GRAPH_TRY(p.finalize("execution plan"));
  auto ws = get_int(p, "the plan's workspace size", CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
  if (!ws) return ws.error();
  if (ws.value() < 0) return Error{"the plan's workspace size is negative"};
  return Finalized{std::move(plan.value()), static_cast<uint64_t>(ws.value())};
}

std::string join_reasons(const std::vector<std::string>& reasons) {
  std::string s;
  for (size_t i = 0; i < reasons.size() && i < kMaxReasons; ++i) s += (i ? "; " : "") + reasons[i];
  if (reasons.size() > kMaxReasons) s += "; and " + std::to_string(reasons.size() - kMaxReasons) + " more";
  return s.empty() ? "the heuristics offered no configuration" : s;
}

}  // namespace

// ---- Micro-batch arithmetic

std::vector<MicroBatchSlice> split_batch(int64_t n, int32_t m) {
  std::vector<MicroBatchSlice> slices;
  if (n <= 0) return slices;
  if (m <= 0 || m >= n) {
    slices.push_back({0, static_cast<int32_t>(n)});
    return slices;
  }
  for (int64_t offset = 0; offset < n; offset += m)
    slices.push_back({offset, static_cast<int32_t>(std::min<int64_t>(m, n - offset))});
  return slices;
}

int64_t offset_alignment(int64_t base_alignment, uint64_t step_bytes) {
  if (base_alignment <= 0) return 1;
  const int64_t base = power_of_two_dividing(static_cast<uint64_t>(base_alignment));
  return std::min(base, power_of_two_dividing(step_bytes));
}

int64_t pointer_alignment(const void* p) { return power_of_two_dividing(reinterpret_cast<uintptr_t>(p)); }

std::optional<std::array<int64_t, kMaxDims>> filter_strides(const FilterFingerprint& w) {
  const int32_t nb = w.nb_dims;
  if (nb < 3 || nb > kMaxDims) return std::nullopt;
  std::array<int32_t, kMaxDims> order{};  // outermost first
  if (w.format == CUDNN_TENSOR_NCHW) {
    for (int32_t i = 0; i < nb; ++i) order[i] = i;
  } else if (w.format == CUDNN_TENSOR_NHWC) {
    order[0] = 0;
    for (int32_t i = 2; i < nb; ++i) order[i - 1] = i;
    order[nb - 1] = 1;
  } else {
    return std::nullopt;
  }
  std::array<int64_t, kMaxDims> strides{};
  int64_t s = 1;
  for (int32_t i = nb - 1; i >= 0; --i) {
    strides[order[i]] = s;
    s *= w.dims[order[i]];
  }
  return strides;
}

Result<SplitGeometry> split_geometry(const ConvLayer& layer, int32_t micro_batch, int64_t base_alignment) {
  if (!is_power_of_two(base_alignment)) return Error{"the base alignment must be a power of two"};
  const size_t xb = element_bytes(layer.x.dtype), yb = element_bytes(layer.y.dtype);
  if (!xb || !yb || layer.x.nb_dims < 1 || layer.x.strides[0] <= 0 || layer.y.strides[0] <= 0)
    return Error{"x and y must have a supported data type and a positive N stride"};
  SplitGeometry g;
  g.x_sample_bytes = static_cast<uint64_t>(layer.x.strides[0]) * xb;
  g.y_sample_bytes = static_cast<uint64_t>(layer.y.strides[0]) * yb;
  // Micro-batch k starts k * m samples in; one micro-batch only ever starts at the base.
  const bool divided = micro_batch > 0 && micro_batch < layer.x.dims[0];
  const uint64_t m = divided ? static_cast<uint64_t>(micro_batch) : 0;
  g.x_alignment = offset_alignment(base_alignment, m * g.x_sample_bytes);
  g.y_alignment = offset_alignment(base_alignment, m * g.y_sample_bytes);
  g.w_alignment = offset_alignment(base_alignment, 0);
  return g;
}

// ---- The operation graph

Result<ConvGraph> build_conv_graph(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                   const GraphConvPlanSpec& spec) {
  const int32_t batch = spec.batch > 0 ? spec.batch : static_cast<int32_t>(layer.x.dims[0]);
  VCUDNN_GRAPH_TRY(check_layer(layer, batch));
  for (int64_t a : {spec.x_alignment, spec.w_alignment, spec.y_alignment})
    if (!is_power_of_two(a)) return Error{"tensor alignments must be powers of two"};
  const auto w_strides = filter_strides(layer.w);
  if (!w_strides) return Error{"the filter's layout (" + format_name(layer.w.format) + ") is neither NCHW nor NHWC"};
  const int32_t nb = layer.x.nb_dims;
  std::array<int64_t, kMaxDims> x_dims = layer.x.dims, y_dims = layer.y.dims;
  x_dims[0] = batch;
  y_dims[0] = batch;

  ConvGraph g;
  auto x = make_tensor("x", kGraphXUid, layer.x.dtype, nb, x_dims.data(), layer.x.strides.data(), spec.x_alignment);
  if (!x) return x.error();
  g.x = std::move(x.value());
  auto w = make_tensor("w", kGraphWUid, layer.w.dtype, nb, layer.w.dims.data(), w_strides->data(), spec.w_alignment);
  if (!w) return w.error();
  g.w = std::move(w.value());
  auto y = make_tensor("y", kGraphYUid, layer.y.dtype, nb, y_dims.data(), layer.y.strides.data(), spec.y_alignment);
  if (!y) return y.error();
  g.y = std::move(y.value());
  auto conv = make_convolution(layer.conv);
  if (!conv) return conv.error();
  g.conv = std::move(conv.value());

  const OpAttributes a = op_attributes(kind);
  auto op = make_descriptor(a.type);
  if (!op) return op.error();
  g.op = std::move(op.value());
  VCUDNN_GRAPH_TRY(g.op.set_descriptor("operation x", a.x, g.x));
  VCUDNN_GRAPH_TRY(g.op.set_descriptor("operation w", a.w, g.w));
  VCUDNN_GRAPH_TRY(g.op.set_descriptor("operation y", a.y, g.y));
  VCUDNN_GRAPH_TRY(g.op.set_descriptor("operation convolution", a.conv, g.conv));
  const bool as_double = layer.x.dtype == CUDNN_DATA_DOUBLE;
  VCUDNN_GRAPH_TRY(set_scaling(g.op, "operation alpha", a.alpha, spec.alpha, as_double));
  VCUDNN_GRAPH_TRY(set_scaling(g.op, "operation beta", a.beta, spec.beta, as_double));
  VCUDNN_GRAPH_TRY(g.op.finalize("convolution operation"));

  auto graph = make_descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (!graph) return graph.error();
  g.graph = std::move(graph.value());
  const cudnnBackendDescriptor_t ops[] = {g.op.get()};
  VCUDNN_GRAPH_TRY(
      g.graph.set("graph operations", CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops));
  if (handle)
    VCUDNN_GRAPH_TRY(g.graph.set("graph handle", CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
  VCUDNN_GRAPH_TRY(g.graph.finalize("operation graph"));
  return g;
}

// ---- Plans

Result<ConfigEngine> configuration_engine(cudnnBackendDescriptor_t config) {
  if (!config) return Error{"no engine configuration"};
  Candidate c;
  VCUDNN_GRAPH_TRY(read_config_engine(config, c));
  return ConfigEngine{c.engine, c.notes};
}

Result<uint32_t> engine_numerical_notes(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind, int64_t engine,
                                        const GraphConvPlanSpec& spec) {
  auto graph = build_conv_graph(handle, layer, kind, spec);
  if (!graph) return graph.error();
  auto c = engine_candidate(graph.value().graph, engine);
  if (!c)
    return Error{"engine " + std::to_string(engine) + " on " + describe(layer, kind, spec.batch) + ": " +
                 c.error().message};
  return c.value().notes;
}

Result<GraphConvPlan> GraphConvPlan::build(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                           const GraphConvPlanSpec& spec) {
  GraphConvPlan p;
  p.kind_ = kind;
  p.spec_ = spec;
  if (p.spec_.batch <= 0) p.spec_.batch = static_cast<int32_t>(layer.x.dims[0]);
  auto graph = build_conv_graph(handle, layer, kind, p.spec_);
  if (!graph) return Error{describe(layer, kind, p.spec_.batch) + ": " + graph.error().message};
  p.graph_ = std::move(graph.value());

  std::vector<std::string> reasons;
  // Takes the candidate when its plan finalizes within the workspace limit.
  const auto take = [&](Candidate& c, int64_t id, const char* mode) {
    auto f = finalize_plan(c);
    if (!f) {
      reasons.push_back("engine " + std::to_string(c.engine) + ": " + f.error().message);
      return false;
    }
    if (f.value().workspace > spec.max_workspace) {
      reasons.push_back("engine " + std::to_string(c.engine) + ": workspace " + std::to_string(f.value().workspace) +
                        " > " + std::to_string(spec.max_workspace));
      return false;
    }
    p.plan_ = std::move(f.value().plan);
    p.workspace_bytes_ = f.value().workspace;
    p.config_ = std::move(c.config);
    p.engine_ = c.engine;
    p.config_id_ = id;
    p.mode_ = mode;
    return true;
  };

  const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {{CUDNN_HEUR_MODE_A, "a"},
                                                                  {CUDNN_HEUR_MODE_FALLBACK, "fallback"}};
  std::map<int64_t, int64_t> seen;           // configurations of each engine so far: the next one's variant
  std::optional<Candidate> first_of_engine;  // with spec.engine: that engine's first configuration
  for (const auto& [mode, name] : modes) {
    auto candidates = heuristic_candidates(p.graph_.graph, mode, reasons);
    if (!candidates) {
      reasons.push_back(std::string("heuristics ") + name + ": " + candidates.error().message);
      continue;
    }
    for (Candidate& c : candidates.value()) {
      const int64_t id = config_id(c.engine, seen[c.engine]++);
      if (spec.engine) {
        if (config_engine(*spec.engine) != c.engine) continue;
        if (id != *spec.engine) {
          if (!first_of_engine) first_of_engine = std::move(c);
          continue;
        }
        if (take(c, id, name)) return p;
        continue;
      }
      if (std::find(spec.excluded_configs.begin(), spec.excluded_configs.end(), id) != spec.excluded_configs.end())
        continue;
      if ((c.notes & spec.denied_notes) != 0) {
        reasons.push_back("engine " + std::to_string(c.engine) + ": numerical notes denied");
        continue;
      }
      if (take(c, id, name)) return p;
    }
  }
  if (spec.engine) {
    // The configuration is not offered for this graph (other micro-batch sizes or alignments give
    // other lists): the engine's first one, else the engine with its default knobs.
    const int64_t engine = config_engine(*spec.engine);
    if (first_of_engine && take(*first_of_engine, config_id(engine, 0), "a")) return p;
    auto c = engine_candidate(p.graph_.graph, engine);
    if (c && take(c.value(), config_id(engine, 0), "engine")) return p;
    if (!c) reasons.push_back("engine " + std::to_string(engine) + ": " + c.error().message);
  }
  return Error{"no plan for " + describe(layer, kind, p.spec_.batch) + ": " + join_reasons(reasons)};
}

cudnnStatus_t GraphConvPlan::execute(cudnnHandle_t handle, void* x, void* w, void* y, void* workspace) const {
  const RealBackend& b = real_backend();
  if (!plan_ || !b.complete()) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!handle || !x || !w || !y || (workspace_bytes_ > 0 && !workspace)) return CUDNN_STATUS_BAD_PARAM;
  if (pointer_alignment(x) < spec_.x_alignment || pointer_alignment(w) < spec_.w_alignment ||
      pointer_alignment(y) < spec_.y_alignment)
    return CUDNN_STATUS_BAD_PARAM;
  const int64_t uids[] = {kGraphXUid, kGraphWUid, kGraphYUid};
  void* const pointers[] = {x, w, y};
  return execute_plan(handle, plan_.get(), uids, pointers, workspace);
}

// ---- Splits

Result<SplitGeometry> steps_geometry(const ConvLayer& layer, const std::vector<SplitStep>& steps,
                                     int64_t base_alignment) {
  auto g = split_geometry(layer, 0, base_alignment);
  if (!g) return g.error();
  int64_t offset = 0;
  uint64_t x_offsets = 0, y_offsets = 0;  // OR of every offset: its lowest bit is the common power of two
  for (const SplitStep& s : steps) {
    if (s.batch <= 0) return Error{"a micro-batch has no samples"};
    x_offsets |= static_cast<uint64_t>(offset) * g.value().x_sample_bytes;
    y_offsets |= static_cast<uint64_t>(offset) * g.value().y_sample_bytes;
    offset += s.batch;
  }
  if (offset != layer.x.dims[0])
    return Error{"the micro-batches cover " + std::to_string(offset) + " samples, not " +
                 std::to_string(layer.x.dims[0])};
  g.value().x_alignment = offset_alignment(base_alignment, x_offsets);
  g.value().y_alignment = offset_alignment(base_alignment, y_offsets);
  return g;
}

Result<GraphConvSplit> build_steps_split(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                         const std::vector<SplitStep>& steps, const GraphConvSplitOptions& options) {
  if (steps.empty()) return Error{"the layer has no samples"};
  auto geometry = steps_geometry(layer, steps, options.base_alignment);
  if (!geometry) return geometry.error();
  if (kind == ConvKind::kBackwardFilter && steps.size() > 1 && element_bytes(layer.w.dtype) == 2)
    return Error{"a 16-bit weight gradient is not split: every partial sum would be rounded to 16 bits"};
  GraphConvSplit split;
  split.kind = kind;
  split.geometry = geometry.value();
  int64_t offset = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    GraphConvPlanSpec spec;
    spec.batch = steps[i].batch;
    spec.x_alignment = split.geometry.x_alignment;
    spec.w_alignment = split.geometry.w_alignment;
    spec.y_alignment = split.geometry.y_alignment;
    spec.alpha = options.alpha;
    spec.beta = kind == ConvKind::kBackwardFilter && i > 0 ? 1.0 : options.beta;  // accumulate into dw
    spec.engine = steps[i].engine ? steps[i].engine : options.engine;
    spec.max_workspace = options.max_workspace;
    spec.denied_notes = options.denied_notes;
    const auto same = [&](const GraphConvPlan& p) {
      return p.batch() == spec.batch && p.spec().beta == spec.beta && p.spec().engine == spec.engine;
    };
    const auto it = std::find_if(split.plans.begin(), split.plans.end(), same);
    size_t index = static_cast<size_t>(it - split.plans.begin());
    if (it == split.plans.end()) {
      auto plan = GraphConvPlan::build(handle, layer, kind, spec);
      if (!plan) return plan.error();
      split.workspace_bytes = std::max(split.workspace_bytes, plan.value().workspace_bytes());
      split.plans.push_back(std::move(plan.value()));
      index = split.plans.size() - 1;
    }
    split.steps.push_back({{offset, steps[i].batch}, index});
    offset += steps[i].batch;
  }
  return split;
}

Result<GraphConvSplit> build_split(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind, int32_t micro_batch,
                                   const GraphConvSplitOptions& options) {
  if (auto g = split_geometry(layer, micro_batch, options.base_alignment); !g) return g.error();
  std::vector<SplitStep> steps;
  for (const MicroBatchSlice& s : split_batch(layer.x.dims[0], micro_batch)) steps.push_back({s.batch, std::nullopt});
  return build_steps_split(handle, layer, kind, steps, options);
}

cudnnStatus_t execute_split(const GraphConvSplit& split, cudnnHandle_t handle, void* x, void* w, void* y,
                            void* workspace) {
  if (!x || !y) return CUDNN_STATUS_BAD_PARAM;
  for (const GraphConvSplit::Step& s : split.steps) {
    const uint64_t first = static_cast<uint64_t>(s.slice.offset);
    char* xs = static_cast<char*>(x) + first * split.geometry.x_sample_bytes;
    char* ys = static_cast<char*>(y) + first * split.geometry.y_sample_bytes;
    const cudnnStatus_t st = split.plans[s.plan].execute(handle, xs, w, ys, workspace);
    if (st != CUDNN_STATUS_SUCCESS) return st;
  }
  return CUDNN_STATUS_SUCCESS;
}

#undef VCUDNN_GRAPH_TRY

}  // namespace vcudnn
