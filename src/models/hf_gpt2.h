// Hugging Face's GPT-2 layout of weight files (docs/data.md, "Published
// weights"), beside the engine's own (nanoGPT's).
//
// The two differ in two ways:
//   - names: HF's `h.0.attn.c_attn.weight`, `wte.weight`, `ln_f.bias`, with
//     or without a `transformer.` prefix (GPT2LMHeadModel's state_dict has
//     it, the published model.safetensors does not); the engine's always
//     have it;
//   - the four matrices of each block (attn.c_attn, attn.c_proj, mlp.c_fc,
//     mlp.c_proj) are HF Conv1D weights, stored [in, out], where a Linear's
//     (the engine's) are [out, in].
// With the prefix the names are the same, so the layout is told by shape:
// h.0's c_attn.weight is [C, 3C] in HF's layout and [3C, C] in the engine's
// (--load-format overrides). HF files carry no hyper-parameters: they come
// from the engine's metadata if present, else config.json beside the file.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/safetensors.h"

namespace dpt {

class Model;

enum class WeightFormat { Auto, Dpt, Hf };
// "auto" (or "") | "dpt" | "hf"; InputError otherwise.
WeightFormat parse_weight_format(const std::string& s);

// Where the model's parameters are in one file.
struct WeightNames {
  bool hf = false;
  std::string prefix;  // HF only: "" or "transformer."
  // A GPT with a padded vocabulary (models/decoder.h): the rows of wte a file
  // holds, the true vocabulary; the model's further rows are padding, never
  // stored. 0: no padding.
  int64_t wte_rows = 0;
  // The file's name for the engine's slot `slot` ("transformer.h.0.ln_1.weight").
  std::string file_name(const std::string& slot) const;
  // True for a Conv1D weight in an HF file: stored as the transpose.
  bool transposed(const std::string& slot) const;
  // The file's shape for a slot of shape `shape`.
  std::vector<int64_t> file_shape(const std::string& slot, const std::vector<int64_t>& shape) const;
  // Elements of a slot the file stores: all of them but wte's pad rows.
  size_t stored(const std::string& slot, const std::vector<int64_t>& shape, size_t numel) const;
};

// The layout of a file whose tensors are `tensors`, for `model`: `format`
// if it is not Auto, else told by names and shapes as above (for writing,
// pass no tensors and Dpt or Hf). MLP files are always the engine's.
WeightNames weight_names(const Model& model, const std::vector<TensorSpec>& tensors, WeightFormat format);

// The engine's hyper-parameters of GPT-2's config.json (model_type "gpt2"
// or none): Hugging Face's n_layer, n_head, n_embd, n_positions, vocab_size
// (those present), with "dpt.model" = "gpt". `where` names the file.
std::map<std::string, std::string> gpt2_hparams_from_config(const nlohmann::json& config, const std::string& where);

// The hyper-parameters a weight file (a safetensors file, a sharded set's
// index or a directory: io/safetensors_set.h) describes: its __metadata__,
// and when that lacks the engine's "dpt.model", those of the config.json
// beside it if there is one, translated by its model_type (GPT-2's here,
// the Llama family's in models/hf_config.h) over the metadata.
std::map<std::string, std::string> weight_file_hparams(const std::string& path);

// The model's hyper-parameters for loading `path`: the file's (see above),
// then `flags` over them (a --model preset and sizes). InputError, one
// sentence, when neither says what the model is, or, for a GPT whose file
// has no "dpt.model", when none of the file's metadata, a config.json and
// the flags gives the head count (which no shape tells); the sentence says
// which of the engine's keys the file does carry.
std::map<std::string, std::string> hparams_for_file(const std::string& path,
                                                    const std::map<std::string, std::string>& flags);

}  // namespace dpt
