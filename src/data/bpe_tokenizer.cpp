#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "data/utf8.h"

namespace dpt {

void EncodeCache::put(std::string_view piece, std::vector<uint32_t> ids) {
  // Bounded: a corpus of endless distinct words must not grow it forever.
  if (map_.size() >= kMaxEntries) map_.clear();
  map_.emplace(std::string(piece), std::move(ids));
}

BpeTokenizer::BpeTokenizer(BpeModel model, SplitPattern pattern, std::vector<AddedToken> added)
    : model_(std::move(model)), pattern_(pattern), added_(std::move(added)) {
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  uint32_t top = 0;
  for (const auto& [bytes, id] : model_.vocab()) top = std::max(top, id + 1);
  for (const AddedToken& t : added_) top = std::max(top, t.id + 1);
  bytes_of_id_.resize(top);
  for (const auto& [bytes, id] : model_.vocab()) bytes_of_id_[id] = bytes;
  for (const AddedToken& t : added_) bytes_of_id_[t.id] = t.content;
}

void BpeTokenizer::encode_plain(std::string_view text, EncodeCache& cache, std::vector<uint32_t>& out) const {
  for (size_t i = 0; i < text.size();) {
    const size_t end = next_pretoken(pattern_, text, i);
    const std::string_view piece = text.substr(i, end - i);
    i = end;
    if (piece.size() > EncodeCache::kMaxPieceBytes) {
      model_.merge(piece, out);
    } else if (const std::vector<uint32_t>* ids = cache.find(piece)) {
      out.insert(out.end(), ids->begin(), ids->end());
    } else {
      const size_t at = out.size();
      model_.merge(piece, out);
      cache.put(piece, std::vector<uint32_t>(out.begin() + static_cast<long>(at), out.end()));
    }
  }
}

namespace {

// Added tokens of one pass, longest first, and the bytes they start with
// (most positions of a text start none: one load rules them out).
struct AddedSet {
  std::vector<const AddedToken*> tokens;
  std::array<bool, 256> first{};
  void add(const AddedToken& t) {
    tokens.push_back(&t);
    first[static_cast<uint8_t>(t.content[0])] = true;
  }
};

// The leftmost match of the set in text from `from`, the longest at that
// position (tokenizers' leftmost-longest matching); {size, nullptr} if none.
std::pair<size_t, const AddedToken*> find_added(std::string_view text, size_t from, const AddedSet& set) {
  if (set.tokens.empty()) return {text.size(), nullptr};
  for (size_t p = from; p < text.size(); ++p) {
    if (!set.first[static_cast<uint8_t>(text[p])]) continue;
    for (const AddedToken* t : set.tokens)
      if (text.substr(p, t->content.size()) == t->content) return {p, t};
  }
  return {text.size(), nullptr};
}

}  // namespace

void BpeTokenizer::encode_valid(std::string_view text, EncodeCache& cache, std::vector<uint32_t>& out) const {
  // Two passes, as tokenizers splits: tokens matched on the raw text
  // (normalized false: the special tokens) first, then the others.
  AddedSet raw, normalized;
  for (const AddedToken& t : added_) (t.normalized ? normalized : raw).add(t);
  const auto second = [&](std::string_view seg) {
    for (size_t at = 0; at < seg.size();) {
      const auto [p, t] = find_added(seg, at, normalized);
      encode_plain(seg.substr(at, p - at), cache, out);
      if (!t) break;
      out.push_back(t->id);
      at = p + t->content.size();
    }
  };
  for (size_t at = 0; at < text.size();) {
    const auto [p, t] = find_added(text, at, raw);
    second(text.substr(at, p - at));
    if (!t) break;
    out.push_back(t->id);
    at = p + t->content.size();
  }
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text, EncodeCache* cache) const {
  EncodeCache local;
  std::vector<uint32_t> out;
  if (utf8::valid(text)) {
    encode_valid(text, cache ? *cache : local, out);
  } else {
    encode_valid(utf8::replace_invalid(text), cache ? *cache : local, out);
  }
  return out;
}

std::vector<uint32_t> BpeTokenizer::encode_ordinary(std::string_view text, EncodeCache* cache) const {
  EncodeCache local;
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  if (utf8::valid(text)) {
    encode_plain(text, cache ? *cache : local, out);
  } else {
    encode_plain(utf8::replace_invalid(text), cache ? *cache : local, out);
  }
  return out;
}

std::vector<std::vector<uint32_t>> BpeTokenizer::encode_batch(const std::vector<std::string_view>& docs) const {
  std::vector<std::vector<uint32_t>> out(docs.size());
  const auto n = static_cast<long>(docs.size());
#pragma omp parallel if (n > 1)
  {
    EncodeCache cache;
    // Dynamic: documents differ in length by orders of magnitude.
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < n; ++i) out[static_cast<size_t>(i)] = encode_ordinary(docs[static_cast<size_t>(i)], &cache);
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string out;
  for (const uint32_t id : ids) {
    if (id >= bytes_of_id_.size())
      throw InputError(fmt::format("token id {} is outside the vocabulary 0..{}", id, bytes_of_id_.size() - 1));
    out += bytes_of_id_[id];
  }
  return out;
}

std::optional<uint32_t> BpeTokenizer::special_id(std::string_view content) const {
  for (const AddedToken& t : added_)
    if (t.special && t.content == content) return t.id;
  return std::nullopt;
}

std::optional<uint32_t> BpeTokenizer::delimiter() const {
  if (auto id = special_id("<|endoftext|>")) return id;
  return special_id("<|begin_of_text|>");
}

}  // namespace dpt
