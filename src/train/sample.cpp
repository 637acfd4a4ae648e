#include "train/sample.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/utf8.h"
#include "models/generate.h"

namespace dpt {

SampleText sample_text_setup(const TrainOptions& o, const DecoderConfig& c) {
  SampleText t;
  if (o.sample_tokenizer.empty()) {
    if (c.vocab != 256)
      throw InputError(fmt::format("--sample-every needs --tokenizer for a model of {} tokens (without one only a "
                                   "byte-level model, vocabulary 256, reads and writes raw bytes)",
                                   c.vocab));
    for (const char ch : o.sample_prompt) t.prompt.push_back(static_cast<unsigned char>(ch));
  } else {
    t.tokenizer = BpeTokenizer::load(o.sample_tokenizer);
    if (t.tokenizer->vocab_size() > static_cast<uint32_t>(c.vocab))
      throw InputError(fmt::format("--tokenizer {}'s {} tokens do not fit the model's vocabulary of {}",
                                   o.sample_tokenizer, t.tokenizer->vocab_size(), c.vocab));
    for (const uint32_t id : t.tokenizer->encode(o.sample_prompt)) t.prompt.push_back(static_cast<int32_t>(id));
  }
  if (t.prompt.empty()) throw InputError("--sample-prompt is empty");
  if (static_cast<int64_t>(t.prompt.size()) >= c.context)
    throw InputError(fmt::format("--sample-prompt's {} tokens do not fit below the model's context of {}",
                                 t.prompt.size(), c.context));
  return t;
}

size_t sample_bytes(const DecoderConfig& c, DType precision) {
  const Decoder whole(c);  // its layout; never allocated
  const size_t params = whole.param_count();
  return params * sizeof(float) + (precision == DType::BF16 ? params * sizeof(bf16) : 0) +
         whole.generation_bytes(c.context);
}

TrainingSamples::TrainingSamples(const TrainOptions& o, const DecoderConfig& config)
    : o_(o), config_(config), text_(sample_text_setup(o, config)) {}

std::string TrainingSamples::sample(Executor& executor, comm::ProcessGroup& pg, int64_t step) {
  const bool lead = pg.rank() == 0;
  if (lead && !whole_) {
    whole_ = std::make_unique<Decoder>(config_);
    whole_->set_precision(o_.precision);
  }
  pg.set_phase("sample");  // the ledger counts the gathers apart from the step's traffic
  // params(): writable, so the bf16 compute copy is made again from the new values.
  executor.gather_weights(lead ? whole_->params() : nullptr);
  std::string text;
  if (lead) text = sample(*whole_, step);
  pg.barrier();
  pg.set_phase("other");
  return text;
}

std::string TrainingSamples::sample(Decoder& whole, int64_t step) const {
  // The prompt and the new tokens fit the context (sample_text_setup leaves
  // one position at least).
  const int64_t room = config_.context - static_cast<int64_t>(text_.prompt.size()) + 1;
  TokenSampler sampler(SamplingOptions{}, counter_bits(o_.seed, static_cast<uint64_t>(step)));
  const Generation g = generate(whole, text_.prompt, std::min(o_.sample_tokens, room), sampler);
  std::string bytes;
  if (!text_.tokenizer) {
    bytes.assign(g.tokens.begin(), g.tokens.end());
  } else {
    // A model's vocabulary may be larger than its tokenizer's (padded rows):
    // a token the tokenizer lacks is shown as U+FFFD.
    for (const int32_t t : g.tokens)
      bytes += static_cast<uint32_t>(t) < text_.tokenizer->vocab_size()
                   ? text_.tokenizer->decode({static_cast<uint32_t>(t)})
                   : std::string("\xEF\xBF\xBD");
  }
  return utf8::replace_invalid(bytes);
}

}  // namespace dpt
