// UTF-8 as the tokenizer reads it: validity, Python's errors="replace"
// decoding (so a corpus with invalid bytes is read as `tokenizers` users read
// it in Python), and one code point at a time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dpt::utf8 {

// The length of the longest valid UTF-8 prefix of s (s.size() when valid).
size_t valid_prefix(std::string_view s);
inline bool valid(std::string_view s) { return valid_prefix(s) == s.size(); }

// The bytes of s that can be written out now, for text that arrives in
// pieces (a generated token's bytes at a time): all of s but a trailing
// sequence that is incomplete yet could still become valid (a lead byte
// and fewer continuation bytes than it announces). Invalid bytes are not
// held (they are written as they are).
size_t complete_prefix(std::string_view s);

// s with each maximal invalid subsequence replaced by U+FFFD, exactly as
// Python's s.decode("utf-8", errors="replace").encode() (the Unicode
// standard's "maximal subpart" practice).
std::string replace_invalid(std::string_view s);

// Decodes the code point at s[i] of valid UTF-8; sets len to its bytes.
inline char32_t decode(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  const auto c = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  if (b < 0x80) return len = 1, b;
  if (b < 0xE0) return len = 2, ((b & 0x1Fu) << 6) | c(1);
  if (b < 0xF0) return len = 3, ((b & 0x0Fu) << 12) | (c(1) << 6) | c(2);
  return len = 4, ((b & 0x07u) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
}

// Appends the UTF-8 encoding of cp.
void append(std::string& out, char32_t cp);

}  // namespace dpt::utf8
