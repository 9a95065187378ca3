// Memory budgets as the user writes them (VCUDNN_DEVICE_BUDGET, VCUDNN_HOST_BUDGET).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace vcudnn::pool {

// A memory budget: bytes with an optional K/M/G/T suffix (powers of 1024; "B", "KB", "KiB", any
// case), or a percentage of `device_total` ("60%", "62.5%"; 0 < p <= 100). nullopt for anything
// else: empty, negative, junk, zero, over 100%, overflow.
std::optional<uint64_t> parse_budget(std::string_view text, uint64_t device_total);

}  // namespace vcudnn::pool
