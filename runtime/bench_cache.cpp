// BenchCache on SQLite: one conv_measurement row per (key, cap) and one conv_result row per measured
// algorithm, so that a measurement in which nothing fit still answers. Every value goes through a
// bound parameter; every failure comes back as a value, never as an exception or a message printed.
#include "runtime/bench_cache.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <system_error>

namespace vcudnn {
namespace {

// Per statement once the cache is open (lookups and stores of other processes are short).
constexpr int kBusyTimeoutMs = 10000;

using Clock = std::chrono::steady_clock;

// Milliseconds left before `deadline` (0 when past), for sqlite3_busy_timeout.
int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

// Created only after the meta row has shown the file to be ours (a foreign version may hold tables
// of these names with other columns). The UNIQUE index also serves lookup: six equalities, then
// the smallest cap >= the one asked for.
constexpr const char* kCreateTables = R"sql(
CREATE TABLE IF NOT EXISTS conv_measurement(
  id INTEGER PRIMARY KEY,
  gpu_name TEXT NOT NULL,
  sm_count INTEGER NOT NULL,
  cudnn_version INTEGER NOT NULL,
  layer TEXT NOT NULL,
  kind INTEGER NOT NULL,
  micro_batch INTEGER NOT NULL,
  cap INTEGER NOT NULL,
  UNIQUE(gpu_name, sm_count, cudnn_version, layer, kind, micro_batch, cap));
CREATE TABLE IF NOT EXISTS conv_result(
  measurement_id INTEGER NOT NULL REFERENCES conv_measurement(id),
  algo INTEGER NOT NULL,
  math_type INTEGER NOT NULL,
  determinism INTEGER NOT NULL,
  time_ms REAL,
  workspace INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS conv_result_by_measurement ON conv_result(measurement_id);
)sql";

// Statements that bind a key take it as ?1..?6 and the cap as ?7 (see bind_key).
constexpr const char* kKeyMatch =
    "gpu_name = ?1 AND sm_count = ?2 AND cudnn_version = ?3 AND layer = ?4 AND kind = ?5 AND micro_batch = ?6";

struct SqlStatus {
  int rc = SQLITE_OK;
  std::string message;
  bool ok() const { return rc == SQLITE_OK; }
};

SqlStatus failure(sqlite3* db, int rc) { return {rc, sqlite3_errmsg(db)}; }

bool is_corruption(int rc) { return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT; }

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  sqlite3_stmt* get() const { return stmt_; }
  // OK unless preparing failed.
  SqlStatus status() const { return rc_ == SQLITE_OK ? SqlStatus{} : failure(db_, rc_); }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(stmt_); }
  // Runs a statement that returns no rows of interest to the end, then makes it reusable.
  SqlStatus run() {
    int rc;
    while ((rc = step()) == SQLITE_ROW) {
    }
    SqlStatus s = rc == SQLITE_DONE ? SqlStatus{} : failure(db_, rc);
    sqlite3_reset(stmt_);
    return s;
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// Holds the connection's own (recursive) mutex across several calls, so that a transaction of one
// thread cannot take in the statements of another thread using the same BenchCache.
class DbLock {
 public:
  explicit DbLock(sqlite3* db) : mutex_(sqlite3_db_mutex(db)) { sqlite3_mutex_enter(mutex_); }
  ~DbLock() { sqlite3_mutex_leave(mutex_); }
  DbLock(const DbLock&) = delete;
  DbLock& operator=(const DbLock&) = delete;

 private:
  sqlite3_mutex* mutex_;
};

SqlStatus exec(sqlite3* db, const char* sql) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? SqlStatus{} : failure(db, rc);
}

// BEGIN IMMEDIATE takes the write lock at once (waiting up to the busy timeout), so that two
// writers never deadlock upgrading read locks. Rolled back unless committed.
class WriteTransaction {
 public:
  explicit WriteTransaction(sqlite3* db) : db_(db) {}
  ~WriteTransaction() {
    if (begun_ && !sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;

  SqlStatus begin() {
    SqlStatus s = exec(db_, "BEGIN IMMEDIATE");
    begun_ = s.ok();
    return s;
  }
  SqlStatus commit() { return exec(db_, "COMMIT"); }

 private:
  sqlite3* db_;
  bool begun_ = false;
};

// SQLite integers are signed. Caps keep their order only below 2^63, so larger ones (8 EiB, i.e.
// "no cap") become 2^63-1; workspace sizes are never compared and keep all 64 bits as a bit pattern.
int64_t stored_cap(uint64_t cap) {
  return static_cast<int64_t>(std::min<uint64_t>(cap, std::numeric_limits<int64_t>::max()));
}

int bind_text(sqlite3_stmt* stmt, int index, const std::string& text) {
  return sqlite3_bind_text64(stmt, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
}

int bind_key(sqlite3_stmt* stmt, const BenchKey& key, uint64_t cap) {
  const int rcs[] = {bind_text(stmt, 1, key.gpu_name),
                     sqlite3_bind_int(stmt, 2, key.sm_count),
                     sqlite3_bind_int(stmt, 3, key.cudnn_version),
                     bind_text(stmt, 4, key.layer),
                     sqlite3_bind_int(stmt, 5, key.kind),
                     sqlite3_bind_int(stmt, 6, key.micro_batch),
                     sqlite3_bind_int64(stmt, 7, stored_cap(cap))};
  for (int rc : rcs)
    if (rc != SQLITE_OK) return rc;
  return SQLITE_OK;
}

int bind_row(sqlite3_stmt* stmt, int64_t measurement_id, const BenchRow& row) {
  // SQLite stores a NaN time as NULL; lookup turns it back into NaN and sorts it last.
  const int rcs[] = {
      sqlite3_bind_int64(stmt, 1, measurement_id), sqlite3_bind_int(stmt, 2, row.algo),
      sqlite3_bind_int(stmt, 3, row.math_type),    sqlite3_bind_int(stmt, 4, row.determinism),
      sqlite3_bind_double(stmt, 5, row.time_ms),   sqlite3_bind_int64(stmt, 6, static_cast<int64_t>(row.workspace))};
  for (int rc : rcs)
    if (rc != SQLITE_OK) return rc;
  return SQLITE_OK;
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// mkdir -p of the folder holding `path`: "" when it exists afterwards, else what failed.
std::string make_parent_dirs(const std::string& path) {
  const size_t last_slash = path.rfind('/');
  if (last_slash == std::string::npos || last_slash == 0) return {};
  const std::string dir = path.substr(0, last_slash);
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0755) != 0) {
      const int e = errno;  // is_dir() may change errno
      if (e != EEXIST && !is_dir(prefix)) return "cannot create folder " + prefix + ": " + errno_text(e);
    }
    if (end == std::string::npos) break;
  }
  return is_dir(dir) ? std::string() : "cannot create folder " + dir + ": " + errno_text(ENOTDIR);
}

// Switching to WAL takes an exclusive lock, and while another connection holds the file SQLite
// may answer SQLITE_BUSY at once instead of calling the busy handler (it would risk a deadlock), or
// only after the busy timeout; so retry here until the deadline, by the clock (counting retries
// once made a locked file in rollback-journal mode wait ~2,000 busy timeouts). Once the file is in
// WAL mode this is a no-op.
SqlStatus set_wal_mode(sqlite3* db, Clock::time_point deadline) {
  constexpr int kRetryMs = 5;
  for (;;) {
    sqlite3_busy_timeout(db, remaining_ms(deadline));
    SqlStatus s = exec(db, "PRAGMA journal_mode=WAL");
    const int primary = s.rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || remaining_ms(deadline) == 0) return s;
    sqlite3_sleep(kRetryMs);
  }
}

// "" when the file passes PRAGMA quick_check, else its first complaint.
SqlStatus quick_check(sqlite3* db, std::string* problem) {
  Statement stmt(db, "PRAGMA quick_check(1)");
  if (!stmt.status().ok()) return stmt.status();
  int rc = stmt.step();
  if (rc != SQLITE_ROW) return failure(db, rc);
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0));
  std::string result = text ? text : "";
  if (result != "ok") *problem = result;
  return {};
}

