// BackendShadow (backend_shadow.h).
#include "runtime/backend_shadow.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/no_destroy.h"

namespace vcudnn {
namespace {

constexpr const char* kKindNames[] = {"conv_fwd", "conv_bwd_data", "conv_bwd_filter", "other", "unknown"};
static_assert(std::size(kKindNames) == static_cast<size_t>(GraphKind::kCount));

template <typename T>
const T* as(const void* elements) {
  return static_cast<const T*>(elements);
}

// Up to kMaxDims int64 values into `out`; their number, or -1 when there are too many.
int32_t copy_ints(const void* elements, int64_t count, std::array<int64_t, kMaxDims>& out) {
  if (count < 0 || count > kMaxDims || (count > 0 && !elements)) return -1;
  out.fill(0);
  std::copy_n(as<int64_t>(elements), count, out.begin());
  return static_cast<int32_t>(count);
}

std::optional<int64_t> one_int(cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
  if (type != CUDNN_TYPE_INT64 || count < 1 || !elements) return std::nullopt;
  return *as<int64_t>(elements);
}

std::optional<double> one_real(cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
  if (count < 1 || !elements) return std::nullopt;
  if (type == CUDNN_TYPE_FLOAT) return *as<float>(elements);
  if (type == CUDNN_TYPE_DOUBLE) return *as<double>(elements);
  return std::nullopt;
}

cudnnBackendDescriptor_t one_descriptor(cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
  if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR || count < 1 || !elements) return nullptr;
  return *as<cudnnBackendDescriptor_t>(elements);
}

bool is_conv_op(cudnnBackendDescriptorType_t t) {
  return t == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
}

// Where a convolution operation's attribute goes in layer terms (backend_shadow.h: x or dx, w or
// dw, y or dy). 'x', 'w', 'y', 'c' (the convolution), 'a' (alpha), 'b' (beta), or 0.
char conv_op_slot(cudnnBackendAttributeName_t name) {
  switch (name) {
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X:
      return 'x';
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW:
      return 'w';
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY:
      return 'y';
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC:
      return 'c';
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA:
      return 'a';
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA:
      return 'b';
    default:
      return 0;
  }
}

// Strides of a tensor of `dims` packed with dimension order `order` (outermost first).
bool packed_as(const std::array<int64_t, kMaxDims>& dims, const std::array<int64_t, kMaxDims>& strides,
               const std::vector<int32_t>& order) {
  int64_t expect = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int32_t d = *it;
    if (dims[d] > 1 && strides[d] != expect) return false;
    expect *= dims[d];
  }
  return true;
}

// The legacy filter format a tensor with these strides would have been described with: NCHW or
// NHWC when packed in that order (any rank), -1 otherwise. A filter packed both ways (every
// spatial extent 1, or one channel) takes the input's layout, as frameworks give input and filter
// the same memory format.
int32_t packed_format(const std::array<int64_t, kMaxDims>& dims, const std::array<int64_t, kMaxDims>& strides,
                      int32_t n, int32_t tie) {
  if (n < 3) return -1;
  std::vector<int32_t> nchw(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) nchw[i] = i;
  std::vector<int32_t> nhwc{0};
  for (int32_t i = 2; i < n; ++i) nhwc.push_back(i);
  nhwc.push_back(1);
  const bool is_nchw = packed_as(dims, strides, nchw);
  const bool is_nhwc = packed_as(dims, strides, nhwc);
  if (is_nchw && is_nhwc) return tie >= 0 ? tie : CUDNN_TENSOR_NCHW;
  return is_nchw ? CUDNN_TENSOR_NCHW : is_nhwc ? CUDNN_TENSOR_NHWC : -1;
}

}  // namespace

const char* graph_kind_name(GraphKind kind) { return kKindNames[static_cast<size_t>(kind)]; }

BackendShadow::Desc* BackendShadow::find_locked(cudnnBackendDescriptor_t d) {
  const auto it = descs_.find(d);
  return it == descs_.end() ? nullptr : &it->second;
}

const BackendShadow::Desc* BackendShadow::find_locked(cudnnBackendDescriptor_t d) const {
  const auto it = descs_.find(d);
  return it == descs_.end() ? nullptr : &it->second;
}

