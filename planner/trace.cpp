// Trace <-> JSON. Pointers and handle values are hex strings (JSON readers lose 64-bit
// integers); unknown GPU times are null. from_json validates what the planner relies on.
#include "planner/trace.h"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "planner/json_read.h"
#include "planner/output_file.h"

namespace vcudnn {
namespace {

using json_read::integer;
using json_read::integer_at;
using json_read::integer_or;
using json_read::real_at;
using json_read::real_or;

constexpr const char* kCallKindNames[kCallKindCount] = {
    "create",           "destroy",        "set_stream",        "get_stream",         "convolution",
    "get_algorithm_v7", "find_algorithm", "find_algorithm_ex", "get_workspace_size", "get_algorithm_max_count",
    "graph_execute",    "library",        "launch",            "memcpy",             "memset",
    "alloc",            "free",           "sync"};

constexpr const char* kAccessModeNames[] = {"u", "r", "w", "rw"};

[[noreturn]] void refuse(const nlohmann::json& j, const std::string& why) {
  throw nlohmann::json::other_error::create(501, why, &j);
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// "0x" and 1 to 16 hex digits, nothing else (stoull alone would take a sign or blanks).
uint64_t unhex(const nlohmann::json& j) {
  const auto& s = j.get_ref<const std::string&>();
  const bool ok = s.size() > 2 && s.size() <= 18 && s[0] == '0' && s[1] == 'x' &&
                  std::all_of(s.begin() + 2, s.end(), [](unsigned char ch) { return std::isxdigit(ch) != 0; });
  if (!ok) throw nlohmann::json::other_error::create(501, "bad hex value \"" + s + "\"", &j);
  return std::stoull(s.substr(2), nullptr, 16);
}

nlohmann::json hex_list(const std::vector<uint64_t>& v) {
  auto j = nlohmann::json::array();
  for (uint64_t x : v) j.push_back(hex(x));
  return j;
}

std::vector<uint64_t> unhex_list(const nlohmann::json& j) {
  std::vector<uint64_t> v;
  for (const auto& e : j) v.push_back(unhex(e));
  return v;
}

ConvKind conv_kind_from_name(const nlohmann::json& j) {
  const auto& s = j.get_ref<const std::string&>();
  for (ConvKind k : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter})
    if (conv_kind_name(k) == s) return k;
  throw nlohmann::json::other_error::create(501, "unknown conv kind " + s, &j);
}

nlohmann::json call_to_json(const TraceCall& c) {
  nlohmann::json j = {{"seq", c.seq},       {"host_us", c.host_us}, {"thread", c.thread},
                      {"handle", c.handle}, {"stream", c.stream},   {"kind", call_kind_name(c.kind)},
                      {"status", c.status}};
  if (call_has_conv_kind(c.kind)) j["conv"] = conv_kind_name(c.conv);
  if (call_has_layer(c.kind)) j["layer"] = c.layer;
  if (c.kind == CallKind::kConvolution || c.kind == CallKind::kGetWorkspaceSize) j["algo"] = c.algo;
  if (c.kind == CallKind::kConvolution || c.kind == CallKind::kFindAlgorithmEx || c.kind == CallKind::kGetWorkspaceSize)
    j["workspace_bytes"] = c.workspace_bytes;
  if (c.kind == CallKind::kConvolution || c.kind == CallKind::kFindAlgorithmEx) {
    j["ptrs"] = {{"x", hex(c.ptrs[kPtrX])},
                 {"w", hex(c.ptrs[kPtrW])},
                 {"y", hex(c.ptrs[kPtrY])},
                 {"workspace", hex(c.ptrs[kPtrWorkspace])}};
  }
  if (c.kind == CallKind::kConvolution) {
    j["alpha"] = c.alpha;
    j["beta"] = c.beta;
    j["gpu_ms"] = c.gpu_ms ? nlohmann::json(*c.gpu_ms) : nlohmann::json(nullptr);
    j["captured"] = c.captured;
  }
  if (c.kind == CallKind::kGetAlgorithmV7 || c.kind == CallKind::kFindAlgorithm ||
      c.kind == CallKind::kFindAlgorithmEx) {
    j["requested"] = c.requested;
    auto perf = nlohmann::json::array();
    for (const auto& p : c.perf)
      perf.push_back({{"algo", p.algo},
                      {"status", p.status},
                      {"time_ms", p.time_ms},
                      {"memory", p.memory},
                      {"determinism", p.determinism},
                      {"math_type", p.math_type}});
    j["perf"] = std::move(perf);
  }
  if (c.kind == CallKind::kGetAlgorithmV7 || c.kind == CallKind::kFindAlgorithm ||
      c.kind == CallKind::kFindAlgorithmEx || c.kind == CallKind::kGetAlgorithmMaxCount)
    j["returned"] = c.returned;
  if (c.user_layer) j["user_layer"] = c.user_layer;
  if (c.name >= 0) j["name"] = c.name;
  if (c.kind == CallKind::kAlloc || c.kind == CallKind::kFree) j["buffer"] = c.buffer;
  if (c.kind == CallKind::kMemcpy || c.kind == CallKind::kMemset) j["bytes"] = c.bytes;
  if (c.kind == CallKind::kConvolution || c.kind == CallKind::kGraphExecute || c.kind == CallKind::kLibrary ||
      c.kind == CallKind::kLaunch || c.kind == CallKind::kMemcpy || c.kind == CallKind::kMemset) {
    if (!j.contains("gpu_ms")) j["gpu_ms"] = c.gpu_ms ? nlohmann::json(*c.gpu_ms) : nlohmann::json(nullptr);
    auto accesses = nlohmann::json::array();
    for (const BufferAccess& a : c.accesses) accesses.push_back({a.buffer, access_mode_name(a.mode)});
    j["accesses"] = std::move(accesses);
  }
  return j;
}

AccessMode access_mode_from_json(const nlohmann::json& j) {
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    for (int m = 0; m < 4; ++m)
      if (s == kAccessModeNames[m]) return static_cast<AccessMode>(m);
  }
  refuse(j, "an access mode is \"u\", \"r\", \"w\" or \"rw\"");
}

TraceCall call_from_json(const nlohmann::json& j) {
  TraceCall c;
  c.seq = integer_at<uint64_t>(j, "seq");
  c.host_us = real_at<double>(j, "host_us");
  c.thread = integer_at<uint32_t>(j, "thread");
  c.handle = integer_at<uint32_t>(j, "handle");
  c.stream = integer_at<uint32_t>(j, "stream");
  auto kind = call_kind_from_name(j.at("kind").get<std::string>());
  if (!kind) throw nlohmann::json::other_error::create(501, "unknown call kind", &j);
  c.kind = *kind;
  c.status = integer_at<int32_t>(j, "status");
  if (call_has_conv_kind(c.kind)) c.conv = conv_kind_from_name(j.at("conv"));
  if (call_has_layer(c.kind)) c.layer = integer_at<int32_t>(j, "layer");
  c.algo = integer_or<int32_t>(j, "algo", -1);
  c.workspace_bytes = integer_or<uint64_t>(j, "workspace_bytes", 0);
  if (j.contains("ptrs")) {
    const auto& p = j["ptrs"];
    c.ptrs = {unhex(p.at("x")), unhex(p.at("w")), unhex(p.at("y")), unhex(p.at("workspace"))};
  }
  c.alpha = real_or<double>(j, "alpha", 0.0);
  c.beta = real_or<double>(j, "beta", 0.0);
  c.requested = integer_or<int32_t>(j, "requested", 0);
  c.returned = integer_or<int32_t>(j, "returned", 0);
  if (j.contains("perf")) {
    for (const auto& p : j["perf"])
      c.perf.push_back({integer_at<int32_t>(p, "algo"), integer_at<int32_t>(p, "status"), real_at<float>(p, "time_ms"),
                        integer_at<uint64_t>(p, "memory"), integer_at<int32_t>(p, "determinism"),
                        integer_at<int32_t>(p, "math_type")});
  }
  c.user_layer = integer_or<uint64_t>(j, "user_layer", 0);
  if (j.contains("gpu_ms") && !j["gpu_ms"].is_null()) c.gpu_ms = json_read::real<float>(j["gpu_ms"], "gpu_ms");
  c.captured = json_read::boolean_or(j, "captured", false);
  c.name = integer_or<int32_t>(j, "name", -1);
  c.buffer = integer_or<int32_t>(j, "buffer", -1);
  c.bytes = integer_or<uint64_t>(j, "bytes", 0);
  if (const auto it = j.find("accesses"); it != j.end()) {
    if (!it->is_array()) refuse(*it, "accesses: not an array");
    for (const auto& a : *it) {
      if (!a.is_array() || a.size() != 2) refuse(a, "an access is [buffer, mode]");
      c.accesses.push_back({integer<uint32_t>(a[0], "accesses[][0]"), access_mode_from_json(a[1])});
    }
  }
  if ((c.kind == CallKind::kAlloc || c.kind == CallKind::kFree) && c.buffer < 0)
    refuse(j, "call " + std::to_string(c.seq) + ": an alloc or free names its buffer");
  return c;
}

nlohmann::json buffer_to_json(const TraceBuffer& b) {
  return {{"id", b.id}, {"address", hex(b.address)}, {"bytes", b.bytes}, {"library", b.library}};
}

TraceBuffer buffer_from_json(const nlohmann::json& j) {
  TraceBuffer b;
  b.id = integer_at<uint64_t>(j, "id");
  b.address = unhex(j.at("address"));
  b.bytes = integer_at<uint64_t>(j, "bytes");
  b.library = json_read::boolean_or(j, "library", false);
  return b;
}

// Every buffer allocated at most once and freed at most once, after its allocation; no call
// uses a buffer before its allocation or after its free (a buffer the trace never allocates
// existed when recording started).
void check_lifetimes(const nlohmann::json& j, const Trace& t) {
  constexpr uint64_t kNone = UINT64_MAX;
  std::vector<uint64_t> alloc(t.buffers.size(), kNone), freed(t.buffers.size(), kNone);
  for (const TraceCall& c : t.calls) {
    if (c.kind != CallKind::kAlloc) continue;
    const auto b = static_cast<size_t>(c.buffer);
    if (alloc[b] != kNone) refuse(j, "call " + std::to_string(c.seq) + ": buffer " + std::to_string(b) + " allocated twice");
    alloc[b] = c.seq;
  }
  for (const TraceCall& c : t.calls) {
    const auto where = [&](const std::string& what) { return "call " + std::to_string(c.seq) + ": " + what; };
    if (c.kind == CallKind::kFree) {
      const auto b = static_cast<size_t>(c.buffer);
      if (freed[b] != kNone) refuse(j, where("buffer " + std::to_string(b) + " freed twice"));
      if (alloc[b] != kNone && alloc[b] > c.seq) refuse(j, where("buffer " + std::to_string(b) + " freed before its allocation"));
      freed[b] = c.seq;
    }
    for (const BufferAccess& a : c.accesses) {
      if (freed[a.buffer] != kNone) refuse(j, where("uses buffer " + std::to_string(a.buffer) + " after its free"));
      if (alloc[a.buffer] != kNone && alloc[a.buffer] > c.seq)
        refuse(j, where("uses buffer " + std::to_string(a.buffer) + " before its allocation"));
    }
  }
}

}  // namespace

