// The character classes the pre-tokenizers' split patterns use: \p{L}
// (general category L*), \p{N} (N*) and \s (the White_Space property), from
// a table generated from Python's unicodedata (scripts/gen_unicode_classes.py;
// kUnicodeVersion says which Unicode). Hugging Face `tokenizers` matches the
// same patterns with Oniguruma, whose classes follow the same definitions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpt::unicode {

enum class CharClass : uint8_t { Other, Letter, Number, Space };

struct ClassRange {
  char32_t first, last;
  CharClass cls;
};

extern const char* const kUnicodeVersion;
extern const ClassRange kClassRanges[];  // letters and numbers, sorted, disjoint
extern const size_t kClassRangeCount;
extern const ClassRange kWhiteSpace[];
extern const size_t kWhiteSpaceCount;

// The class of a code point (Other for anything outside the tables).
CharClass char_class(char32_t cp);

}  // namespace dpt::unicode
