// Test helpers (see test_util.h).
#include "tests/common/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace vcudnn::test {

std::string exe_dir() { return std::filesystem::canonical("/proc/self/exe").parent_path().string(); }

std::string source_dir() {
  if (const char* s = std::getenv("VCUDNN_TEST_SOURCE_DIR"); s && *s) return s;
  return VCUDNN_SOURCE_DIR;  // the tree CMake configured, not a guess from where the binary is
}

std::string libvcudnn_path() { return exe_dir() + "/libvcudnn.so"; }

std::string python_executable() {
  const char* p = std::getenv("VCUDNN_TEST_PYTHON");
  return p && *p ? p : "python3";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// vcudnn's settings are never inherited (see run_process); the suite's own are.
bool inherited(const std::string& name) {
  if (!name.starts_with("VCUDNN_")) return true;
  return name.starts_with("VCUDNN_TEST_") || name == "VCUDNN_BUILD_DIR";
}

std::map<std::string, std::string> child_environment(const std::map<std::string, std::optional<std::string>>& set) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos && inherited(kv.substr(0, eq))) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : set) {
    if (v)
      env[k] = *v;
    else
      env.erase(k);
  }
  return env;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::optional<std::string>>& set, int timeout_s) {
  TempDir tmp;
  const std::string out_path = tmp.file("out"), err_path = tmp.file("err");
  const std::map<std::string, std::string> env = child_environment(set);
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ProcessResult result;
  if (rc != 0) {
    result.err = std::string("posix_spawnp(") + argv[0] + ") failed: " + std::strerror(rc);
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.err = "timed out after " + std::to_string(timeout_s) + " s\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(out_path);
  result.err += read_file(err_path);
  return result;
}

std::map<std::string, std::string> parse_env_output(const std::string& out) {
  std::map<std::string, std::string> env;
  std::string last;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      if (!last.empty()) env[last] += "\n" + line;
      continue;
    }
    last = line.substr(0, eq);
    env[last] = line.substr(eq + 1);
  }
  return env;
}

ScopedEnv::ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
  if (const char* v = std::getenv(name_.c_str())) old_ = v;
  if (value)
    ::setenv(name_.c_str(), value->c_str(), 1);
  else
    ::unsetenv(name_.c_str());
}

ScopedEnv::~ScopedEnv() {
  if (old_)
    ::setenv(name_.c_str(), old_->c_str(), 1);
  else
    ::unsetenv(name_.c_str());
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vcudnn-test-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> grep(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  return lines;
}

long long counter_value(const std::string& line, const std::string& key) {
  const std::string pat = key + "=";
  size_t pos = 0;
  while ((pos = line.find(pat, pos)) != std::string::npos) {
    if (pos == 0 || line[pos - 1] == ' ' || line[pos - 1] == '(') return std::atoll(line.c_str() + pos + pat.size());
    pos += pat.size();
  }
  return -1;
}

}  // namespace vcudnn::test
