// GPT-2's byte-to-unicode mapping: every byte as a printable character, so a
// vocabulary of byte strings can be written as text (tokenizer.json,
// vocab.json). Printable Latin-1 bytes stand for themselves; the other 68
// take the code points from U+0100 up, in byte order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dpt::byte_level {

// The bytes a vocabulary entry stands for; nullopt when a character is not
// one of the 256 (such an entry cannot come out of byte-level merges).
std::optional<std::string> to_bytes(std::string_view token);

}  // namespace dpt::byte_level
