// BackendShadow: what vcudnn knows of cuDNN's graph-API (backend) descriptors, learned from the
// calls the program makes (create, set, get, finalize, destroy), enough to recognise an execution
// plan whose operation graph is one convolution (forward, backward data, backward filter), decode
// it into the ConvLayer fingerprint the legacy path uses, and map a variant pack's unique ids to
// its pointers. Anything else (fusions, normalisation, attention, plans loaded from JSON) is
// counted by kind and left alone. It never calls cuDNN.
//
// Note [A shadow of values]
// cuDNN takes only finalized descriptors as attribute values, and a finalized descriptor does not
// change; so when a descriptor is set as another's attribute (a tensor into an operation, the
// operations into a graph, the graph into heuristics or an engine, an engine configuration into a
// plan), the shadow copies its value there and then. Destroying a descriptor forgets its entry
// only: what others copied stays valid, as in cuDNN. Heuristics answer with engine configurations
// through cudnnBackendGetAttribute (ENGINEHEUR_RESULTS), so gets are observed too.
//
// Thread-safe (one mutex; each call does one or two hash lookups). Never throws: on failure
// (out of memory) the descriptor is forgotten and its plans go unrecognised.
#pragma once

#include <cudnn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/conv_layer.h"

namespace vcudnn {

// What an execution plan runs, as far as the shadow can tell.
enum class GraphKind : uint8_t {
  kConvForward,
  kConvBackwardData,
  kConvBackwardFilter,
  kOther,    // a graph of other or several operations (fusion, norm, attention, matmul, ...)
  kUnknown,  // a plan the shadow did not see built (from JSON, or before vcudnn was loaded)
  kCount
};
const char* graph_kind_name(GraphKind kind);

// A recognised single-convolution plan with its variant pack.
struct GraphConv {
  ConvKind kind = ConvKind::kForward;
  ConvLayer layer;  // math_type is -1: in the graph API the engine decides it
  int64_t x_uid = -1, w_uid = -1, y_uid = -1;  // in layer terms (x or dx, w or dw, y or dy)
  uint64_t x = 0, w = 0, y = 0;                // the variant pack's pointers for them (0: not given)
  uint64_t workspace = 0;                      // the variant pack's workspace pointer
  std::optional<int64_t> workspace_bytes;      // the plan's, when the program asked for it
  int64_t engine = -1;                         // the engine's global index, when known
  // The plan's engine configuration while the caller keeps it (nullptr once destroyed): what cuDNN
  // can be asked for the engine when the caller never read its index.
  cudnnBackendDescriptor_t engine_config = nullptr;
  double alpha = 1.0, beta = 0.0;
};

class BackendShadow {
 public:
  // Each after the real call succeeded, with its arguments.
  void created(cudnnBackendDescriptor_t d, cudnnBackendDescriptorType_t type) noexcept;
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* elements) noexcept;
  void got(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* elements) noexcept;
  void destroyed(cudnnBackendDescriptor_t d) noexcept;

  // What `plan` runs; for a single convolution, its fingerprint and the pointers `variant_pack`
  // gives it. Counts the execution by kind.
  GraphKind classify(cudnnBackendDescriptor_t plan) const noexcept;
  std::optional<GraphConv> convolution(cudnnBackendDescriptor_t plan,
                                       cudnnBackendDescriptor_t variant_pack) const noexcept;
  void count_execution(GraphKind kind) noexcept;

  size_t size() const;  // descriptors known now
  uint64_t executions(GraphKind kind) const { return executions_[static_cast<size_t>(kind)].load(); }
  // "graph_api: conv_fwd_plans=… conv_bwd_data_plans=… conv_bwd_filter_plans=… other_plans=…
  // unknown_plans=…" (keys of their own: the legacy counters are conv_fwd=… and so on)
  std::string summary() const;

 private:
  struct Tensor {
    int64_t uid = -1;
    int32_t dtype = -1;
    int32_t nb_dims = 0;
    std::array<int64_t, kMaxDims> dims{};
    std::array<int64_t, kMaxDims> strides{};
    bool is_virtual = false;
  };
  struct Conv {
    int32_t spatial_dims = 0;
    int32_t mode = -1;
    int32_t compute_type = -1;
    int32_t n_pre = 0, n_post = 0, n_stride = 0, n_dilation = 0;
    std::array<int64_t, kMaxDims> pre{}, post{}, stride{}, dilation{};
  };
  struct Op {
    cudnnBackendDescriptorType_t type{};
    std::shared_ptr<const Tensor> x, w, y;  // per the operation's own names: X/DX, W/DW, Y/DY
    std::shared_ptr<const Conv> conv;
    double alpha = 1.0, beta = 0.0;
  };
  struct Graph {
    std::vector<std::shared_ptr<const Op>> ops;
  };
  struct Desc {
    cudnnBackendDescriptorType_t type{};
    Tensor tensor;
    Conv conv;
    Op op;
    std::vector<std::shared_ptr<const Op>> ops;  // operation graph
    std::shared_ptr<const Graph> graph;          // heuristics, engine, engine configuration, plan
    int64_t engine = -1;
    cudnnBackendDescriptor_t owner = nullptr;  // engine: the configuration cuDNN filled it from
    std::optional<int64_t> workspace_bytes;    // plan
    cudnnBackendDescriptor_t config = nullptr;  // plan: its engine configuration
    std::vector<int64_t> uids;               // variant pack
    std::vector<uint64_t> pointers;
    uint64_t workspace = 0;
  };

  Desc* find_locked(cudnnBackendDescriptor_t d);
  const Desc* find_locked(cudnnBackendDescriptor_t d) const;
  void set_locked(Desc& desc, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* elements);
  std::shared_ptr<const Graph> graph_of_locked(cudnnBackendDescriptor_t d) const;
  static GraphKind kind_of(const Graph* graph);

  mutable std::mutex mu_;
  std::unordered_map<cudnnBackendDescriptor_t, Desc> descs_;
  std::array<std::atomic<uint64_t>, static_cast<size_t>(GraphKind::kCount)> executions_{};
};

// The process's shadow (never destroyed: descriptors may be destroyed during teardown).
BackendShadow& backend_shadow();

}  // namespace vcudnn
