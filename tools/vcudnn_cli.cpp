// `vcudnn`: the project's main command. `vcudnn info` prints the cuDNN and CUDA runtime vcudnn
// resolves, whether a GPU is present, and the configuration table; `vcudnn trace FILE` checks
// and summarises a trace written by VCUDNN_TRACE; `vcudnn run [options] -- command` starts a
// command under vcudnn (launcher.cpp).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/lifetimes.h"
#include "planner/offload_plan.h"
#include "planner/output_file.h"
#include "planner/placement.h"
#include "planner/replay_script.h"
#include "planner/trace.h"
#include "pool/budget.h"
#include "runtime/options.h"
#include "runtime/real_api.h"
#include "tools/launcher.h"

namespace vcudnn {
namespace {

std::string cudnn_version_text(size_t v) { return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100); }

void print_library(const char* what, const LibraryInfo& lib) {
  if (!lib.found) {
    fmt::print("{:<14} not found: {}\n", what, lib.error);
    return;
  }
  fmt::print("{:<14} {} (found via {})\n", what, lib.path, lib.how);
  if (lib.missing) fmt::print("{:<14} {} entry points missing: {}\n", "", lib.missing, lib.missing_names);
}

void print_gpu() {
  const RealCudart& rt = real_cudart();
  if (!rt.cudaGetDeviceCount) {
    fmt::print("{:<14} unknown (no CUDA runtime)\n", "GPU");
    return;
  }
  int count = 0;
  cudaError_t err = rt.cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    // Without a driver the runtime says its "driver version is insufficient": say what is missing.
    const LibraryInfo& driver_lib = library_info(Library::kDriver);
    const std::string why = err == cudaSuccess  ? std::string("no device")
                            : !driver_lib.found ? "no GPU driver: libcuda.so.1 was not found"
                                                : rt.cudaGetErrorString(err);
    fmt::print("{:<14} none ({})\n", "GPU", why);
    return;
  }
  int runtime = 0, driver = 0;
  rt.cudaRuntimeGetVersion(&runtime);
  rt.cudaDriverGetVersion(&driver);
  for (int d = 0; d < count; ++d) {
    // cudaDeviceProp's layout is the one of the headers' CUDA major version; ask only a runtime
    // of that major version for it.
    if (runtime / 1000 == CUDART_VERSION / 1000 && rt.cudaGetDeviceProperties) {
      cudaDeviceProp prop{};
      if (rt.cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        fmt::print("{:<14} {}: {} ({} SMs, {:.1f} GiB, compute {}.{})\n", d == 0 ? "GPU" : "", d, prop.name,
                   prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30), prop.major, prop.minor);
        continue;
      }
    }
    fmt::print("{:<14} {}: present\n", d == 0 ? "GPU" : "", d);
  }
  fmt::print("{:<14} runtime {}.{}, driver {}.{}\n", "CUDA", runtime / 1000, runtime % 1000 / 10, driver / 1000,
             driver % 1000 / 10);
}

int run_info() {
  fmt::print("vcudnn {}\n", VCUDNN_VERSION);
  const LibraryInfo& cudnn = cudnn_library();
  print_library("cuDNN", cudnn);
  if (cudnn.found && real().cudnnGetVersion)
    fmt::print("{:<14} {} (built against {})\n", "cuDNN version", cudnn_version_text(real().cudnnGetVersion()),
               cudnn_version_text(CUDNN_VERSION));
  print_library("CUDA runtime", cudart_library());
  print_gpu();
  const Options& o = options();
  fmt::print("\nconfiguration\n");
  fmt::print("  {:<22} {:<14} {:<11} {}\n", "variable", "value", "source", "meaning");
  for (const auto& spec : option_specs()) {
    const char* source = o.source[spec.id] == OptionSource::kEnvironment ? "environment"
                         : o.source[spec.id] == OptionSource::kFallback  ? "fallback"
                                                                         : "default";
    std::string value = o.get(spec.id).empty() ? "(unset)" : o.get(spec.id);
    std::string doc = spec.doc;
    if (spec.type == OptionType::kEnum) doc = std::string("[") + spec.accepted + "] " + doc;
    fmt::print("  {:<22} {:<14} {:<11} {}\n", spec.env, value, source, doc);
  }
  for (const auto& e : o.errors) fmt::print("error: {}\n", e);
  for (const auto& w : o.warnings) fmt::print("warning: {}\n", w);
  return o.errors.empty() ? 0 : 2;
}