void BackendShadow::created(cudnnBackendDescriptor_t d, cudnnBackendDescriptorType_t type) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    Desc& desc = descs_[d];
    desc = Desc{};
    desc.type = type;
  } catch (...) {
  }
}

void BackendShadow::destroyed(cudnnBackendDescriptor_t d) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  descs_.erase(d);
}

void BackendShadow::set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t count, const void* elements) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (Desc* desc = find_locked(d)) set_locked(*desc, name, type, count, elements);
  } catch (...) {
    destroyed(d);  // what the shadow holds of it can no longer be trusted
  }
}

std::shared_ptr<const BackendShadow::Graph> BackendShadow::graph_of_locked(cudnnBackendDescriptor_t d) const {
  const Desc* desc = find_locked(d);
  if (!desc) return nullptr;
  if (desc->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) {
    auto g = std::make_shared<Graph>();
    g->ops = desc->ops;
    return g;
  }
  return desc->graph;
}

void BackendShadow::set_locked(Desc& desc, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                               int64_t count, const void* elements) {
  switch (desc.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      Tensor& t = desc.tensor;
      if (name == CUDNN_ATTR_TENSOR_UNIQUE_ID) {
        if (auto v = one_int(type, count, elements)) t.uid = *v;
      } else if (name == CUDNN_ATTR_TENSOR_DATA_TYPE && type == CUDNN_TYPE_DATA_TYPE && count >= 1 && elements) {
        t.dtype = static_cast<int32_t>(*as<cudnnDataType_t>(elements));
      } else if (name == CUDNN_ATTR_TENSOR_DIMENSIONS && type == CUDNN_TYPE_INT64) {
        t.nb_dims = copy_ints(elements, count, t.dims);
      } else if (name == CUDNN_ATTR_TENSOR_STRIDES && type == CUDNN_TYPE_INT64) {
        copy_ints(elements, count, t.strides);
      } else if (name == CUDNN_ATTR_TENSOR_IS_VIRTUAL && type == CUDNN_TYPE_BOOLEAN && count >= 1 && elements) {
        t.is_virtual = *as<bool>(elements);
      }
      return;
    }
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: {
      Conv& c = desc.conv;
      if (name == CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS) {
        if (auto v = one_int(type, count, elements)) c.spatial_dims = static_cast<int32_t>(*v);
      } else if (name == CUDNN_ATTR_CONVOLUTION_COMP_TYPE && type == CUDNN_TYPE_DATA_TYPE && count >= 1 && elements) {
        c.compute_type = static_cast<int32_t>(*as<cudnnDataType_t>(elements));
      } else if (name == CUDNN_ATTR_CONVOLUTION_CONV_MODE && type == CUDNN_TYPE_CONVOLUTION_MODE && count >= 1 &&
                 elements) {
        c.mode = static_cast<int32_t>(*as<cudnnConvolutionMode_t>(elements));
      } else if (type == CUDNN_TYPE_INT64) {
        if (name == CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS) c.n_pre = copy_ints(elements, count, c.pre);
        if (name == CUDNN_ATTR_CONVOLUTION_POST_PADDINGS) c.n_post = copy_ints(elements, count, c.post);
        if (name == CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES) c.n_stride = copy_ints(elements, count, c.stride);
        if (name == CUDNN_ATTR_CONVOLUTION_DILATIONS) c.n_dilation = copy_ints(elements, count, c.dilation);
      }
      return;
    }
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: {
      Op& op = desc.op;
      op.type = desc.type;
      const char slot = conv_op_slot(name);
      if (slot == 'a' || slot == 'b') {
        if (auto v = one_real(type, count, elements)) (slot == 'a' ? op.alpha : op.beta) = *v;
        return;
      }
      const Desc* value = find_locked(one_descriptor(type, count, elements));
      if (!value) return;
      if (slot == 'c' && value->type == CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
        op.conv = std::make_shared<const Conv>(value->conv);
      if ((slot == 'x' || slot == 'w' || slot == 'y') && value->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR) {
        auto t = std::make_shared<const Tensor>(value->tensor);
        (slot == 'x' ? op.x : slot == 'w' ? op.w : op.y) = std::move(t);
      }
      return;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (name == CUDNN_ATTR_OPERATIONGRAPH_OPS && type == CUDNN_TYPE_BACKEND_DESCRIPTOR && elements && count >= 0) {
        desc.ops.clear();
        for (int64_t i = 0; i < count; ++i) {
          const Desc* value = find_locked(as<cudnnBackendDescriptor_t>(elements)[i]);
          auto op = std::make_shared<Op>();
          if (value && is_conv_op(value->type)) {
            *op = value->op;
          } else {
            op->type = value ? value->type : CUDNN_BACKEND_POINTWISE_DESCRIPTOR;  // not a convolution
          }
          desc.ops.push_back(std::move(op));
        }
      }
      return;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) desc.graph = graph_of_locked(one_descriptor(type, count, elements));
      return;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINE_OPERATION_GRAPH) desc.graph = graph_of_locked(one_descriptor(type, count, elements));
      if (name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
        if (auto v = one_int(type, count, elements)) desc.engine = *v;
      return;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        if (const Desc* engine = find_locked(one_descriptor(type, count, elements))) {
          desc.graph = engine->graph;
          desc.engine = engine->engine;
        }
      }
      return;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) {
        const cudnnBackendDescriptor_t config = one_descriptor(type, count, elements);
        if (const Desc* cfg = find_locked(config)) {
          desc.graph = cfg->graph;
          desc.engine = cfg->engine;
          desc.config = config;
        }
      } else if (name == CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION) {
        desc.graph = nullptr;  // loaded from JSON: what it runs is not known
      }
      return;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS && type == CUDNN_TYPE_INT64 && count >= 0 && elements) {
        desc.uids.assign(as<int64_t>(elements), as<int64_t>(elements) + count);
      } else if (name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS && type == CUDNN_TYPE_VOID_PTR && count >= 0 &&
                 elements) {
        desc.pointers.clear();
        for (int64_t i = 0; i < count; ++i)
          desc.pointers.push_back(reinterpret_cast<uintptr_t>(as<void*>(elements)[i]));
      } else if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE && type == CUDNN_TYPE_VOID_PTR && count >= 1 && elements) {
        desc.workspace = reinterpret_cast<uintptr_t>(*as<void*>(elements));
      }
      return;
    default:
      return;
  }
}