std::string_view call_kind_name(CallKind kind) { return kCallKindNames[static_cast<int>(kind)]; }

std::string_view access_mode_name(AccessMode mode) { return kAccessModeNames[static_cast<int>(mode) & 3]; }

std::optional<CallKind> call_kind_from_name(std::string_view name) {
  for (int i = 0; i < kCallKindCount; ++i)
    if (name == kCallKindNames[i]) return static_cast<CallKind>(i);
  return std::nullopt;
}

bool call_has_conv_kind(CallKind kind) {
  return kind >= CallKind::kConvolution && kind <= CallKind::kGetAlgorithmMaxCount;
}

bool call_has_layer(CallKind kind) { return call_has_conv_kind(kind) && kind != CallKind::kGetAlgorithmMaxCount; }

bool call_queues_device_work(CallKind kind) {
  switch (kind) {
    case CallKind::kConvolution:
    case CallKind::kGraphExecute:
    case CallKind::kLibrary:
    case CallKind::kLaunch:
    case CallKind::kMemcpy:
    case CallKind::kMemset:
      return true;
    default:
      return false;
  }
}

bool is_collective(const Trace& trace, const TraceCall& call) {
  return call.kind == CallKind::kLibrary && call.name >= 0 && static_cast<size_t>(call.name) < trace.names.size() &&
         trace.names[static_cast<size_t>(call.name)].starts_with("nccl");
}

