// [pytorch][offload] An unmodified PyTorch (cuDNN graph API, one cudaMallocAsync per tensor) under
// VCUDNN_POLICY=offload: vcudnn serves its memory, and under a device budget of 60% of what the
// step needs, evicts buffers to the host and brings them back; the losses stay bit-identical.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "planner/lifetimes.h"
#include "planner/trace.h"
#include "tests/common/test_util.h"

using namespace vcudnn::test;

namespace {

constexpr int kSteps = 4;
constexpr const char* kAllocConf = "backend:cudaMallocAsync";  // vcudnn refuses expandable_segments
constexpr double kMiB = 1024.0 * 1024.0;

// Batches large enough that most activations are above one 2 MiB granule (smaller buffers are
// never evicted), small enough that the three runs of one model take well under a minute.
struct Model {
  const char* name;
  int batch;
  std::vector<std::string> extra = {};  // more worker arguments: --compile MODE, --graphed
  bool alone_twice = false;             // check that PyTorch alone is deterministic run to run (compiled kernels)
  bool budget = true;                   // also train under 60%
  // PYTORCH_CUDA_ALLOC_CONF: cudaMallocAsync (one allocation per tensor), or "" for PyTorch's caching
  // allocator (vcudnn owns its segments), which CUDA graph trees need (PyTorch's cudaMallocAsync
  // backend lacks checkPoolLiveAllocations).
  std::string alloc_conf = kAllocConf;
  int steps = kSteps;
  std::map<std::string, std::string> vcudnn_env = {};  // on top of VCUDNN_POLICY=offload (preloaded runs)
};

struct Run {
  std::string tag;
  ProcessResult proc;
  nlohmann::json result;  // null when the worker failed
  std::string log;        // vcudnn's log (preloaded runs)
};

// Every run: PyTorch's cudaMallocAsync backend, cuDNN's graph API (TORCH_CUDNN_V8_API_DISABLED
// unset); run_process drops the vcudnn settings of the caller's shell.
std::map<std::string, std::optional<std::string>> base_env() {
  return {{"LD_PRELOAD", std::nullopt},
          {"TORCH_CUDNN_V8_API_DISABLED", std::nullopt},
          {"PYTORCH_CUDA_ALLOC_CONF", kAllocConf},
          {"PYTHONUNBUFFERED", "1"},
          {"VCUDNN_TEST_FORCE_SPLIT", std::nullopt}};
}

// preload: LD_PRELOAD=libvcudnn.so with VCUDNN_POLICY=offload; budget: VCUDNN_DEVICE_BUDGET in bytes.
Run train(const Model& m, const std::string& tag, const TempDir& tmp, bool preload,
          std::optional<uint64_t> budget = std::nullopt, const std::string& trace = "") {
  auto env = base_env();
  if (m.alloc_conf.empty())
    env["PYTORCH_CUDA_ALLOC_CONF"] = std::nullopt;
  else
    env["PYTORCH_CUDA_ALLOC_CONF"] = m.alloc_conf;
  if (preload) {
    env["LD_PRELOAD"] = libvcudnn_path();
    env["VCUDNN_POLICY"] = "offload";
    env["VCUDNN_LOG_LEVEL"] = "info";
    env["VCUDNN_LOG_FILE"] = tmp.file(tag + ".log");
    for (const auto& [key, value] : m.vcudnn_env) env[key] = value;
  }
  if (budget) env["VCUDNN_DEVICE_BUDGET"] = std::to_string(*budget);
  if (!trace.empty()) env["VCUDNN_TRACE"] = trace;
  // Compiled kernels: one cache per test, so that the first run compiles and autotunes and the
  // others load the same kernels and choices.
  env["TORCHINDUCTOR_CACHE_DIR"] = tmp.file("inductor");
  env["TRITON_CACHE_DIR"] = tmp.file("triton");
  const std::string json_path = tmp.file(tag + ".json");
  Run r{tag, {}, nullptr, {}};
  std::vector<std::string> argv{python_executable(),
                                source_dir() + "/tests/pytorch/train_offload.py",
                                "--model",
                                m.name,
                                "--batch",
                                std::to_string(m.batch),
                                "--steps",
                                std::to_string(m.steps),
                                "--seed",
                                "0",
                                "--json",
                                json_path};
  argv.insert(argv.end(), m.extra.begin(), m.extra.end());
  r.proc = run_process(argv, env, 600);
  if (preload) r.log = read_file(tmp.file(tag + ".log"));
  if (r.proc.exit_code == 0) {
    auto parsed = nlohmann::json::parse(read_file(json_path), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) r.result = std::move(parsed);
  }
  return r;
}

// Everything a failure report needs: the worker's output and vcudnn's log.
std::string describe(const Run& r) {
  std::ostringstream s;
  s << r.tag << ": exit " << r.proc.exit_code << "\n--- stdout\n" << r.proc.out << "--- stderr\n" << r.proc.err;
  if (!r.log.empty()) s << "--- vcudnn log\n" << r.log;
  return s.str();
}

uint64_t mem_stat(const Run& r, const char* key) { return r.result.at("vcudnn").at(key).get<uint64_t>(); }

// One line per run for the log: step times, peak memory, eviction traffic, vcudnn's exit line.
std::string numbers(const Run& r) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << r.tag << ": step ms";
  for (const auto& ms : r.result.at("step_ms")) s << " " << ms.get<double>();
  const auto& v = r.result.at("vcudnn");
  if (v.is_null()) {
    const auto& peak = r.result.at("max_memory_allocated");
    if (peak.is_number()) s << "; PyTorch max_memory_allocated " << peak.get<double>() / kMiB << " MiB";
    return s.str();
  }
  s << "; peakMapped " << mem_stat(r, "peakMappedBytes") / kMiB << " MiB (budget " << mem_stat(r, "budgetBytes") / kMiB
    << " MiB), allocations " << mem_stat(r, "allocations") << ", evictions " << mem_stat(r, "evictions")
    << ", restores " << mem_stat(r, "restores") << ", fault-ins " << mem_stat(r, "faultIns") << ", moved out "
    << mem_stat(r, "bytesEvicted") / kMiB << " MiB, back " << mem_stat(r, "bytesRestored") / kMiB
    << " MiB, failed allocations " << mem_stat(r, "failedAllocations") << ", tracked calls "
    << mem_stat(r, "trackedCalls");
  const auto exit_lines = grep(r.log, "exit: ");
  if (!exit_lines.empty()) s << "\n  " << exit_lines.back();
  return s.str();
}

