#include "train/sample.h"

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "data/utf8.h"
#include "models/decoder.h"
#include "models/generate.h"

namespace dpt {

std::string sample_text(const TrainOptions& o, Model& model, int64_t step) {
  auto& m = dynamic_cast<Decoder&>(model);
  std::vector<int32_t> prompt;
  for (const char c : o.sample_prompt) prompt.push_back(static_cast<unsigned char>(c));
  // The prompt and the new tokens fit the context (check_samples leaves one
  // position at least).
  const int64_t room = m.config().context - static_cast<int64_t>(prompt.size()) + 1;
  TokenSampler sampler(SamplingOptions{}, counter_bits(o.seed, static_cast<uint64_t>(step)));
  const Generation g = generate(m, prompt, std::min(o.sample_tokens, room), sampler);
  const std::string bytes(g.tokens.begin(), g.tokens.end());
  return utf8::replace_invalid(bytes);
}

}  // namespace dpt
