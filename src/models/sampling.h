// Choosing the next token from a model's logits (dpt generate,
// docs/generate.md): greedy, or a draw at a temperature from the top-k
// tokens and the top-p nucleus, as Hugging Face's logits processors apply
// them (temperature, then top-k, then top-p), seeded: draw i of a sampler
// with seed s reads the counter-based uniform counter_uniform(s, i)
// (core/rng.h), so the same seed gives the same tokens, whatever came
// before in the process.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace dpt {

struct SamplingOptions {
  bool greedy = false;       // the largest logit (the first of equal ones); also temperature 0 or top-k 1
  float temperature = 1.0f;  // logits / temperature; > 0, or 0 for greedy
  int64_t top_k = 0;         // keep the k largest logits (0: all)
  float top_p = 1.0f;        // then the smallest set of the most likely tokens whose probabilities sum
                             // to at least top_p, in (0, 1] (1: all)
};

// InputError, one sentence naming the flag, for a temperature below 0 or
// not finite, a top-k below 0, a top-p outside (0, 1].
void check_sampling(const SamplingOptions& o);

// The index of the largest of logits[0, V) (the first of equal ones).
int32_t argmax_token(const float* logits, int64_t V);

// The tokens a draw can pick and their probabilities (summing to 1), after
// temperature, top-k and top-p: most likely first (ties by id) under top-k
// or top-p, else every id in order; one token when greedy.
std::vector<std::pair<int32_t, double>> sampling_candidates(const float* logits, int64_t V, const SamplingOptions& o);

// The token of a uniform u in [0, 1) over the candidates: the first whose
// cumulative probability exceeds u.
int32_t pick(const std::vector<std::pair<int32_t, double>>& candidates, double u);

class TokenSampler {
 public:
  TokenSampler(SamplingOptions options, uint64_t seed);
  // The next token for logits [V]: the seed's draw numbered by the draws
  // before it (0 first).
  int32_t next(const float* logits, int64_t V);

 private:
  SamplingOptions o_;
  uint64_t seed_;
  uint64_t drawn_ = 0;
};

}  // namespace dpt