void require_ran(const Model& m, const Run& r) {
  INFO(describe(r));
  REQUIRE(r.proc.exit_code == 0);
  REQUIRE(r.result.is_object());
  REQUIRE(r.result.at("losses").size() == static_cast<size_t>(m.steps));
  CHECK(r.result.at("finite").get<bool>());
  CHECK(r.result.at("deterministic").get<bool>());
  CHECK(r.result.at("allocator_backend") == (m.alloc_conf.empty() ? "native" : "cudaMallocAsync"));
}

// The exit line's count of launches vcudnn saw without knowing their parameters (their buffers
// could not be tracked one by one); nullopt when the line is missing.
std::optional<uint64_t> untracked_launches(const Run& r) {
  const auto lines = grep(r.log, "exit: ");
  if (lines.empty()) return std::nullopt;
  const auto at = lines.back().find("untracked_launches=");
  if (at == std::string::npos) return std::nullopt;
  return std::stoull(lines.back().substr(at + std::strlen("untracked_launches=")));
}

// A count from the exit line ("key=N"); nullopt when the line or the key is missing.
std::optional<uint64_t> exit_count(const Run& r, const std::string& key) {
  const auto lines = grep(r.log, "exit: ");
  if (lines.empty()) return std::nullopt;
  const auto at = lines.back().find(" " + key + "=");
  if (at == std::string::npos) return std::nullopt;
  return std::stoull(lines.back().substr(at + key.size() + 2));
}

void require_owned(const Run& r) {
  INFO(describe(r));
  CHECK(untracked_launches(r) == std::optional<uint64_t>(0));
  // The struct came back: the preloaded library exports vcudnnGetMemoryStats and it succeeded.
  REQUIRE(r.result.at("vcudnn").is_object());
  REQUIRE(r.result.at("vcudnn").contains("active"));
  CHECK(mem_stat(r, "active") == 1);
  CHECK(mem_stat(r, "allocations") > 0);
  CHECK(mem_stat(r, "failedAllocations") == 0);
}

