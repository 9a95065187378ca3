// BenchCache: exact round trips, key separation, cap semantics, empty measurements, replacement,
// persistence, recovery from corrupt and foreign files, unwritable paths, the default path, and
// many processes (and threads) sharing one file.
#include <catch2/catch.hpp>

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/bench_cache.h"
#include "tests/common/test_util.h"

namespace {

using vcudnn::BenchCache;
using vcudnn::BenchKey;
using vcudnn::BenchRow;
using vcudnn::test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

BenchKey make_key(int i = 0) {
  BenchKey key;
  key.gpu_name = "NVIDIA H100 80GB HBM3";
  key.sm_count = 132;
  key.cudnn_version = 90100;
  key.layer = R"({"kind":"fwd","x":[)" + std::to_string(32 + i) + R"(,64,56,56],"w":[64,64,3,3]})";
  key.kind = 0;
  key.micro_batch = 32;
  return key;
}

BenchRow row(int32_t algo, double time_ms, uint64_t workspace, int32_t math_type = 0, int32_t determinism = 1) {
  BenchRow r;
  r.algo = algo;
  r.math_type = math_type;
  r.determinism = determinism;
  r.time_ms = time_ms;
  r.workspace = workspace;
  return r;
}

// Distinct rows for key number `i` (the multi-process test checks contents, not just presence).
std::vector<BenchRow> rows_for(int i) {
  return {row(i % 8, 0.25 + i / 1024.0, static_cast<uint64_t>(i) * 4096), row(7, 1.0 / (i + 3), 17 * kMiB + i, 1, 0)};
}

std::vector<BenchRow> sorted_by_time(std::vector<BenchRow> rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const BenchRow& a, const BenchRow& b) { return a.time_ms < b.time_ms; });
  return rows;
}

std::unique_ptr<BenchCache> open_clean(const std::string& path) {
  std::string warning = "unset", error = "unset";
  auto cache = BenchCache::open(path, &warning, &error);
  INFO("error: " << error << "; warning: " << warning);
  REQUIRE(cache != nullptr);
  CHECK(warning.empty());
  CHECK(error.empty());
  return cache;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Runs SQL on the file with sqlite3 directly, as another program (or version) would.
void sql_on_file(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) == SQLITE_OK);
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &message);
  INFO((message ? message : ""));
  sqlite3_free(message);
  sqlite3_close_v2(db);
  REQUIRE(rc == SQLITE_OK);
}

