// A byte-level BPE tokenizer as GPT-2, Llama 3 and their kin ship it in a
// Hugging Face tokenizer.json (or GPT-2's vocab.json + merges.txt): added and
// special tokens, the pre-tokenizer's split (data/pretokenizer.h), bytes as
// characters (data/byte_level.h), merges by rank (data/bpe_model.h). Ids are
// those of `tokenizers`' encode(text, add_special_tokens=False). What it
// cannot represent is refused when loaded (data/tokenizer_json.cpp,
// docs/tokenizer.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe_model.h"
#include "data/pretokenizer.h"

namespace dpt {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool normalized = false;  // matched in the second pass, as tokenizers does
};

// Pre-tokens already merged, so a word seen again costs one lookup. One per
// thread: encode_batch gives each OpenMP thread its own.
class EncodeCache {
 public:
  static constexpr size_t kMaxPieceBytes = 256;  // longer pre-tokens are merged each time
  static constexpr size_t kMaxEntries = size_t{1} << 18;
  const std::vector<uint32_t>* find(std::string_view piece) const {
    const auto it = map_.find(piece);
    return it == map_.end() ? nullptr : &it->second;
  }
  void put(std::string_view piece, std::vector<uint32_t> ids);

 private:
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> map_;
};

class BpeTokenizer {
 public:
  // A tokenizer.json; a vocab.json with merges.txt beside it; or a directory
  // holding either. InputError naming the field for what is not supported.
  static BpeTokenizer load(const std::string& path);
  static BpeTokenizer from_json(const std::string& text, const std::string& name);
  static BpeTokenizer from_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

  // The ids of text, as tokenizers' encode(text, add_special_tokens=False):
  // added tokens' text becomes their ids, the rest is split and merged.
  // Invalid UTF-8 is read as Python's errors="replace" reads it.
  std::vector<uint32_t> encode(std::string_view text, EncodeCache* cache = nullptr) const;
  // The same with added tokens' text encoded as plain text, as llm.c and
  // tiktoken's encode_ordinary do for a corpus (a document quoting
  // "<|endoftext|>" must not end itself).
  std::vector<uint32_t> encode_ordinary(std::string_view text, EncodeCache* cache = nullptr) const;
  // encode_ordinary of each document, the documents in parallel (OpenMP).
  std::vector<std::vector<uint32_t>> encode_batch(const std::vector<std::string_view>& docs) const;

  // The bytes the ids stand for (added tokens as their text). InputError for
  // an id outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& ids) const;

  uint32_t vocab_size() const { return static_cast<uint32_t>(bytes_of_id_.size()); }  // largest id + 1
  std::optional<uint32_t> special_id(std::string_view content) const;
  // The token llm.c puts before each document: <|endoftext|> (GPT-2 style)
  // or <|begin_of_text|> (Llama 3 style); nullopt when there is neither.
  std::optional<uint32_t> delimiter() const;
  SplitPattern pattern() const { return pattern_; }

  // Set up by the loaders (data/tokenizer_json.cpp).
  BpeTokenizer(BpeModel model, SplitPattern pattern, std::vector<AddedToken> added);

 private:
  void encode_plain(std::string_view text, EncodeCache& cache, std::vector<uint32_t>& out) const;
  void encode_valid(std::string_view text, EncodeCache& cache, std::vector<uint32_t>& out) const;

  BpeModel model_;
  SplitPattern pattern_;
  std::vector<AddedToken> added_;  // longest first
  std::vector<std::string> bytes_of_id_;
};

}  // namespace dpt
