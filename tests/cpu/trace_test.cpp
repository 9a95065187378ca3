// Trace <-> JSON: round trips (in memory and through write_trace/read_trace) with every CallKind,
// rejection of bad input as an Error (never an exception), call kind names, write errors.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/trace.h"
#include "tests/common/test_util.h"

namespace {

using vcudnn::CallKind;
using vcudnn::ConvKind;
using vcudnn::ConvLayer;
using vcudnn::Trace;
using vcudnn::TraceCall;

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// A hand-made layer (ranks consistent), distinct per `i`.
ConvLayer make_layer(int i, int spatial) {
  ConvLayer l;
  const int rank = spatial + 2;
  l.x.dtype = i % 3;
  l.x.nb_dims = rank;
  l.y.dtype = i % 3;
  l.y.nb_dims = rank;
  l.w.dtype = i % 3;
  l.w.format = i % 2;
  l.w.nb_dims = rank;
  int64_t xs = 1, ys = 1;
  for (int d = rank - 1; d >= 0; --d) {
    l.x.dims[d] = 2 + d + i;
    l.x.strides[d] = xs;
    xs *= l.x.dims[d];
    l.y.dims[d] = 3 + d + i;
    l.y.strides[d] = ys;
    ys *= l.y.dims[d];
    l.w.dims[d] = 1 + d;
  }
  l.conv.spatial_dims = spatial;
  for (int s = 0; s < spatial; ++s) {
    l.conv.pad[s] = s + i;
    l.conv.stride[s] = 1 + s;
    l.conv.dilation[s] = 1 + (i + s) % 2;
  }
  l.conv.mode = 1;
  l.conv.compute_type = 0;
  l.conv.groups = 1 + i;
  l.conv.math_type = i % 4;
  l.conv.reorder_type = i % 2;
  return l;
}

bool has(CallKind k, std::initializer_list<CallKind> kinds) {
  for (CallKind x : kinds)
    if (x == k) return true;
  return false;
}

// One call of `kind` with every field that kind carries set (others keep their defaults, which
// is what the JSON form keeps). `v` varies the values.
TraceCall make_call(CallKind kind, uint64_t seq, int v, const Trace& t) {
  TraceCall c;
  c.seq = seq;
  c.host_us = 1234.5678 * (seq + 1) + 0.001;
  c.thread = static_cast<uint32_t>(v % t.threads.size());
  c.handle = static_cast<uint32_t>((v + 1) % t.handles.size());
  c.stream = static_cast<uint32_t>((v + 2) % t.streams.size());
  c.kind = kind;
  c.status = v % 2 ? 3 : 0;
  c.user_layer = v % 2 ? kMax - static_cast<uint64_t>(v) : 0;
  if (vcudnn::call_has_conv_kind(kind)) c.conv = static_cast<ConvKind>(v % 3);
  if (vcudnn::call_has_layer(kind)) c.layer = v % 3 == 2 ? -1 : v % static_cast<int>(t.layers.size());
  if (has(kind, {CallKind::kConvolution, CallKind::kGetWorkspaceSize})) c.algo = v % 8;
  if (has(kind, {CallKind::kConvolution, CallKind::kFindAlgorithmEx, CallKind::kGetWorkspaceSize}))
    c.workspace_bytes = v % 2 ? kMax - 7 : (uint64_t{1} << 33) + static_cast<uint64_t>(v);
  if (has(kind, {CallKind::kConvolution, CallKind::kFindAlgorithmEx}))
    c.ptrs = {0xffff'ffff'ffff'ff00ULL + static_cast<uint64_t>(v), kMax, 0x7f00'dead'beefULL, v % 2 ? 0 : kMax - 1};
  if (kind == CallKind::kConvolution) {
    c.alpha = 1.0 + v * 0.25;
    c.beta = v % 2 ? 0.0 : 0.1;
    if (v % 2) c.gpu_ms = 0.1f * static_cast<float>(v + 1);  // null for even v
    c.captured = v % 3 == 1;
  }
  if (has(kind, {CallKind::kGetAlgorithmV7, CallKind::kFindAlgorithm, CallKind::kFindAlgorithmEx})) {
    c.requested = 8 + v;
    for (int r = 0; r < 3 + v % 2; ++r)
      c.perf.push_back({r, r == 2 ? 9 : 0, 0.1f * static_cast<float>(r + 1) + 1e-3f,
                        r == 1 ? kMax - 3 : (uint64_t{1} << (30 + r)), r % 2, (r + v) % 4});
  }
  if (has(kind, {CallKind::kGetAlgorithmV7, CallKind::kFindAlgorithm, CallKind::kFindAlgorithmEx,
                 CallKind::kGetAlgorithmMaxCount}))
    c.returned = 3 + v % 2;
  // Schema 2: buffer v is allocated and freed in round v; buffers 4 and 5 existed before and are
  // used throughout.
  if (has(kind, {CallKind::kAlloc, CallKind::kFree})) c.buffer = v;
  if (has(kind, {CallKind::kMemcpy, CallKind::kMemset})) c.bytes = v % 2 ? kMax : 4096 + static_cast<uint64_t>(v);
  if (has(kind, {CallKind::kGraphExecute, CallKind::kLibrary, CallKind::kLaunch, CallKind::kMemcpy,
                 CallKind::kMemset})) {
    c.name = v % static_cast<int>(t.names.size());
    if (v % 2) c.gpu_ms = 0.5f * static_cast<float>(v);
  }
  if (has(kind, {CallKind::kConvolution, CallKind::kGraphExecute, CallKind::kLibrary, CallKind::kLaunch,
                 CallKind::kMemcpy, CallKind::kMemset}))
    c.accesses = {{4, static_cast<vcudnn::AccessMode>(v % 4)}, {5, vcudnn::AccessMode::kWrite}};
  return c;
}

Trace make_trace() {
  Trace t;
  t.vcudnn_version = "0.1.0";
  t.cudnn_version = 91900;
  t.cudnn_library = "/usr/local/cuda/lib64/libcudnn.so.9";
  t.pid = 4242;
  t.program = "python3 train.py --épochs=3";
  t.detected_by = "auto";
  t.complete = true;
  t.gpu_times = "next";
  t.next_timed = 5;
  t.alive_at_start = kMax - 3;
  t.first_seq = 17;
  t.end_seq = kMax - 1;
  t.layers = {make_layer(0, 2), make_layer(1, 2), make_layer(2, 3)};
  t.threads = {1234, kMax - 2, 77};
  t.handles = {0x5555'5555'0000ULL, kMax, 0xffff'ffff'ffff'fff0ULL};
  t.streams = {0, kMax - 15, 0x7fff'0000'1000ULL};
  t.names = {"cudaLaunchKernel", "cublasSgemm_v2", "triton_poi_fused_relu_0", "cudaMemcpyAsync"};
  for (uint64_t b = 0; b < 6; ++b) t.buffers.push_back({100 + b, 0x7f00'0000'0000ULL + (b << 24), (b + 1) << 20, b == 5});
  t.buffers.push_back({kMax, kMax, kMax, false});
  t.link = vcudnn::LinkBandwidth{53.5, 55.25, 78.125};
  uint64_t seq = t.first_seq;
  for (int v = 0; v < 4; ++v)
    for (int k = 0; k < vcudnn::kCallKindCount; ++k) {
      const auto kind = static_cast<CallKind>(k);
      t.calls.push_back(make_call(kind, seq++, v, t));
    }
  return t;
}

// A serialised trace to corrupt.
nlohmann::json good_json() { return make_trace(); }

// The index in calls of the first call of `kind`.
size_t first_of(const nlohmann::json& j, std::string_view kind) {
  for (size_t i = 0; i < j["calls"].size(); ++i)
    if (j["calls"][i]["kind"] == kind) return i;
  FAIL("no call of kind " << kind);
  return 0;
}

void require_rejected(const std::string& text) {
  vcudnn::Result<Trace> r = vcudnn::Error{"not run"};
  REQUIRE_NOTHROW(r = vcudnn::parse_trace(text));
  REQUIRE_FALSE(r.ok());
  CHECK_FALSE(r.error().message.empty());
}

}  // namespace

TEST_CASE("trace: the test trace covers every kind and variant", "[trace]") {
  const Trace t = make_trace();
  std::set<CallKind> kinds;
  bool null_gpu = false, timed_gpu = false, user_layer = false, no_layer = false;
  for (const auto& c : t.calls) {
    kinds.insert(c.kind);
    if (c.kind == CallKind::kConvolution) (c.gpu_ms ? timed_gpu : null_gpu) = true;
    user_layer |= c.user_layer != 0;
    no_layer |= vcudnn::call_has_conv_kind(c.kind) && c.layer == -1;
  }
  CHECK(kinds.size() == static_cast<size_t>(vcudnn::kCallKindCount));
  CHECK(null_gpu);
  CHECK(timed_gpu);
  CHECK(user_layer);
  CHECK(no_layer);
}

TEST_CASE("trace: JSON round trip keeps every field", "[trace]") {
  const Trace t = make_trace();
  nlohmann::json j = t;
  CHECK(j.at("schema") == "vcudnn.trace/2");
  CHECK(j.at("schema") == std::string(vcudnn::kTraceSchema));
  // Handles, streams and pointers are hex strings, so that no JSON reader truncates them.
  CHECK(j.at("handles")[1] == "0xffffffffffffffff");
  CHECK(j.at("streams")[0] == "0x0");
  const auto& conv = j.at("calls")[first_of(j, "convolution")];
  CHECK(conv.at("ptrs").at("w") == "0xffffffffffffffff");
  CHECK(conv.at("gpu_ms").is_null());
  CHECK(j.at("calls")[vcudnn::kCallKindCount + first_of(j, "convolution")].at("gpu_ms").is_number());

  const Trace back = j.get<Trace>();
  CHECK(back.calls.size() == t.calls.size());
  for (size_t i = 0; i < t.calls.size() && i < back.calls.size(); ++i) {
    INFO("call " << i << " kind " << vcudnn::call_kind_name(t.calls[i].kind));
    CHECK(back.calls[i] == t.calls[i]);
  }
  CHECK(back.layers == t.layers);
  CHECK(back == t);

  // Through text too.
  auto parsed = vcudnn::parse_trace(j.dump());
  REQUIRE(parsed.ok());
  CHECK(parsed.value() == t);
  auto indented = vcudnn::parse_trace(j.dump(2));
  REQUIRE(indented.ok());
  CHECK(indented.value() == t);
}

TEST_CASE("trace: an empty trace round-trips", "[trace]") {
  Trace t;
  auto r = vcudnn::parse_trace(nlohmann::json(t).dump());
  REQUIRE(r.ok());
  CHECK(r.value() == t);
  CHECK(r.value().detected_by == "none");
  CHECK_FALSE(r.value().complete);
}

TEST_CASE("trace: max-count calls keep their ConvKind", "[trace]") {
  // The recorder stores which of the three cudnnGet*AlgorithmMaxCount was called in `conv`.
  Trace t = make_trace();
  t.calls.clear();
  uint64_t seq = 0;
  for (ConvKind k : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    TraceCall c = make_call(CallKind::kGetAlgorithmMaxCount, seq++, 0, t);
    c.conv = k;
    t.calls.push_back(c);
  }
  const Trace back = nlohmann::json(t).get<Trace>();
  REQUIRE(back.calls.size() == 3);
  CHECK(back.calls[0].conv == ConvKind::kForward);
  CHECK(back.calls[1].conv == ConvKind::kBackwardData);
  CHECK(back.calls[2].conv == ConvKind::kBackwardFilter);
}

TEST_CASE("trace: write_trace / read_trace round trip", "[trace]") {
  vcudnn::test::TempDir dir;
  const Trace t = make_trace();
  const std::string path = dir.file("trace.json");
  auto w = vcudnn::write_trace(t, path);
  REQUIRE(w.ok());
  auto r = vcudnn::read_trace(path);
  REQUIRE(r.ok());
  CHECK(r.value() == t);
  // Atomic write: only the final file is left behind.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files.push_back(e.path().filename());
  CHECK(files == std::vector<std::string>{"trace.json"});

  // Overwriting replaces the content.
  Trace t2 = t;
  t2.calls.resize(3);
  t2.program = "second";
  REQUIRE(vcudnn::write_trace(t2, path).ok());
  auto r2 = vcudnn::read_trace(path);
  REQUIRE(r2.ok());
  CHECK(r2.value() == t2);
}

TEST_CASE("trace: read_trace of a missing or bad file is an error", "[trace]") {
  vcudnn::test::TempDir dir;
  vcudnn::Result<Trace> r = vcudnn::Error{"not run"};
  REQUIRE_NOTHROW(r = vcudnn::read_trace(dir.file("absent.json")));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("absent.json"));

  const std::string bad = dir.file("bad.json");
  {
    std::ofstream out(bad);
    out << "{\"schema\": ";
  }
  REQUIRE_NOTHROW(r = vcudnn::read_trace(bad));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("bad.json"));
}

