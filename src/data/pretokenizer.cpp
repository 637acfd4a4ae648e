#include "data/pretokenizer.h"

#include "data/unicode_classes.h"
#include "data/utf8.h"

namespace dpt {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using unicode::CharClass;

struct Char {
  char32_t cp;
  size_t len;
  CharClass cls;
};

// ASCII classes without a lookup in the big table (most text is ASCII).
CharClass ascii_class(unsigned char b) {
  if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return CharClass::Letter;
  if (b >= '0' && b <= '9') return CharClass::Number;
  if (b == ' ' || (b >= 9 && b <= 13)) return CharClass::Space;
  return CharClass::Other;
}

Char at(std::string_view t, size_t i) {
  const auto b = static_cast<unsigned char>(t[i]);
  if (b < 0x80) return {b, 1, ascii_class(b)};
  size_t len;
  const char32_t cp = utf8::decode(t, i, len);
  return {cp, len, unicode::char_class(cp)};
}

// The end of the run of class `cls` from i, at most `max` characters.
size_t run(std::string_view t, size_t i, CharClass cls, size_t max = ~size_t{0}) {
  for (size_t n = 0; i < t.size() && n < max; ++n) {
    const Char c = at(t, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

// 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at i - 1: the end, or 0.
// Case-insensitive matching folds as Oniguruma does: 'S and U+017F (long s)
// match 's.
size_t contraction(std::string_view t, size_t i, bool fold) {
  const auto ch = [&](size_t k) -> char { return i + k < t.size() ? t[i + k] : '\0'; };
  const auto is = [&](size_t k, char lower) {
    const char c = ch(k);
    return c == lower || (fold && c == lower - ('a' - 'A'));
  };
  if (is(0, 's') || is(0, 't') || is(0, 'm') || is(0, 'd')) return i + 1;
  if (fold && ch(0) == '\xC5' && ch(1) == '\xBF') return i + 2;  // U+017F
  if ((is(0, 'r') && is(1, 'e')) || (is(0, 'v') && is(1, 'e')) || (is(0, 'l') && is(1, 'l'))) return i + 2;
  return 0;
}

// \s+(?!\S)|\s+ at white space i: the run, less its last character when
// something other than white space follows and the run has two or more.
size_t space_run(std::string_view t, size_t i) {
  size_t last = i, j = i;
  while (j < t.size()) {
    const Char c = at(t, j);
    if (c.cls != CharClass::Space) break;
    last = j;
    j += c.len;
  }
  if (j == t.size() || last == i) return j;
  return last;
}

size_t gpt2(std::string_view t, size_t i) {
  const Char c = at(t, i);
  if (c.cp == '\'')
    if (const size_t e = contraction(t, i + 1, false)) return e;
  // ` ?` before a letter, number or other run.
  size_t j = i;
  Char d = c;
  if (c.cp == ' ' && i + 1 < t.size()) d = at(t, j = i + 1);
  if (d.cls != CharClass::Space) return run(t, j, d.cls);
  return space_run(t, i);
}

// [^\s\p{L}\p{N}]+[\r\n]* from j.
size_t others_then_newlines(std::string_view t, size_t j) {
  j = run(t, j, CharClass::Other);
  while (j < t.size() && (t[j] == '\r' || t[j] == '\n')) ++j;
  return j;
}

// \s*[\r\n]+ at white space i: up to the run's last \r or \n (the greedy
// \s* backs off to it), or 0 when the run has none.
size_t spaces_to_newline(std::string_view t, size_t i) {
  size_t end = 0;
  for (size_t j = i; j < t.size();) {
    const Char c = at(t, j);
    if (c.cls != CharClass::Space) break;
    j += c.len;
    if (c.cp == '\r' || c.cp == '\n') end = j;
  }
  return end;
}

size_t llama3(std::string_view t, size_t i) {
  const Char c = at(t, i);
  if (c.cp == '\'')
    if (const size_t e = contraction(t, i + 1, true)) return e;
  if (c.cls == CharClass::Letter) return run(t, i, CharClass::Letter);
  // [^\r\n\p{L}\p{N}]\p{L}+: one character of anything else before letters.
  if (c.cls != CharClass::Number && c.cp != '\r' && c.cp != '\n' && i + c.len < t.size()) {
    const Char d = at(t, i + c.len);
    if (d.cls == CharClass::Letter) return run(t, i + c.len, CharClass::Letter);
  }
  if (c.cls == CharClass::Number) return run(t, i, CharClass::Number, 3);
  if (c.cls == CharClass::Other) return others_then_newlines(t, i);
  if (c.cp == ' ' && i + 1 < t.size() && at(t, i + 1).cls == CharClass::Other) return others_then_newlines(t, i + 1);
  if (const size_t e = spaces_to_newline(t, i)) return e;
  return space_run(t, i);
}

}  // namespace

size_t next_pretoken(SplitPattern p, std::string_view text, size_t i) {
  return p == SplitPattern::Gpt2 ? gpt2(text, i) : llama3(text, i);
}

}  // namespace dpt
