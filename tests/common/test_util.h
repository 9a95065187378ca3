// Helpers shared by the test programs: where the build and source trees are (relative to the
// running executable, so that a build folder carried to another machine still works), running a
// child process with a modified environment, and temporary folders.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vcudnn::test {

// Folder of the running executable (build/bin).
std::string exe_dir();
// The source tree: $VCUDNN_TEST_SOURCE_DIR (a tree copied to another machine), else the one the
// build was configured from, wherever the build folder is.
std::string source_dir();
// build/bin/libvcudnn.so
std::string libvcudnn_path();

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out;
  std::string err;
};

// Runs argv[0] (searched in PATH) with the current environment, less every VCUDNN_* variable but
// the suite's own (VCUDNN_TEST_*, VCUDNN_BUILD_DIR), plus `set` (a value of nullopt removes the
// variable): a child sees only the vcudnn settings its test gives it, whatever the shell that
// runs the tests exports. Output is captured through files. `timeout_s` kills a hung child.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::optional<std::string>>& set = {}, int timeout_s = 300);

// `env`'s output (NAME=value lines) as a map; a line without '=' continues the previous value.
std::map<std::string, std::string> parse_env_output(const std::string& out);

// Sets (or, with nullopt, removes) a variable of the test process itself until the end of the
// scope, then restores it. Not thread-safe: only for tests that start no threads meanwhile.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A fresh folder under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path);

// $VCUDNN_TEST_PYTHON, else "python3".
std::string python_executable();

// Lines of `text` containing `needle`.
std::vector<std::string> grep(const std::string& text, const std::string& needle);

// The integer after "key=" in `line` (e.g. "conv_fwd=60"), or -1.
long long counter_value(const std::string& line, const std::string& key);

}  // namespace vcudnn::test