// Bitwise is the right bar for offload, not a tolerance: owning memory and evicting it move
// bytes exactly (device -> pinned host -> the same device address) and change nothing PyTorch,
// cuDNN or cuBLAS decide from (shapes, algorithms, stream order). With deterministic algorithms,
// no TF32 and the same seeds and data, every kernel of the three runs is the same kernel on the
// same bytes. The one thing that could legitimately differ is address alignment (kernels pick
// vectorised paths by it), and vcudnn must keep cudaMalloc's 256-byte alignment anyway: a loss
// that moves even in its last bit means a buffer was read stale, early or from the wrong place.
void check_model(const Model& m) {
  TempDir tmp;
  // (a) PyTorch alone, same allocator configuration.
  const Run alone = train(m, "alone", tmp, false);
  require_ran(m, alone);
  CHECK(alone.result.at("vcudnn").is_null());
  std::string variant;
  for (const auto& a : m.extra) variant += " " + a;
  WARN(m.name << variant << " batch " << m.batch << ", " << m.steps << " steps\n" << numbers(alone));
  if (m.alone_twice) {  // bitwise comparison means something only if PyTorch alone repeats itself
    const Run again = train(m, "alone2", tmp, false);
    require_ran(m, again);
    INFO(describe(alone) << describe(again));
    REQUIRE(again.result.at("losses") == alone.result.at("losses"));
  }

  // (b) vcudnn owns the memory, no budget: nothing is evicted.
  const Run owned = train(m, "owned", tmp, true);
  require_ran(m, owned);
  require_owned(owned);
  WARN(numbers(owned));
  {
    INFO(describe(owned));
    CHECK(mem_stat(owned, "budgetBytes") == 0);
    CHECK(mem_stat(owned, "evictions") == 0);
    CHECK(owned.result.at("losses") == alone.result.at("losses"));
  }
  if (!m.budget) return;
  // (c) A device budget of 60% of (b)'s peak: vcudnn must evict and still never fail. (b)'s
  // peakMappedBytes counts freed buffers kept mapped for reuse too, and may be far above what is
  // ever live at once (resnet18 batch 32 on an H100: 1862 MiB mapped, 903 MiB live; at batch 16,
  // 60% of it needed no eviction at all). The base is therefore the smaller of it and the peak of live
  // bytes, which PyTorch alone reports with this allocator (max_memory_allocated): 60% of that
  // cannot be met without evicting.
  const uint64_t mapped = mem_stat(owned, "peakMappedBytes");
  const auto& live_json = alone.result.at("max_memory_allocated");
  const uint64_t live = live_json.is_number() ? live_json.get<uint64_t>() : 0;
  REQUIRE(mapped > 0);
  const uint64_t base = live > 0 ? std::min(mapped, live) : mapped;
  const uint64_t budget = base * 3 / 5;
  WARN("budget: 60% of min(peakMapped " << mapped / kMiB << " MiB, PyTorch's live peak " << live / kMiB
                                        << " MiB) = " << budget / kMiB << " MiB");
  const Run tight = train(m, "budget60", tmp, true, budget);
  require_ran(m, tight);
  require_owned(tight);
  WARN(numbers(tight));
  INFO(describe(tight));
  CHECK(mem_stat(tight, "budgetBytes") > 0);
  CHECK(mem_stat(tight, "budgetBytes") <= budget);  // the option was read (rounding down to granules is allowed)
  CHECK(mem_stat(tight, "evictions") > 0);
  CHECK(mem_stat(tight, "peakMappedBytes") <= budget);  // the steps after the first
  CHECK(tight.result.at("vcudnn_first_step").at("peakMappedBytes").get<uint64_t>() <= budget);
  CHECK(tight.result.at("losses") == alone.result.at("losses"));
}

