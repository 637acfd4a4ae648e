#include "data/unicode_classes.h"

#include <algorithm>
#include <array>

namespace dpt::unicode {

namespace {

// The Basic Multilingual Plane as one byte per code point, built once from
// the ranges: nearly every character of real text is classified by one load.
constexpr char32_t kTableSize = 0x10000;

std::array<CharClass, kTableSize> build_table() {
  std::array<CharClass, kTableSize> t{};
  for (const ClassRange* list : {kClassRanges, kWhiteSpace}) {
    const size_t n = list == kClassRanges ? kClassRangeCount : kWhiteSpaceCount;
    for (size_t i = 0; i < n; ++i)
      for (char32_t c = list[i].first; c <= list[i].last && c < kTableSize; ++c) t[c] = list[i].cls;
  }
  return t;
}

}  // namespace

CharClass char_class(char32_t cp) {
  static const std::array<CharClass, kTableSize> table = build_table();
  if (cp < kTableSize) return table[cp];
  // Above the BMP there is no white space; letters and numbers by search.
  const ClassRange* end = kClassRanges + kClassRangeCount;
  const ClassRange* r = std::upper_bound(kClassRanges, end, cp,
                                         [](char32_t c, const ClassRange& x) { return c < x.first; });
  if (r == kClassRanges) return CharClass::Other;
  --r;
  return cp <= r->last ? r->cls : CharClass::Other;
}

}  // namespace dpt::unicode
