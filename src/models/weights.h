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
//
// "The file" is a SafetensorsSet (io/safetensors_set.h): one safetensors
// file, or Hugging Face's sharded set (model.safetensors.index.json and its
// shards), or a directory holding either; every function here reads both
// the same way, ZeRO-3's ranges included.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "models/hf_gpt2.h"
#include "models/model.h"

namespace dpt {

// Hugging Face's default cap per shard (save_pretrained's max_shard_size,
// "5GB"): what a sharded save uses when no cap is given.
inline constexpr uint64_t kDefaultShardBytes = 5'000'000'000;

// How weights are written: their layout, a cap on each file's tensor bytes
// (a sharded set; 0: one file unless the path names an index), and the
// tensors' type (bf16 or fp16 halve the files; loading converts any of the
// three to fp32).
struct SaveOptions {
  WeightFormat format = WeightFormat::Dpt;
  uint64_t shard_bytes = 0;
  DType dtype = DType::F32;
};

// Writes the model's weights to path: one file, or, when max_shard_bytes is
// not 0 or path names an index ("<stem>.safetensors.index.json"), a sharded
// set of files of at most max_shard_bytes of data each (kDefaultShardBytes
// when 0), named as Hugging Face names them (io/safetensors_set.h).
void save_weights(const Model& model, const std::string& path, WeightFormat format = WeightFormat::Dpt,
                  uint64_t max_shard_bytes = 0);
void save_weights(const Model& model, const std::string& path, const SaveOptions& options);

// True when save_weights(path, max_shard_bytes) writes a sharded set.
bool sharded_save(const std::string& path, uint64_t max_shard_bytes);

// Streams a model's weights into a file (or a sharded set, as save_weights
// decides) one unit at a time (a unit's parameters as they lie in the flat
// buffer, e.g. just gathered under ZeRO-3), in the engine's layout (Dpt) or
// HF's (Hf: no prefix, Conv1D weights transposed, the engine's metadata kept
// so the file rebuilds its model). Creating it checks the path (IoError)
// before any work.
class WeightWriter {
 public:
  WeightWriter(const std::string& path, const Model& model, WeightFormat format, uint64_t max_shard_bytes = 0)
      : WeightWriter(path, model, SaveOptions{format, max_shard_bytes, DType::F32}) {}
  WeightWriter(const std::string& path, const Model& model, const SaveOptions& options);
  // Units in order, each once.
  void write_unit(int unit, const float* values);
  void commit();

 private:
  void put(const float* values, size_t n);

  const Model& model_;
  WeightNames names_;
  std::optional<SafetensorsWriter> file_;            // one file
  std::unique_ptr<ShardedSafetensorsWriter> shards_;  // or a sharded set
  std::vector<float> scratch_;  // a transposed weight
};

// Copies every parameter from the file into the model, reading each tensor
// where it lies (no copy of the whole file). Throws InputError naming the
// tensor for a missing tensor, a shape that differs (both shapes given), an
// unexpected tensor, or an lm_head.weight unequal to wte.
void load_weights(Model& model, const SafetensorsSet& file, WeightFormat format = WeightFormat::Auto);
// The same from a path: a file, an index or a directory.
void load_weights(Model& model, const std::string& path, WeightFormat format = WeightFormat::Auto);

// Checks, from the header alone, that the file holds every parameter of the
// model in its shape and nothing unexpected (the same sentences as
// load_weights), and that an lm_head.weight equals the tied wte.
void check_weight_file(const Model& model, const SafetensorsSet& file, WeightFormat format = WeightFormat::Auto);

// Reads elements [begin, begin + n) of the model's flat parameter buffer
// from the file into out[0, n), touching only those bytes (for a transposed
// HF weight, one piece per stored row): a rank's shard under ZeRO-3. Call
// check_weight_file first.
void load_weight_range(const Model& model, const SafetensorsSet& file, size_t begin, size_t n, float* out,
                       WeightFormat format = WeightFormat::Auto);

// What a Hugging Face save writes beside a "llama" model's weights (at
// path: a file, an index or a directory): its config.json
// (models/hf_config.h, write_hf_config), so the directory loads in
// transformers as a checkpoint of theirs does. Nothing for another model
// or for format Dpt.
void save_hf_config(const Model& model, const std::string& path, WeightFormat format);

// Builds the model the file describes (hparams_for_file: its metadata, or a
// config.json beside it; flags in `overrides` win) and loads its weights.
std::unique_ptr<Model> model_from_file(const std::string& path,
                                       const std::map<std::string, std::string>& overrides,
                                       WeightFormat format = WeightFormat::Auto);

}  // namespace dpt