TEST_CASE("trace: write_trace into a missing folder is an error, not an exception", "[trace]") {
  vcudnn::test::TempDir dir;
  const std::string path = dir.path() + "/no/such/folder/trace.json";
  vcudnn::Status s = vcudnn::Error{"not run"};
  REQUIRE_NOTHROW(s = vcudnn::write_trace(make_trace(), path));
  REQUIRE_FALSE(s.ok());
  CHECK_FALSE(s.error().message.empty());
  CHECK_FALSE(std::filesystem::exists(path));
}

// Note [Writing through symlinks]. Before, write_trace renamed its temporary file over whatever
// was there: a FIFO (or, as root, /dev/null) became a JSON file, a symbolic link a regular file.
TEST_CASE("trace: write_trace refuses what is not a regular file and writes through symlinks", "[trace]") {
  namespace fs = std::filesystem;
  vcudnn::test::TempDir dir;
  const auto read = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  SECTION("a FIFO stays a FIFO") {
    const std::string fifo = dir.path() + "/fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const vcudnn::Status s = vcudnn::write_trace(make_trace(), fifo);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("FIFO") && Catch::Contains("not a regular file"));
    CHECK(fs::is_fifo(fs::symlink_status(fifo)));
    CHECK(fs::directory_iterator(dir.path()) != fs::directory_iterator());
    for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().filename() == "fifo");  // no temp left
  }
  SECTION("a folder is refused") {
    const std::string folder = dir.path() + "/folder";
    fs::create_directory(folder);
    const vcudnn::Status s = vcudnn::write_trace(make_trace(), folder);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("a folder"));
    CHECK(fs::is_directory(folder));
  }
  SECTION("a symlink stays a link and its target gets the trace") {
    const std::string target = dir.path() + "/real.json", link = dir.path() + "/link.json";
    { std::ofstream(target) << "old"; }
    fs::create_symlink("real.json", link);  // relative, as links often are
    REQUIRE(vcudnn::write_trace(make_trace(), link).ok());
    CHECK(fs::is_symlink(fs::symlink_status(link)));
    const auto back = vcudnn::read_trace(target);
    REQUIRE(back.ok());
    CHECK(back->calls.size() == make_trace().calls.size());
    CHECK(read(link) == read(target));
  }
  SECTION("a dangling symlink: its target is created") {
    const std::string target = dir.path() + "/made.json", link = dir.path() + "/dangling.json";
    fs::create_symlink(target, link);
    REQUIRE(vcudnn::write_trace(make_trace(), link).ok());
    CHECK(fs::is_symlink(fs::symlink_status(link)));
    CHECK(fs::is_regular_file(target));
  }
  SECTION("a symlink to a FIFO is refused, naming both") {
    const std::string fifo = dir.path() + "/fifo2", link = dir.path() + "/to_fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    fs::create_symlink(fifo, link);
    const vcudnn::Status s = vcudnn::write_trace(make_trace(), link);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("to_fifo") && Catch::Contains("fifo2"));
    CHECK(fs::is_fifo(fs::symlink_status(fifo)));
    CHECK(fs::is_symlink(fs::symlink_status(link)));
  }
  SECTION("a link loop is an error") {
    const std::string a = dir.path() + "/a", b = dir.path() + "/b";
    fs::create_symlink(b, a);
    fs::create_symlink(a, b);
    const vcudnn::Status s = vcudnn::write_trace(make_trace(), a);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("symbolic links"));
  }
}

