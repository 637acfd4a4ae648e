// Reading and writing safetensors files (the format of Hugging Face's
// safetensors library): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dpt {

struct NamedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<float> data;  // F32 values; BF16 tensors are widened on load
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order of their data offsets
  std::map<std::string, std::string> metadata;
  // The tensor with this name, or nullptr.
  const NamedTensor* find(const std::string& name) const;
};

// Reads a whole file. Throws IoError naming the file and the problem for a
// missing file, a truncated file, a header that is not valid JSON, offsets
// outside the data, a shape that disagrees with the byte count, overlapping
// tensors, or an unsupported dtype.
SafetensorsFile load_safetensors(const std::string& path);

// Writes tensors and string metadata, in the order given. F32 tensors are
// written as is; BF16 ones are rounded (to nearest even) from their float
// values. Writes to "<path>.tmp.<pid>", fsyncs, then renames over path, so a
// crash never leaves a half-written file. Throws IoError if the directory is
// not writable, InputError for an empty, reserved or repeated tensor name or a
// shape that disagrees with the number of values.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace dpt
