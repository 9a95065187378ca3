// parse_byte_count and parse_budget (budget.h).
#include "pool/budget.h"

#include <cctype>
#include <string>

namespace vcudnn::pool {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// Digits at the front of `text` (consumed); nullopt on none or overflow.
std::optional<uint64_t> take_digits(std::string_view* text) {
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text->size() && std::isdigit(static_cast<unsigned char>((*text)[i])); ++i) {
    const uint64_t d = static_cast<uint64_t>((*text)[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return std::nullopt;
    value = value * 10 + d;
  }
  if (i == 0) return std::nullopt;
  text->remove_prefix(i);
  return value;
}

}  // namespace

std::optional<uint64_t> parse_byte_count(std::string_view text) {
  text = trimmed(text);
  const std::optional<uint64_t> whole = take_digits(&text);
  if (!whole) return std::nullopt;
  std::string unit;
  for (char c : trimmed(text)) unit.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  const char* const units = "KMGT";
  for (int u = 0; u < 4; ++u) {
    const std::string one(1, units[u]);
    if (unit == one || unit == one + "B" || unit == one + "IB") shift = 10 * (u + 1);
  }
  if (shift < 0) return std::nullopt;
  if (shift > 0 && *whole > (UINT64_MAX >> shift)) return std::nullopt;
  return *whole << shift;
}

std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total) {
  text = trimmed(text);
  if (text.empty() || text.back() != '%') {
    const std::optional<uint64_t> bytes = parse_byte_count(text);
    if (!bytes || *bytes == 0) return std::nullopt;
    return bytes;
  }
  text.remove_suffix(1);
  text = trimmed(text);
  const std::optional<uint64_t> whole = take_digits(&text);
  if (!whole || *whole > 100) return std::nullopt;
  // Decimals: at most 9 digits.
  uint64_t fraction = 0;
  uint64_t scale = 1;
  if (!text.empty() && text.front() == '.') {
    text.remove_prefix(1);
    size_t n = 0;
    for (; n < text.size() && std::isdigit(static_cast<unsigned char>(text[n])); ++n) {
      if (n >= 9) return std::nullopt;
      fraction = fraction * 10 + static_cast<uint64_t>(text[n] - '0');
      scale *= 10;
    }
    if (n == 0) return std::nullopt;
    text.remove_prefix(n);
  }
  if (!text.empty()) return std::nullopt;
  const unsigned __int128 mantissa = static_cast<unsigned __int128>(*whole) * scale + fraction;  // p * scale
  if (mantissa == 0 || mantissa > static_cast<unsigned __int128>(100) * scale) return std::nullopt;
  const unsigned __int128 bytes = static_cast<unsigned __int128>(device_total) * mantissa / (100 * scale);
  if (bytes == 0) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

}  // namespace vcudnn::pool
