// `dpt train --sample-every N` (docs/generate.md): a short sample of the
// model's text at those steps, generated over the decoder's key/value cache
// (models/generate.h). Its refusals are check_samples' (train/run_checks.h).
#pragma once

#include <cstdint>
#include <string>

#include "models/model.h"
#include "train/train.h"

namespace dpt {

// The text of o.sample_tokens tokens after o.sample_prompt, sampled at
// temperature 1 with a seed of (o.seed, step): invalid UTF-8 replaced, so
// a terminal shows it whole.
std::string sample_text(const TrainOptions& o, Model& model, int64_t step);

}  // namespace dpt
