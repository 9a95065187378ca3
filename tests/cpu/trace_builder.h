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

}  // namespace vcudnn::test