// Planned offload (Note [Replaying an offload plan]): under each budget (a percentage of the same
// base as check_model's), the first recorded iteration becomes vcudnn's plan, which the iterations
// after follow; losses bit-identical, the budget held, the plan made and followed.
// follow: the plan must be made and followed through two iterations or more. Without it, the
// iteration must be found from the operations and what vcudnn decided said in the log: a
// transformer's iteration may begin where no allocation is unique (no plan: on demand), and its
// frees come in another order from one iteration to the next, so a plan it gets loses step.
// also: further checks on each run whose plan was followed without on-demand help. Returns how many
// budgets that was.
int check_planned(const Model& m, const std::vector<int>& percents, bool follow = true,
                  const std::function<void(const Run&)>& also = {}) {
  TempDir tmp;
  const Run alone = train(m, "alone", tmp, false);
  require_ran(m, alone);
  WARN(m.name << " batch " << m.batch << ", " << m.steps << " steps\n" << numbers(alone));
  if (m.alone_twice) {  // the comparison below is bit for bit: PyTorch alone must repeat itself
    const Run again = train(m, "again", tmp, false);
    require_ran(m, again);
    REQUIRE(again.result.at("losses") == alone.result.at("losses"));
  }
  const Run owned = train(m, "owned", tmp, true);
  require_ran(m, owned);
  require_owned(owned);
  const auto& live_json = alone.result.at("max_memory_allocated");
  const uint64_t live = live_json.is_number() ? live_json.get<uint64_t>() : 0;
  const uint64_t mapped = mem_stat(owned, "peakMappedBytes");
  const uint64_t base = live > 0 ? std::min(mapped, live) : mapped;
  int followed = 0;
  for (int pct : percents) {
    const uint64_t budget = base * static_cast<uint64_t>(pct) / 100;
    const Run r = train(m, "plan" + std::to_string(pct), tmp, true, budget);
    require_ran(m, r);
    require_owned(r);
    WARN(pct << "% = " << budget / kMiB << " MiB: " << numbers(r));
    INFO(describe(r));
    CHECK(r.result.at("losses") == alone.result.at("losses"));
    CHECK(mem_stat(r, "peakMappedBytes") <= budget);
    CHECK(r.result.at("vcudnn_first_step").at("peakMappedBytes").get<uint64_t>() <= budget);
    const bool planned = !grep(r.log, "offload: vcudnn plan from the recorded iteration").empty();
    if (!follow) {
      CHECK(!grep(r.log, "iteration found from the operations (no convolutions)").empty());
      CHECK((planned || !grep(r.log, "offload: the recorded iteration has no unique start").empty()));
      continue;
    }
    CHECK(planned);
    // Below the least budget any plan needs, the plan brings the other calls under what it can and
    // on-demand eviction covers the rest; each iteration that needed it makes the plan again with
    // more room (Note [Room the plan leaves]), so it is not followed for long: the losses and the
    // budget above are what must hold.
    if (!grep(r.log, "calls that need more are served by on-demand eviction").empty()) continue;
    CHECK(exit_count(r, "iterations").value_or(0) >= 2);  // followed to the end of at least two
    CHECK(exit_count(r, "offloads").value_or(0) > 0);
    CHECK(exit_count(r, "prefetches").value_or(0) > 0);
    ++followed;
    if (also) also(r);
  }
  return followed;
}

}  // namespace

TEST_CASE(
    "resnet50 under planned offload at 70% and 50%: the recorded iteration's plan replayed, losses "
    "bit-identical, the budget held",
    "[pytorch][offload][replay]") {
  Model m{"resnet50", 32};
  m.steps = 10;  // recorded by the fifth (Note [A steady iteration]), followed from the sixth
  check_planned(m, {70, 50});
}

// Note [Across the iteration's end] (planner/offload_plan.h): under
// VCUDNN_OFFLOAD_PLACEMENT=static-across, SGD's momentum and weights after their backward use may
// leave after their last use and come back before the iteration ends; each is taken into its pool
// slot at its own address when it first comes back. The plan that uses them is kept only where the
// model says it is faster (the shipped ResNet-50 b64 trace: at 70% and 50%, not at 90%). Offload
// moves bytes: the losses stay PyTorch's bit for bit.
TEST_CASE(
    "across the iteration's end: resnet50 under planned offload at 70% and 50%, buffers alive through the "
    "iteration adopted into the pool, losses bit-identical, the budget held",
    "[pytorch][offload][replay][across]") {
  Model m{"resnet50", 32};
  m.steps = 10;
  m.vcudnn_env = {{"VCUDNN_OFFLOAD_PLACEMENT", "static-across"}};
  const int followed = check_planned(m, {70, 50}, true, [](const Run& r) {
    INFO(describe(r));
    CHECK(!grep(r.log, "moves across the iteration's end (").empty());
    CHECK(exit_count(r, "adopted").value_or(0) > 0);
  });
  CHECK(followed >= 1);
}

// VGG-16 b32 in this deterministic setting takes convolution workspaces of up to 2.4 GiB (the H100,
// 2026-11-25), so that no plan brings every call below 75 % of its peak: at 90 % the plan is
// followed; at 50 % it brings the other calls under what it can and on-demand eviction covers the
// rest. (At 80 %, 6 % above that least budget, each plan needed on-demand help in its first
// iteration and was made again with more room until it fell below it.) The losses stay PyTorch's.
TEST_CASE(
    "vgg16 under planned offload at 90% and 50%: the recorded iteration's plan replayed (with on-demand eviction "
    "below the least budget of a plan), losses bit-identical, the budget held",
    "[pytorch][offload][replay]") {
  Model m{"vgg16", 32};
  m.steps = 10;
  m.alone_twice = true;
  check_planned(m, {90, 50});
}

