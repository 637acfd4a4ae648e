// Named tensors in one safetensors file or in several: Hugging Face's sharded
// checkpoints, as published models ship them. An index,
// "model.safetensors.index.json",
//
//   {"metadata": {"total_size": 4943274328},
//    "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", ...}}
//
// maps every tensor name to the shard file beside it that holds it.
//
// SafetensorsSet reads either kind the same way: the callers (models/
// weights.h) see one set of tensors with element-range reads, and never ask
// how many files there are. ShardedSafetensorsWriter writes a set: tensors
// in order, cut into files of at most a given size, then the index.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/safetensors.h"

namespace dpt {

// The file a weights path names: the path itself for a file (an index if
// its name ends in ".json", else one safetensors file), and for a directory
// its model.safetensors.index.json, else its model.safetensors. IoError, one
// sentence, for a directory holding neither.
std::string resolve_safetensors_path(const std::string& path);

class SafetensorsSet {
 public:
  // Opens the file or the index and every shard it names, and checks their
  // headers (SafetensorsReader's checks) and the index against them. Throws
  // IoError, one sentence naming the file, for: an index that is not JSON
  // or has no weight_map object, a weight_map entry that is not a file name
  // beside the index, a shard file missing, the same tensor in two shards, a
  // tensor named in the index but absent from its shard, a tensor in a shard
  // that the index does not name, or shards whose metadata disagree.
  explicit SafetensorsSet(const std::string& path);
  ~SafetensorsSet();
  SafetensorsSet(const SafetensorsSet&) = delete;
  SafetensorsSet& operator=(const SafetensorsSet&) = delete;

  // The resolved path: the single file or the index.
  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // The safetensors files: the single file, or the shards in name order.
  std::vector<std::string> files() const;
  // Every tensor, shard by shard, each shard's in file order.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The files' __metadata__, merged (equal in every shard that has a key).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor with this name, or nullptr.
  const TensorSpec* find(const std::string& name) const;
  // The safetensors file that holds a tensor of the set (for messages).
  const std::string& file_of(const std::string& name) const;
  // As SafetensorsReader::read, from the shard that holds the tensor:
  // elements [begin, begin + n) as floats, touching only those bytes.
  // InputError naming the set for an unknown name. Thread-safe.
  void read(const std::string& name, uint64_t begin, uint64_t n, float* out) const;

 private:
  void open_index();  // the sharded case of the constructor
  void add_file(std::unique_ptr<SafetensorsReader> file);

  std::string path_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::vector<TensorSpec> tensors_;
  std::unordered_map<std::string, size_t> file_of_;  // name -> index in files_
  std::unordered_map<std::string, size_t> spec_of_;  // name -> index in tensors_
  std::map<std::string, std::string> metadata_;
};

// The names of a sharded set written at `path`: path names the index,
// "<stem>.safetensors.index.json", or "<stem>.safetensors" (the index then
// is that name + ".index.json", as Hugging Face names it), and shard k of n
// is "<stem>-0000k-of-0000n.safetensors" beside it.
struct ShardNames {
  std::string index;
  std::vector<std::string> shards;
};
ShardNames shard_names(const std::string& path, size_t n);

// Which tensors go to which file when tensors are cut, in order, into files
// of at most max_bytes of data (0: no cap): a file closes when the next
// tensor would take it past the cap; a tensor larger than the cap gets a
// file to itself (as Hugging Face's save_pretrained cuts). The index of the
// first tensor of each file; always at least one file.
std::vector<size_t> plan_shards(const std::vector<TensorSpec>& tensors, uint64_t max_bytes);

// Writes a sharded set from values that arrive in pieces, as
// SafetensorsWriter writes one file (it writes each shard): the tensors'
// values in order, in chunks of any size. Every shard carries `metadata`.
// Nothing appears under the final names until commit(), which checks that
// every value arrived, fsyncs every shard, removes an older index at the
// path, renames the shards into place and then writes the index (each file
// through a temporary name). A failure before commit() leaves no file
// behind; a crash during commit()'s renames leaves shards without an index,
// which no reader takes for a checkpoint. Shards of an older set at the same
// stem with another shard count are left alone.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                           const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes);
  ~ShardedSafetensorsWriter();
  void write(const float* values, size_t n);  // throws IoError, InputError
  void commit();                              // throws IoError
  const ShardNames& names() const { return names_; }

 private:
  void open_shard(size_t k);  // creates shard k's writer
  void settle();              // seals the shards that are complete, opening the next

  std::vector<TensorSpec> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<size_t> first_;            // first tensor of each shard, then tensors_.size()
  std::vector<uint64_t> shard_values_;   // values each shard holds
  ShardNames names_;
  std::vector<std::unique_ptr<SafetensorsWriter>> shards_;  // created as reached
  size_t current_ = 0;       // the shard the next value belongs to
  uint64_t done_ = 0;        // values of shards_[current_] already written
  uint64_t received_ = 0, expected_ = 0;
  uint64_t total_bytes_ = 0;  // of all tensors' data: the index's total_size
};

}  // namespace dpt
