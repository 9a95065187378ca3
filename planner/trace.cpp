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

#include "planner/output_file.h"

namespace vcudnn {
namespace {

constexpr const char* kCallKindNames[kCallKindCount] = {
    "create",           "destroy",        "set_stream",        "get_stream",         "convolution",
    "get_algorithm_v7", "find_algorithm", "find_algorithm_ex", "get_workspace_size", "get_algorithm_max_count"};

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
  return j;
}

TraceCall call_from_json(const nlohmann::json& j) {
  TraceCall c;
  c.seq = j.at("seq").get<uint64_t>();
  c.host_us = j.at("host_us").get<double>();
  c.thread = j.at("thread").get<uint32_t>();
  c.handle = j.at("handle").get<uint32_t>();
  c.stream = j.at("stream").get<uint32_t>();
  auto kind = call_kind_from_name(j.at("kind").get<std::string>());
  if (!kind) throw nlohmann::json::other_error::create(501, "unknown call kind", &j);
  c.kind = *kind;
  c.status = j.at("status").get<int32_t>();
  if (call_has_conv_kind(c.kind)) c.conv = conv_kind_from_name(j.at("conv"));
  if (call_has_layer(c.kind)) c.layer = j.at("layer").get<int32_t>();
  c.algo = j.value("algo", -1);
  c.workspace_bytes = j.value("workspace_bytes", uint64_t{0});
  if (j.contains("ptrs")) {
    const auto& p = j["ptrs"];
    c.ptrs = {unhex(p.at("x")), unhex(p.at("w")), unhex(p.at("y")), unhex(p.at("workspace"))};
  }
  c.alpha = j.value("alpha", 0.0);
  c.beta = j.value("beta", 0.0);
  c.requested = j.value("requested", 0);
  c.returned = j.value("returned", 0);
  if (j.contains("perf")) {
    for (const auto& p : j["perf"])
      c.perf.push_back({p.at("algo").get<int32_t>(), p.at("status").get<int32_t>(), p.at("time_ms").get<float>(),
                        p.at("memory").get<uint64_t>(), p.at("determinism").get<int32_t>(),
                        p.at("math_type").get<int32_t>()});
  }
  c.user_layer = j.value("user_layer", uint64_t{0});
  if (j.contains("gpu_ms") && !j["gpu_ms"].is_null()) c.gpu_ms = j["gpu_ms"].get<float>();
  c.captured = j.value("captured", false);
  return c;
}

}  // namespace

std::string_view call_kind_name(CallKind kind) { return kCallKindNames[static_cast<int>(kind)]; }

std::optional<CallKind> call_kind_from_name(std::string_view name) {
  for (int i = 0; i < kCallKindCount; ++i)
    if (name == kCallKindNames[i]) return static_cast<CallKind>(i);
  return std::nullopt;
}

bool call_has_conv_kind(CallKind kind) {
  return kind >= CallKind::kConvolution && kind <= CallKind::kGetAlgorithmMaxCount;
}

bool call_has_layer(CallKind kind) { return call_has_conv_kind(kind) && kind != CallKind::kGetAlgorithmMaxCount; }

void to_json(nlohmann::json& j, const Trace& t) {
  auto calls = nlohmann::json::array();
  for (const auto& c : t.calls) calls.push_back(call_to_json(c));
  j = {{"schema", kTraceSchema},
       {"vcudnn_version", t.vcudnn_version},
       {"cudnn_version", t.cudnn_version},
       {"cudnn_library", t.cudnn_library},
       {"pid", t.pid},
       {"program", t.program},
       {"iteration",
        {{"detected_by", t.detected_by}, {"complete", t.complete}, {"first_seq", t.first_seq}, {"end_seq", t.end_seq}}},
       {"layers", t.layers},
       {"threads", t.threads},
       {"handles", hex_list(t.handles)},
       {"streams", hex_list(t.streams)},
       {"calls", std::move(calls)}};
}

void from_json(const nlohmann::json& j, Trace& t) {
  const auto schema = j.at("schema").get<std::string>();
  if (schema != kTraceSchema)
    throw nlohmann::json::other_error::create(
        501, "trace schema is \"" + schema + "\", this vcudnn reads \"" + std::string(kTraceSchema) + "\"", &j);
  t = Trace{};
  t.vcudnn_version = j.at("vcudnn_version").get<std::string>();
  t.cudnn_version = j.at("cudnn_version").get<int64_t>();
  t.cudnn_library = j.at("cudnn_library").get<std::string>();
  t.pid = j.at("pid").get<int64_t>();
  t.program = j.at("program").get<std::string>();
  const auto& it = j.at("iteration");
  t.detected_by = it.at("detected_by").get<std::string>();
  t.complete = it.at("complete").get<bool>();
  t.first_seq = it.at("first_seq").get<uint64_t>();
  t.end_seq = it.at("end_seq").get<uint64_t>();
  t.layers = j.at("layers").get<std::vector<ConvLayer>>();
  t.threads = j.at("threads").get<std::vector<uint64_t>>();
  t.handles = unhex_list(j.at("handles"));
  t.streams = unhex_list(j.at("streams"));
  for (const auto& c : j.at("calls")) {
    TraceCall call = call_from_json(c);
    if (call.thread >= t.threads.size() || call.handle >= t.handles.size() || call.stream >= t.streams.size() ||
        call.layer < -1 || call.layer >= static_cast<int32_t>(t.layers.size()))
      throw nlohmann::json::other_error::create(501, "call " + std::to_string(call.seq) + " refers past a table", &c);
    t.calls.push_back(std::move(call));
  }
}

Result<Trace> parse_trace(std::string_view text) {
  try {
    return nlohmann::json::parse(text).get<Trace>();
  } catch (const std::exception& e) {
    return Error{std::string("not a valid vcudnn trace: ") + e.what()};
  }
}

Result<Trace> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{"cannot open trace " + path};
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = parse_trace(ss.str());
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