// Note [Workspaces that decide the budget] (planner/offload_plan.h): with micro-batching (its
// workspace for one call: Note [Workspace that lives for one call]) VGG-16 on PyTorch's default
// path trains under a budget that the plan covers without on-demand help once it is followed. Not
// bitwise: micro-batches sum in another order. fp32 without TF32: the first loss (forward only,
// same weights) differs by reassociation alone; later ones drift through SGD (the legacy path's
// micro-batching test in pytorch_test.cpp measured it).
TEST_CASE(
    "vgg16, micro-batching and planned offload: at 70% on the default path, the plan with its static "
    "placement, workspaces for one call, the budget held, losses within reassociation",
    "[pytorch][offload][replay][microbatch]") {
  TempDir tmp;
  Model m{"vgg16", 32};
  m.steps = 10;
  const Run alone = train(m, "alone", tmp, false);
  require_ran(m, alone);
  const auto& live_json = alone.result.at("max_memory_allocated");
  REQUIRE(live_json.is_number());
  const uint64_t budget = live_json.get<uint64_t>() * 70 / 100;
  m.vcudnn_env = {{"VCUDNN_POLICY", "microbatch+offload"},
                  {"VCUDNN_WORKSPACE_LIMIT", "64M"},
                  {"VCUDNN_CACHE", tmp.file("bench.sqlite")}};
  const Run r = train(m, "mb70", tmp, true, budget);
  require_ran(m, r);
  require_owned(r);
  WARN("70% = " << budget / kMiB << " MiB: " << numbers(alone) << "\n" << numbers(r));
  INFO(describe(r));
  CHECK(mem_stat(r, "peakMappedBytes") <= budget);
  CHECK(exit_count(r, "graph_executed").value_or(0) > 0);  // convolutions ran as vcudnn's micro-batches
  CHECK(exit_count(r, "graph_passthrough") == std::optional<uint64_t>(0));
  CHECK(exit_count(r, "graph_errors") == std::optional<uint64_t>(0));
  CHECK(!grep(r.log, "offload: vcudnn plan from the recorded iteration").empty());
  CHECK(!grep(r.log, "; a static placement: ").empty());
  CHECK(grep(r.log, "convolution workspaces reach").empty());  // micro-batching is on: nothing to advise
  CHECK(exit_count(r, "iterations").value_or(0) >= 2);
  CHECK(exit_count(r, "offloads").value_or(0) > 0);
  CHECK(exit_count(r, "replans") == std::optional<uint64_t>(0));  // the plan needed no on-demand help
  std::vector<double> a, b;
  for (const auto& x : alone.result.at("loss_values")) a.push_back(x.get<double>());
  for (const auto& x : r.result.at("loss_values")) b.push_back(x.get<double>());
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  const auto gap = [&](size_t i) { return std::abs(a[i] - b[i]) / std::abs(a[i]); };
  CHECK(gap(0) <= 1e-5);
  for (size_t i = 0; i < a.size(); ++i) CHECK(gap(i) <= 0.1);
}

// Note [A recorder without cuDNN calls]: a transformer calls no cuDNN; its iteration is found from
// the operations (Note [Iterations without convolutions]) and planned like a network's when it
// can be. Not yet followed: on the H100 the replay lost step in the first iteration after it
// (frees in another order: first stray at step 946 of 1086) and never found an iteration's start
// again; in another run at 50% the window found began where no allocation is unique (no plan).
TEST_CASE(
    "transformer under planned offload at 70% and 50%: an iteration found without convolutions, the decision "
    "logged, losses bit-identical",
    "[pytorch][offload][replay]") {
  Model m{"transformer", 16};
  m.steps = 8;
  check_planned(m, {70, 50}, /*follow=*/false);
}