TEST_CASE("trace: parse_trace rejects another schema, naming both", "[trace]") {
  auto j = good_json();
  j["schema"] = "vcudnn.trace/3";
  vcudnn::Result<Trace> r = vcudnn::Error{"not run"};
  REQUIRE_NOTHROW(r = vcudnn::parse_trace(j.dump()));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("vcudnn.trace/3"));
  CHECK_THAT(r.error().message, Catch::Contains("vcudnn.trace/2"));
  // A trace of the first schema (only cuDNN calls) is refused with advice.
  j["schema"] = "vcudnn.trace/1";
  REQUIRE_NOTHROW(r = vcudnn::parse_trace(j.dump()));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("record it again"));

  j.erase("schema");
  require_rejected(j.dump());
}

TEST_CASE("trace: parse_trace rejects indexes out of range", "[trace]") {
  auto j = good_json();
  // Sanity: the untouched JSON parses.
  REQUIRE(vcudnn::parse_trace(j.dump()).ok());
  const size_t conv = first_of(j, "convolution");
  auto& call = j["calls"][conv];
  SECTION("layer == layers.size()") { call["layer"] = j["layers"].size(); }
  SECTION("layer far past the table") { call["layer"] = 1000; }
  SECTION("layer below -1") { call["layer"] = -2; }
  SECTION("thread") { call["thread"] = j["threads"].size(); }
  SECTION("handle") { call["handle"] = j["handles"].size(); }
  SECTION("stream") { call["stream"] = j["streams"].size(); }
  SECTION("stream of a non-convolution call") { j["calls"][first_of(j, "set_stream")]["stream"] = 99; }
  require_rejected(j.dump());
}

