// A recorded iteration (trace schema 2), run again and again through the memory manager on the
// simulated device: every allocation, free and call with its buffers, in the recorded order, under
// a budget and an offload policy. Sizes are divided by `scale` (granule too), so a ResNet-50
// iteration of 5 GiB runs in a few MiB of host memory with the same granule counts. What it
// measures is the runtime's host-side work: driver calls for mapping (the churn of Note [Extents
// under a budget]), evictions, fault-ins and host waits per iteration, and the device's peak.
#pragma once

#include <fmt/format.h>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "planner/lifetimes.h"
#include "planner/trace.h"
#include "runtime/memory/call_scope.h"
#include "runtime/memory_manager.h"
#include "runtime/offload_replay.h"
#include "tests/cpu/manager_fixture.h"
#include "tests/cpu/sim_device.h"

namespace vcudnn::test {

struct SimIteration {
  uint64_t creates = 0, maps = 0, unmaps = 0;   // the device's driver calls
  uint64_t fresh_bytes = 0, trimmed_bytes = 0;  // scaled back to the trace's bytes
  uint64_t evictions = 0, fault_ins = 0, host_waits = 0, reused = 0, allocations = 0;
};

struct SimResult {
  std::string decided;  // the plan's log line
  std::vector<SimIteration> iterations;
  uint64_t peak_bytes = 0;  // most mapped at once, in the trace's bytes
  uint64_t held_peak = 0;   // the manager's own count: arena mapped and pools held, at its most
  uint64_t unmatched = 0;   // buffers alive at the iteration's end that no later free matched (freed)
  std::string errors;       // the simulated device's complaints
  std::string summary;
  std::optional<memory::ReplayStats> replay;
  uint64_t replans = 0;  // scripts installed after the first (offload_replay.h)
  uint64_t bytes_out = 0;  // copied out over the run, in the trace's bytes
};

inline Trace scaled_trace(Trace t, uint64_t scale) {
  const auto down = [scale](uint64_t b) { return b == 0 ? 0 : std::max<uint64_t>(1, (b + scale - 1) / scale); };
  const uint64_t untouched = lifetimes(t).untouched_bytes;
  for (TraceBuffer& b : t.buffers) b.bytes = down(b.bytes);
  for (TraceCall& c : t.calls) {
    c.workspace_bytes = down(c.workspace_bytes);
    c.bytes = down(c.bytes);
  }
  if (t.alive_at_start) t.alive_at_start = lifetimes(t).existing_bytes + down(untouched);  // each part rounded alone
  // The link scaled with the bytes, so that a copy takes as long against the calls' GPU times as it
  // did (the plan times its moves by the link: Note [Moves timed by the link]).
  if (t.link) {
    const double s = static_cast<double>(scale);
    t.link->device_to_host /= s;
    t.link->host_to_device /= s;
    t.link->both /= s;
  }
  return t;
}

// `budget`: in the trace's bytes. The plan is installed after the first iteration, as the runtime
// does once the recorder has it.
// Every access checks the stamps its buffer's last writer left (the first bytes of each of its
// granules) and leaves new ones, so that a buffer whose bytes another one overwrote, or that came back
// from the host wrong, is a device error. `placement`: the plan's static placement (Note [A static
// placement]) is followed; `partial`: its plan may move part of a buffer (Note [Moving part of a
// buffer]); `across`: which plans move buffers across the iteration's end (Note [Across the
// iteration's end]; the default is VCUDNN_OFFLOAD_PLACEMENT=static's);
// `replan_at`: after that iteration the plan is installed again. `device_lag`: see below.
// Each call runs on its recorded stream, and a call (or free) on one stream that uses a buffer last
// used on another waits for that stream first, as the program does (PyTorch waits for an NCCL
// collective's end before reading its buffer). `hidden`: calls that run on the device but that
// vcudnn never sees: they touch nothing and are not in the trace the plan is made from (NCCL's
// collectives before vcudnn interposed them).
inline SimResult simulate_trace(const Trace& original, uint64_t budget, const std::string& policy, int iterations,
                                uint64_t scale = 64, uint32_t room = kFirstRoom, bool placement = true,
                                size_t device_lag = 0, bool partial = true, AcrossEnd across = AcrossEnd::kWhereNeeded,
                                int replan_at = -1, const std::function<bool(const Trace&, const TraceCall&)>& hidden = {}) {
  constexpr uint64_t kGranule = 2ull << 20;
  const uint64_t g = kGranule / scale;
  Trace trace = scaled_trace(original, scale);
  const Lifetimes lt = lifetimes(trace);
  if (across != AcrossEnd::kNever) {
    // Buffers alive through the iteration are named by serial (Note [Replaying an offload plan]): the
    // trace's become the ones the simulation's allocations get (1, 2, ... in the order below), the
    // others' out of their way.
    uint64_t next = 0;
    for (TraceBuffer& b : trace.buffers) b.id = (1ull << 40) + b.id;
    for (const BufferLife& b : lt.buffers)
      if (!b.alloc_seq) trace.buffers[b.buffer].id = ++next;
  }
  MemoryActive on;
  const uint64_t budget_granules = budget / kGranule;
  SimDevice dev(g, budget_granules);
  memory::ManagerConfig config = manager_config(budget_granules * g, g);
  config.device_total = 40960 * g;
  config.reserve_bytes = 4 * config.device_total;
  config.host_budget = 64ull << 30 >> 6;
  config.host_slab_bytes = 4 * g;
  config.copy_piece_bytes = kCopyPiece / scale;  // Note [Copies out in pieces], scaled as the granule
  memory::MemoryManager m(dev, dev, dev, config);
  const memory::Stream s = SimDevice::stream(1);
  SimResult out;

  // What vcudnn sees of the iteration (the plan's trace): the calls that are not hidden.
  Trace seen = trace;
  if (hidden) std::erase_if(seen.calls, [&](const TraceCall& c) { return hidden(trace, c); });
  const auto stream_of = [](const TraceCall& c) { return SimDevice::stream(1 + c.stream); };
  std::map<uint64_t, memory::Stream> last_stream;  // by address: the stream that used it last
  const auto after_others = [&](uint64_t at, memory::Stream x) {
    const auto last = last_stream.find(at);
    if (last != last_stream.end() && last->second != x) {
      const memory::Event e = dev.create_event();
      dev.record(e, last->second);
      dev.wait(x, e);
    }
    last_stream[at] = x;
  };

  std::vector<uint64_t> address(trace.buffers.size(), 0);
  size_t failed_touches = 0;
  constexpr uint64_t kStamp = 64;
  std::map<uint64_t, uint32_t> stamp_seed;  // by address: the last writer's
  uint32_t stamp_next = 0;
  const auto origin = [&](uint32_t i) {
    return trace.buffers[i].library ? memory::Origin::kLibrary : memory::Origin::kFramework;
  };
  for (const BufferLife& b : lt.buffers) {  // alive before the iteration: parameters, state, ...
    if (b.alloc_seq) continue;
    const auto a = m.allocate(trace.buffers[b.buffer].bytes, s, origin(b.buffer));
    if (a) address[b.buffer] = *a;
  }
  // Alive but used by no call (cuBLAS's workspace, pinned by the runtime): a library buffer here.
  if (lt.untouched_bytes) (void)m.allocate(lt.untouched_bytes, s, memory::Origin::kLibrary);
  const auto snapshot = [&] {
    const memory::ManagerStats st = m.stats();
    SimIteration x;
    x.creates = dev.creates, x.maps = dev.maps, x.unmaps = dev.unmaps;
    x.fresh_bytes = st.fresh_bytes * scale, x.trimmed_bytes = st.trimmed_bytes * scale;
    x.evictions = st.evictions_started, x.fault_ins = st.fault_ins, x.host_waits = st.host_waits;
    x.reused = st.reused, x.allocations = st.allocations;
    return x;
  };
  for (int it = 0; it < iterations; ++it) {
    const SimIteration before = snapshot();
    for (const TraceCall& c : trace.calls) {
      if (c.seq < trace.first_seq || c.seq >= trace.end_seq) continue;
      if (c.kind == CallKind::kAlloc && c.buffer >= 0) {
        const auto a = m.allocate(trace.buffers[c.buffer].bytes, s, origin(c.buffer));
        address[c.buffer] = a.value_or(0);
      } else if (c.kind == CallKind::kFree && c.buffer >= 0) {
        stamp_seed.erase(address[c.buffer]);
        if (address[c.buffer]) {
          after_others(address[c.buffer], s);
          last_stream.erase(address[c.buffer]);
          m.free(address[c.buffer], s);
        }
        address[c.buffer] = 0;
      } else if (!c.accesses.empty()) {
        const memory::Stream x = stream_of(c);
        memory::CallScope scope;
        std::vector<uint64_t> words;
        for (const BufferAccess& a : c.accesses)
          if (address[a.buffer]) words.push_back(address[a.buffer]);
        for (uint64_t at : words) after_others(at, x);
        // A touch that finds no room fails the real call (out of memory): an error here, not a kernel
        // that runs anyway.
        if ((!hidden || !hidden(trace, c)) && !m.touch(words.data(), words.size(), memory::Access::kUnknown, x, "call"))
          ++failed_touches;
        for (const BufferAccess& a : c.accesses) {
          const uint64_t at = address[a.buffer];
          if (!at) continue;
          const uint64_t bytes = trace.buffers[a.buffer].bytes;
          const auto stamps = [&](auto&& each) {
            for (uint64_t off = 0; off < bytes; off += g) each(at + off, std::min<uint64_t>(kStamp, bytes - off));
          };
          if (const auto seed = stamp_seed.find(at); seed != stamp_seed.end() && a.mode != AccessMode::kWrite)
            stamps([&](uint64_t va, uint64_t n) { dev.check(x, va, n, seed->second); });
          if (a.mode != AccessMode::kRead) {
            const uint32_t seed = ++stamp_next;
            stamps([&](uint64_t va, uint64_t n) { dev.write(x, va, n, seed); });
            stamp_seed[at] = seed;
          }
        }
      }
      // A device that keeps up with the host, or one that leaves `device_lag` operations queued (the
      // H100 runs a step behind PyTorch's host thread: frees settle late).
      if (device_lag == 0)
        dev.run_all();
      else
        while (dev.queued() > device_lag && dev.run_some(1) > 0) {
        }
    }
    // Buffers the iteration allocated and left alive are the ones the next iteration frees where
    // this one freed buffers alive at its start: matched by size, in order. The rest are freed
    // before the next iteration starts, as a training loop's zero_grad frees the gradients that the
    // backward pass allocates again.
    std::map<uint64_t, std::deque<uint32_t>> carried;
    for (const BufferLife& b : lt.buffers)
      if (b.alloc_seq && !b.free_seq && address[b.buffer]) carried[trace.buffers[b.buffer].bytes].push_back(b.buffer);
    for (const BufferLife& b : lt.buffers) {
      if (b.alloc_seq || !b.free_seq) continue;
      auto& q = carried[trace.buffers[b.buffer].bytes];
      if (q.empty()) continue;
      address[b.buffer] = address[q.front()];
      address[q.front()] = 0;
      q.pop_front();
    }
    for (auto& [bytes, q] : carried) {
      for (uint32_t i : q) {
        stamp_seed.erase(address[i]);
        after_others(address[i], s);
        last_stream.erase(address[i]);
        m.free(address[i], s);
        address[i] = 0;
        ++out.unmatched;
      }
    }
    dev.run_all();
    if (it == 0) out.decided = replay_recorded_iteration(seen, m, policy, room, placement, partial, across);
    if (it == replan_at) {  // the same plan installed again: the first script's pool retires
      (void)replay_recorded_iteration(seen, m, policy, room, placement, partial, across);
    }
    const SimIteration after = snapshot();
    SimIteration d;
    d.creates = after.creates - before.creates, d.maps = after.maps - before.maps;
    d.unmaps = after.unmaps - before.unmaps;
    d.fresh_bytes = after.fresh_bytes - before.fresh_bytes;
    d.trimmed_bytes = after.trimmed_bytes - before.trimmed_bytes;
    d.evictions = after.evictions - before.evictions, d.fault_ins = after.fault_ins - before.fault_ins;
    d.host_waits = after.host_waits - before.host_waits, d.reused = after.reused - before.reused;
    d.allocations = after.allocations - before.allocations;
    out.iterations.push_back(d);
  }
  out.peak_bytes = dev.peak_mapped_granules() * kGranule;
  out.held_peak = m.stats().peak_mapped * scale;
  out.errors = dev.errors.empty() ? "" : dev.first_errors();
  if (failed_touches)
    out.errors += (out.errors.empty() ? "" : "; ") + std::to_string(failed_touches) +
                  " calls found no room for their buffers (touch() failed: the real calls would fail)";
  out.summary = m.summary();
  out.replay = m.replay_stats();
  out.replans = m.stats().replans;
  out.bytes_out = m.stats().bytes_evicted * scale;
  return out;
}

}  // namespace vcudnn::test