namespace {

// The default path's trace (schema 2) of one owned run: one automatic iteration holding every
// allocation, free and call, each call that queues work timed (from the next iteration, where the
// first's own times are cuDNN's and cuBLAS's first calls), and bytes alive as PyTorch counts them.
void check_default_path_trace(const Model& m) {
  TempDir tmp;
  const std::string path = tmp.file("trace.json");
  const Run alone = train(m, "alone", tmp, false);  // PyTorch's own count of live bytes (none under vcudnn)
  require_ran(m, alone);
  const Run r = train(m, "owned", tmp, true, std::nullopt, path);
  require_ran(m, r);
  require_owned(r);
  INFO(describe(r));
  const auto read = vcudnn::read_trace(path);
  REQUIRE(read.ok());
  const vcudnn::Trace& t = read.value();
  CHECK(t.complete);
  CHECK(t.detected_by == "auto");
  size_t work = 0, timed = 0, allocs = 0, frees = 0, unknown_stream = 0;
  double gpu_ms = 0;
  std::set<std::string> untimed;
  for (const vcudnn::TraceCall& c : t.calls) {
    allocs += c.kind == vcudnn::CallKind::kAlloc;
    frees += c.kind == vcudnn::CallKind::kFree;
    switch (c.kind) {
      case vcudnn::CallKind::kConvolution:
      case vcudnn::CallKind::kGraphExecute:
      case vcudnn::CallKind::kLibrary:
      case vcudnn::CallKind::kLaunch:
      case vcudnn::CallKind::kMemcpy:
      case vcudnn::CallKind::kMemset:
        if (t.streams.at(c.stream) == ~uint64_t{0}) {
          ++unknown_stream;
          break;
        }
        ++work;
        if (c.gpu_ms) {
          ++timed;
          gpu_ms += *c.gpu_ms;
        } else {
          untimed.insert(c.name >= 0 ? t.names.at(static_cast<size_t>(c.name)) : "convolution");
        }
        break;
      default:
        break;
    }
  }
  const vcudnn::Lifetimes lt = vcudnn::lifetimes(t);
  const uint64_t steady_live = alone.result.at("steady_max_memory_allocated").get<uint64_t>();
  std::string untimed_names;
  for (const std::string& name : untimed) untimed_names += " " + name;
  WARN(m.name << " batch " << m.batch << ": iteration of " << t.calls.size() << " calls, " << allocs
              << " allocations, " << frees << " frees; GPU time for " << timed << " of " << work
              << " calls that queue work (" << t.next_timed << " from the next iteration; " << unknown_stream
              << " on no known stream; untimed:" << untimed_names << "), " << gpu_ms
              << " ms in all; trace live peak " << lt.peak_bytes / kMiB
              << " MiB, PyTorch's steady max_memory_allocated " << steady_live / kMiB << " MiB; step ms "
              << r.result.at("step_ms").dump());
  // Note [Measuring the host link]: this machine's link, in the trace.
  REQUIRE(t.link.has_value());
  WARN("host link: " << t.link->device_to_host << " GB/s device to host, " << t.link->host_to_device
                     << " GB/s host to device, " << t.link->both << " GB/s both");
  CHECK(t.link->device_to_host > 1);
  CHECK(t.link->host_to_device > 1);
  CHECK(t.link->both >= 0.9 * std::max(t.link->device_to_host, t.link->host_to_device));
  // The probe's own time, from its log line: under 50 ms (issue: link bandwidths measured at start).
  {
    const std::string key = "host link measured in ";
    const size_t at = r.log.find(key);
    REQUIRE(at != std::string::npos);
    const double probe_ms = std::stod(r.log.substr(at + key.size(), 16));
    WARN("host link probe: " << r.log.substr(at, r.log.find('\n', at) - at));
    CHECK(probe_ms < 50);
  }
  CHECK(allocs > 0);
  CHECK(frees > 0);
  CHECK(work > 0);
  CHECK(timed == work);
  CHECK(t.gpu_times == "next");
  CHECK(t.next_timed * 3 >= timed * 2);  // most calls matched in the next iteration
  CHECK(unknown_stream * 100 <= work);  // a hook that cannot know its stream: rare
  // The trace's bytes alive against PyTorch's own count (PyTorch alone, steady steps), within 5% either way: the
  // iteration recorded is a steady one (Note [A steady iteration]: the first step's peak lacked the optimizer's
  // state, 0.949 of the steady peak for resnet18), and bytes alive that no call uses (cuBLAS's workspace) count.
  CHECK(t.alive_at_start.has_value());
  WARN("trace live peak / PyTorch's steady max_memory_allocated: "
       << static_cast<double>(lt.peak_bytes) / static_cast<double>(steady_live) << " (" << lt.untouched_bytes / kMiB
       << " MiB alive but used by no call)");
  CHECK(static_cast<double>(lt.peak_bytes) <= 1.05 * static_cast<double>(steady_live));
  CHECK(static_cast<double>(lt.peak_bytes) >= 0.95 * static_cast<double>(steady_live));
  // Steady GPU times: the first iteration's convolutions take about 10x their steady time (cuDNN's first calls);
  // the next iteration's, recorded with a host slower than usual, stay near a steady step's wall time.
  const auto& steps = r.result.at("step_ms");
  CHECK(gpu_ms <= 2.0 * steps.back().get<double>());
}

}  // namespace

TEST_CASE("default-path trace of resnet18 and a transformer: every operation timed, every allocation and free",
          "[pytorch][offload][trace]") {
  SECTION("resnet18") { check_default_path_trace({"resnet18", 32, {}, false, true, kAllocConf, 6}); }
  SECTION("transformer") { check_default_path_trace({"transformer", 8, {}, false, true, kAllocConf, 6}); }
}