TEST_CASE("trace: parse_trace rejects malformed hex values", "[trace]") {
  auto j = good_json();
  const size_t conv = first_of(j, "convolution");
  SECTION("pointer with a non-hex digit") { j["calls"][conv]["ptrs"]["x"] = "0x12g4"; }
  SECTION("pointer that is not hex at all") { j["calls"][conv]["ptrs"]["workspace"] = "zz"; }
  SECTION("empty pointer") { j["calls"][conv]["ptrs"]["y"] = ""; }
  SECTION("pointer past 2^64") { j["calls"][conv]["ptrs"]["w"] = "0x1ffffffffffffffff"; }
  SECTION("negative pointer") { j["calls"][conv]["ptrs"]["x"] = "-0x1"; }
  SECTION("pointer as a number") { j["calls"][conv]["ptrs"]["x"] = 4096; }
  SECTION("handle") { j["handles"][0] = "0xnothex"; }
  SECTION("stream") { j["streams"][1] = "0x10 trailing"; }
  require_rejected(j.dump());
}

TEST_CASE("trace: parse_trace rejects invalid JSON and wrong shapes", "[trace]") {
  for (const std::string text : {"", "{", "not json", "[]", "null", "{\"schema\": \"vcudnn.trace/2\"}",
                                 "{\"schema\": \"vcudnn.trace/2\", \"calls\": 3}"}) {
    INFO("text: " << text);
    require_rejected(text);
  }
  auto j = good_json();
  j["calls"][0]["kind"] = "teleport";
  require_rejected(j.dump());
  j = good_json();
  j["calls"][first_of(j, "convolution")]["conv"] = "sideways";
  require_rejected(j.dump());
  j = good_json();
  j["layers"][0]["x"]["strides"] = {1, 2};  // rank differs from dims
  require_rejected(j.dump());
  // A truncated file.
  const std::string text = good_json().dump();
  require_rejected(text.substr(0, text.size() / 2));
}

