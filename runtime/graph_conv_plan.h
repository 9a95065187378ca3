// GraphConvPlan: one convolution rebuilt by vcudnn with cuDNN's graph API at a micro-batch size, the
// building block for micro-batching the convolutions PyTorch runs through the graph API. From a
// layer's fingerprint (BackendShadow's GraphConv) it builds its own tensors (N replaced by the
// micro-batch size, every stride kept, so that a micro-batch is the caller's tensor offset by
// i * N-stride), convolution, operation and operation graph, takes engine configurations from
// cuDNN's heuristics and finalizes an execution plan; execute() runs it on offset pointers.
//
// Note [Graph-API alpha and beta]
// In the graph API, alpha and beta are attributes of the operation, fixed when the plan is built,
// not arguments of the execution. A backward-filter split accumulates its micro-batches into dw
// (beta = 1 after the first), so it needs a second plan whose operation has beta = 1, and a third
// when the last micro-batch is shorter. GraphConvSplit builds the plans a split needs.
//
// Note [Alignment of offset pointers]
// Every tensor declares CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, and engines that need more than a tensor
// declares are not offered for it. A micro-batch's pointer is base + k * m * N-stride bytes, so the
// alignment a split plan may declare is the base's (16 bytes, as cudaMalloc and PyTorch's caching
// allocator give) reduced to the largest power of two that divides the step. That is why a split
// can be offered other engines than the whole batch. execute() checks each pointer against what
// its plan declared and refuses (CUDNN_STATUS_BAD_PARAM) rather than run misaligned.
//
// A plan is immutable once built and may run on any thread; it calls cuDNN only through the real
// entry points (backend_descriptor.h). Descriptors are destroyed on every path.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "planner/conv_layer.h"
#include "planner/result.h"
#include "runtime/backend_descriptor.h"

namespace vcudnn {

// ---- Micro-batch arithmetic (pure; tested without a GPU)

// One micro-batch: samples [offset, offset + batch) of the whole batch.
struct MicroBatchSlice {
  int64_t offset = 0;
  int32_t batch = 0;
  bool operator==(const MicroBatchSlice&) const = default;
};

// A batch of n in micro-batches of m, the last taking the rest; one slice of n when m <= 0 or
// m >= n; none when n <= 0.
std::vector<MicroBatchSlice> split_batch(int64_t n, int32_t m);

inline constexpr int64_t kMaxTensorAlignment = 16;  // what cuDNN's fastest engines ask for

// The alignment a tensor may declare when its data pointer is base + k * step_bytes for every
// k >= 0 and base is aligned to base_alignment: the largest power of two (at most 16) dividing
// both. step_bytes 0 (one micro-batch) leaves the base's.
int64_t offset_alignment(int64_t base_alignment, uint64_t step_bytes);

// The largest power of two, at most 16, dividing the address (what PyTorch declares for a tensor).
int64_t pointer_alignment(const void* p);

// Strides of the filter packed in its fingerprint's format (NCHW or NHWC order, any rank);
// nullopt for another format or a bad rank.
std::optional<std::array<int64_t, kMaxDims>> filter_strides(const FilterFingerprint& w);

// Where micro-batches of m samples lie in memory (per sample bytes of x and y, in layer terms)
// and what alignment each tensor of a split plan may declare.
struct SplitGeometry {
  uint64_t x_sample_bytes = 0, y_sample_bytes = 0;  // N-stride * element size
  int64_t x_alignment = 0, w_alignment = 0, y_alignment = 0;
};
Result<SplitGeometry> split_geometry(const ConvLayer& layer, int32_t micro_batch,
                                     int64_t base_alignment = kMaxTensorAlignment);

// ---- Plans

// Engines whose numerical notes are in this mask (bit 1 << cudnnBackendNumericalNote_t) are not
// taken from the heuristics. PyTorch always refuses DOWN_CONVERT_INPUTS; TENSOR_CORE for fp32 data
// means TF32; NONDETERMINISTIC, atomics.
inline constexpr uint32_t note_bit(cudnnBackendNumericalNote_t note) { return 1u << static_cast<unsigned>(note); }
inline constexpr uint32_t kDefaultDeniedNotes = note_bit(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);

// A configuration of the heuristics: its engine (global index) and which of that engine's
// configurations (knob choices), in the heuristics' order (mode A, then FALLBACK), it is, packed in
// one number for the planner and the cache: the engine's index itself for its first configuration.
inline constexpr int64_t kConfigVariantStride = int64_t{1} << 16;
inline constexpr int64_t config_id(int64_t engine, int64_t variant) { return engine + variant * kConfigVariantStride; }
inline constexpr int64_t config_engine(int64_t id) { return id % kConfigVariantStride; }
inline constexpr int64_t config_variant(int64_t id) { return id / kConfigVariantStride; }

struct GraphConvPlanSpec {
  int32_t batch = 0;  // N of x and y in this plan; 0: the layer's own
  // CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT of x, w, y (powers of two; Note [Alignment of offset pointers]).
  int64_t x_alignment = kMaxTensorAlignment, w_alignment = kMaxTensorAlignment, y_alignment = kMaxTensorAlignment;
  double alpha = 1.0, beta = 0.0;  // the operation's (Note [Graph-API alpha and beta])
  std::optional<int64_t> engine;   // this configuration (config_id()) only, whatever its notes
  uint64_t max_workspace = std::numeric_limits<uint64_t>::max();
  uint32_t denied_notes = kDefaultDeniedNotes;
  std::vector<int64_t> excluded_configs;  // without `engine`: configurations not taken (the next ones are)
};

// Unique ids of the plan's tensors in its variant pack.
inline constexpr int64_t kGraphXUid = 'x', kGraphWUid = 'w', kGraphYUid = 'y';

// The finalized descriptors of one convolution's operation graph. handle may be null: cuDNN
// 9.8+ finalizes an operation graph without one (and without a GPU).
struct ConvGraph {
  BackendDescriptor x, w, y, conv, op, graph;
};
Result<ConvGraph> build_conv_graph(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                   const GraphConvPlanSpec& spec);

// The engine of an engine configuration the caller built (a raw descriptor that stays the caller's):
// its global index and numerical notes (note_bit() of each), read as cudnn-frontend reads them,
// through an engine descriptor cuDNN fills.
struct ConfigEngine {
  int64_t engine = -1;
  uint32_t notes = 0;
};
Result<ConfigEngine> configuration_engine(cudnnBackendDescriptor_t config);

// The numerical notes (note_bit() of each) of engine `engine` (global index) on the graph of
// `layer` built with `spec` (its batch and alignments), read from the engine finalized with its
// default knobs: what the engine's plans do to the numerics, whichever configuration runs.
Result<uint32_t> engine_numerical_notes(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind, int64_t engine,
                                        const GraphConvPlanSpec& spec);

class GraphConvPlan {
 public:
  // The first configuration of the heuristics (mode A, then FALLBACK) whose plan finalizes on
  // `handle` within spec.max_workspace, skipping denied notes and excluded configurations; or, with
  // spec.engine, that configuration (from the heuristics; else the engine's first one there, else
  // the engine with default knobs). The error says why each candidate was refused.
  static Result<GraphConvPlan> build(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                     const GraphConvPlanSpec& spec);

