// A hand-made trace (schema 2) for planner tests: buffers, then calls in order with the buffers
// each one allocates, frees or uses. One thread, handle and stream; convolutions name layer 0.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "planner/trace.h"

namespace vcudnn::test {

struct TraceBuilder {
  Trace t;
  uint64_t seq;
  explicit TraceBuilder(uint64_t first_seq = 100) : seq(first_seq) {
    t.threads = {1};
    t.handles = {0};
    t.streams = {0};
    t.layers = {ConvLayer{}};
  }
  uint32_t buffer(uint64_t bytes, bool library = false) {
    t.buffers.push_back({t.buffers.size() + 1, 0x7000000 + t.buffers.size() * 0x1000000, bytes, library});
    return static_cast<uint32_t>(t.buffers.size() - 1);
  }
  uint64_t add(CallKind kind, int32_t buffer = -1, std::vector<BufferAccess> accesses = {},
               ConvKind conv = ConvKind::kForward) {
    TraceCall c;
    c.seq = seq++;
    c.kind = kind;
    c.buffer = buffer;
    c.conv = conv;
    if (kind == CallKind::kConvolution) c.layer = 0;
    c.accesses = std::move(accesses);
    t.calls.push_back(c);
    return c.seq;
  }
  // The iteration: calls from `first` to the last added.
  void done(uint64_t first) {
    t.complete = true;
    t.first_seq = first;
    t.end_seq = seq;
  }
};

// A chain of layers, each a convolution and an activation: forward, conv i reads map i (and the
// weight) and writes pre i; a launch reads pre i and writes map i+1. The backward pass reads them
// in reverse (the activation's backward reads pre i and map i+1) and frees each after its last use.
// Forward convolutions read the maps, never the pre-activations: vdnn-conv leaves those.
struct Chain {
  TraceBuilder b;
  uint32_t weight = 0;
  std::vector<uint32_t> maps, pre;
};

inline Chain chain(const std::vector<uint64_t>& map_bytes) {
  using M = AccessMode;
  Chain c;
  TraceBuilder& b = c.b;
  c.weight = b.buffer(1ull << 20);
  for (uint64_t bytes : map_bytes) c.maps.push_back(b.buffer(bytes));
  for (size_t i = 0; i + 1 < map_bytes.size(); ++i) c.pre.push_back(b.buffer(map_bytes[i + 1]));
  const uint64_t first = b.add(CallKind::kAlloc, static_cast<int32_t>(c.maps[0]));
  b.add(CallKind::kLaunch, -1, {{c.maps[0], M::kWrite}});  // the input
  for (size_t i = 0; i + 1 < c.maps.size(); ++i) {
    b.add(CallKind::kAlloc, static_cast<int32_t>(c.pre[i]));
    b.add(CallKind::kConvolution, -1, {{c.maps[i], M::kRead}, {c.weight, M::kRead}, {c.pre[i], M::kWrite}});
    b.add(CallKind::kAlloc, static_cast<int32_t>(c.maps[i + 1]));
    b.add(CallKind::kLaunch, -1, {{c.pre[i], M::kRead}, {c.maps[i + 1], M::kWrite}});
  }
  for (size_t i = c.maps.size() - 1; i-- > 0;) {
    b.add(CallKind::kLaunch, -1, {{c.pre[i], M::kRead}, {c.maps[i + 1], M::kRead}});
    b.add(CallKind::kConvolution, -1, {{c.weight, M::kRead}}, ConvKind::kBackwardData);
    b.add(CallKind::kConvolution, -1, {{c.maps[i], M::kRead}}, ConvKind::kBackwardFilter);
    b.add(CallKind::kFree, static_cast<int32_t>(c.maps[i + 1]));
    b.add(CallKind::kFree, static_cast<int32_t>(c.pre[i]));
  }
  b.add(CallKind::kFree, static_cast<int32_t>(c.maps[0]));
  b.done(first);
  return c;
}

}  // namespace vcudnn::test