// Creates the schema or checks that the file holds ours. Inside one IMMEDIATE transaction, so that
// processes opening a new file together neither race nor see half a schema. *foreign says why the
// file is not a cache of this version (then nothing was changed).
SqlStatus init_schema(sqlite3* db, std::string* foreign) {
  WriteTransaction tx(db);
  if (SqlStatus s = tx.begin(); !s.ok()) return s;

  // A database of another program: objects, but no meta table.
  Statement probe(db,
                  "SELECT (SELECT count(*) FROM sqlite_master), "
                  "(SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta')");
  if (!probe.status().ok()) return probe.status();
  if (int rc = probe.step(); rc != SQLITE_ROW) return failure(db, rc);
  if (sqlite3_column_int64(probe.get(), 0) > 0 && sqlite3_column_int64(probe.get(), 1) == 0) {
    *foreign = "is a SQLite database without a vcudnn meta table";
    return {};
  }

  if (SqlStatus s = exec(db, "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)"); !s.ok()) return s;
  Statement insert(db, "INSERT OR IGNORE INTO meta(key, value) VALUES('schema', ?1)");
  if (!insert.status().ok()) return insert.status();
  if (int rc = sqlite3_bind_text(insert.get(), 1, kBenchCacheSchema, -1, SQLITE_STATIC); rc != SQLITE_OK)
    return failure(db, rc);
  if (SqlStatus s = insert.run(); !s.ok()) return s;

  Statement read(db, "SELECT value FROM meta WHERE key = 'schema'");
  if (!read.status().ok()) return read.status();
  if (int rc = read.step(); rc != SQLITE_ROW) return failure(db, rc);
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(read.get(), 0));
  const std::string schema = text ? text : "NULL";
  if (schema != kBenchCacheSchema) {
    *foreign = "has schema '" + schema + "', not '" + kBenchCacheSchema + "'";
    return {};
  }

  // The meta row can be right and the tables not (another build's, or edited): creating the
  // indexes then fails on a missing column, or a later check does.
  if (SqlStatus s = exec(db, kCreateTables); !s.ok()) {
    if ((s.rc & 0xff) != SQLITE_ERROR) return s;
    *foreign = "has this version's meta row but not its tables (" + s.message + ")";
    return {};
  }
  // Every column the lookups and stores name must be there, or the file is set aside like a
  // foreign one.
  for (const char* columns : {"SELECT id, gpu_name, sm_count, cudnn_version, layer, kind, micro_batch, cap "
                              "FROM conv_measurement LIMIT 0",
                              "SELECT measurement_id, algo, math_type, determinism, time_ms, workspace "
                              "FROM conv_result LIMIT 0"}) {
    Statement check(db, columns);
    if (!check.status().ok()) {
      *foreign = "has this version's meta row but not its tables (" + check.status().message + ")";
      return {};
    }
  }
  return tx.commit();
}