std::string mib_text(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Runs one of this build's source tree's plotting scripts (matplotlib) with python3; its exit status.
int run_plot_script(const char* name, std::vector<std::string> script_args) {
  const std::string script = std::string(VCUDNN_SOURCE_DIR) + "/scripts/" + name;
  if (::access(script.c_str(), R_OK) != 0) {
    fmt::print(stderr, "error: cannot plot: {} is missing\n", script);
    return 1;
  }
  std::vector<std::string> args{"python3", script};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int e = posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ); e != 0) {
    fmt::print(stderr, "error: cannot plot: python3: {}\n", std::strerror(e));
    return 1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// The trace shipped with the sources (tests/data): a recorded iteration to plan and draw on a
// machine without a GPU, the default of `vcudnn trace` and `vcudnn plan`.
std::string shipped_trace_name() { return "ResNet-50, batch 64, recorded on an H100"; }
std::string shipped_trace() {
  const std::string path = std::string(VCUDNN_SOURCE_DIR) + "/tests/data/resnet50_b64_trace.json";
  fmt::print("no trace given: the shipped one, {} ({})\n", shipped_trace_name(), path);
  return path;
}

// Draws the trace with scripts/trace_plot.py.
int plot_trace(const std::string& path, const std::string& out, uint64_t budget) {
  std::vector<std::string> args{path, out};
  if (budget) args.insert(args.end(), {"--budget", std::to_string(budget)});
  return run_plot_script("trace_plot.py", std::move(args));
}

int run_trace(const std::string& path, bool require_complete) {
  auto r = read_trace(path);
  if (!r) {
    fmt::print(stderr, "error: {}\n", r.error().message);
    return 1;
  }
  const Trace& t = r.value();
  std::map<std::string, int> kinds;
  double gpu_ms = 0;
  int convs = 0, timed = 0, timed_all = 0;
  double gpu_ms_all = 0;
  for (const auto& c : t.calls) {
    std::string k(call_kind_name(c.kind));
    if (call_has_conv_kind(c.kind)) k += "/" + std::string(conv_kind_name(c.conv));
    ++kinds[k];
    if (c.gpu_ms) {
      ++timed_all;
      gpu_ms_all += *c.gpu_ms;
    }
    if (c.kind == CallKind::kConvolution) {
      ++convs;
      if (c.gpu_ms) {
        ++timed;
        gpu_ms += *c.gpu_ms;
      }
    }
  }
  fmt::print("trace {}: schema {}, vcudnn {}, cuDNN {}\n", path, kTraceSchema, t.vcudnn_version,
             cudnn_version_text(static_cast<size_t>(t.cudnn_version)));
  fmt::print("iteration: {} (detected: {}), calls {}..{}\n", t.complete ? "complete" : "INCOMPLETE", t.detected_by,
             t.first_seq, t.end_seq);
  fmt::print("{} calls, {} convolutions ({} timed, {:.3f} ms GPU), {} layers, {} threads, {} handles, {} streams\n",
             t.calls.size(), convs, timed, gpu_ms, t.layers.size(), t.threads.size(), t.handles.size(),
             t.streams.size());
  if (timed_all > timed) fmt::print("all timed operations: {} ({:.3f} ms GPU)\n", timed_all, gpu_ms_all);
  if (t.gpu_times == "next")
    fmt::print(
        "GPU times: {} calls take those of the same operation in the next iteration (the recorded one's own are "
        "the first calls of cuDNN and cuBLAS)\n",
        t.next_timed);
  else if (timed_all > 0)
    fmt::print("GPU times: the recorded iteration's own (a first iteration's are slower than a steady one's)\n");
  for (const auto& [k, n] : kinds) fmt::print("  {:<36} {}\n", k, n);
  if (!t.buffers.empty()) {
    const Lifetimes l = lifetimes(t);
    fmt::print("memory over calls {}..{}: {} buffers; {} alive at the start, {} allocated; live peak {} at call {}\n",
               l.first_seq, l.end_seq, l.buffers.size(), mib_text(l.existing_bytes), mib_text(l.allocated_bytes),
               mib_text(l.peak_bytes), l.peak_seq);
    if (l.untouched_bytes)
      fmt::print("  of which {} alive throughout but used by no call of the iteration (counted in the peak)\n",
                 mib_text(l.untouched_bytes));
    const size_t shown = std::min<size_t>(l.at_peak.size(), 5);
    for (size_t k = 0; k < shown; ++k) {  // what holds the peak
      const BufferLife& b = l.buffers[l.at_peak[k]];
      fmt::print("  at the peak: {} buffer {}{}, {}, {}\n", mib_text(b.bytes), t.buffers[b.buffer].id,
                 t.buffers[b.buffer].library ? " (library)" : "",
                 b.alloc_seq ? fmt::format("allocated at call {}", *b.alloc_seq) : std::string("alive at the start"),
                 b.uses.empty() ? std::string("not used in the span")
                                : fmt::format("used {} times, last at call {}", b.uses.size(), b.uses.back()));
    }
    if (l.at_peak.size() > shown) fmt::print("  at the peak: {} more buffers\n", l.at_peak.size() - shown);
    if (l.turn_seq)
      fmt::print("forward to backward at call {}: {} alive across it\n", *l.turn_seq, mib_text(l.alive_across_turn));
    fmt::print("least device memory any offload plan needs: {} (call {}: its buffers and the library's)\n",
               mib_text(l.least_bytes), l.least_seq);
  }
  if (t.link)
    fmt::print("host link: {:.1f} GB/s device to host, {:.1f} GB/s host to device, {:.1f} GB/s both\n",
               t.link->device_to_host, t.link->host_to_device, t.link->both);
  return (require_complete && !t.complete) ? 3 : 0;
}

// `vcudnn plan FILE --budget B`: every policy's plan for the trace's iteration under the budget
// (bytes, or a percentage of the iteration's peak without a plan), side by side, with its memory
// and its predicted time. Exit 0 when vcudnn's plan fits, 1 for an unreadable trace, 2 for a bad
// setting, 3 when the budget is below the least any plan needs (the message names it).
struct PlanRequest {
  std::string path, budget, policy = "all", json, plot, timeline;
  bool replay = false;
  bool placement = false;
  bool whole_moves = false;
  bool across_end = false;
  double d2h_gbps = 0, h2d_gbps = 0, both_gbps = 0;  // 0: the trace's, else kAssumedLink
  double call_ms = 0;                                // a call the trace did not time
  std::string workspace_limit;                       // what if micro-batching bounded the workspaces
};

// `--workspace-limit`: the iteration as if micro-batching (VCUDNN_POLICY=microbatch+offload) held each
// convolution's workspace to `limit` (Note [Workspaces that decide the budget]): every workspace
// buffer above it (the accessed buffer at a convolution's workspace pointer) shrinks to it. A what-if
// of memory only: the calls keep their recorded GPU times, though micro-batches may run slower or
// faster. Returns how many buffers shrank and the bytes they gave up at most.
std::pair<size_t, uint64_t> bound_workspaces(Trace& t, uint64_t limit) {
  std::vector<bool> shrunk(t.buffers.size(), false);
  std::pair<size_t, uint64_t> out{0, 0};
  for (const TraceCall& c : t.calls) {
    if (c.kind != CallKind::kConvolution || c.seq < t.first_seq || c.seq >= t.end_seq) continue;
    for (const BufferAccess& a : c.accesses) {
      TraceBuffer& b = t.buffers[a.buffer];
      if (c.ptrs[kPtrWorkspace] == 0 || b.address != c.ptrs[kPtrWorkspace] || b.bytes <= limit || shrunk[a.buffer])
        continue;
      shrunk[a.buffer] = true;
      ++out.first;
      out.second = std::max(out.second, b.bytes - limit);
      b.bytes = limit;
    }
  }
  return out;
}

int run_plan(PlanRequest q) {
  auto r = read_trace(q.path);
  if (!r) {
    fmt::print(stderr, "error: {}\n", r.error().message);
    return 1;
  }
  Trace& t = r.value();
  if (!q.workspace_limit.empty()) {
    const auto limit = pool::parse_budget(q.workspace_limit, 0);
    if (!limit || q.workspace_limit.back() == '%') {
      fmt::print(stderr, "error: --workspace-limit {}: expected bytes (K/M/G/T)\n", q.workspace_limit);
      return 2;
    }
    const auto [buffers, most] = bound_workspaces(t, *limit);
    fmt::print(
        "workspace limit {}: {} convolution workspaces bounded (the largest by {}), as micro-batching would; GPU "
        "times as recorded\n",
        mib_text(*limit), buffers, mib_text(most));
  }
  if (t.buffers.empty()) {
    fmt::print(stderr, "error: {} has no buffers (recorded without memory ownership: VCUDNN_POLICY=offload)\n", q.path);
    return 1;
  }
  std::vector<OffloadPolicy> policies(std::begin(kOffloadPolicies), std::end(kOffloadPolicies));
  if (q.policy != "all") {
    const auto p = offload_policy_from_name(q.policy);
    if (!p) {
      fmt::print(stderr, "error: --policy {}: expected all, vcudnn, vdnn-all, vdnn-conv or modnn\n", q.policy);
      return 2;
    }
    policies = {*p};
  }
  if (q.d2h_gbps < 0 || q.h2d_gbps < 0 || q.both_gbps < 0 || q.call_ms < 0) {
    fmt::print(stderr, "error: bandwidths and --call-ms must not be negative\n");
    return 2;
  }
  const Lifetimes l = lifetimes(t);
  const SpanModel m = span_model(t, l);
  const std::vector<uint64_t> none = simulate(m, {});
  const uint64_t peak = none.empty() ? 0 : *std::max_element(none.begin(), none.end());
  const auto budget = pool::parse_budget(q.budget, peak);
  if (!budget) {
    fmt::print(stderr, "error: --budget {}: expected bytes (K/M/G/T) or a percentage of the peak ({})\n", q.budget,
               mib_text(peak));
    return 2;
  }
  LinkModel link = kAssumedLink;
  const char* link_from = "assumed: H100, PCIe 5; the trace has none";
  if (t.link) {
    link = {t.link->device_to_host, t.link->host_to_device, t.link->both};
    link_from = "measured when the trace was recorded";
  }
  if (q.d2h_gbps > 0 || q.h2d_gbps > 0 || q.both_gbps > 0) link_from = "given";
  if (q.d2h_gbps > 0) link.device_to_host_gbps = q.d2h_gbps;
  if (q.h2d_gbps > 0) link.host_to_device_gbps = q.h2d_gbps;
  if (q.both_gbps > 0) link.both_gbps = q.both_gbps;
  const OffloadBound bound = offload_bound(m);
  fmt::print("plan {}: calls {}..{} ({}), device bytes at the peak without a plan {} (granules of 2 MiB)\n", q.path,
             l.first_seq, l.end_seq, m.seqs.size(), mib_text(peak));
  fmt::print("least budget any plan needs: {} at call {}; budget {} ({:.1f}% of the peak)\n",
             mib_text(bound.least_bytes), bound.seq, mib_text(*budget),
             peak ? 100.0 * static_cast<double>(*budget) / static_cast<double>(peak) : 0.0);
  fmt::print("link: {:.1f} GB/s out, {:.1f} GB/s back, {:.1f} GB/s both ({}); calls without GPU time: {} ms each\n",
             link.device_to_host_gbps, link.host_to_device_gbps, link.both_gbps, link_from, q.call_ms);
  // Note [Workspaces that decide the budget]
  if (const std::string advice = workspace_advice(largest_conv_workspace(t), *budget); !advice.empty())
    fmt::print("{}\n", advice);
  fmt::print(
      "| policy | fits | moves | moved out | peak | peak / budget | step (ms) | waits for copies back (ms) | waits for "
      "room (ms) | late copies back / out | x lower bound |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  nlohmann::json out = {{"schema", "vcudnn.plan/1"},
                        {"trace", q.path},
                        {"budget", *budget},
                        {"peak_without", peak},
                        {"least_budget", bound.least_bytes},
                        {"link",
                         {{"device_to_host_gbps", link.device_to_host_gbps},
                          {"host_to_device_gbps", link.host_to_device_gbps},
                          {"both_gbps", link.both_gbps}}},
                        {"plans", nlohmann::json::array()},
                        {"curves", {{"without", none}}}};
  size_t untimed = 0;
  for (OffloadPolicy policy : policies) {
    auto plan = plan_offload(t, l, *budget, policy, {}, link, q.call_ms);
    if (!plan) {
      fmt::print("| {} | refused | | | | | | | | | |\n", offload_policy_name(policy));
      fmt::print(stderr, "{}: {}\n", offload_policy_name(policy), plan.error().message);
      if (*budget < bound.least_bytes) rc = 3;
      continue;
    }
    OffloadPlan& p = plan.value();
    schedule_prefetches(t, m, p, link, q.call_ms);
    const PlanTimeline time = time_plan(t, m, p, link, q.call_ms);
    untimed = time.untimed_calls;
    fmt::print("| {} | {} | {} | {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {} / {} | {:.3f} |\n",
               offload_policy_name(policy), p.fits ? "yes" : "NO", p.moves.size(), mib_text(p.bytes_moved), mib_text(p.peak_bytes),
               static_cast<double>(p.peak_bytes) / static_cast<double>(*budget), time.step_ms, time.stall_ms,
               time.room_ms, time.late_prefetches, time.late_offloads,
               time.lower_bound_ms > 0 ? time.step_ms / time.lower_bound_ms : 0.0);
    nlohmann::json moves = nlohmann::json::array();
    for (const OffloadMove& mv : p.moves)
      moves.push_back({{"buffer", t.buffers[l.buffers[mv.life].buffer].id},
                       {"bytes", mv.bytes},
                       {"offset", mv.offset},
                       {"out_after", m.seqs[mv.out_after]},
                       {"prefetch_at", m.seqs[mv.prefetch_at]},
                       // past the span: the next iteration's (Note [Across the iteration's end])
                       {"next_use", mv.next_use < m.seqs.size() ? m.seqs[mv.next_use] : t.end_seq}});
    out["plans"].push_back({{"policy", offload_policy_name(policy)},
                            {"fits", p.fits},
                            {"bytes_moved", p.bytes_moved},
                            {"peak", p.peak_bytes},
                            {"step_ms", time.step_ms},
                            {"stall_ms", time.stall_ms},
                            {"room_ms", time.room_ms},
                            {"lower_bound_ms", time.lower_bound_ms},
                            {"moves", std::move(moves)}});
    out["curves"][std::string(offload_policy_name(policy))] = simulate(m, p.moves);
    if (policy == OffloadPolicy::kVcudnn) {
      if (!p.fits && rc == 0) rc = 3;
      if (!q.timeline.empty()) {
        if (Status s = write_output_file(q.timeline, timeline_json(m, p, time)); !s) {
          fmt::print(stderr, "error: {}\n", s.error().message);
          return 1;
        }
      }
    }
  }
  if (q.replay) {  // what the runtime would follow (offload_replay.h): buffers a later iteration can name
    OffloadOptions o;
    o.replayable_only = true;
    const SpanModel rm = span_model(t, l, o);
    for (OffloadPolicy policy : policies) {
      auto plan = plan_offload(t, l, *budget, policy, o, link, q.call_ms);
      if (!plan) {
        fmt::print("replay {}: no plan: {}\n", offload_policy_name(policy), plan.error().message);
        continue;
      }
      schedule_prefetches(t, rm, plan.value(), link, q.call_ms);
      const auto script = replay_script(t, l, rm, plan.value());
      if (!script) {
        fmt::print("replay {}: {}\n", offload_policy_name(policy), script.error().message);
        continue;
      }
      size_t persistent = 0;
      for (const ReplayTarget& target : script->targets) persistent += target.persistent ? 1 : 0;
      fmt::print(
          "replay {}: {} memory events and {} allocations/frees per iteration, found by its first {}; {} buffers "
          "move ({} alive through the iteration), {} each way; peak {}{}\n",
          offload_policy_name(policy), script->events, script->steps.size(), script->anchor, script->targets.size(),
          persistent, mib_text(script->bytes_moved), mib_text(plan->peak_bytes), plan->fits ? "" : " (does NOT fit)");
    }
  }
  if (q.placement) {  // Note [A static placement]: what a layout planned once would hold and cost
    OffloadOptions o;
    o.replayable_only = true;
    o.partial_moves = !q.whole_moves;  // Note [Moving part of a buffer]
    // Note [Across the iteration's end]: as VCUDNN_OFFLOAD_PLACEMENT=static (only where no plan without
    // them fits), static-across (--across-end: where faster) or static-whole (--whole-moves: never).
    o.across_end = q.across_end || !q.whole_moves;
    o.across_only_where_needed = !q.across_end;
    auto placed = plan_placed(t, l, *budget, o, link, q.call_ms);
    if (!placed) {
      fmt::print("static placement: {}\n", placed.error().message);
      if (rc == 0) rc = 3;
    } else {
      const Placement& p = placed->placement;
      const SpanModel pm = span_model(t, l, o);
      const PlanTimeline time = time_placed(t, pm, placed->plan, p, link, q.call_ms);
      if (!q.timeline.empty()) {  // the placed plan's, in place of the plain plan's
        if (Status s = write_output_file(q.timeline, timeline_json(pm, placed->plan, time)); !s) {
          fmt::print(stderr, "error: {}\n", s.error().message);
          return 1;
        }
      }
      fmt::print(
          "static placement: the vcudnn plan for {} ({:.1f}% of the budget): {} moves ({} in part), {} each way, step "
          "{:.3f} ms "
          "({:.3f} waiting for copies out; moved buffers' bytes {}); "
          "a pool of {} for {} buffers (the most of them on the device at once {}), {} outside it at most; {} for the "
          "budget {}: fits; per iteration {} driver calls ({} blocks), {} mappings made once\n",
          mib_text(placed->plan_budget),
          100.0 * static_cast<double>(placed->plan_budget) / static_cast<double>(*budget), placed->plan.moves.size(),
          std::count_if(placed->plan.moves.begin(), placed->plan.moves.end(),
                        [](const OffloadMove& mv) { return mv.offset != 0; }),
          mib_text(placed->plan.bytes_moved), time.step_ms, time.room_ms,
          placed->held ? "held until copied out" : "handed over as they leave", mib_text(p.pool_bytes),
          p.buffers.size(), mib_text(p.resident_peak), mib_text(p.other_peak), mib_text(p.total()), mib_text(*budget),
          p.remap_calls, p.blocks, p.first_mappings);
      size_t in_part = 0, across = 0;
      uint64_t across_bytes = 0;
      for (const OffloadMove& mv : placed->plan.moves) {
        in_part += mv.offset ? 1 : 0;
        if (mv.next_use == pm.seqs.size()) {
          ++across;
          across_bytes += mv.bytes;
        }
      }
      if (q.across_end || across)
        fmt::print(
            "static placement: {} moves across the iteration's end ({}); lower bound with such moves {:.3f} ms\n",
            across, mib_text(across_bytes), time.lower_bound_ms);
      out["placement"] = {{"plan_budget", placed->plan_budget},
                          {"moves", placed->plan.moves.size()},
                          {"moves_in_part", in_part},
                          {"moves_across_end", across},
                          {"bytes_across_end", across_bytes},
                          {"bytes_moved", placed->plan.bytes_moved},
                          {"step_ms", time.step_ms},
                          {"lower_bound_ms", time.lower_bound_ms},  // Note [The lower bound], in this plan's model
                          {"waits_for_copies_out_ms", time.room_ms},
                          {"held_until_copied", placed->held},
                          {"pool_bytes", p.pool_bytes},
                          {"placed_buffers", p.buffers.size()},
                          {"resident_peak", p.resident_peak},
                          {"other_peak", p.other_peak},
                          {"total", p.total()},
                          {"blocks", p.blocks},
                          {"remap_calls", p.remap_calls},
                          {"first_mappings", p.first_mappings}};
    }
  }
  if (untimed)
    fmt::print(
        "{} of {} calls have no GPU time in the trace (allocations and frees, calls on no known stream or captured "
        "into a "
        "graph; a trace of an older vcudnn times convolutions only): counted as {} ms\n",
        untimed, m.seqs.size(), q.call_ms);
  if (q.json.empty() && !q.plot.empty()) q.json = q.plot + ".json";  // the plot's input
  if (!q.json.empty()) {
    if (Status s = write_output_file(q.json, out.dump(1) + "\n"); !s) {
      fmt::print(stderr, "error: {}\n", s.error().message);
      return 1;
    }
  }
  if (!q.plot.empty()) {
    const int plotted = run_plot_script("plan_plot.py", {q.json, q.plot});
    if (plotted != 0) return plotted;
  }
  return rc;
}

}  // namespace
}  // namespace vcudnn

