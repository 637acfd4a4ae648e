#include "data/byte_level.h"

#include <array>

#include "data/utf8.h"

namespace dpt::byte_level {

namespace {

// The byte each character stands for, by code point (all below U+0144);
// -1: none.
using Bytes = std::array<int16_t, 324>;

const Bytes& bytes_of() {
  static const Bytes t = [] {
    Bytes t;
    t.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? static_cast<char32_t>(b) : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

std::optional<std::string> to_bytes(std::string_view token) {
  if (!utf8::valid(token)) return std::nullopt;
  const Bytes& bytes = bytes_of();
  std::string out;
  for (size_t i = 0, len = 0; i < token.size(); i += len) {
    const char32_t cp = utf8::decode(token, i, len);
    if (cp >= bytes.size() || bytes[cp] < 0) return std::nullopt;
    out += static_cast<char>(bytes[cp]);
  }
  return out;
}

}  // namespace dpt::byte_level