TEST_CASE("trace: call kind names round trip", "[trace]") {
  static_assert(static_cast<int>(CallKind::kSync) + 1 == vcudnn::kCallKindCount);
  std::set<std::string> names;
  for (int k = 0; k < vcudnn::kCallKindCount; ++k) {
    const auto kind = static_cast<CallKind>(k);
    const std::string name(vcudnn::call_kind_name(kind));
    INFO("kind " << k << " name " << name);
    CHECK_FALSE(name.empty());
    names.insert(name);
    auto back = vcudnn::call_kind_from_name(name);
    REQUIRE(back.has_value());
    CHECK(*back == kind);
  }
  CHECK(names.size() == static_cast<size_t>(vcudnn::kCallKindCount));
  CHECK(vcudnn::call_kind_name(CallKind::kConvolution) == "convolution");
  CHECK_FALSE(vcudnn::call_kind_from_name("").has_value());
  CHECK_FALSE(vcudnn::call_kind_from_name("Convolution").has_value());
  CHECK_FALSE(vcudnn::call_kind_from_name("bogus").has_value());
  // Exactly the per-convolution kinds carry a ConvKind.
  CHECK(vcudnn::call_has_conv_kind(CallKind::kConvolution));
  CHECK(vcudnn::call_has_conv_kind(CallKind::kFindAlgorithmEx));
  CHECK(vcudnn::call_has_conv_kind(CallKind::kGetWorkspaceSize));
  CHECK_FALSE(vcudnn::call_has_conv_kind(CallKind::kCreate));
  CHECK_FALSE(vcudnn::call_has_conv_kind(CallKind::kSetStream));
}

