#include "models/generate.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

namespace {

// The last position's logits of a full forward over `seq`.
std::vector<float> full_forward_logits(Decoder& m, const std::vector<int32_t>& seq) {
  if (static_cast<int64_t>(seq.size()) > m.config().context)
    throw InputError(fmt::format("the prompt's {} tokens do not fit the model's context of {} positions", seq.size(),
                                 m.config().context));
  Batch b;
  b.B = 1;
  b.T = static_cast<int64_t>(seq.size());
  b.tokens = seq;
  const std::vector<float> all = m.logits(b);
  return std::vector<float>(all.end() - m.config().vocab, all.end());
}

}  // namespace

Generation generate(Decoder& m, const std::vector<int32_t>& prompt, int64_t max_new, TokenSampler& sampler,
                    const std::vector<int32_t>& eos, const std::function<void(int32_t, bool)>& on_token,
                    bool no_cache) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  Generation g;
  std::vector<int32_t> seq = prompt;  // what the model has read
  Clock::time_point t0 = Clock::now();
  std::vector<float> logits = no_cache ? full_forward_logits(m, seq) : m.prefill(prompt);
  g.prompt_s = since(t0);
  t0 = Clock::now();
  const int64_t V = m.config().vocab, T = m.config().context;
  while (static_cast<int64_t>(g.tokens.size()) < max_new) {
    const int32_t t = sampler.next(logits.data(), V);
    g.tokens.push_back(t);
    const bool end = std::find(eos.begin(), eos.end(), t) != eos.end();
    if (on_token) on_token(t, end);
    if (end) {
      g.stop = fmt::format("at end-of-sequence token {}", t);
      break;
    }
    if (static_cast<int64_t>(g.tokens.size()) == max_new) break;
    if (static_cast<int64_t>(seq.size()) == T) {
      g.stop = fmt::format("at the model's context of {} positions", T);
      break;
    }
    seq.push_back(t);
    logits = no_cache ? full_forward_logits(m, seq) : m.step(t);
  }
  g.generate_s = since(t0);
  return g;
}

}  // namespace dpt
