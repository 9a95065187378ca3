// note_exception (barrier.h).
#include "runtime/barrier.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "runtime/log.h"

namespace vcudnn {
namespace {

std::atomic<uint64_t> g_caught{0};

}  // namespace

void note_exception(const char* where) noexcept {
  g_caught.fetch_add(1, std::memory_order_relaxed);
  try {
    try {
      throw;
    } catch (const std::exception& e) {
      VCUDNN_WARN_LIMITED("internal error in {}: {}; the call goes on as the real library would make it", where,
                          e.what());
    } catch (...) {
      VCUDNN_WARN_LIMITED("internal error in {}: an unknown exception; the call goes on as the real library would "
                          "make it",
                          where);
    }
  } catch (...) {
    // Logging itself failed (no memory): the count above still tells.
  }
}

void test_fault(const char* where) {
  static const std::string wanted = [] {
    const char* v = std::getenv("VCUDNN_TEST_THROW");
    return std::string(v ? v : "");
  }();
  if (!wanted.empty() && wanted == where) throw std::runtime_error(std::string("VCUDNN_TEST_THROW=") + where);
}

uint64_t exceptions_caught() noexcept { return g_caught.load(std::memory_order_relaxed); }

}  // namespace vcudnn
