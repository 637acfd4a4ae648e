// The generation loop (dpt generate, docs/generate.md): a prompt through
// the decoder's key/value cache (Decoder::prefill), then a token sampled
// (models/sampling.h) and run through the cache (Decoder::step) at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/sampling.h"

namespace dpt {

struct Generation {
  std::vector<int32_t> tokens;  // the generated ids, an end-of-sequence one included
  double prompt_s = 0;          // the prefill's seconds
  double generate_s = 0;        // from its end to the last token sampled
  std::string stop;             // why it ended before max_new tokens ("at ..."), or empty
};

// Up to max_new tokens after `prompt`: ends early after a token of `eos`
// (which it includes) or when the sequence fills the model's context.
// on_token(id, is_eos), when set, sees each token as it is sampled. With
// no_cache every token's logits come from a full forward over the whole
// sequence so far (Decoder::logits) instead of the cache: what generation
// costs without one, for comparison (dpt generate --no-cache).
Generation generate(Decoder& model, const std::vector<int32_t>& prompt, int64_t max_new, TokenSampler& sampler,
                    const std::vector<int32_t>& eos = {},
                    const std::function<void(int32_t, bool)>& on_token = nullptr, bool no_cache = false);

}  // namespace dpt
