// Byte-level BPE's model: a vocabulary of byte strings and the merges by
// rank, and the merging of one pre-token into ids.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dpt {

// std::string keys looked up by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using IdsByBytes = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // vocab: each entry's bytes and id (all 256 single bytes among them);
  // merges: in rank order, {left id, right id, id of the pair merged}. The loader
  // (data/tokenizer_json.cpp) has checked them.
  BpeModel(IdsByBytes vocab, const std::vector<std::array<uint32_t, 3>>& merges, bool ignore_merges);
  BpeModel() = default;

  // Appends the ids of one pre-token (raw bytes, non-empty): its bytes as
  // single-byte tokens, then the adjacent pair of lowest rank merged until
  // no pair has a merge (ties: the leftmost first), as `tokenizers` does.
  // With ignore_merges a pre-token that is itself in the vocabulary is that
  // one token (Llama 3). A priority queue over adjacent pairs and a linked
  // list of symbols: O(n log n) for n bytes.
  void merge(std::string_view piece, std::vector<uint32_t>& out) const;

  const IdsByBytes& vocab() const { return vocab_; }

 private:
  struct Merge {
    uint32_t rank, id;
  };
  const Merge* find(uint32_t left, uint32_t right) const {
    const auto it = merges_.find((uint64_t{left} << 32) | right);
    return it == merges_.end() ? nullptr : &it->second;
  }

  IdsByBytes vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank, merged id
  std::array<uint32_t, 256> byte_ids_{};
  bool ignore_merges_ = false;
};

}  // namespace dpt