void to_json(nlohmann::json& j, const Trace& t) {
  auto calls = nlohmann::json::array();
  for (const auto& c : t.calls) calls.push_back(call_to_json(c));
  auto buffers = nlohmann::json::array();
  for (const auto& b : t.buffers) buffers.push_back(buffer_to_json(b));
  j = {{"schema", kTraceSchema},
       {"vcudnn_version", t.vcudnn_version},
       {"cudnn_version", t.cudnn_version},
       {"cudnn_library", t.cudnn_library},
       {"pid", t.pid},
       {"program", t.program},
       {"iteration",
        {{"detected_by", t.detected_by},
         {"complete", t.complete},
         {"first_seq", t.first_seq},
         {"end_seq", t.end_seq},
         {"gpu_times", t.gpu_times},
         {"next_timed", t.next_timed},
         {"alive_at_start", t.alive_at_start ? nlohmann::json(*t.alive_at_start) : nlohmann::json(nullptr)}}},
       {"layers", t.layers},
       {"threads", t.threads},
       {"handles", hex_list(t.handles)},
       {"streams", hex_list(t.streams)},
       {"names", t.names},
       {"buffers", std::move(buffers)},
       {"link", t.link ? nlohmann::json{{"device_to_host_gbps", t.link->device_to_host},
                                        {"host_to_device_gbps", t.link->host_to_device},
                                        {"both_gbps", t.link->both}}
                       : nlohmann::json(nullptr)},
       {"calls", std::move(calls)}};
}

