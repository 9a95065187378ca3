// Note [Exception barrier]
// No C++ exception may leave an exported function: the host program was not written to expect one
// from a C library, and one escaping a hook would terminate it. Every hook runs vcudnn's own work
// through barrier(): an exception (std::bad_alloc, a JSON or SQLite error, std::map::at) is
// logged (rate-limited) and counted for the exit line, and the hook does what the real library
// would have done without vcudnn: it makes the real call, unchanged, if vcudnn had not made it
// yet; it returns the real call's status if vcudnn had made it; and it returns the library's
// out-of-memory or internal-error status when the real call was under way (re-running it could
// apply it twice) or vcudnn could not make the memory the call needs resident.
#pragma once

#include <cstdint>

namespace vcudnn {

// Call from inside a catch block: logs the exception in flight (what() when it is a
// std::exception), once per few at each `where`, and counts it.
void note_exception(const char* where) noexcept;
uint64_t exceptions_caught() noexcept;

// The tests' way to prove the barrier: throws std::runtime_error when VCUDNN_TEST_THROW names
// `where` (read once). Costs one load otherwise.
void test_fault(const char* where);

// f(); if it throws, fallback(); if that throws too, `last_resort`.
template <typename F, typename Fallback, typename R>
R barrier(const char* where, F&& f, Fallback&& fallback, R last_resort) noexcept {
  try {
    return f();
  } catch (...) {
    note_exception(where);
  }
  try {
    return fallback();
  } catch (...) {
    note_exception(where);
  }
  return last_resort;
}

}  // namespace vcudnn
