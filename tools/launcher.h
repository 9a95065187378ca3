// `vcudnn run`: starts a command with libvcudnn.so preloaded and the VCUDNN_* settings given as
// options. Settings are checked the way the preloaded library will check them, so that a typo
// stops the launch instead of letting a long job run in pass-through.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/result.h"
#include "runtime/options.h"

namespace vcudnn::launcher {

using Environment = std::map<std::string, std::string>;

struct Request {
  std::string library;  // --library; empty: the libvcudnn.so next to the running `vcudnn`
  std::array<std::optional<std::string>, kOptionCount> options;  // only those given
  bool dry_run = false;
  bool quiet = false;
  std::vector<std::string> command;
};

// One variable `vcudnn run` changes, in the order they are printed.
struct Setting {
  std::string name;
  std::string value;
};

// The option's flag: VCUDNN_DEVICE_BUDGET -> "--device-budget".
std::string flag_name(const OptionSpec& spec);

// Every variable the request changes in `env` (only those whose value differs), or why the
// command must not start.
Result<std::vector<Setting>> plan(const Request& request, const Environment& env);

// Prints, sets and execs. Returns only when no command was exec'd: 0 after a dry run, 2 when the
// settings are refused, 127 or 126 when the command cannot be found or executed.
int run(const Request& request);

}  // namespace vcudnn::launcher