void from_json(const nlohmann::json& j, Trace& t) {
  const auto schema = j.at("schema").get<std::string>();
  if (schema != kTraceSchema)
    throw nlohmann::json::other_error::create(
        501,
        "trace schema is \"" + schema + "\", this vcudnn reads \"" + std::string(kTraceSchema) + "\"" +
            (schema == "vcudnn.trace/1" ? " (a trace of an older vcudnn: record it again)" : ""),
        &j);
  t = Trace{};
  t.vcudnn_version = j.at("vcudnn_version").get<std::string>();
  t.cudnn_version = integer_at<int64_t>(j, "cudnn_version");
  t.cudnn_library = j.at("cudnn_library").get<std::string>();
  t.pid = integer_at<int64_t>(j, "pid");
  t.program = j.at("program").get<std::string>();
  const auto& it = j.at("iteration");
  t.detected_by = it.at("detected_by").get<std::string>();
  t.complete = it.at("complete").get<bool>();
  t.first_seq = integer_at<uint64_t>(it, "first_seq");
  t.end_seq = integer_at<uint64_t>(it, "end_seq");
  if (const auto g = it.find("gpu_times"); g != it.end()) {  // absent in traces of older vcudnn
    if (!g->is_string() || (*g != "iteration" && *g != "next")) refuse(*g, "iteration.gpu_times: not \"iteration\" or \"next\"");
    t.gpu_times = g->get<std::string>();
    t.next_timed = integer_at<uint64_t>(it, "next_timed");
  }
  if (const auto a = it.find("alive_at_start"); a != it.end() && !a->is_null())  // absent: older, or not owned
    t.alive_at_start = json_read::integer<uint64_t>(*a, "iteration.alive_at_start");
  t.layers = j.at("layers").get<std::vector<ConvLayer>>();
  for (const auto& thread : j.at("threads")) t.threads.push_back(integer<uint64_t>(thread, "threads[]"));
  t.handles = unhex_list(j.at("handles"));
  t.streams = unhex_list(j.at("streams"));
  for (const auto& name : j.at("names")) {
    if (!name.is_string()) refuse(name, "names[]: not a string");
    t.names.push_back(name.get<std::string>());
  }
  std::vector<uint64_t> ids;
  for (const auto& b : j.at("buffers")) {
    t.buffers.push_back(buffer_from_json(b));
    ids.push_back(t.buffers.back().id);
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) refuse(j.at("buffers"), "two buffers share an id");
  if (const auto it = j.find("link"); it != j.end() && !it->is_null()) {
    LinkBandwidth l;
    l.device_to_host = real_at<double>(*it, "device_to_host_gbps");
    l.host_to_device = real_at<double>(*it, "host_to_device_gbps");
    l.both = real_at<double>(*it, "both_gbps");
    if (l.device_to_host < 0 || l.host_to_device < 0 || l.both < 0) refuse(*it, "link: negative bandwidth");
    t.link = l;
  }
  for (const auto& c : j.at("calls")) {
    TraceCall call = call_from_json(c);
    if (call.thread >= t.threads.size() || call.handle >= t.handles.size() || call.stream >= t.streams.size() ||
        call.layer < -1 || call.layer >= static_cast<int32_t>(t.layers.size()))
      throw nlohmann::json::other_error::create(501, "call " + std::to_string(call.seq) + " refers past a table", &c);
    if (!t.calls.empty() && call.seq <= t.calls.back().seq)
      throw nlohmann::json::other_error::create(
          501, "call " + std::to_string(call.seq) + " follows call " + std::to_string(t.calls.back().seq) +
                   ": sequence numbers must increase",
          &c);
    if (call.host_us < 0)
      throw nlohmann::json::other_error::create(501, "call " + std::to_string(call.seq) + " has a negative host_us",
                                                &c);
    if (call.name >= static_cast<int32_t>(t.names.size()) || call.name < -1 ||
        call.buffer >= static_cast<int32_t>(t.buffers.size()) || call.buffer < -1)
      refuse(c, "call " + std::to_string(call.seq) + " refers past the names or buffers");
    for (size_t a = 0; a < call.accesses.size(); ++a) {
      if (call.accesses[a].buffer >= t.buffers.size())
        refuse(c, "call " + std::to_string(call.seq) + " uses a buffer past the table");
      for (size_t b = 0; b < a; ++b)
        if (call.accesses[b].buffer == call.accesses[a].buffer)
          refuse(c, "call " + std::to_string(call.seq) + " names a buffer twice");
    }
    t.calls.push_back(std::move(call));
  }
  if (t.first_seq > t.end_seq)
    throw nlohmann::json::other_error::create(
        501, "iteration.first_seq " + std::to_string(t.first_seq) + " is after end_seq " + std::to_string(t.end_seq),
        &it);
  check_lifetimes(j, t);
}

