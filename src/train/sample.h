// `dpt train --sample-every N` (docs/generate.md): a short sample of the
// model's text at those steps, generated over a key/value cache
// (models/generate.h) from the model as it stands after the step, under
// every layout. Its refusals are check_samples' (train/run_checks.h),
// which reads the prompt and tokenizer as this does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/bpe_tokenizer.h"
#include "models/decoder.h"
#include "train/executor.h"
#include "train/train.h"

namespace dpt {

// What samples are read and written with: --tokenizer (none: a byte-level
// model, whose tokens are bytes) and the prompt's ids. InputError, one
// sentence, for an unreadable or too large tokenizer, a model of another
// vocabulary without one, and a prompt that is empty or leaves no room in
// the context.
struct SampleText {
  std::optional<BpeTokenizer> tokenizer;
  std::vector<int32_t> prompt;
};
SampleText sample_text_setup(const TrainOptions& o, const DecoderConfig& c);

// Bytes rank 0 holds for samples under a layout that gathers the model
// (every one but naive dp): the whole model's fp32 parameters, their bf16
// compute copies in a bf16 run, and what generation allocates at most (the
// cache at the full context, a prompt chunk's activations). Training's
// memory check counts them.
size_t sample_bytes(const DecoderConfig& c, DType precision);

class TrainingSamples {
 public:
  // Every rank: reads the tokenizer and encodes the prompt. config: the
  // run's model (the whole model's, whatever slice or stage a rank holds).
  TrainingSamples(const TrainOptions& o, const DecoderConfig& config);
  // Collective over every rank of the job (pg: the world group): the whole
  // model's weights gathered into a Decoder of its own on rank 0 (made on
  // the first call, kept: sample_bytes), which generates while the others
  // wait at a barrier. The text on rank 0, empty elsewhere.
  std::string sample(Executor& executor, comm::ProcessGroup& pg, int64_t step);
  // The same from a whole model in hand (naive dp's master replica).
  std::string sample(Decoder& whole, int64_t step) const;

 private:
  const TrainOptions& o_;
  DecoderConfig config_;
  SampleText text_;
  std::unique_ptr<Decoder> whole_;  // rank 0
};

}  // namespace dpt
