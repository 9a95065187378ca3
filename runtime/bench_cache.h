// BenchCache: the benchmark results of micro-batched convolutions, kept in SQLite so that a
// later process (or another rank) plans without benchmarking. One row per measured algorithm,
// keyed by GPU (name and SM count), cuDNN version, the full layer fingerprint at the micro-batch
// size, the kernel kind and the micro-batch size, plus the workspace cap the measurement ran
// under (a measurement under cap C lists every algorithm needing at most C bytes, so it answers
// any limit <= C). WAL mode and a busy timeout make it safe for many processes at once. A
// corrupt file or one written by another schema version is set aside with a warning and rebuilt;
// nothing here ever throws or aborts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace vcudnn {

inline constexpr const char* kBenchCacheSchema = "vcudnn.bench/1";

struct BenchKey {
  std::string gpu_name;
  int32_t sm_count = 0;
  int32_t cudnn_version = 0;
  std::string layer;  // the full fingerprint of the micro-batch-sized layer (canonical JSON)
  int32_t kind = 0;   // ConvKind
  int32_t micro_batch = 0;
};

struct BenchRow {
  int32_t algo = 0;
  int32_t math_type = 0;
  int32_t determinism = 0;
  double time_ms = 0;
  uint64_t workspace = 0;
  bool operator==(const BenchRow&) const = default;
};

class BenchCache {
 public:
  // Opens (creating folders and file as needed) the cache at `path`. On any problem returns
  // nullptr and sets *error to one line naming the path and the cause; a corrupt or foreign file
  // is first moved aside to "<path>.bad-<pid>" and a fresh cache created (with *warning set).
  // Waiting for other processes (their locks) ends after `max_wait` in all, by the clock: then
  // nullptr, and the caller runs without the cache.
  static constexpr std::chrono::milliseconds kOpenWait{10000};
  static std::unique_ptr<BenchCache> open(const std::string& path, std::string* warning, std::string* error,
                                          std::chrono::milliseconds max_wait = kOpenWait);
  ~BenchCache();
  BenchCache(const BenchCache&) = delete;
  BenchCache& operator=(const BenchCache&) = delete;

  // Rows of a measurement of `key` made under a cap >= `cap` (the smallest such cap), or nullopt;
  // with `exact`, only under exactly `cap`. An empty vector is a valid answer (measured: nothing
  // fits).
  std::optional<std::vector<BenchRow>> lookup(const BenchKey& key, uint64_t cap, bool exact = false);
  // Replaces any measurement of `key` under exactly `cap`. False (and *error) on failure.
  bool store(const BenchKey& key, uint64_t cap, const std::vector<BenchRow>& rows, std::string* error = nullptr);

  const std::string& path() const { return path_; }

 private:
  BenchCache(sqlite3* db, std::string path);
  sqlite3* db_;
  std::string path_;
};

// $VCUDNN_CACHE semantics live in options; this is the default: $XDG_CACHE_HOME/vcudnn/bench.sqlite,
// else $HOME/.cache/vcudnn/bench.sqlite, else /tmp/vcudnn-<uid>/bench.sqlite.
std::string default_bench_cache_path();

}  // namespace vcudnn