void BackendShadow::got(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t count, const void* elements) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    Desc* desc = find_locked(d);
    if (!desc || !elements || count < 1) return;
    // Descriptors cuDNN filled for the caller inherit what this one runs.
    const auto inherit = [&](cudnnBackendDescriptor_t filled) {
      if (Desc* f = find_locked(filled)) {
        f->graph = desc->graph;
        if (f->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR || f->engine < 0) f->engine = desc->engine;
      }
    };
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR &&
        (name == CUDNN_ATTR_ENGINEHEUR_RESULTS || name == CUDNN_ATTR_ENGINECFG_ENGINE ||
         name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)) {
      for (int64_t i = 0; i < count; ++i) inherit(as<cudnnBackendDescriptor_t>(elements)[i]);
      if (name == CUDNN_ATTR_ENGINECFG_ENGINE)
        if (Desc* engine = find_locked(*as<cudnnBackendDescriptor_t>(elements))) engine->owner = d;
    } else if (name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX) {
      // The index of a configuration's engine, read back through the engine cuDNN filled.
      if (auto v = one_int(type, count, elements)) {
        desc->engine = *v;
        if (Desc* cfg = find_locked(desc->owner); cfg && cfg->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
          cfg->engine = *v;
      }
    } else if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
      if (auto v = one_int(type, count, elements)) desc->workspace_bytes = *v;
    }
  } catch (...) {
  }
}

GraphKind BackendShadow::kind_of(const Graph* graph) {
  if (!graph) return GraphKind::kUnknown;
  if (graph->ops.size() != 1) return GraphKind::kOther;
  const Op& op = *graph->ops.front();
  if (!op.x || !op.w || !op.y || !op.conv) return GraphKind::kOther;
  switch (op.type) {
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      return GraphKind::kConvForward;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      return GraphKind::kConvBackwardData;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return GraphKind::kConvBackwardFilter;
    default:
      return GraphKind::kOther;
  }
}

GraphKind BackendShadow::classify(cudnnBackendDescriptor_t plan) const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const Desc* p = find_locked(plan);
  return p ? kind_of(p->graph.get()) : GraphKind::kUnknown;
}

