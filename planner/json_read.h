// Strict reads of JSON numbers for the files vcudnn reads back (traces, plans). nlohmann's get<T>()
// converts whatever number it finds: 1e30 into an integer is undefined behaviour, -5 into an
// unsigned one wraps, 3.7 truncates. These refuse all of that with the field's name.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace vcudnn::json_read {

[[noreturn]] inline void refuse(const nlohmann::json& j, const std::string& what, const std::string& why) {
  std::string shown = j.dump();
  if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
  throw nlohmann::json::other_error::create(501, what + ": " + why + ", got " + shown, &j);
}

// An integer of type T: a JSON integer (no fraction, no exponent form that is not integral) within T's range.
template <typename T>
T integer(const nlohmann::json& j, const std::string& what) {
  static_assert(std::is_integral_v<T>);
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) refuse(j, what, "out of range");
    return static_cast<T>(v);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) refuse(j, what, "negative");
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        refuse(j, what, "out of range");
    } else {
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<T>::max()))
        refuse(j, what, "out of range");
    }
    return static_cast<T>(v);
  }
  refuse(j, what, "not an integer");
}

template <typename T>
T integer_at(const nlohmann::json& object, const char* key) {
  return integer<T>(object.at(key), key);
}

// The integer at `key`, or `fallback` when the key is absent.
template <typename T>
T integer_or(const nlohmann::json& object, const char* key, T fallback) {
  const auto it = object.find(key);
  return it == object.end() ? fallback : integer<T>(*it, key);
}

// A finite number that fits T (double or float).
template <typename T>
T real(const nlohmann::json& j, const std::string& what) {
  static_assert(std::is_floating_point_v<T>);
  if (!j.is_number()) refuse(j, what, "not a number");
  const double v = j.get<double>();
  if (!std::isfinite(v) || std::fabs(v) > static_cast<double>(std::numeric_limits<T>::max()))
    refuse(j, what, "not a finite number in range");
  return static_cast<T>(v);
}

template <typename T>
T real_at(const nlohmann::json& object, const char* key) {
  return real<T>(object.at(key), key);
}

template <typename T>
T real_or(const nlohmann::json& object, const char* key, T fallback) {
  const auto it = object.find(key);
  return it == object.end() ? fallback : real<T>(*it, key);
}

inline bool boolean_or(const nlohmann::json& object, const char* key, bool fallback) {
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  if (!it->is_boolean()) refuse(*it, key, "not true or false");
  return it->get<bool>();
}

}  // namespace vcudnn::json_read