Result<Trace> parse_trace(std::string_view text) {
  try {
    return nlohmann::json::parse(text).get<Trace>();
  } catch (const std::exception& e) {
    return Error{std::string("not a valid vcudnn trace: ") + e.what()};
  }
}

Result<Trace> read_trace(const std::string& path) {
  // Only a regular file of a sane size is read: a directory, a device (/dev/urandom) or a FIFO is
  // refused by name rather than read for ever.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) return Error{"cannot open trace " + path + ": " + ec.message()};
  if (!std::filesystem::is_regular_file(status)) {
    const char* what = std::filesystem::is_directory(status)  ? "a directory"
                       : std::filesystem::is_fifo(status)     ? "a FIFO"
                       : std::filesystem::is_character_file(status) || std::filesystem::is_block_file(status)
                           ? "a device"
                           : "not a regular file";
    return Error{"cannot read trace " + path + ": it is " + std::string(what) + ", not a trace file"};
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxTraceBytes)
    return Error{"cannot read trace " + path + ": it has " + std::to_string(size >> 20) + " MiB, more than the " +
                 std::to_string(kMaxTraceBytes >> 20) + " MiB a trace may have"};
  std::ifstream in(path);
  if (!in) return Error{"cannot open trace " + path};
  std::string text;
  text.resize(static_cast<size_t>(size));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto r = parse_trace(text);
  if (!r) return Error{path + ": " + r.error().message};
  return r;
}

Status write_trace(const Trace& trace, const std::string& path) {
  std::string text;
  try {
    // Invalid UTF-8 (a program name, say) is replaced rather than thrown on.
    text = nlohmann::json(trace).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } catch (const std::exception& e) {
    return Error{std::string("cannot serialise the trace: ") + e.what()};
  }
  return write_output_file(path, text);
}

}  // namespace vcudnn
