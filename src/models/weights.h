// Model weights in safetensors, under PyTorch's names and layouts, so they
// move between this engine and PyTorch both ways. The hyper-parameters go
// into __metadata__ (see make_model), so a file alone rebuilds its model.
//
// The GPT's output projection is tied to transformer.wte.weight; files are
// written without lm_head.weight (safetensors refuses shared tensors), and a
// file that has one is accepted when it equals wte.
#pragma once

#include <memory>
#include <string>

#include "io/safetensors.h"
#include "models/model.h"

namespace dpt {

void save_weights(const Model& model, const std::string& path);

// Copies every parameter from the file into the model. Throws InputError
// naming the tensor for a missing tensor, a shape that differs (both shapes
// given), an unexpected tensor, or an lm_head.weight unequal to wte.
void load_weights(Model& model, const SafetensorsFile& file, const std::string& path);

// Checks, from the header alone, that the file holds every parameter of the
// model in its shape and nothing unexpected (the same sentences as
// load_weights), and that an lm_head.weight equals the tied wte.
void check_weight_file(const Model& model, const SafetensorsReader& file);

// Reads elements [begin, begin + n) of the model's flat parameter buffer
// from the file into out[0, n), touching only those bytes: a rank's shard
// under ZeRO-3. Call check_weight_file first.
void load_weight_range(const Model& model, const SafetensorsReader& file, size_t begin, size_t n, float* out);

// Builds the model the file's metadata describes (flags in `overrides` win)
// and loads its weights.
std::unique_ptr<Model> model_from_file(const std::string& path,
                                       const std::map<std::string, std::string>& overrides);

}  // namespace dpt