  int64_t engine() const { return engine_; }     // global index
  int64_t config() const { return config_id_; }  // config_id(): the engine and its knob choices
  uint64_t workspace_bytes() const { return workspace_bytes_; }
  int32_t batch() const { return spec_.batch; }
  ConvKind kind() const { return kind_; }
  const GraphConvPlanSpec& spec() const { return spec_; }
  const char* heuristic_mode() const { return mode_; }  // "a", "fallback" or "engine" (built directly)

  // Runs the plan on the handle's stream; pointers in layer terms (x or dx, w or dw, y or dy), each
  // aligned as the plan declared, and workspace_bytes() of workspace. CUDNN_STATUS_BAD_PARAM without
  // running when they are not.
  cudnnStatus_t execute(cudnnHandle_t handle, void* x, void* w, void* y, void* workspace) const;

 private:
  GraphConvPlan() = default;

  ConvGraph graph_;
  BackendDescriptor config_, plan_;
  ConvKind kind_ = ConvKind::kForward;
  GraphConvPlanSpec spec_;
  int64_t engine_ = -1, config_id_ = -1;
  uint64_t workspace_bytes_ = 0;
  const char* mode_ = "";
};

// ---- A whole-batch convolution as micro-batches

struct GraphConvSplitOptions {
  double alpha = 1.0, beta = 0.0;  // the whole-batch call's
  std::optional<int64_t> engine;   // every plan runs this engine
  uint64_t max_workspace = std::numeric_limits<uint64_t>::max();
  uint32_t denied_notes = kDefaultDeniedNotes;
  int64_t base_alignment = kMaxTensorAlignment;  // of the whole-batch pointers
};

// The plans of one split and the order they run in: the micro-batches one after the other on the
// handle's stream, sharing one workspace.
struct GraphConvSplit {
  struct Step {
    MicroBatchSlice slice;
    size_t plan = 0;  // index into plans
  };
  ConvKind kind = ConvKind::kForward;
  SplitGeometry geometry;
  std::vector<GraphConvPlan> plans;  // one per (micro-batch size, beta)
  std::vector<Step> steps;
  uint64_t workspace_bytes = 0;  // the largest plan's
};

// One micro-batch of a split, in execution order: `batch` samples, on `engine` (else the options').
struct SplitStep {
  int32_t batch = 0;
  std::optional<int64_t> engine;
  bool operator==(const SplitStep&) const = default;
};

// Where the micro-batches of `steps` start (their batches must sum to N) and the alignment each
// tensor of their plans may declare: the largest power of two (at most the base's) dividing every
// micro-batch's byte offset, so that one plan serves every micro-batch of its size.
Result<SplitGeometry> steps_geometry(const ConvLayer& layer, const std::vector<SplitStep>& steps,
                                     int64_t base_alignment = kMaxTensorAlignment);

// The plans that run the whole-batch convolution `layer` as the micro-batches `steps`, one after
// the other, offsets accumulating (one plan per (batch, engine, beta)); the rules of build_split.
Result<GraphConvSplit> build_steps_split(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind,
                                         const std::vector<SplitStep>& steps, const GraphConvSplitOptions& options);

// The plans that run the whole-batch convolution `layer` as micro-batches of `micro_batch`
// (m >= N: one plan, undivided). Forward and backward-data micro-batches write disjoint slices with
// the call's alpha and beta; backward-filter ones accumulate into dw (Note [Graph-API alpha and
// beta]), which is refused for 16-bit dw: every partial sum would be rounded to 16 bits.
Result<GraphConvSplit> build_split(cudnnHandle_t handle, const ConvLayer& layer, ConvKind kind, int32_t micro_batch,
                                   const GraphConvSplitOptions& options);

// Runs every micro-batch on the handle's stream, pointers of the whole batch in layer terms and
// split.workspace_bytes of workspace. Stops at the first failure and returns its status.
cudnnStatus_t execute_split(const GraphConvSplit& split, cudnnHandle_t handle, void* x, void* w, void* y,
                            void* workspace);

}  // namespace vcudnn
