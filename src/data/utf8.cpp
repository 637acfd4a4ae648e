#include "data/utf8.h"

#include <cstdint>
#include <cstring>

namespace dpt::utf8 {

namespace {

// How many bytes follow lead byte b, and the range its first continuation
// byte must fall in (narrower after E0, ED, F0, F4: no overlong forms, no
// surrogates, nothing above U+10FFFF). 0 continuation bytes: not a lead.
struct Lead {
  int follow;
  unsigned char lo, hi;
};

Lead lead(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {0, 0, 0};
}

// The bytes of the sequence at s[i]: its length when valid, else -(the
// maximal subpart's length), the bytes one U+FFFD replaces.
long sequence(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  const Lead l = lead(b);
  if (l.follow == 0) return -1;
  unsigned char lo = l.lo, hi = l.hi;
  size_t j = i + 1;
  for (int k = 0; k < l.follow; ++k, ++j) {
    if (j >= s.size()) return -static_cast<long>(j - i);
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < lo || c > hi) return -static_cast<long>(j - i);
    lo = 0x80, hi = 0xBF;
  }
  return static_cast<long>(j - i);
}

}  // namespace

size_t valid_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII eight bytes at a time: most text is.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const long n = sequence(s, i);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return s.size();
}

std::string replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t ok = valid_prefix(s.substr(i));
    out.append(s.substr(i, ok));
    i += ok;
    if (i >= s.size()) break;
    out.append("\xEF\xBF\xBD");  // U+FFFD
    i += static_cast<size_t>(-sequence(s, i));
  }
  return out;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Whether s[i..] is the start of a multi-byte sequence that lacks bytes.
bool incomplete_tail(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t len = b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
  if (len == 0 || s.size() - i >= len) return false;
  for (size_t j = i + 1; j < s.size(); ++j)
    if ((static_cast<unsigned char>(s[j]) & 0xC0) != 0x80) return false;
  return true;
}

}  // namespace

size_t complete_prefix(std::string_view s) {
  size_t i = 0;
  while (true) {
    i += valid_prefix(s.substr(i));
    if (i == s.size() || incomplete_tail(s, i)) return i;
    ++i;  // an invalid byte goes out as it is
  }
}

}  // namespace dpt::utf8
