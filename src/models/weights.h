// Model weights in safetensors, under PyTorch's names and layouts, so they
// move between this engine and PyTorch both ways. The hyper-parameters go
// into __metadata__ (see make_model), so a file alone rebuilds its model.
//
// Two layouts of GPT files (models/hf_gpt2.h): the engine's own (nanoGPT's
// names, Linear weights [out, in]) and Hugging Face's GPT-2 (Conv1D weights
// [in, out], names with or without `transformer.`). Loading tells them apart
// by names and shapes unless a WeightFormat says which; saving writes
// either.
//
// The GPT's output projection is tied to transformer.wte.weight; files are
// written without lm_head.weight (safetensors refuses shared tensors), and a
// file that has one is accepted when it equals wte.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "models/hf_gpt2.h"
#include "models/model.h"

namespace dpt {

void save_weights(const Model& model, const std::string& path, WeightFormat format = WeightFormat::Dpt);

// Streams a model's weights into a file one unit at a time (a unit's
// parameters as they lie in the flat buffer, e.g. just gathered under
// ZeRO-3), in the engine's layout (Dpt) or HF's (Hf: no prefix, Conv1D
// weights transposed, the engine's metadata kept so the file rebuilds its
// model). Creating it checks the path (IoError) before any work.
class WeightWriter {
 public:
  WeightWriter(const std::string& path, const Model& model, WeightFormat format);
  // Units in order, each once.
  void write_unit(int unit, const float* values);
  void commit();

 private:
  const Model& model_;
  WeightNames names_;
  std::optional<SafetensorsWriter> file_;
  std::vector<float> scratch_;  // a transposed weight
};

// Copies every parameter from the file into the model. Throws InputError
// naming the tensor for a missing tensor, a shape that differs (both shapes
// given), an unexpected tensor, or an lm_head.weight unequal to wte.
void load_weights(Model& model, const SafetensorsFile& file, const std::string& path,
                  WeightFormat format = WeightFormat::Auto);

// Checks, from the header alone, that the file holds every parameter of the
// model in its shape and nothing unexpected (the same sentences as
// load_weights), and that an lm_head.weight equals the tied wte.
void check_weight_file(const Model& model, const SafetensorsReader& file, WeightFormat format = WeightFormat::Auto);

// Reads elements [begin, begin + n) of the model's flat parameter buffer
// from the file into out[0, n), touching only those bytes (for a transposed
// HF weight, one piece per stored row): a rank's shard under ZeRO-3. Call
// check_weight_file first.
void load_weight_range(const Model& model, const SafetensorsReader& file, size_t begin, size_t n, float* out,
                       WeightFormat format = WeightFormat::Auto);

// Builds the model the file describes (hparams_for_file: its metadata, or a
// config.json beside it; flags in `overrides` win) and loads its weights.
std::unique_ptr<Model> model_from_file(const std::string& path,
                                       const std::map<std::string, std::string>& overrides,
                                       WeightFormat format = WeightFormat::Auto);

}  // namespace dpt
