// parse_budget (budget.h).
#include "pool/budget.h"

#include <cctype>
#include <string>

namespace vcudnn::pool {

std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total) {
  size_t i = 0;
  uint64_t whole = 0;
  size_t digits = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) return std::nullopt;
    whole = whole * 10 + d;
  }
  if (digits == 0) return std::nullopt;
  // Decimals: percentages only; at most 9 digits.
  uint64_t fraction = 0;
  uint64_t scale = 1;
  bool has_point = false;
  if (i < text.size() && text[i] == '.') {
    has_point = true;
    ++i;
    size_t n = 0;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++n) {
      if (n >= 9) return std::nullopt;
      fraction = fraction * 10 + static_cast<uint64_t>(text[i] - '0');
      scale *= 10;
    }
    if (n == 0) return std::nullopt;
  }
  const std::string_view rest = text.substr(i);
  if (rest == "%") {
    if (whole > 100) return std::nullopt;
    const unsigned __int128 mantissa = static_cast<unsigned __int128>(whole) * scale + fraction;  // p * scale
    if (mantissa == 0 || mantissa > static_cast<unsigned __int128>(100) * scale) return std::nullopt;
    const unsigned __int128 bytes = static_cast<unsigned __int128>(device_total) * mantissa / (100 * scale);
    if (bytes == 0) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  if (has_point) return std::nullopt;
  std::string s;
  for (char c : rest) s.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  int shift = -1;
  if (s.empty() || s == "B") shift = 0;
  const char* const units = "KMGT";
  for (int u = 0; u < 4; ++u) {
    const std::string unit(1, units[u]);
    if (s == unit || s == unit + "B" || s == unit + "IB") shift = 10 * (u + 1);
  }
  if (shift < 0 || whole == 0) return std::nullopt;
  if (shift > 0 && whole > (UINT64_MAX >> shift)) return std::nullopt;
  return whole << shift;
}

}  // namespace vcudnn::pool
