// Lifetimes (lifetimes.h).
#include "planner/lifetimes.h"

#include <algorithm>

namespace vcudnn {

Lifetimes lifetimes(const Trace& trace) {
  if (trace.complete && trace.first_seq < trace.end_seq) return lifetimes(trace, trace.first_seq, trace.end_seq);
  const uint64_t first = trace.calls.empty() ? 0 : trace.calls.front().seq;
  const uint64_t end = trace.calls.empty() ? 0 : trace.calls.back().seq + 1;
  return lifetimes(trace, first, end);
}

Lifetimes lifetimes(const Trace& trace, uint64_t first_seq, uint64_t end_seq) {
  Lifetimes out;
  out.first_seq = first_seq;
  out.end_seq = end_seq;
  std::vector<int64_t> slot(trace.buffers.size(), -1);  // buffer -> index in out.buffers
  const auto life = [&](uint32_t b) -> BufferLife& {
    if (slot[b] < 0) {
      slot[b] = static_cast<int64_t>(out.buffers.size());
      out.buffers.push_back({b, trace.buffers[b].bytes, std::nullopt, std::nullopt, {}});
    }
    return out.buffers[static_cast<size_t>(slot[b])];
  };
  bool seen_forward = false;
  for (const TraceCall& c : trace.calls) {
    if (c.seq < first_seq || c.seq >= end_seq) continue;
    if (c.kind == CallKind::kAlloc) life(static_cast<uint32_t>(c.buffer)).alloc_seq = c.seq;
    if (c.kind == CallKind::kFree) life(static_cast<uint32_t>(c.buffer)).free_seq = c.seq;
    for (const BufferAccess& a : c.accesses) life(a.buffer).uses.push_back(c.seq);
    if (c.kind == CallKind::kConvolution && !out.turn_seq) {
      if (c.conv == ConvKind::kForward) seen_forward = true;
      else if (seen_forward) out.turn_seq = c.seq;
    }
  }
  // Bytes alive at the start: buffers of the span that it does not allocate.
  for (const BufferLife& l : out.buffers) {
    if (!l.alloc_seq) out.existing_bytes += l.bytes;
    else out.allocated_bytes += l.bytes;
  }
  // Bytes alive that no call of the span uses (Trace::alive_at_start): on the device throughout.
  if (trace.alive_at_start && first_seq == trace.first_seq && *trace.alive_at_start > out.existing_bytes)
    out.untouched_bytes = *trace.alive_at_start - out.existing_bytes;
  uint64_t live = out.existing_bytes + out.untouched_bytes;
  out.peak_bytes = live;
  out.peak_seq = first_seq;
  uint64_t library = out.untouched_bytes;  // library buffers alive now, and what no call uses
  for (const BufferLife& l : out.buffers)
    if (!l.alloc_seq && trace.buffers[l.buffer].library) library += l.bytes;
  for (const TraceCall& c : trace.calls) {
    if (c.seq < first_seq || c.seq >= end_seq) continue;
    const uint64_t bytes = c.buffer >= 0 ? trace.buffers[static_cast<size_t>(c.buffer)].bytes : 0;
    const bool library_buffer = c.buffer >= 0 && trace.buffers[static_cast<size_t>(c.buffer)].library;
    if (c.kind == CallKind::kAlloc && library_buffer) library += bytes;
    uint64_t needed = library + (c.kind == CallKind::kAlloc && !library_buffer ? bytes : 0);
    for (const BufferAccess& a : c.accesses)
      if (!trace.buffers[a.buffer].library) needed += trace.buffers[a.buffer].bytes;
    if (needed > out.least_bytes) {
      out.least_bytes = needed;
      out.least_seq = c.seq;
    }
    if (c.kind == CallKind::kFree && library_buffer) library -= std::min(library, bytes);
    if (c.kind == CallKind::kAlloc) live += bytes;
    if (live > out.peak_bytes) {
      out.peak_bytes = live;
      out.peak_seq = c.seq;
    }
    if (c.kind == CallKind::kFree) live -= std::min(live, bytes);
    out.curve.push_back({c.seq, live});
  }
  // Alive at the peak: allocated before it or at it (or before the span), freed after it or never.
  for (size_t i = 0; i < out.buffers.size(); ++i) {
    const BufferLife& l = out.buffers[i];
    if ((!l.alloc_seq || *l.alloc_seq <= out.peak_seq) && (!l.free_seq || *l.free_seq > out.peak_seq))
      out.at_peak.push_back(i);
  }
  std::stable_sort(out.at_peak.begin(), out.at_peak.end(),
                   [&](size_t a, size_t b) { return out.buffers[a].bytes > out.buffers[b].bytes; });
  if (out.turn_seq) {
    for (const BufferLife& l : out.buffers) {
      const bool before = !l.alloc_seq || *l.alloc_seq < *out.turn_seq;
      const bool after = !l.free_seq || *l.free_seq > *out.turn_seq;
      if (before && after) out.alive_across_turn += l.bytes;
    }
  }
  return out;
}

}  // namespace vcudnn