// Numbers are taken only when they are integers (or finite reals) in their field's range: 1e30
// into an integer field is undefined behaviour in a plain conversion, -1 into an unsigned one wraps.
TEST_CASE("trace: parse_trace rejects numbers out of their field's range, naming the field", "[trace]") {
  auto j = good_json();
  REQUIRE(vcudnn::parse_trace(j.dump()).ok());
  const size_t conv = first_of(j, "convolution");
  std::string field;
  SECTION("first_seq 1e30") {
    j["iteration"]["first_seq"] = 1e30;
    field = "first_seq";
  }
  SECTION("negative end_seq") {
    j["iteration"]["end_seq"] = -3;
    field = "end_seq";
  }
  SECTION("fractional seq") {
    j["calls"][conv]["seq"] = 2.5;
    field = "seq";
  }
  SECTION("thread past 2^32") {
    j["calls"][conv]["thread"] = 1ull << 40;
    field = "thread";
  }
  SECTION("workspace as a string") {
    j["calls"][conv]["workspace_bytes"] = "big";
    field = "workspace_bytes";
  }
  SECTION("negative workspace") {
    j["calls"][conv]["workspace_bytes"] = -1;
    field = "workspace_bytes";
  }
  SECTION("a dimension 1e300") {
    j["layers"][0]["x"]["dims"][0] = 1e300;
    field = "dims";
  }
  SECTION("host time as a string") {
    j["calls"][conv]["host_us"] = "fast";
    field = "host_us";
  }
  SECTION("gpu time beyond a float") {
    j["calls"][conv]["gpu_ms"] = 1e300;
    field = "gpu_ms";
  }
  vcudnn::Result<Trace> r = vcudnn::Error{"not run"};
  REQUIRE_NOTHROW(r = vcudnn::parse_trace(j.dump()));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains(field));
}

TEST_CASE("trace: parse_trace rejects sequence numbers out of order and an inverted iteration", "[trace]") {
  auto j = good_json();
  SECTION("a call repeats the previous seq") { j["calls"][1]["seq"] = j["calls"][0]["seq"]; }
  SECTION("a call goes back") { j["calls"][2]["seq"] = 0; }
  SECTION("first_seq after end_seq") {
    j["iteration"]["first_seq"] = 10;
    j["iteration"]["end_seq"] = 5;
  }
  SECTION("negative host time") { j["calls"][0]["host_us"] = -1.0; }
  require_rejected(j.dump());
}

TEST_CASE("trace: read_trace refuses a directory, a device and a FIFO by name, without reading them", "[trace]") {
  vcudnn::test::TempDir tmp;
  const std::string fifo = tmp.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
           {tmp.path(), "a directory"}, {"/dev/urandom", "a device"}, {"/dev/null", "a device"}, {fifo, "a FIFO"}}) {
    INFO(path);
    const auto r = vcudnn::read_trace(path);  // a FIFO without a writer would block a plain open for ever
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(what));
    CHECK_THAT(r.error().message, Catch::Contains(path));
  }
}