// Note [GPU time without the waits for memory]: the iterations recorded under a budget run with on-demand
// eviction, and a call whose buffers come back from the host used to count the wait for them as GPU time. The
// same model's trace recorded without a budget is the reference.
TEST_CASE("a trace recorded under a budget times each call's work, not the waits for its buffers",
          "[pytorch][offload][trace]") {
  const Model m{"resnet18", 32, {}, false, true, kAllocConf, 6};
  TempDir tmp;
  const Run alone = train(m, "alone", tmp, false);
  require_ran(m, alone);
  const uint64_t live = alone.result.at("steady_max_memory_allocated").get<uint64_t>();
  const auto traced_ms = [&](const std::string& tag, std::optional<uint64_t> budget) {
    const std::string path = tmp.file(tag + ".trace.json");
    const Run r = train(m, tag, tmp, true, budget, path);
    require_ran(m, r);
    const auto read = vcudnn::read_trace(path);
    REQUIRE(read.ok());
    double ms = 0;
    for (const vcudnn::TraceCall& c : read.value().calls) ms += c.gpu_ms.value_or(0);
    return std::pair(ms, r);
  };
  const auto [owned_ms, owned] = traced_ms("owned", std::nullopt);
  const auto [budget_ms, budgeted] = traced_ms("budget", live * 6 / 10);
  INFO(describe(budgeted));
  WARN("resnet18 batch 32: GPU time of the recorded iteration " << owned_ms << " ms without a budget, " << budget_ms
                                                                << " ms recorded under 60% of its live peak");
  // Recording under the budget faulted buffers in (the waits this is about).
  CHECK(budgeted.log.find("fault_ins=0 ") == std::string::npos);
  CHECK(budget_ms <= 1.25 * owned_ms);
}

TEST_CASE("resnet18 under offload: owned, then evicted to 60%, losses bit-identical", "[pytorch][offload]") {
  check_model({"resnet18", 32});  // 224x224: layer1's activations are 24.5 MiB each
}

TEST_CASE("transformer under offload: owned, then evicted to 60%, losses bit-identical", "[pytorch][offload]") {
  check_model({"transformer", 8});  // 8 x 256 tokens x 512: 4 MiB per activation, 16 MiB per attention map
}

// torch.compile (default mode): Inductor's Triton kernels reach the driver through Triton's launcher
// or PyTorch's static launcher, which find cuLaunchKernel(Ex) and cuPointerGetAttribute by dlsym
// on libcuda: vcudnn must see every one of those launches (untracked_launches=0) and bring back
// what they read. Issue 11: a 1000M budget used to end the job with "CUDA driver error: invalid
// argument".
TEST_CASE("resnet18 under torch.compile and offload: owned, then evicted to 60%, losses bit-identical",
          "[pytorch][offload][compile]") {
  check_model({"resnet18", 32, {"--compile", "default"}, true});
}

TEST_CASE("transformer under torch.compile and offload: owned, then evicted to 60%, losses bit-identical",
          "[pytorch][offload][compile]") {
  check_model({"transformer", 8, {"--compile", "default"}, true});
}

// CUDA graphs under ownership and under 60%: what a capture uses stays on the device, the rest may
// still be evicted, during the capture too (Note [CUDA graphs under a budget]). Memory the framework
// allocates with cudaMallocAsync while capturing is CUDA's own and outside the budget; CUDA graph
// trees (reduce-overhead) need PyTorch's caching allocator, whose segments vcudnn owns.
TEST_CASE("resnet18 as CUDA graphs (make_graphed_callables) under offload: owned, losses bit-identical",
          "[pytorch][offload][graph]") {
  check_model({"resnet18", 32, {"--graphed"}, true, false});
}

TEST_CASE(
    "resnet18 under torch.compile reduce-overhead and offload: CUDA graph trees, caching allocator, owned, losses "
    "bit-identical",
    "[pytorch][offload][graph][compile]") {
  // Ownership only: under the caching allocator vcudnn's unit is a segment, and a graph pins every
  // segment it touches (resnet18 batch 32: 690 MiB of 1.2 GiB), more than a 60% budget holds.
  check_model({"resnet18", 32, {"--compile", "reduce-overhead"}, true, false, ""});
}

namespace {

// A count from the exit line of one process of a log several processes append to.
std::optional<uint64_t> exit_count_of(const std::string& log, uint64_t pid, const std::string& key) {
  std::optional<uint64_t> found;
  for (const std::string& line : grep(log, "vcudnn[" + std::to_string(pid) + "]")) {
    if (line.find("exit: ") == std::string::npos) continue;
    const auto at = line.find(" " + key + "=");
    if (at != std::string::npos) found = std::stoull(line.substr(at + key.size() + 2));
  }
  return found;
}

}  // namespace

