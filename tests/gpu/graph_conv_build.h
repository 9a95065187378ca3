// One graph-API (backend) convolution built the way PyTorch's default path builds it (cudnn-frontend
// under Conv_v8.cpp): x, w, y tensors with unique ids and 16-byte alignment, a convolution, one
// operation, an operation graph, heuristics (mode A, then FALLBACK) and the first engine
// configuration that the caller accepts and whose execution plan finalizes; then a variant pack.
// Every backend call goes through a BackendApi table, the linked cuDNN by default, so that a
// program can drive a dlopen()ed libvcudnn.so with the same sequence (scripts/bench/graph_layers.cpp).
// Failures throw graph::Error with a message naming the step.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vcudnn::test::graph {

// The backend entry points the builder calls.
struct BackendApi {
  decltype(&::cudnnBackendCreateDescriptor) create = &::cudnnBackendCreateDescriptor;
  decltype(&::cudnnBackendDestroyDescriptor) destroy = &::cudnnBackendDestroyDescriptor;
  decltype(&::cudnnBackendSetAttribute) set = &::cudnnBackendSetAttribute;
  decltype(&::cudnnBackendGetAttribute) get = &::cudnnBackendGetAttribute;
  decltype(&::cudnnBackendFinalize) finalize = &::cudnnBackendFinalize;
  decltype(&::cudnnBackendExecute) execute = &::cudnnBackendExecute;
};

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// cuDNN's name for the status, and its last error message when it has one.
inline std::string cudnn_message(cudnnStatus_t s) {
  std::string m = cudnnGetErrorString(s);
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0]) m += std::string(" (") + last + ")";
  return m;
}

inline void check(cudnnStatus_t s, const std::string& what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Error(what + ": " + cudnn_message(s));
}

// A backend descriptor, destroyed through the table that created it.
class Desc {
 public:
  Desc() = default;
  Desc(const BackendApi& api, cudnnBackendDescriptorType_t type) : api_(&api) {
    check(api.create(type, &d_), "creating a backend descriptor of type " + std::to_string(type));
  }
  ~Desc() {
    if (d_) api_->destroy(d_);
  }
  Desc(Desc&& o) noexcept : api_(o.api_), d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(api_, o.api_);
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  const BackendApi& api() const { return *api_; }

 private:
  const BackendApi* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

inline void set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                const void* values, const char* what) {
  check(d.api().set(d.get(), name, type, count, values), std::string("setting ") + what);
}

inline void set_desc(const Desc& d, cudnnBackendAttributeName_t name, const Desc& value, const char* what) {
  const cudnnBackendDescriptor_t v = value.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

inline void finalize(const Desc& d, const char* what) {
  check(d.api().finalize(d.get()), std::string("finalizing ") + what);
}

// ---- The convolution

enum class ConvKind { kFwd, kBwdData, kBwdFilter };

// In the operation's terms: x is dx for backward-data, w is dw for backward-filter, y is dy for both
// backward kinds. Dimensions in NCHW order (w: K, C/groups, R, S), strides those of the layout.
struct ConvSpec {
  ConvKind kind = ConvKind::kFwd;
  std::array<int64_t, 4> x{}, w{}, y{};
  std::array<int64_t, 4> xs{}, ws{}, ys{};
  cudnnDataType_t io = CUDNN_DATA_FLOAT;  // x, w and y; the compute type is always float (PyTorch's)
  int64_t pad = 0, stride = 1, dilation = 1;
};

// Packed strides of NCHW-ordered dimensions in NCHW or NHWC (channels innermost) layout.
inline std::array<int64_t, 4> strides_of(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

inline constexpr int64_t kXUid = 'x', kWUid = 'w', kYUid = 'y';  // as PyTorch names them
inline constexpr int64_t kAlignment = 16;

inline Desc tensor(const BackendApi& api, int64_t uid, const std::array<int64_t, 4>& dims,
                   const std::array<int64_t, 4>& strides, cudnnDataType_t dtype, const char* what) {
  Desc t(api, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, what);
  set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), what);
  set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), what);
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, what);
  finalize(t, what);
  return t;
}

// The operation descriptor of each kind and its attributes, in the operation's terms.
struct OperationAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

inline OperationAttributes operation_attributes(ConvKind kind) {
  switch (kind) {
    case ConvKind::kFwd:
      break;
    case ConvKind::kBwdData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvKind::kBwdFilter:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
}

// The operation graph of the convolution on `handle`; the descriptors it refers to go to `keep`,
// which must outlive it.
inline Desc operation_graph(const BackendApi& api, cudnnHandle_t handle, const ConvSpec& s, std::vector<Desc>& keep) {
  Desc x = tensor(api, kXUid, s.x, s.xs, s.io, "x tensor");
  Desc w = tensor(api, kWUid, s.w, s.ws, s.io, "w tensor");
  Desc y = tensor(api, kYUid, s.y, s.ys, s.io, "y tensor");

  Desc conv(api, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t pad[2] = {s.pad, s.pad}, stride[2] = {s.stride, s.stride}, dilation[2] = {s.dilation, s.dilation};
  set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "convolution spatial dims");
  set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "convolution compute type");
  set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "convolution mode");
  set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution pre-paddings");
  set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution post-paddings");
  set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "convolution strides");
  set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation, "convolution dilations");
  finalize(conv, "convolution");

  const OperationAttributes a = operation_attributes(s.kind);
  Desc op(api, a.type);
  set_desc(op, a.x, x, "operation x");
  set_desc(op, a.w, w, "operation w");
  set_desc(op, a.y, y, "operation y");
  set_desc(op, a.conv, conv, "operation convolution");
  const float alpha = 1.f, beta = 0.f;  // PyTorch's
  set(op, a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha, "operation alpha");
  set(op, a.beta, CUDNN_TYPE_FLOAT, 1, &beta, "operation beta");
  finalize(op, "operation");

  Desc graph(api, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops[] = {op.get()};
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops, "graph operations");
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  finalize(graph, "operation graph");
  for (Desc* d : {&x, &w, &y, &conv, &op}) keep.push_back(std::move(*d));
  return graph;
}

