// One run of tests/pytorch/train_offload.py in its own process, as the [pytorch] tests drive it:
// the environment (PyTorch's cudaMallocAsync backend, cuDNN's graph API unless asked otherwise,
// vcudnn preloaded or not), the result JSON and vcudnn's log.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

namespace vcudnn::test {

struct TrainRun {
  std::string tag;
  ProcessResult proc;
  nlohmann::json result;  // null when the worker failed
  std::string log;        // vcudnn's log (preloaded runs)

  bool ok() const { return proc.exit_code == 0 && result.is_object(); }
  uint64_t stat(const char* key) const { return result.at("vcudnn").at(key).get<uint64_t>(); }
  // The most vcudnn mapped at once over the whole run (the first step and the steady state).
  uint64_t peak_mapped() const {
    return std::max(stat("peakMappedBytes"), result.at("vcudnn_first_step").at("peakMappedBytes").get<uint64_t>());
  }
  std::vector<double> losses() const { return result.at("loss_values").get<std::vector<double>>(); }
  std::string describe() const {
    std::ostringstream s;
    s << tag << ": exit " << proc.exit_code << "\n--- stdout\n" << proc.out << "--- stderr\n" << proc.err;
    if (!log.empty()) s << "--- vcudnn log\n" << log;
    return s.str();
  }
  std::string exit_line() const {
    const auto lines = grep(log, "exit: ");
    return lines.empty() ? std::string() : lines.back();
  }
};

struct TrainSpec {
  std::string model;
  int batch = 32;
  int steps = 4;
  std::vector<std::string> extra;  // more train_offload.py arguments
  std::map<std::string, std::optional<std::string>> env;  // on top of the base environment
};

// `vcudnn`: preload libvcudnn.so with these VCUDNN_* settings (log at info into the temp folder).
inline TrainRun train_model(const TrainSpec& spec, const std::string& tag, const TempDir& tmp,
                            std::optional<std::map<std::string, std::string>> vcudnn = std::nullopt) {
  std::map<std::string, std::optional<std::string>> env{{"LD_PRELOAD", std::nullopt},
                                                        {"TORCH_CUDNN_V8_API_DISABLED", std::nullopt},
                                                        {"PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"},
                                                        {"PYTHONUNBUFFERED", "1"}};
  for (const auto& [k, v] : spec.env) env[k] = v;
  if (vcudnn) {
    env["LD_PRELOAD"] = libvcudnn_path();
    env["VCUDNN_LOG_LEVEL"] = "info";
    env["VCUDNN_LOG_FILE"] = tmp.file(tag + ".log");
    for (const auto& [k, v] : *vcudnn) env[k] = v;
  }
  const std::string json_path = tmp.file(tag + ".json");
  std::vector<std::string> argv{python_executable(), source_dir() + "/tests/pytorch/train_offload.py", "--model",
                                spec.model, "--batch", std::to_string(spec.batch), "--steps",
                                std::to_string(spec.steps), "--seed", "0", "--json", json_path};
  argv.insert(argv.end(), spec.extra.begin(), spec.extra.end());
  TrainRun r{tag, run_process(argv, env, 900), nullptr, {}};
  if (vcudnn) r.log = read_file(tmp.file(tag + ".log"));
  if (r.proc.exit_code == 0) {
    auto parsed = nlohmann::json::parse(read_file(json_path), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) r.result = std::move(parsed);
  }
  return r;
}

inline double relative_gap(double a, double b) { return std::abs(a - b) / std::abs(a); }

// The largest relative gap between two runs' losses, step by step.
inline double max_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) gap = std::max(gap, relative_gap(a[i], b[i]));
  return gap;
}

}  // namespace vcudnn::test
