// `vcudnn run` (see launcher.h): works out the environment, refuses what vcudnn cannot work under,
// and replaces itself with the command, so that the command's exit status and signals reach the
// caller unchanged.
#include "tools/launcher.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace vcudnn::launcher {
namespace {

namespace fs = std::filesystem;

constexpr const char* kAsyncBackend = "cudaMallocAsync";
// PyTorch reads its allocator settings from either name; which one wins depends on the version
// (2.9 reads PYTORCH_ALLOC_CONF first, later ones PYTORCH_CUDA_ALLOC_CONF), so both are checked
// and every one that is set gets the backend.
constexpr const char* kCudaAllocConf = "PYTORCH_CUDA_ALLOC_CONF";
constexpr const char* kAllocConf = "PYTORCH_ALLOC_CONF";

Environment current_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// Lower case, blanks removed: PyTorch's tokenizer ignores blanks.
std::string squeeze(std::string_view s) {
  std::string out;
  for (unsigned char c : s)
    if (!std::isspace(c)) out += static_cast<char>(std::tolower(c));
  return out;
}

// ---- the library and LD_PRELOAD

Result<std::string> library_path(const Request& request) {
  std::error_code ec;
  fs::path lib = request.library.empty() ? fs::canonical("/proc/self/exe", ec).parent_path() / "libvcudnn.so"
                                         : fs::absolute(request.library, ec);
  if (ec) return Error{fmt::format("cannot locate libvcudnn.so: {}", ec.message())};
  lib = lib.lexically_normal();
  const std::string s = lib.string();
  if (!fs::is_regular_file(lib, ec))
    return Error{fmt::format("{} not found{}", s, request.library.empty() ? " (next to vcudnn; use --library)" : "")};
  // The dynamic loader splits LD_PRELOAD at blanks and colons: such a path cannot be preloaded.
  if (s.find_first_of(" :\t") != std::string::npos)
    return Error{fmt::format("{} cannot be preloaded: LD_PRELOAD splits paths at blanks and colons", s)};
  return s;
}

std::vector<std::string> preload_entries(const std::string& value) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : value + ":") {
    if (c == ':' || c == ' ' || c == '\t') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return a == b || fs::equivalent(a, b, ec);
}

// vcudnn first (its hooks must win over other preloads), the user's entries after it, vcudnn once.
std::string preload_value(const std::string& library, const std::optional<std::string>& current) {
  std::string value = library;
  for (const auto& entry : preload_entries(current.value_or("")))
    if (!same_file(entry, library)) value += ":" + entry;
  return value;
}

// ---- the VCUDNN_* settings

Result<Options> check_options(const Environment& env) {
  std::vector<std::string> names;
  for (const auto& [name, value] : env)
    if (name.starts_with("VCUDNN_")) names.push_back(name);
  Options o = parse_options(
      [&env](const char* name) {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      names);
  if (o.errors.empty()) return o;
  std::string message;
  for (const auto& e : o.errors) message += "error: " + e + "\n";
  return Error{message + (o.errors.size() > 1 ? "with these settings" : "with this setting") +
               " vcudnn would only pass calls through"};
}

// Every policy that owns device memory has "offload" in its name (offload, microbatch+offload).
bool owns_device_memory(const Options& o) { return o.get(kPolicy).find("offload") != std::string::npos; }

// ---- PyTorch's allocator settings: "key:value,key:[a:b,c:d],..."

struct ConfEntry {
  std::string key;    // squeezed
  std::string value;  // as written
};

// The top-level entries: commas inside brackets belong to a value.
std::vector<ConfEntry> conf_entries(const std::string& conf) {
  std::vector<ConfEntry> out;
  std::string cur;
  int depth = 0;
  auto flush = [&] {
    const size_t colon = cur.find(':');
    if (!squeeze(cur).empty())
      out.push_back({squeeze(cur.substr(0, colon)), colon == cur.npos ? "" : cur.substr(colon + 1)});
    cur.clear();
  };
  for (char c : conf) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c == ',' && depth <= 0)
      flush();
    else
      cur += c;
  }
  flush();
  return out;
}

std::string strip_blanks(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  return s;
}

// Why vcudnn cannot own memory under this setting, if it cannot.
Status check_alloc_conf(const std::string& name, const std::string& conf, const std::string& policy) {
  for (const auto& e : conf_entries(conf)) {
    if (e.key == "expandable_segments" && squeeze(e.value) == "true")
      return Error{fmt::format(
          "{}=\"{}\" asks for expandable_segments, which VCUDNN_POLICY={} cannot work with: vcudnn must see "
          "each allocation to own it, and expandable segments map memory through the CUDA driver behind its "
          "back. Remove expandable_segments:True (vcudnn run sets backend:{} itself).",
          name, conf, policy, kAsyncBackend)};
    // backend:native, asked for explicitly, is kept: vcudnn then owns the caching allocator's
    // segments (CUDA graph trees, torch.compile's reduce-overhead, need it).
    if (e.key == "backend" && strip_blanks(e.value) != kAsyncBackend && strip_blanks(e.value) != "native")
      return Error{fmt::format(
          "{}=\"{}\" selects backend:{}, but VCUDNN_POLICY={} needs backend:{} (or backend:native): vcudnn must "
          "see each allocation to move a tensor to the host and back. Remove the backend entry (vcudnn run sets "
          "backend:{}).",
          name, conf, strip_blanks(e.value), policy, kAsyncBackend, kAsyncBackend)};
  }
  return ok_status();
}

