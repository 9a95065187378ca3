// Buffer lifetimes and the live-bytes curve of a recorded iteration (trace schema 2), the first
// thing the offload planner needs: which buffers exist when, how long each is idle between uses,
// and how many bytes are alive at each operation. CUDA-free.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/trace.h"

namespace vcudnn {

struct BufferLife {
  uint32_t buffer = 0;  // index into Trace::buffers
  uint64_t bytes = 0;
  std::optional<uint64_t> alloc_seq;  // nullopt: it existed before the span
  std::optional<uint64_t> free_seq;   // nullopt: it outlives the span
  std::vector<uint64_t> uses;         // seqs of the span's calls that used it, in order
};

struct LivePoint {
  uint64_t seq = 0;         // a call of the span
  uint64_t live_bytes = 0;  // bytes alive once it has run (an allocation counts from its call on,
                            // a free until its call)
};

struct Lifetimes {
  uint64_t first_seq = 0, end_seq = 0;  // the span: calls with first_seq <= seq < end_seq
  std::vector<BufferLife> buffers;      // every buffer the span allocates, frees or uses
  std::vector<LivePoint> curve;         // one point per call of the span
  uint64_t peak_bytes = 0;
  uint64_t peak_seq = 0;
  // What holds the peak: indexes into `buffers` of those alive at peak_seq, largest first.
  std::vector<size_t> at_peak;
  uint64_t allocated_bytes = 0;         // allocated within the span
  uint64_t existing_bytes = 0;          // alive when the span starts (parameters, optimizer state, ...)
  // Alive when the span starts but used by none of its calls (a library's workspace set once),
  // from Trace::alive_at_start when the span is the trace's iteration; counted in every live-bytes
  // figure below as on the device throughout.
  uint64_t untouched_bytes = 0;
  // The turn from forward to backward: the first backward convolution after a forward one, and
  // the bytes alive across it (allocated before it, freed after it or never: what a forward pass
  // leaves for its backward).
  std::optional<uint64_t> turn_seq;
  uint64_t alive_across_turn = 0;
  // The least device memory any offload plan needs: at each call, the buffers it uses (they must
  // be on the device while it runs), what it allocates, and every library buffer alive then (never
  // moved); the largest over the span, and where.
  uint64_t least_bytes = 0;
  uint64_t least_seq = 0;
};

// Over the trace's iteration (first_seq..end_seq), or over every call when the trace holds none.
Lifetimes lifetimes(const Trace& trace);
Lifetimes lifetimes(const Trace& trace, uint64_t first_seq, uint64_t end_seq);

}  // namespace vcudnn