TEST_CASE("trace: buffers, accesses and lifetimes are checked", "[trace]") {
  auto j = good_json();
  REQUIRE(vcudnn::parse_trace(j.dump()).ok());
  const size_t alloc = first_of(j, "alloc");
  const size_t launch = first_of(j, "launch");
  const size_t free = first_of(j, "free");
  SECTION("an access past the buffer table") { j["calls"][launch]["accesses"][0][0] = j["buffers"].size(); }
  SECTION("a buffer named twice by one call") { j["calls"][launch]["accesses"][1][0] = 4; }
  SECTION("an unknown access mode") { j["calls"][launch]["accesses"][0][1] = "x"; }
  SECTION("an access that is not a pair") { j["calls"][launch]["accesses"][0] = {4}; }
  SECTION("an alloc without a buffer") { j["calls"][alloc].erase("buffer"); }
  SECTION("a free past the table") { j["calls"][free]["buffer"] = 99; }
  SECTION("a name past the table") { j["calls"][launch]["name"] = j["names"].size(); }
  SECTION("two buffers with one id") { j["buffers"][1]["id"] = j["buffers"][0]["id"]; }
  SECTION("a buffer allocated twice") { j["calls"][first_of(j, "memset")]["kind"] = "alloc", j["calls"][first_of(j, "memset")]["buffer"] = 0; }
  SECTION("a buffer freed twice") { j["calls"].back()["kind"] = "free", j["calls"].back()["buffer"] = 0; }
  SECTION("a use after free") {
    j["calls"][free + 1]["kind"] = "launch";
    j["calls"][free + 1]["accesses"] = {{j["calls"][free]["buffer"], "r"}};
  }
  SECTION("a use before the allocation") { j["calls"][launch]["accesses"][0][0] = j["calls"][alloc + 1 + 18 - 1]["buffer"]; }
  SECTION("a negative bandwidth") { j["link"]["both_gbps"] = -1.0; }
  SECTION("a buffer address that is not hex") { j["buffers"][0]["address"] = 5; }
  require_rejected(j.dump());
}

TEST_CASE("trace: where the GPU times come from is kept, defaults for an older trace and is checked", "[trace]") {
  nlohmann::json j = make_trace();
  CHECK(j.at("iteration").at("gpu_times") == "next");
  CHECK(j.at("iteration").at("next_timed") == 5);
  // A trace written before the field existed: its times are its own iteration's.
  j["iteration"].erase("gpu_times");
  j["iteration"].erase("next_timed");
  auto older = vcudnn::parse_trace(j.dump());
  REQUIRE(older.ok());
  CHECK(older.value().gpu_times == "iteration");
  CHECK(older.value().next_timed == 0);
  j["iteration"]["gpu_times"] = "steady";
  j["iteration"]["next_timed"] = 1;
  require_rejected(j.dump());
  j["iteration"]["gpu_times"] = "next";
  j["iteration"]["next_timed"] = -1;
  require_rejected(j.dump());
  j["iteration"].erase("next_timed");
  require_rejected(j.dump());
}

TEST_CASE("trace: the bytes alive at the iteration's start are kept, absent or null when memory was not owned, and "
          "checked", "[trace]") {
  nlohmann::json j = make_trace();
  CHECK(j.at("iteration").at("alive_at_start") == std::numeric_limits<uint64_t>::max() - 3);
  for (const char* how : {"absent", "null"}) {
    INFO(how);
    nlohmann::json k = j;
    if (std::string(how) == "absent") k["iteration"].erase("alive_at_start");
    else k["iteration"]["alive_at_start"] = nullptr;
    auto r = vcudnn::parse_trace(k.dump());
    REQUIRE(r.ok());
    CHECK_FALSE(r.value().alive_at_start.has_value());
    CHECK(nlohmann::json(r.value()).at("iteration").at("alive_at_start").is_null());
  }
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json(1e30), nlohmann::json("5"), nlohmann::json(2.5)}) {
    INFO(bad.dump());
    j["iteration"]["alive_at_start"] = bad;
    require_rejected(j.dump());
  }
}