std::string with_async_backend(const std::string& conf) {
  const auto entries = conf_entries(conf);
  if (std::any_of(entries.begin(), entries.end(), [](const ConfEntry& e) { return e.key == "backend"; })) return conf;
  const std::string entry = std::string("backend:") + kAsyncBackend;
  return entries.empty() ? entry : conf + "," + entry;
}

Status merge_alloc_conf(Environment& env, const std::string& policy) {
  bool any = false;
  for (const char* name : {kCudaAllocConf, kAllocConf}) {
    const auto conf = lookup(env, name);
    if (!conf) continue;
    any = true;
    if (Status s = check_alloc_conf(name, *conf, policy); !s) return s;
    env[name] = with_async_backend(*conf);
  }
  if (!any) env[kCudaAllocConf] = with_async_backend("");
  return ok_status();
}

// ---- output

// The names `vcudnn run` may change, in the order they are printed.
std::vector<std::string> managed_names() {
  std::vector<std::string> names{"LD_PRELOAD"};
  for (const auto& spec : option_specs()) names.emplace_back(spec.env);
  names.emplace_back(kCudaAllocConf);
  names.emplace_back(kAllocConf);
  return names;
}

// Quoted for a POSIX shell where needed, so that a dry run's command can be pasted.
std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::strchr("_-./:=@%+,", c);
  });
  if (plain) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";  // end the quote, an escaped quote, quote again
    else
      out += c;
  }
  return out + "'";
}

std::string command_line(const std::vector<std::string>& command) {
  std::string line;
  for (const auto& arg : command) {
    if (!line.empty()) line += ' ';
    line += shell_quote(arg);
  }
  return line;
}

void print_refusal(const std::string& message, const std::vector<std::string>& command) {
  std::istringstream lines(message);
  for (std::string line; std::getline(lines, line);) fmt::print(stderr, "vcudnn run: {}\n", line);
  fmt::print(stderr, "vcudnn run: not starting {}\n", command_line(command));
}

void print_summary(const std::vector<Setting>& settings) {
  std::string line;
  for (const auto& s : settings) {
    if (!line.empty()) line += ", ";
    line += s.name + "=" + s.value;
  }
  fmt::print(stderr, "vcudnn run: {}\n", line.empty() ? "environment unchanged" : line);
}

// Like a shell: 127 when the command is not there, 126 when it is but cannot run.
int exec_command(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) {
    fmt::print(stderr, "vcudnn run: {}: command not found\n", command[0]);
    return 127;
  }
  fmt::print(stderr, "vcudnn run: cannot execute {}: {}\n", command[0], std::strerror(err));
  return 126;
}

}  // namespace

std::string flag_name(const OptionSpec& spec) {
  std::string name = spec.env;
  if (name.starts_with("VCUDNN_")) name.erase(0, std::strlen("VCUDNN_"));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return c == '_' ? '-' : static_cast<char>(std::tolower(c)); });
  return "--" + name;
}

Result<std::vector<Setting>> plan(const Request& request, const Environment& env) {
  auto library = library_path(request);
  if (!library) return library.error();
  Environment next = env;
  next["LD_PRELOAD"] = preload_value(library.value(), lookup(env, "LD_PRELOAD"));
  for (const auto& spec : option_specs())
    if (request.options[spec.id]) next[spec.env] = *request.options[spec.id];
  auto checked = check_options(next);
  if (!checked) return checked.error();
  if (owns_device_memory(checked.value()))
    if (Status s = merge_alloc_conf(next, checked->get(kPolicy)); !s) return s.error();
  std::vector<Setting> settings;
  for (const auto& name : managed_names()) {
    const auto after = lookup(next, name);
    if (after && after != lookup(env, name)) settings.push_back({name, *after});
  }
  return settings;
}

int run(const Request& request) {
  auto settings = plan(request, current_environment());
  if (!settings) {
    print_refusal(settings.error().message, request.command);
    return 2;
  }
  if (request.dry_run) {
    for (const auto& s : settings.value()) fmt::print("{}={}\n", s.name, s.value);
    fmt::print("{}\n", command_line(request.command));
    return 0;
  }
  if (!request.quiet) print_summary(settings.value());
  for (const auto& s : settings.value()) ::setenv(s.name.c_str(), s.value.c_str(), 1);
  return exec_command(request.command);
}

}  // namespace vcudnn::launcher
