// Checks on flags' values, each failing with one readable sentence. CLI11's
// own (PositiveNumber, Range) let NaN through (every comparison with NaN is
// false) and print their bounds with 300 digits; its delimiter drops empty
// items of a list ("a,,b" and "a," pass as if whole).
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

// A number in [lo, hi] (either end open when its flag says so), finite.
inline CLI::Validator number_check(double lo, double hi, bool lo_open, bool hi_open, std::string what) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0') return fmt::format("'{}' is not a number", s);
        const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        return ok ? std::string() : fmt::format("must be {}, not {}", what, s);
      },
      what);
}

inline CLI::Validator positive() { return number_check(0, INFINITY, true, true, "a positive number"); }
// A size in MiB (or MB) that becomes a byte count: positive and at most
// 2^30 MiB (1 PiB, past any host's memory or disk), so the bytes fit the
// 64-bit count the flag is converted to (1e30 would not: undefined).
inline CLI::Validator positive_mib() {
  return number_check(0, 0x1p30, true, false, "a positive size of at most 1073741824 MiB (1 PiB)");
}
// A timeout in seconds that becomes milliseconds: positive, at most 10^7 s
// (116 days).
inline CLI::Validator positive_seconds() {
  return number_check(0, 1e7, true, false, "a positive number of seconds, at most 10000000 (116 days)");
}
inline CLI::Validator non_negative() { return number_check(0, INFINITY, false, true, "a number >= 0"); }
inline CLI::Validator finite() { return number_check(-INFINITY, INFINITY, true, true, "a finite number"); }
inline CLI::Validator fraction(double lo, double hi) {
  return number_check(lo, hi, false, false, fmt::format("between {} and {}", lo, hi));
}
// [lo, hi): a fraction that must stay below hi (Adam's betas, below 1).
inline CLI::Validator fraction_below(double lo, double hi) {
  return number_check(lo, hi, false, true, fmt::format("at least {} and below {}", lo, hi));
}

// A comma-separated list's items, blanks around each trimmed; an empty one
// ("a,,b", "a,", "") is refused: "<flag> '<s>': an empty <what> in the list".
inline std::vector<std::string> split_list(const std::string& s, const char* flag, const char* what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(',', start);
    std::string item = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) throw InputError(fmt::format("{} '{}': an empty {} in the list", flag, s, what));
    out.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace dpt