namespace {

const char* value_text(const vcudnn::OptionSpec& spec) {
  switch (spec.type) {
    case vcudnn::OptionType::kEnum:
      return "VALUE";
    case vcudnn::OptionType::kPath:
      return "PATH";
    case vcudnn::OptionType::kBytes:
      return "BYTES";
    case vcudnn::OptionType::kBudget:
      return "BYTES|N%";
  }
  return "VALUE";
}

// One option per row of options.def, so that a new setting needs no change here; the accepted
// values are checked by parse_options when the command runs, not by CLI11.
CLI::App* add_run_command(CLI::App& app, vcudnn::launcher::Request& request) {
  auto* run = app.add_subcommand("run", "run a command with libvcudnn.so preloaded: vcudnn run [options] -- command");
  run->add_option("--library", request.library, "libvcudnn.so to preload (default: the one next to this vcudnn)");
  for (const auto& spec : vcudnn::option_specs()) {
    std::string names = vcudnn::launcher::flag_name(spec);
    if (spec.id == vcudnn::kDeviceBudget) names += ",--budget";
    std::string doc = spec.env + std::string(": ") + spec.doc;
    if (spec.type == vcudnn::OptionType::kEnum) doc = spec.env + std::string(" [") + spec.accepted + "]: " + spec.doc;
    run->add_option_function<std::string>(
           names, [&request, id = spec.id](const std::string& v) { request.options[id] = v; }, doc)
        ->type_name(value_text(spec));
  }
  run->add_flag("--dry-run", request.dry_run, "print the variables that would change and the command; run nothing");
  run->add_flag("-q,--quiet", request.quiet, "do not print the line naming what was set");
  run->footer("The command follows --. Options not given leave the environment as it is.");
  return run;
}

// Everything after the first "--" that follows `run` is the command: CLI11 would otherwise take
// the command's own options (a training script's --quiet, say) for vcudnn's.
std::vector<std::string> split_command(int& argc, char** argv) {
  int sub = 1;
  while (sub < argc && argv[sub][0] == '-') ++sub;  // options of `vcudnn` itself (--help)
  if (sub == argc || std::string_view(argv[sub]) != "run") return {};
  for (int i = sub + 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    std::vector<std::string> command(argv + i + 1, argv + argc);
    argc = i;
    return command;
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vcudnn: cuDNN interposer for micro-batching and offloading"};
  app.require_subcommand(0, 1);
  auto* info = app.add_subcommand("info", "resolved libraries, GPU and configuration (default)");
  std::string trace_path;
  bool require_complete = false;
  std::string plot_path;
  uint64_t plot_budget = 0;
  auto* trace = app.add_subcommand("trace", "check and summarise a trace written by VCUDNN_TRACE");
  trace->add_option("file", trace_path, "trace file (default: the shipped one, " + vcudnn::shipped_trace_name() + ")");
  trace->add_flag("--require-complete", require_complete, "exit 3 when the trace holds no complete iteration");
  trace->add_option("--plot", plot_path, "also draw memory over the iteration into this PNG (python3 with matplotlib)");
  trace->add_option("--budget", plot_budget, "with --plot: draw a device budget (bytes)");
  vcudnn::PlanRequest plan_request;
  auto* plan = app.add_subcommand("plan", "offload plans for a trace's iteration under a device budget, by policy");
  plan->add_option("file", plan_request.path,
                   "trace file, recorded with VCUDNN_POLICY=offload (default: the shipped one, " +
                       vcudnn::shipped_trace_name() + ")");
  plan->add_option("--budget", plan_request.budget,
                   "device budget: bytes (K/M/G/T) or a percentage of the peak (default 60%)");
  plan->add_option("--policy", plan_request.policy, "all (default), vcudnn, vdnn-all, vdnn-conv or modnn");
  plan->add_option("--json", plan_request.json, "write the plans (moves, device bytes per call, times) to this file");
  plan->add_option("--plot", plan_request.plot, "draw device memory with and without each plan into this PNG");
  plan->add_option("--timeline", plan_request.timeline, "write vcudnn's plan as a Chrome trace JSON (three lanes)");
  plan->add_flag("--replay", plan_request.replay,
                 "also plan as the runtime does (only buffers a later iteration can name move) and say what it "
                 "would follow");
  plan->add_flag("--placement", plan_request.placement,
                 "also lay the iteration's buffers out once for the budget (Note [A static placement]): the plan it "
                 "needs, the pool, and the driver calls per iteration");
  plan->add_flag("--whole-moves", plan_request.whole_moves,
                 "with --placement: move whole buffers only, none across the iteration's end, as "
                 "VCUDNN_OFFLOAD_PLACEMENT=static-whole does (by default a buffer may move in part: Note [Moving part "
                 "of a buffer])");
  plan->add_flag("--across-end", plan_request.across_end,
                 "with --placement: buffers alive through the iteration (optimizer state) may stay off the device "
                 "across its end, placed in the pool while they move (Note [Across the iteration's end]), wherever "
                 "that predicts a shorter step, as VCUDNN_OFFLOAD_PLACEMENT=static-across plans (without it, as "
                 "the default static: only where no plan without them fits)");
  plan->add_option("--d2h-gbps", plan_request.d2h_gbps, "device-to-host bandwidth (default: the trace's, else 55)");
  plan->add_option("--h2d-gbps", plan_request.h2d_gbps, "host-to-device bandwidth (default: the trace's, else 55)");
  plan->add_option("--both-gbps", plan_request.both_gbps, "both directions at once (default: the trace's, else 78)");
  plan->add_option("--call-ms", plan_request.call_ms, "GPU time of a call the trace did not time (default 0)");
  plan->add_option("--workspace-limit", plan_request.workspace_limit,
                   "plan the iteration as if micro-batching (VCUDNN_POLICY=microbatch+offload) held every convolution "
                   "workspace to these bytes (K/M/G/T); the calls keep their recorded GPU times");
  vcudnn::launcher::Request request;
  auto* run = add_run_command(app, request);
  request.command = split_command(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // usage errors: 2, like the refusals of `vcudnn run`
  }
  if (run->parsed()) {
    if (request.command.empty()) {
      fmt::print(stderr, "vcudnn run: no command: vcudnn run [options] -- command [args...]\n");
      return 2;
    }
    return vcudnn::launcher::run(request);
  }
  if (plan->parsed()) {
    if (plan_request.path.empty()) plan_request.path = vcudnn::shipped_trace();
    if (plan_request.budget.empty()) plan_request.budget = "60%";
    return vcudnn::run_plan(plan_request);
  }
  if (trace->parsed()) {
    if (trace_path.empty()) trace_path = vcudnn::shipped_trace();
    const int rc = vcudnn::run_trace(trace_path, require_complete);
    if (rc == 1 || plot_path.empty()) return rc;
    const int plotted = vcudnn::plot_trace(trace_path, plot_path, plot_budget);
    return plotted != 0 ? plotted : rc;
  }
  (void)info;
  return vcudnn::run_info();
}
