// The pre-tokenizer's split: text into pre-tokens, each merged by BPE on its
// own. The two split patterns byte-level BPE tokenizers ship, matched by hand
// (std::regex is slow and knows no Unicode classes), with exactly the
// leftmost-first, backtracking semantics of the regular expressions:
//
//   Gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// (Llama 3's first line ends with "| ?[^..." : its fourth alternative begins
// with an optional space.) Classes: data/unicode_classes.h.
#pragma once

#include <cstddef>
#include <string_view>

namespace dpt {

enum class SplitPattern { Gpt2, Llama3 };

// The patterns as tokenizer.json writes them (Split's "pattern": {"Regex"}).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;

// The end of the pre-token that starts at byte i (< text.size()) of valid
// UTF-8 text: the regular expression's match at i.
size_t next_pretoken(SplitPattern p, std::string_view text, size_t i);

}  // namespace dpt
