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
  t.cudnn_version = integer_at<int64_t>(j, "cudnn_version");
  t.cudnn_library = j.at("cudnn_library").get<std::string>();
  t.pid = integer_at<int64_t>(j, "pid");
  t.program = j.at("program").get<std::string>();
  const auto& it = j.at("iteration");
  t.detected_by = it.at("detected_by").get<std::string>();
  t.complete = it.at("complete").get<bool>();
  t.first_seq = integer_at<uint64_t>(it, "first_seq");
  t.end_seq = integer_at<uint64_t>(it, "end_seq");
  t.layers = j.at("layers").get<std::vector<ConvLayer>>();
  for (const auto& thread : j.at("threads")) t.threads.push_back(integer<uint64_t>(thread, "threads[]"));
  t.handles = unhex_list(j.at("handles"));
  t.streams = unhex_list(j.at("streams"));
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
    t.calls.push_back(std::move(call));
  }
  if (t.first_seq > t.end_seq)
    throw nlohmann::json::other_error::create(
        501, "iteration.first_seq " + std::to_string(t.first_seq) + " is after end_seq " + std::to_string(t.end_seq),
        &it);
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