// Sets and unsets environment variables, restoring their values on destruction.
class EnvGuard {
 public:
  explicit EnvGuard(const std::vector<std::string>& names) {
    for (const auto& name : names) {
      const char* value = std::getenv(name.c_str());
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST_CASE("bench cache: rows round-trip exactly, sorted by time", "[cache]") {
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  const std::vector<BenchRow> rows = {
      row(1, 0.1 + 0.2, 0),
      row(6, 1.0 / 3.0, (1ull << 62) + 12345, 2, 0),
      row(0, 1e-300, 1),
      row(-1, 12345.678901234567, std::numeric_limits<uint64_t>::max(), 1, 1),
      row(5, std::nextafter(1.0 / 3.0, 1.0), (1ull << 63) - 1),
  };
  REQUIRE(cache->store(make_key(), 64 * kMiB, rows));
  auto got = cache->lookup(make_key(), 64 * kMiB);
  REQUIRE(got.has_value());
  const auto expected = sorted_by_time(rows);
  REQUIRE(got->size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("row " << i);
    CHECK(got->at(i) == expected[i]);  // operator== on doubles: bit-exact, not approximate
  }
  CHECK(got->front().time_ms == 1e-300);
  CHECK(got->back().workspace == std::numeric_limits<uint64_t>::max());
}

TEST_CASE("bench cache: a NaN time comes back as NaN, sorted last", "[cache]") {
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  REQUIRE(cache->store(make_key(), kGiB, {row(1, std::nan(""), 10), row(2, 5.0, 20), row(3, 2.0, 30)}));
  auto got = cache->lookup(make_key(), kGiB);
  REQUIRE(got.has_value());
  REQUIRE(got->size() == 3);
  CHECK(got->at(0).algo == 3);
  CHECK(got->at(1).algo == 2);
  CHECK(got->at(2).algo == 1);
  CHECK(std::isnan(got->at(2).time_ms));
}

TEST_CASE("bench cache: each key field separates measurements", "[cache]") {
  const std::vector<std::pair<const char*, std::function<void(BenchKey&)>>> changes = {
      {"gpu_name", [](BenchKey& k) { k.gpu_name = "NVIDIA A100-SXM4-80GB"; }},
      {"sm_count", [](BenchKey& k) { k.sm_count = 114; }},
      {"cudnn_version", [](BenchKey& k) { k.cudnn_version = 90101; }},
      {"layer", [](BenchKey& k) { k.layer += " "; }},
      {"kind", [](BenchKey& k) { k.kind = 1; }},
      {"micro_batch", [](BenchKey& k) { k.micro_batch = 16; }},
  };
  for (const auto& [field, change] : changes) {
    DYNAMIC_SECTION("changing " << field) {
      TempDir tmp;
      auto cache = open_clean(tmp.file("bench.sqlite"));
      const BenchKey base = make_key();
      BenchKey other = base;
      change(other);
      const std::vector<BenchRow> base_rows = {row(1, 1.5, 100)}, other_rows = {row(2, 2.5, 200), row(3, 3.5, 300)};
      REQUIRE(cache->store(base, 64 * kMiB, base_rows));
      CHECK_FALSE(cache->lookup(other, 64 * kMiB).has_value());
      REQUIRE(cache->store(other, 64 * kMiB, other_rows));
      CHECK(cache->lookup(base, 64 * kMiB) == std::optional(base_rows));
      CHECK(cache->lookup(other, 64 * kMiB) == std::optional(other_rows));
    }
  }
}

TEST_CASE("bench cache: a lookup takes the smallest stored cap that covers it", "[cache]") {
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  const std::vector<BenchRow> small = {row(1, 2.0, 8 * kMiB)};
  const std::vector<BenchRow> large = {row(2, 1.0, 300 * kMiB), row(1, 2.0, 8 * kMiB)};
  REQUIRE(cache->store(make_key(), 512 * kMiB, large));
  REQUIRE(cache->store(make_key(), 64 * kMiB, small));

  CHECK(cache->lookup(make_key(), 8 * kMiB) == std::optional(small));
  CHECK(cache->lookup(make_key(), 64 * kMiB) == std::optional(small));
  CHECK(cache->lookup(make_key(), 64 * kMiB + 1) == std::optional(large));
  CHECK(cache->lookup(make_key(), 100 * kMiB) == std::optional(large));
  CHECK(cache->lookup(make_key(), 512 * kMiB) == std::optional(large));
  CHECK_FALSE(cache->lookup(make_key(), kGiB).has_value());

  SECTION("an unlimited cap (2^64-1) answers every limit") {
    const std::vector<BenchRow> unlimited = {row(3, 0.5, 40 * kGiB)};
    REQUIRE(cache->store(make_key(), std::numeric_limits<uint64_t>::max(), unlimited));
    CHECK(cache->lookup(make_key(), kGiB) == std::optional(unlimited));
    CHECK(cache->lookup(make_key(), std::numeric_limits<uint64_t>::max()) == std::optional(unlimited));
    CHECK(cache->lookup(make_key(), 100 * kMiB) == std::optional(large));
  }
}

TEST_CASE("bench cache: a measurement with no rows is an empty answer, not a miss", "[cache]") {
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  REQUIRE(cache->store(make_key(), 0, {}));
  auto got = cache->lookup(make_key(), 0);
  REQUIRE(got.has_value());
  CHECK(got->empty());
  CHECK_FALSE(cache->lookup(make_key(), 1).has_value());
}

TEST_CASE("bench cache: store replaces the measurement of the same key and cap only", "[cache]") {
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  const std::vector<BenchRow> first = {row(1, 3.0, 10), row(2, 4.0, 20)}, second = {row(5, 1.0, 50)};
  const std::vector<BenchRow> other_cap = {row(6, 9.0, 60)};
  REQUIRE(cache->store(make_key(), 256 * kMiB, other_cap));
  REQUIRE(cache->store(make_key(), 64 * kMiB, first));
  REQUIRE(cache->store(make_key(), 64 * kMiB, second));
  CHECK(cache->lookup(make_key(), 64 * kMiB) == std::optional(second));
  CHECK(cache->lookup(make_key(), 128 * kMiB) == std::optional(other_cap));
  // exact: only a measurement under that very cap answers.
  CHECK(cache->lookup(make_key(), 256 * kMiB, true) == std::optional(other_cap));
  CHECK(cache->lookup(make_key(), 64 * kMiB, true) == std::optional(second));
  CHECK_FALSE(cache->lookup(make_key(), 128 * kMiB, true).has_value());
  CHECK_FALSE(cache->lookup(make_key(), 8 * kMiB, true).has_value());
  REQUIRE(cache->store(make_key(), 64 * kMiB, {}));
  CHECK(cache->lookup(make_key(), 64 * kMiB) == std::optional(std::vector<BenchRow>{}));
}

TEST_CASE("bench cache: measurements persist across close and reopen", "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("a/b/c/bench.sqlite");  // folders created on open
  const std::vector<BenchRow> rows = {row(4, 0.75, 3 * kGiB, 1, 0)};
  {
    auto cache = open_clean(path);
    CHECK(cache->path() == path);
    REQUIRE(cache->store(make_key(1), 64 * kMiB, rows));
    REQUIRE(cache->store(make_key(2), 64 * kMiB, {}));
  }
  struct stat st;
  REQUIRE(::stat(tmp.file("a/b/c").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == (0755 & ~[] {
          mode_t mask = ::umask(0);
          ::umask(mask);
          return mask;
        }()));
  auto cache = open_clean(path);
  CHECK(cache->lookup(make_key(1), 64 * kMiB) == std::optional(rows));
  CHECK(cache->lookup(make_key(2), 64 * kMiB) == std::optional(std::vector<BenchRow>{}));
  CHECK_FALSE(cache->lookup(make_key(3), 64 * kMiB).has_value());
}

TEST_CASE("bench cache: a corrupt file is moved aside and replaced", "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("bench.sqlite");
  std::string garbage(4096, '\0');
  std::mt19937 rng(12345);
  for (char& c : garbage) c = static_cast<char>(rng());
  REQUIRE(garbage.compare(0, 6, "SQLite") != 0);
  write_file(path, garbage);

  std::string warning, error;
  auto cache = BenchCache::open(path, &warning, &error);
  INFO("warning: " << warning << "; error: " << error);
  REQUIRE(cache != nullptr);
  CHECK(error.empty());
  const std::string bad_path = path + ".bad-" + std::to_string(::getpid());
  CHECK(warning.find(path) != std::string::npos);
  CHECK(warning.find(bad_path) != std::string::npos);
  CHECK(warning.find('\n') == std::string::npos);
  REQUIRE(exists(bad_path));
  CHECK(vcudnn::test::read_file(bad_path) == garbage);

  const std::vector<BenchRow> rows = {row(1, 1.0, 1)};
  REQUIRE(cache->store(make_key(), kMiB, rows));
  CHECK(cache->lookup(make_key(), kMiB) == std::optional(rows));
  cache.reset();
  open_clean(path);  // the new file is healthy: no second warning
}

TEST_CASE("bench cache: a file of another schema version is set aside", "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("bench.sqlite");
  {
    auto cache = open_clean(path);
    REQUIRE(cache->store(make_key(), kMiB, {row(1, 1.0, 1)}));
    REQUIRE(cache->lookup(make_key(), kMiB).has_value());
  }
  sql_on_file(path, "UPDATE meta SET value = 'vcudnn.bench/0' WHERE key = 'schema'");

  std::string warning, error;
  auto cache = BenchCache::open(path, &warning, &error);
  INFO("warning: " << warning << "; error: " << error);
  REQUIRE(cache != nullptr);
  CHECK(error.empty());
  CHECK(warning.find(path) != std::string::npos);
  CHECK(warning.find("vcudnn.bench/0") != std::string::npos);
  CHECK(exists(path + ".bad-" + std::to_string(::getpid())));
  CHECK_FALSE(cache->lookup(make_key(), kMiB).has_value());
  REQUIRE(cache->store(make_key(), kMiB, {}));
  CHECK(cache->lookup(make_key(), kMiB) == std::optional(std::vector<BenchRow>{}));
}

TEST_CASE("bench cache: another program's SQLite database is set aside, not written into", "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("bench.sqlite");
  sql_on_file(path, "CREATE TABLE notes(text TEXT); INSERT INTO notes VALUES('keep me')");
  std::string warning, error;
  auto cache = BenchCache::open(path, &warning, &error);
  INFO("warning: " << warning << "; error: " << error);
  REQUIRE(cache != nullptr);
  CHECK(warning.find(path) != std::string::npos);
  const std::string bad_path = path + ".bad-" + std::to_string(::getpid());
  REQUIRE(exists(bad_path));
  // The moved file is untouched: still exactly one table, ours not added.
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(bad_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT group_concat(name) FROM sqlite_master", -1, &stmt, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  CHECK(std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0))) == "notes");
  sqlite3_finalize(stmt);
  sqlite3_close_v2(db);
}

TEST_CASE("bench cache: an unusable location gives nullptr and an error", "[cache]") {
  TempDir tmp;
  write_file(tmp.file("x-file"), "a regular file, not a folder\n");
  const std::string path = tmp.file("x-file/sub/bench.sqlite");
  std::string warning = "unset", error;
  auto cache = BenchCache::open(path, &warning, &error);
  CHECK(cache == nullptr);
  CHECK(warning.empty());
  INFO("error: " << error);
  CHECK(error.find(path) != std::string::npos);
  CHECK(error.find('\n') == std::string::npos);
  CHECK(BenchCache::open(path, nullptr, nullptr) == nullptr);  // null out-params are allowed
  CHECK(BenchCache::open("", nullptr, &error) == nullptr);
  CHECK_FALSE(error.empty());
}

TEST_CASE("bench cache: the default path follows XDG_CACHE_HOME, then HOME, then /tmp", "[cache]") {
  EnvGuard guard({"XDG_CACHE_HOME", "HOME"});
  ::setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
  ::setenv("HOME", "/home/someone", 1);
  CHECK(vcudnn::default_bench_cache_path() == "/xdg/cache/vcudnn/bench.sqlite");
  ::setenv("XDG_CACHE_HOME", "", 1);
  CHECK(vcudnn::default_bench_cache_path() == "/home/someone/.cache/vcudnn/bench.sqlite");
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(vcudnn::default_bench_cache_path() == "/home/someone/.cache/vcudnn/bench.sqlite");
  ::unsetenv("HOME");
  CHECK(vcudnn::default_bench_cache_path() == "/tmp/vcudnn-" + std::to_string(::getuid()) + "/bench.sqlite");
  ::setenv("HOME", "", 1);
  CHECK(vcudnn::default_bench_cache_path() == "/tmp/vcudnn-" + std::to_string(::getuid()) + "/bench.sqlite");
}

TEST_CASE("bench cache: many processes share one new file", "[cache]") {
  constexpr int kChildren = 6, kKeysEach = 40;
  TempDir tmp;
  const std::string path = tmp.file("shared/bench.sqlite");  // nothing exists yet: they race to create it
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: no Catch2 here; the exit code says what failed.
      ::close(gate[1]);
      char byte;
      if (::read(gate[0], &byte, 1) != 0) ::_exit(10);  // wait until the parent opens the gate
      ::alarm(120);                                     // a hang kills the child, never the test run
      std::string warning, error;
      auto die = [&](int code, const std::string& why) {
        std::ofstream(tmp.file("child-" + std::to_string(c) + ".txt")) << why;
        ::_exit(code);
      };
      auto cache = BenchCache::open(path, &warning, &error);
      if (!cache) die(11, error);
      if (!warning.empty()) die(12, warning);
      for (int k = 0; k < kKeysEach; ++k) {
        const int i = c * kKeysEach + k;
        if (!cache->store(make_key(i), 64 * kMiB, rows_for(i), &error)) die(13, error);
        if (cache->lookup(make_key(i), 64 * kMiB) != sorted_by_time(rows_for(i))) ::_exit(14);
        // Keys of other children: absent so far, or complete and correct.
        const int j = ((c + 1) % kChildren) * kKeysEach + k;
        if (auto got = cache->lookup(make_key(j), 64 * kMiB); got && *got != sorted_by_time(rows_for(j))) ::_exit(15);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // all children start together
  for (int c = 0; c < kChildren; ++c) {
    int status = 0;
    REQUIRE(::waitpid(children[c], &status, 0) == children[c]);
    const std::string said = exists(tmp.file("child-" + std::to_string(c) + ".txt"))
                                 ? vcudnn::test::read_file(tmp.file("child-" + std::to_string(c) + ".txt"))
                                 : "";
    INFO("child " << c << " status " << status << ": " << said);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  auto cache = open_clean(path);
  int found = 0;
  for (int i = 0; i < kChildren * kKeysEach; ++i)
    if (cache->lookup(make_key(i), 64 * kMiB) == sorted_by_time(rows_for(i))) ++found;
  CHECK(found == kChildren * kKeysEach);
}

TEST_CASE("bench cache: threads share one BenchCache", "[cache]") {
  constexpr int kThreads = 4, kKeysEach = 50;
  TempDir tmp;
  auto cache = open_clean(tmp.file("bench.sqlite"));
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeysEach; ++k) {
        const int i = t * kKeysEach + k;
        if (!cache->store(make_key(i), 64 * kMiB, rows_for(i))) ++failures[t];
        if (cache->lookup(make_key(i), 64 * kMiB) != sorted_by_time(rows_for(i))) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(failures[t] == 0);
  for (int i = 0; i < kThreads * kKeysEach; ++i)
    REQUIRE(cache->lookup(make_key(i), 64 * kMiB) == sorted_by_time(rows_for(i)));
}

// Issue "Hardening": with the file in rollback-journal mode and another process holding an
// exclusive lock, opening once retried PRAGMA journal_mode=WAL ~2,000 times, each retry waiting
// the whole busy timeout (hours, under the planner's lock). Now every wait of the open ends by one
// deadline, by the clock, and the caller carries on without the cache.
TEST_CASE("bench cache: a file locked by another process is given up after the open's wait, by the clock",
          "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("bench.sqlite");
  sqlite3* holder = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &holder, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_exec(holder, "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE; CREATE TABLE busy(x);", nullptr,
                       nullptr, nullptr) == SQLITE_OK);
  std::string warning, error;
  const auto start = std::chrono::steady_clock::now();
  auto cache = BenchCache::open(path, &warning, &error, std::chrono::milliseconds(300));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("error: " << error << "; waited " << waited << " s");
  CHECK(cache == nullptr);
  CHECK(waited >= 0.25);
  CHECK(waited < 3.0);
  CHECK(error.find(path) != std::string::npos);
  CHECK(error.find("gave up after waiting") != std::string::npos);
  // Once the other process lets go, the cache opens.
  REQUIRE(sqlite3_exec(holder, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close_v2(holder);
  cache = BenchCache::open(path, &warning, &error, std::chrono::milliseconds(300));
  INFO("then: " << error);
  CHECK(cache != nullptr);
}

// Issue "Hardening": the meta row right, a table wrong: every later statement failed with "no
// such column: measurement_id" and the file stayed. Now it is set aside like a foreign file.
TEST_CASE("bench cache: right meta row, wrong tables: set aside and rebuilt", "[cache]") {
  TempDir tmp;
  const std::string path = tmp.file("bench.sqlite");
  {
    std::string warning, error;
    auto cache = BenchCache::open(path, &warning, &error);
    REQUIRE(cache != nullptr);
  }
  sql_on_file(path, "DROP TABLE conv_result; CREATE TABLE conv_result(something_else INTEGER)");
  std::string warning, error;
  auto cache = BenchCache::open(path, &warning, &error);
  INFO("warning: " << warning << "; error: " << error);
  REQUIRE(cache != nullptr);
  CHECK(warning.find("not its tables") != std::string::npos);
  CHECK(warning.find("measurement_id") != std::string::npos);
  CHECK(exists(path + ".bad-" + std::to_string(::getpid())));
  REQUIRE(cache->store(make_key(), kMiB, {}));
  CHECK(cache->lookup(make_key(), kMiB) == std::optional(std::vector<BenchRow>{}));
}

// Issue "Hardening": a folder that cannot be made was reported with the errno of the stat() that
// followed ("No such file or directory") instead of the mkdir's. /sys refuses new folders, even
// to root (CI runs as root); skipped where /sys is absent.
TEST_CASE("bench cache: a folder that cannot be made is reported with mkdir's own error", "[cache]") {
  if (!exists("/sys/kernel")) return;
  errno = 0;
  if (::mkdir("/sys/vcudnn-cache-probe", 0755) == 0 || errno == ENOENT) return;  // not this kernel's /sys
  const std::string expected = std::strerror(errno);
  std::string warning, error;
  auto cache = BenchCache::open("/sys/vcudnn-cache-probe/bench.sqlite", &warning, &error);
  INFO(error);
  CHECK(cache == nullptr);
  CHECK(error.find("cannot create folder /sys/vcudnn-cache-probe: " + expected) != std::string::npos);
}