// DistributedDataParallel on two GPUs (NCCL, one process per GPU, each with its own data): each rank
// records, plans and follows its own iteration under its own budget; every rank's losses are bit-
// identical to DDP without vcudnn (which gives the same losses twice). Skipped with fewer than two
// GPUs (the suite's usual machine); run on two with VCUDNN_TEST_PYTORCH_FILTER='[ddp]'.
TEST_CASE(
    "resnet50 under DDP on two GPUs and planned offload at 60%: each rank plans its own iteration, losses "
    "bit-identical",
    "[pytorch][offload][replay][ddp]") {
  const ProcessResult count =
      run_process({python_executable(), "-c", "import torch; print(torch.cuda.device_count())"}, base_env(), 120);
  REQUIRE(count.exit_code == 0);
  const int gpus = std::stoi(count.out);
  if (gpus < 2) {
    WARN("skipped: DDP needs two GPUs; " << gpus << " visible");
    return;
  }
  Model m{"resnet50", 32, {"--ddp", "2"}};
  m.steps = 10;
  TempDir tmp;
  const Run alone = train(m, "alone", tmp, false);
  require_ran(m, alone);
  const Run again = train(m, "again", tmp, false);
  require_ran(m, again);
  REQUIRE(alone.result.at("ranks").size() == 2);
  uint64_t live = UINT64_MAX;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& a = alone.result.at("ranks").at(rank);
    REQUIRE(a.at("losses") == again.result.at("ranks").at(rank).at("losses"));  // DDP alone is deterministic
    live = std::min(live, a.at("max_memory_allocated").get<uint64_t>());
  }
  CHECK(alone.result.at("ranks").at(0).at("losses") != alone.result.at("ranks").at(1).at("losses"));  // own data
  const uint64_t budget = live * 60 / 100;
  const Run r = train(m, "plan60", tmp, true, budget);
  INFO(describe(r));
  require_ran(m, r);
  REQUIRE(r.result.at("ranks").size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& mine = r.result.at("ranks").at(rank);
    INFO("rank " << rank);
    CHECK(mine.at("losses") == alone.result.at("ranks").at(rank).at("losses"));
    REQUIRE(mine.at("vcudnn").is_object());
    CHECK(mine.at("vcudnn").at("peakMappedBytes").get<uint64_t>() <= budget);
    CHECK(mine.at("vcudnn_first_step").at("peakMappedBytes").get<uint64_t>() <= budget);
    CHECK(mine.at("vcudnn").at("evictions").get<uint64_t>() > 0);
    const auto pid = mine.at("pid").get<uint64_t>();
    bool planned = false;
    for (const std::string& line : grep(r.log, "vcudnn[" + std::to_string(pid) + "]"))
      planned = planned || line.find("offload: vcudnn plan from the recorded iteration") != std::string::npos;
    CHECK(planned);
    // Note [No placement beside unseen collectives]: the plan without its static placement.
    bool unplaced = false;
    for (const std::string& line : grep(r.log, "vcudnn[" + std::to_string(pid) + "]"))
      unplaced = unplaced || line.find("offload: no static placement") != std::string::npos;
    CHECK(unplaced);
    CHECK(exit_count_of(r.log, pid, "iterations").value_or(0) >= 2);
    CHECK(exit_count_of(r.log, pid, "offloads").value_or(0) > 0);
    CHECK(exit_count_of(r.log, pid, "untracked_launches") == std::optional<uint64_t>(0));
    // Note [Collectives queue their work at the group's end]: DDP's all-reduces were seen.
    CHECK(exit_count_of(r.log, pid, "nccl_collectives").value_or(0) >= 10);
  }
  WARN("DDP, 2 ranks, " << budget / kMiB << " MiB each:\n" << numbers(alone) << "\n" << numbers(r));

  // The placement asked for explicitly is kept beside the collectives vcudnn now sees: the same losses.
  Model placed = m;
  placed.vcudnn_env["VCUDNN_OFFLOAD_PLACEMENT"] = "static";
  const Run p = train(placed, "placed60", tmp, true, budget);
  INFO(describe(p));
  require_ran(placed, p);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& mine = p.result.at("ranks").at(rank);
    INFO("rank " << rank);
    CHECK(mine.at("losses") == alone.result.at("ranks").at(rank).at("losses"));
    CHECK(mine.at("vcudnn").at("peakMappedBytes").get<uint64_t>() <= budget);
    const auto pid = mine.at("pid").get<uint64_t>();
    bool kept = false;
    for (const std::string& line : grep(p.log, "vcudnn[" + std::to_string(pid) + "]"))
      kept = kept || line.find("static placement kept beside NCCL") != std::string::npos;
    CHECK(kept);
  }
  WARN("DDP with the placement:\n" << numbers(p));
}
