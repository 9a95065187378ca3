// Memory budgets as the user writes them (VCUDNN_DEVICE_BUDGET, VCUDNN_HOST_BUDGET).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace vcudnn::pool {

// The one parser of byte counts (every VCUDNN_* size: workspace limits and budgets): digits, then
// optionally spaces and a unit K/M/G/T (powers of 1024; "B", "KB", "KiB", any case); spaces around
// are ignored. nullopt for anything else: empty, negative, a fraction, junk, overflow. 0 parses as
// 0: the callers refuse it (no setting of vcudnn means anything with 0 bytes).
std::optional<uint64_t> parse_byte_count(std::string_view text);

// A memory budget: a byte count as above, above 0, or a percentage of `device_total` ("60%",
// "62.5%"; 0 < p <= 100). nullopt for anything else.
std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total);

}  // namespace vcudnn::pool
