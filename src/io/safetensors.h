// Reading and writing safetensors files (the format of Hugging Face's
// safetensors library): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes.
//
// Two levels:
//  - SafetensorsWriter and SafetensorsReader stream: neither ever holds a whole
//    tensor, let alone the whole model. They exist for ZeRO-3/FSDP, where no
//    rank holds the model: the writer lets a checkpoint be saved unit by unit
//    (gather a unit, write it, free it) into one ordinary file, and the reader
//    lets each rank read just its slice of each tensor.
//  - load_safetensors / save_safetensors move a whole file to and from memory.
//    They are built on the two classes, so the format lives in one place.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/atomic_file.h"

namespace dpt {

// A tensor as the header describes it: no data.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t numel() const;  // product of the shape (1 for a scalar)
};

struct NamedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<float> data;  // F32 values; BF16 and F16 tensors are widened on load
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order of their data offsets
  std::map<std::string, std::string> metadata;
  // The tensor with this name, or nullptr.
  const NamedTensor* find(const std::string& name) const;
};

// Writes one file from data that arrives in pieces. The constructor validates
// the tensors (InputError for an empty, reserved or repeated name or a
// negative or overflowing shape), creates "<path>.tmp.<pid>" (IoError naming
// the path if it cannot, so a bad output path is caught before any work) and
// writes the header, so every offset is fixed before any data. write() then
// takes the values of all tensors, in the order given, in chunks of any size:
// a chunk may end inside a tensor or span several. BF16 and F16 tensors are
// rounded to nearest even (an F16 tensor refuses a value that would round
// to infinity, from 65520 on, InputError naming it). commit() checks that exactly the promised number of
// values arrived (IoError otherwise), then fsyncs and renames over path. If
// commit() fails or never runs, the temporary is removed and nothing appears
// at path. seal() does commit()'s checks and fsync without the rename, for
// files that must appear together (io/safetensors_set.h).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata);
  void write(const float* values, size_t n);  // throws IoError, InputError
  void seal();                                // throws IoError
  void commit();                              // throws IoError
  const std::string& path() const { return path_; }

 private:
  void check_f16_range(const float* values, uint64_t k);  // of tensors_[current_], from done_

  std::string path_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> numels_;  // of tensors_
  std::optional<AtomicFile> file_;  // empty once committed or failed
  bool sealed_ = false;
  size_t current_ = 0;      // the tensor the next value belongs to
  uint64_t done_ = 0;       // values of tensors_[current_] already written
  uint64_t received_ = 0;   // all values passed to write(), extras included
  uint64_t expected_ = 0;   // all values the header promises
};

// Opens a file and validates its header (the checks and messages of
// load_safetensors) without reading any tensor data; read() then fetches any
// range of elements of one tensor with positioned reads, touching only those
// bytes. Thread-safe for concurrent read() calls.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // throws IoError
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor with this name, or nullptr.
  const TensorSpec* find(const std::string& name) const;

  // Elements [begin, begin + n) of the flattened tensor, as floats (BF16 and
  // F16 are widened). InputError naming the tensor for an unknown name or a range
  // past its end; IoError if the file cannot be read.
  void read(const std::string& name, uint64_t begin, uint64_t n, float* out) const;

 private:
  void parse_header();  // fills the fields below; throws IoError

  std::string path_;
  int fd_ = -1;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> offsets_;  // file offset of each tensor's first byte
  std::map<std::string, std::string> metadata_;
};

// Reads a whole file. Throws IoError naming the file and the problem for a
// missing file, a truncated file, a header that is not valid JSON, offsets
// outside the data, a shape that disagrees with the byte count, overlapping
// tensors, or an unsupported dtype.
SafetensorsFile load_safetensors(const std::string& path);

// Writes tensors and string metadata, in the order given. F32 tensors are
// written as is; BF16 and F16 ones are rounded (to nearest even) from their
// float values. Writes to "<path>.tmp.<pid>", fsyncs, then renames over path, so a
// crash never leaves a half-written file. Throws IoError if the directory is
// not writable, InputError for an empty, reserved or repeated tensor name or a
// shape that disagrees with the number of values.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace dpt