struct Attempt {
  sqlite3* db = nullptr;  // set on success
  bool bad_file = false;  // corrupt or foreign: to be moved aside
  std::string why;        // what is wrong with the file, or why it could not be opened
};

// Every wait (busy handler, WAL retries) ends by `deadline`.
Attempt try_open(const std::string& path, Clock::time_point deadline) {
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  const int open_rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  auto fail = [&db](const SqlStatus& s, const std::string& during) {
    Attempt a;
    a.bad_file = is_corruption(s.rc);
    a.why =
        a.bad_file ? "is not a usable SQLite database (" + during + ": " + s.message + ")" : during + ": " + s.message;
    sqlite3_close_v2(db);
    return a;
  };
  if (open_rc != SQLITE_OK) return fail({open_rc, db ? sqlite3_errmsg(db) : sqlite3_errstr(open_rc)}, "open");

  sqlite3_extended_result_codes(db, 1);
  // On a file system without WAL support SQLite keeps its rollback journal: slower, still correct.
  if (SqlStatus s = set_wal_mode(db, deadline); !s.ok()) return fail(s, "PRAGMA journal_mode");
  sqlite3_busy_timeout(db, remaining_ms(deadline));
  if (SqlStatus s = exec(db, "PRAGMA synchronous=NORMAL"); !s.ok()) return fail(s, "PRAGMA synchronous");

  std::string problem;
  sqlite3_busy_timeout(db, remaining_ms(deadline));
  if (SqlStatus s = quick_check(db, &problem); !s.ok()) return fail(s, "PRAGMA quick_check");
  if (!problem.empty()) {
    sqlite3_close_v2(db);
    return {nullptr, true, "failed PRAGMA quick_check (" + problem + ")"};
  }
  std::string foreign;
  sqlite3_busy_timeout(db, remaining_ms(deadline));
  if (SqlStatus s = init_schema(db, &foreign); !s.ok()) return fail(s, "creating the schema");
  if (!foreign.empty()) {
    sqlite3_close_v2(db);
    return {nullptr, true, foreign};
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  return {db, false, {}};
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// Moves `path` and its WAL siblings to "<path>.bad-<pid>[-wal|-shm]". "" on success, else why not.
std::string move_aside(const std::string& path, const std::string& bad_path) {
  if (std::rename(path.c_str(), bad_path.c_str()) != 0) return errno_text(errno);
  for (const char* suffix : {"-wal", "-shm"}) std::rename((path + suffix).c_str(), (bad_path + suffix).c_str());
  return {};
}

// For catch blocks: a second std::bad_alloc while reporting the first is swallowed.
template <typename MakeText>
void set_quietly(std::string* out, MakeText&& make_text) {
  if (!out) return;
  try {
    *out = make_text();
  } catch (...) {
    out->clear();
  }
}

}  // namespace

BenchCache::BenchCache(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

BenchCache::~BenchCache() { sqlite3_close_v2(db_); }

std::unique_ptr<BenchCache> BenchCache::open(const std::string& path, std::string* warning, std::string* error,
                                             std::chrono::milliseconds max_wait) {
  try {
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + max_wait;
    if (warning) warning->clear();
    if (error) error->clear();
    auto fail = [&](const std::string& why) -> std::unique_ptr<BenchCache> {
      if (error) *error = "cannot open bench cache " + path + ": " + why;
      return nullptr;
    };
    if (path.empty()) return fail("empty path");

    const std::string dir_problem = make_parent_dirs(path);
    struct stat examined {};
    const bool existed = ::stat(path.c_str(), &examined) == 0;
    Attempt attempt = try_open(path, deadline);
    if (attempt.bad_file) {
      // Another process may have found the same bad file and replaced it already: move aside only
      // the file that was examined, never a fresh cache someone else just made.
      struct stat now {};
      if (existed && ::stat(path.c_str(), &now) == 0 && same_file(examined, now)) {
        const std::string bad_path = path + ".bad-" + std::to_string(::getpid());
        if (std::string problem = move_aside(path, bad_path); !problem.empty())
          return fail("it " + attempt.why + " and cannot be moved aside: " + problem);
        if (warning)
          *warning = "bench cache " + path + " " + attempt.why + "; moved it to " + bad_path + " and started afresh";
      }
      const std::string first_why = attempt.why;
      attempt = try_open(path, deadline);
      if (attempt.bad_file) return fail("it " + first_why + ", and so does the new file (" + attempt.why + ")");
    }
    if (!attempt.db) {
      std::string why = attempt.why + (dir_problem.empty() ? "" : " (" + dir_problem + ")");
      if (remaining_ms(deadline) == 0)
        why += " (gave up after waiting " +
               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
               " ms for another process)";
      return fail(why);
    }
    return std::unique_ptr<BenchCache>(new BenchCache(attempt.db, path));
  } catch (...) {  // std::bad_alloc: nothing may leave an interposer
    set_quietly(error, [&] { return "cannot open bench cache " + path + ": out of memory"; });
    return nullptr;
  }
}

std::optional<std::vector<BenchRow>> BenchCache::lookup(const BenchKey& key, uint64_t cap, bool exact) {
  try {
    DbLock lock(db_);
    // One statement, so one snapshot: a concurrent store cannot leave us a measurement without its
    // rows. A measurement without rows comes back as one all-NULL row (LEFT JOIN).
    Statement stmt(db_, std::string("SELECT r.measurement_id, r.algo, r.math_type, r.determinism, r.time_ms, "
                                    "r.workspace FROM (SELECT id FROM conv_measurement WHERE ") +
                            kKeyMatch + (exact ? " AND cap = ?7" : " AND cap >= ?7") +
                            " ORDER BY cap LIMIT 1) AS m "
                            "LEFT JOIN conv_result AS r ON r.measurement_id = m.id "
                            "ORDER BY r.time_ms IS NULL, r.time_ms, r.rowid");
    if (!stmt.status().ok() || bind_key(stmt.get(), key, cap) != SQLITE_OK) return std::nullopt;
    std::optional<std::vector<BenchRow>> rows;
    int rc;
    while ((rc = stmt.step()) == SQLITE_ROW) {
      if (!rows) rows.emplace();
      sqlite3_stmt* s = stmt.get();
      if (sqlite3_column_type(s, 0) == SQLITE_NULL) continue;
      BenchRow row;
      row.algo = sqlite3_column_int(s, 1);
      row.math_type = sqlite3_column_int(s, 2);
      row.determinism = sqlite3_column_int(s, 3);
      row.time_ms = sqlite3_column_type(s, 4) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                             : sqlite3_column_double(s, 4);
      row.workspace = static_cast<uint64_t>(sqlite3_column_int64(s, 5));
      rows->push_back(row);
    }
    if (rc != SQLITE_DONE) return std::nullopt;
    return rows;
  } catch (...) {
    return std::nullopt;
  }
}

bool BenchCache::store(const BenchKey& key, uint64_t cap, const std::vector<BenchRow>& rows, std::string* error) {
  try {
    DbLock lock(db_);
    auto fail = [&](const std::string& during, const SqlStatus& s) {
      if (error) *error = "bench cache " + path_ + ": " + during + ": " + s.message;
      return false;
    };
    auto run_with_key = [&](const std::string& sql) {
      Statement stmt(db_, sql);
      if (!stmt.status().ok()) return stmt.status();
      if (int rc = bind_key(stmt.get(), key, cap); rc != SQLITE_OK) return failure(db_, rc);
      return stmt.run();
    };

    WriteTransaction tx(db_);
    if (SqlStatus s = tx.begin(); !s.ok()) return fail("BEGIN IMMEDIATE", s);
    const std::string same_measurement =
        std::string("SELECT id FROM conv_measurement WHERE ") + kKeyMatch + " AND cap = ?7";
    if (SqlStatus s = run_with_key("DELETE FROM conv_result WHERE measurement_id IN (" + same_measurement + ")");
        !s.ok())
      return fail("deleting old results", s);
    if (SqlStatus s = run_with_key(std::string("DELETE FROM conv_measurement WHERE ") + kKeyMatch + " AND cap = ?7");
        !s.ok())
      return fail("deleting the old measurement", s);
    if (SqlStatus s = run_with_key(
            "INSERT INTO conv_measurement(gpu_name, sm_count, cudnn_version, layer, kind, micro_batch, cap) "
            "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)");
        !s.ok())
      return fail("inserting the measurement", s);
    const int64_t measurement_id = sqlite3_last_insert_rowid(db_);

    Statement insert(db_,
                     "INSERT INTO conv_result(measurement_id, algo, math_type, determinism, time_ms, workspace) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
    if (!insert.status().ok()) return fail("preparing the result insert", insert.status());
    for (const BenchRow& row : rows) {
      if (int rc = bind_row(insert.get(), measurement_id, row); rc != SQLITE_OK)
        return fail("binding a result", failure(db_, rc));
      if (SqlStatus s = insert.run(); !s.ok()) return fail("inserting a result", s);
    }
    if (SqlStatus s = tx.commit(); !s.ok()) return fail("COMMIT", s);
    return true;
  } catch (...) {
    set_quietly(error, [&] { return "bench cache " + path_ + ": out of memory"; });
    return false;
  }
}

std::string default_bench_cache_path() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/vcudnn/bench.sqlite";
  if (std::string home = env("HOME"); !home.empty()) return home + "/.cache/vcudnn/bench.sqlite";
  return "/tmp/vcudnn-" + std::to_string(::getuid()) + "/bench.sqlite";
}

}  // namespace vcudnn
