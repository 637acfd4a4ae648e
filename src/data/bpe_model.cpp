#include "data/bpe_model.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace dpt {

BpeModel::BpeModel(IdsByBytes vocab, const std::vector<std::array<uint32_t, 3>>& merges, bool ignore_merges)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    DPT_CHECK(it != vocab_.end(), "byte {} has no token", b);
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)
    // A pair listed twice keeps its first (lowest) rank, as tokenizers does.
    merges_.try_emplace((uint64_t{merges[r][0]} << 32) | merges[r][1], Merge{static_cast<uint32_t>(r), merges[r][2]});
}

namespace {

constexpr uint32_t kGone = ~uint32_t{0};

struct Symbol {
  uint32_t id;
  int32_t prev, next;
};

// A queued merge: rank in the high half, the left symbol's position in the
// low half, so the smallest key is the lowest rank, then the leftmost.
uint64_t key(uint32_t rank, size_t pos) { return (uint64_t{rank} << 32) | pos; }

}  // namespace

void BpeModel::merge(std::string_view piece, std::vector<uint32_t>& out) const {
  if (ignore_merges_)
    if (const auto it = vocab_.find(piece); it != vocab_.end()) return out.push_back(it->second);
  const size_t n = piece.size();
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  std::vector<uint64_t> heap;
  for (size_t i = 0; i + 1 < n; ++i)
    if (const Merge* m = find(sym[i].id, sym[i + 1].id)) heap.push_back(key(m->rank, i));
  const auto later = std::greater<uint64_t>();
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<size_t>(top & 0xFFFFFFFFu);
    Symbol& s = sym[pos];
    if (s.id == kGone || s.next < 0) continue;
    const Merge* m = find(s.id, sym[static_cast<size_t>(s.next)].id);
    // Stale: the pair queued here has since changed (a neighbour merged).
    if (!m || m->rank != static_cast<uint32_t>(top >> 32)) continue;
    Symbol& right = sym[static_cast<size_t>(s.next)];
    s.id = m->id;
    right.id = kGone;
    s.next = right.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = static_cast<int32_t>(pos);
    if (s.prev >= 0)
      if (const Merge* l = find(sym[static_cast<size_t>(s.prev)].id, s.id)) {
        heap.push_back(key(l->rank, static_cast<size_t>(s.prev)));
        std::push_heap(heap.begin(), heap.end(), later);
      }
    if (s.next >= 0)
      if (const Merge* r = find(s.id, sym[static_cast<size_t>(s.next)].id)) {
        heap.push_back(key(r->rank, pos));
        std::push_heap(heap.begin(), heap.end(), later);
      }
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
}

}  // namespace dpt
