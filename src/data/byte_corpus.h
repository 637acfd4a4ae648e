// A byte-level text corpus: files concatenated as raw bytes (vocabulary
// 256), split into a training part and a held-out validation tail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The files `path` stands for, in the order ByteCorpus concatenates them
// (see load): the file itself, or a directory's regular files by name
// without .dat and .u8. Throws IoError for a missing path.
std::vector<std::string> text_files(const std::string& path);

class ByteCorpus {
 public:
  // path is a file (read whole) or a directory: its regular files, sorted by
  // name, skipping names ending in ".dat" or ".u8" (fortune's index and
  // UTF-8 copies), concatenated. The last val_fraction of the bytes is the
  // validation part. Throws IoError if nothing can be read, InputError if a
  // part is shorter than min_bytes (so at least one window fits).
  static ByteCorpus load(const std::string& path, double val_fraction, size_t min_bytes);

  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t train_size() const { return train_size_; }  // bytes [0, train_size)
  const uint8_t* train() const { return bytes_.data(); }
  const uint8_t* val() const { return bytes_.data() + train_size_; }
  size_t val_size() const { return bytes_.size() - train_size_; }
  size_t file_count() const { return file_count_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t train_size_ = 0;
  size_t file_count_ = 0;
};

}  // namespace dpt
