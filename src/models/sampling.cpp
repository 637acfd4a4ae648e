#include "models/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace dpt {

namespace {

bool greedy(const SamplingOptions& o) { return o.greedy || o.temperature == 0.0f || o.top_k == 1; }

}  // namespace

void check_sampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0f)
    throw InputError(fmt::format("--temperature {} is not a number >= 0", o.temperature));
  if (o.top_k < 0) throw InputError(fmt::format("--top-k {} is below 0", o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) throw InputError(fmt::format("--top-p {} is outside (0, 1]", o.top_p));
}

int32_t argmax_token(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<std::pair<int32_t, double>> sampling_candidates(const float* logits, int64_t V, const SamplingOptions& o) {
  check_sampling(o);
  if (V < 1) throw InputError("there are no logits to sample from");
  if (greedy(o)) return {{argmax_token(logits, V), 1.0}};
  // Scaled logits, most likely first, ties by id (a strict order, so the
  // candidates never depend on the sort's algorithm).
  std::vector<std::pair<int32_t, double>> c(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    c[static_cast<size_t>(i)] = {static_cast<int32_t>(i), static_cast<double>(logits[i]) / o.temperature};
  const auto before = [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  const size_t k = o.top_k > 0 && o.top_k < V ? static_cast<size_t>(o.top_k) : c.size();
  // Without top-k or top-p the order does not matter: ids in order.
  if (k < c.size() || o.top_p < 1.0f) {
    std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), before);
    c.resize(k);
  }
  // Softmax over the kept ones.
  double top = c.front().second;
  for (const auto& [id, x] : c) top = std::max(top, x);
  double sum = 0.0;
  for (auto& [id, p] : c) sum += (p = std::exp(p - top));
  for (auto& [id, p] : c) p /= sum;
  // Top-p: the shortest prefix whose probabilities reach top_p.
  if (o.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = 0;
    while (keep < c.size() && cum < static_cast<double>(o.top_p)) cum += c[keep++].second;
    c.resize(std::max<size_t>(keep, 1));
    for (auto& [id, p] : c) p /= cum;
  }
  return c;
}

int32_t pick(const std::vector<std::pair<int32_t, double>>& candidates, double u) {
  double cum = 0.0;
  for (const auto& [id, p] : candidates) {
    cum += p;
    if (u < cum) return id;
  }
  return candidates.back().first;  // u at the very top, past the rounding of the sum
}

TokenSampler::TokenSampler(SamplingOptions options, uint64_t seed) : o_(options), seed_(seed) { check_sampling(o_); }

int32_t TokenSampler::next(const float* logits, int64_t V) {
  const double u = counter_uniform(seed_, drawn_++);
  if (greedy(o_)) return argmax_token(logits, V);
  return pick(sampling_candidates(logits, V, o_), u);
}

}  // namespace dpt