std::optional<GraphConv> BackendShadow::convolution(cudnnBackendDescriptor_t plan,
                                                    cudnnBackendDescriptor_t variant_pack) const noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    const Desc* p = find_locked(plan);
    if (!p) return std::nullopt;
    const GraphKind kind = kind_of(p->graph.get());
    if (kind != GraphKind::kConvForward && kind != GraphKind::kConvBackwardData &&
        kind != GraphKind::kConvBackwardFilter)
      return std::nullopt;
    const Op& op = *p->graph->ops.front();
    const Conv& c = *op.conv;
    // The legacy fingerprint has one padding per side: asymmetric padding has no legacy twin.
    if (c.n_pre != c.spatial_dims || c.n_post != c.spatial_dims || c.n_stride != c.spatial_dims ||
        c.n_dilation != c.spatial_dims || c.pre != c.post || c.spatial_dims <= 0 || c.spatial_dims > kMaxDims)
      return std::nullopt;
    GraphConv g;
    g.kind = kind == GraphKind::kConvForward      ? ConvKind::kForward
             : kind == GraphKind::kConvBackwardData ? ConvKind::kBackwardData
                                                    : ConvKind::kBackwardFilter;
    const auto tensor = [](const Tensor& t) {
      TensorFingerprint f;
      f.dtype = t.dtype;
      f.nb_dims = t.nb_dims;
      f.dims = t.dims;
      f.strides = t.strides;
      return f;
    };
    g.layer.x = tensor(*op.x);
    g.layer.y = tensor(*op.y);
    g.layer.w.dtype = op.w->dtype;
    g.layer.w.nb_dims = op.w->nb_dims;
    g.layer.w.dims = op.w->dims;
    const int32_t input_format = packed_format(op.x->dims, op.x->strides, op.x->nb_dims, -1);
    g.layer.w.format = packed_format(op.w->dims, op.w->strides, op.w->nb_dims, input_format);
    ConvFingerprint& f = g.layer.conv;
    f.spatial_dims = c.spatial_dims;
    for (int32_t i = 0; i < c.spatial_dims; ++i) {
      f.pad[i] = static_cast<int32_t>(c.pre[i]);
      f.stride[i] = static_cast<int32_t>(c.stride[i]);
      f.dilation[i] = static_cast<int32_t>(c.dilation[i]);
    }
    f.mode = c.mode;
    f.compute_type = c.compute_type;
    f.math_type = -1;
    const int64_t in_channels = op.x->nb_dims > 1 ? op.x->dims[1] : 0;
    const int64_t per_group = op.w->nb_dims > 1 ? op.w->dims[1] : 0;
    f.groups = per_group > 0 && in_channels % per_group == 0 ? static_cast<int32_t>(in_channels / per_group) : 1;
    g.x_uid = op.x->uid;
    g.w_uid = op.w->uid;
    g.y_uid = op.y->uid;
    g.alpha = op.alpha;
    g.beta = op.beta;
    g.workspace_bytes = p->workspace_bytes;
    g.engine = p->engine;
    if (const Desc* cfg = find_locked(p->config); cfg && cfg->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
      g.engine_config = p->config;
    if (const Desc* vp = find_locked(variant_pack)) {
      const size_t n = std::min(vp->uids.size(), vp->pointers.size());
      for (size_t i = 0; i < n; ++i) {
        if (vp->uids[i] == g.x_uid) g.x = vp->pointers[i];
        if (vp->uids[i] == g.w_uid) g.w = vp->pointers[i];
        if (vp->uids[i] == g.y_uid) g.y = vp->pointers[i];
      }
      g.workspace = vp->workspace;
    }
    return g;
  } catch (...) {
    return std::nullopt;
  }
}

void BackendShadow::count_execution(GraphKind kind) noexcept {
  executions_[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
}

size_t BackendShadow::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return descs_.size();
}

std::string BackendShadow::summary() const {
  std::string s = "graph_api:";
  for (size_t i = 0; i < static_cast<size_t>(GraphKind::kCount); ++i)
    s += fmt::format(" {}_plans={}", kKindNames[i], executions_[i].load(std::memory_order_relaxed));
  return s;
}

BackendShadow& backend_shadow() {
  static NoDestroy<BackendShadow> shadow;
  return shadow.get();
}

}  // namespace vcudnn
