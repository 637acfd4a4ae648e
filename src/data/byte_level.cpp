#include "data/byte_level.h"

#include "data/utf8.h"

namespace dpt::byte_level {

namespace {

struct Tables {
  std::array<char32_t, 256> chars{};
  std::array<int16_t, 324> bytes{};  // by code point (all below U+0144); -1: none
};

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.bytes.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t.chars[b] = printable ? static_cast<char32_t>(b) : next++;
      t.bytes[t.chars[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

char32_t char_of(uint8_t b) { return tables().chars[b]; }

std::optional<std::string> to_bytes(std::string_view token) {
  if (!utf8::valid(token)) return std::nullopt;
  const Tables& t = tables();
  std::string out;
  for (size_t i = 0, len = 0; i < token.size(); i += len) {
    const char32_t cp = utf8::decode(token, i, len);
    if (cp >= t.bytes.size() || t.bytes[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.bytes[cp]);
  }
  return out;
}

}  // namespace dpt::byte_level
