// Process (process.h).
#include "runtime/process.h"

#include <cstdlib>
#include <mutex>

#include "runtime/backend_shadow.h"
#include "runtime/barrier.h"
#include "runtime/collectives.h"
#include "runtime/cuda_driver.h"
#include "runtime/entry_points.h"
#include "runtime/engine.h"
#include "runtime/log.h"
#include "runtime/memory/startup.h"
#include "runtime/memory_manager.h"
#include "runtime/no_destroy.h"

namespace vcudnn {
namespace {

memory::Started& memory_part() {
  static NoDestroy<memory::Started> started(memory::start(options()));
  return started.get();
}

}  // namespace

Process& Process::get() {
  static NoDestroy<Process> process;
  return process.get();
}

Process::Process() : features_(features_of(options().policy)) {}

Engine& Process::engine() {
  static NoDestroy<Engine> engine([this] {
    const Options& o = options();
    log::configure_once(o);
    started();
    return o;
  }());
  engine_.store(&engine.get(), std::memory_order_release);
  return engine.get();
}

memory::MemoryManager* Process::memory() {
  if (!features_.own_memory) return nullptr;
  memory::MemoryManager* m = memory_part().manager;
  // The first time only (a plain load on every later call: this is on every hook's path).
  if (m && manager_.load(std::memory_order_acquire) != m && !manager_.exchange(m)) {
    started();
    // Note [A recorder without cuDNN calls]: the engine, which owns the recorder, starts with
    // memory ownership, so that a program that never calls cuDNN (a transformer) still has its
    // allocations, frees, launches and library calls recorded, an iteration found and a plan.
    if (features_.record) engine();
    if (memory::OpSink* sink = sink_.load()) m->set_sink(sink);
  }
  return m;
}

void Process::connect_recorder(memory::OpSink* sink) {
  sink_.store(sink);
  if (memory::MemoryManager* m = manager_.load()) m->set_sink(sink);
}

int Process::memory_device() { return features_.own_memory ? memory_part().device : -1; }

void Process::started() {
  static std::once_flag once;
  // Registered after CUDA and the framework registered theirs (atexit runs in reverse order), so
  // CUDA is still usable when the line is printed.
  std::call_once(once, [] { std::atexit(at_exit); });
}

std::string Process::exit_line() {
  std::string line = "exit: ";
  Engine* e = engine_.load(std::memory_order_acquire);
  line += e ? e->summary() : "no cuDNN calls";
  const BackendShadow& shadow = backend_shadow();
  uint64_t graph_executions = 0;
  for (size_t k = 0; k < static_cast<size_t>(GraphKind::kCount); ++k)
    graph_executions += shadow.executions(static_cast<GraphKind>(k));
  if (graph_executions) line += "; " + shadow.summary();
  if (features_.own_memory) {
    if (const memory::MemoryManager* m = memory_part().manager) {
      line += "; memory: " + m->summary() + " untracked_launches=" + std::to_string(cuda::untracked_launches()) + " " +
              entry_points::summary();
      if (const uint64_t n = collectives::reported())  // Note [Collectives queue their work at the group's end]
        line += " nccl_collectives=" + std::to_string(n) +
                " nccl_at_group_ends=" + std::to_string(collectives::reported_at_group_ends());
    }
  }
  if (uint64_t n = exceptions_caught()) line += "; " + std::to_string(n) + " internal errors caught (calls passed through)";
  if (uint64_t n = log::suppressed_count()) line += "; " + std::to_string(n) + " repeated warnings suppressed";
  return line;
}

void Process::at_exit() {
  try {
    Process& p = get();
    if (Engine* e = p.engine_.load(std::memory_order_acquire)) e->finish();
    VCUDNN_LOG_INFO("{}", p.exit_line());
    if (p.features_.own_memory) {
      if (const memory::MemoryManager* m = memory_part().manager) memory::write_access_log(*m);
    }
  } catch (...) {
  }
}

}  // namespace vcudnn