// ---- Engine configurations

// The configurations of one heuristics mode, best first (cuDNN fills descriptors we create).
inline std::vector<Desc> heuristic_configs(const Desc& graph, cudnnBackendHeurMode_t mode) {
  const BackendApi& api = graph.api();
  Desc heur(api, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  std::vector<Desc> configs;
  if (api.finalize(heur.get()) != CUDNN_STATUS_SUCCESS) return configs;  // e.g. no fallback for it
  int64_t available = 0;
  check(api.get(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr),
        "counting the heuristics' results");
  if (available <= 0) return configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    configs.emplace_back(api, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  check(api.get(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned,
                raw.data()),
        "reading the heuristics' results");
  if (returned < 0) returned = 0;
  if (returned < available) configs.resize(static_cast<size_t>(returned));
  return configs;
}

// The engine of a configuration: its global index and its numerical notes.
struct EngineInfo {
  int64_t index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
  bool has(cudnnBackendNumericalNote_t note) const {
    for (auto n : notes)
      if (n == note) return true;
    return false;
  }
};

inline EngineInfo engine_of(const Desc& config) {
  const BackendApi& api = config.api();
  Desc engine(api, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  check(api.get(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw),
        "reading a configuration's engine");
  EngineInfo info;
  check(api.get(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index),
        "reading an engine's global index");
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  check(api.get(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                static_cast<int64_t>(notes.size()), &count, notes.data()),
        "reading an engine's numerical notes");
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(notes.size()); ++i) info.notes.push_back(notes[i]);
  return info;
}

// The execution plan of one configuration, or an empty Desc with *status when it does not finalize.
inline Desc finalize_plan(const Desc& config, cudnnStatus_t* status) {
  Desc plan(config.api(), CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan configuration");
  *status = config.api().finalize(plan.get());
  return *status == CUDNN_STATUS_SUCCESS ? std::move(plan) : Desc();
}

// The plan's workspace size, as the table's library answers it.
inline int64_t workspace_of(const Desc& plan) {
  int64_t n = 0, bytes = 0;
  check(plan.api().get(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &bytes),
        "reading a plan's workspace size");
  return bytes;
}

// A finalized plan and every descriptor it refers to.
struct Plan {
  std::vector<Desc> keep;  // tensors, convolution, operation, graph, configuration
  Desc plan;
  int64_t engine = -1;
  int64_t workspace = 0;  // read right after finalizing, as PyTorch reads it
  EngineInfo info;        // the engine's notes
  const char* mode = "";
  int64_t configs = 0;  // configurations the heuristics offered before one was taken
};

// Heuristics mode A, then FALLBACK; the first configuration whose engine `acceptable` takes and
// whose plan finalizes. Throws when none does, naming each refused engine and why.
inline Plan build_plan(const BackendApi& api, cudnnHandle_t handle, const ConvSpec& s,
                       const std::function<bool(const EngineInfo&)>& acceptable) {
  Plan p;
  Desc graph = operation_graph(api, handle, s, p.keep);
  std::string refused;
  const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {{CUDNN_HEUR_MODE_A, "a"},
                                                                  {CUDNN_HEUR_MODE_FALLBACK, "fallback"}};
  for (const auto& [mode, name] : modes) {
    std::vector<Desc> configs = heuristic_configs(graph, mode);
    for (Desc& config : configs) {
      ++p.configs;
      EngineInfo engine = engine_of(config);
      if (!acceptable(engine)) {
        refused.append(" ").append(std::to_string(engine.index)).append(":notes");
        continue;
      }
      cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
      Desc plan = finalize_plan(config, &st);
      if (st != CUDNN_STATUS_SUCCESS) {
        refused.append(" ").append(std::to_string(engine.index)).append(":").append(cudnnGetErrorString(st));
        continue;
      }
      p.workspace = workspace_of(plan);
      if (p.workspace < 0) throw Error("negative workspace size for engine " + std::to_string(engine.index));
      p.plan = std::move(plan);
      p.engine = engine.index;
      p.info = std::move(engine);
      p.mode = name;
      p.keep.push_back(std::move(config));
      p.keep.push_back(std::move(graph));
      return p;
    }
  }
  throw Error("no engine configuration finalizes (refused:" + refused + ")");
}

// The variant pack of one execution: x, w and y (in the operation's terms) and the workspace.
inline Desc variant_pack(const BackendApi& api, void* x, void* w, void* y, void* workspace) {
  Desc pack(api, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const int64_t uids[] = {kXUid, kWUid, kYUid};
  void* pointers[] = {x, w, y};
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids, "variant pack ids");
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers, "variant pack pointers");
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "variant pack workspace");
  finalize(pack, "variant pack");
  return pack;
}

}  // namespace vcudnn::test::graph
