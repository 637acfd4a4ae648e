#include "data/byte_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// fortune(6) keeps a binary index (.dat) and a UTF-8 copy or link (.u8) next
// to each text file; neither is text we want twice or at all.
bool skipped_name(const std::string& name) {
  return name.ends_with(".dat") || name.ends_with(".u8");
}

// The files a path stands for, in the order they are concatenated.
std::vector<fs::path> list_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    throw IoError(fmt::format("{}: no such file or directory", path));
  }
  if (fs::is_regular_file(st)) return {fs::path(path)};
  if (!fs::is_directory(st)) throw IoError(fmt::format("{}: not a file or directory", path));

  std::vector<fs::path> files;
  fs::directory_iterator it(path, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    // is_regular_file follows links, so a link to a text file counts;
    // directories, pipes and devices do not.
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || skipped_name(it->path().filename().string())) continue;
    files.push_back(it->path());
  }
  if (ec) throw IoError(fmt::format("{}: cannot list directory ({})", path, ec.message()));
  // Byte order of the names, so the corpus is the same on every machine.
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  return files;
}

void append_file(const fs::path& file, std::vector<uint8_t>& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open ({})", file.string(), std::strerror(errno)));
  // Read until EOF rather than trusting the size, which may change under us.
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.insert(out.end(), buf, buf + in.gcount());
  }
  if (in.bad()) throw IoError(fmt::format("{}: read failed", file.string()));
}

}  // namespace

std::vector<std::string> text_files(const std::string& path) {
  std::vector<std::string> out;
  for (const fs::path& f : list_files(path)) out.push_back(f.string());
  return out;
}

ByteCorpus ByteCorpus::load(const std::string& path, double val_fraction, size_t min_bytes) {
  // Written so NaN fails too.
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw InputError(fmt::format("validation fraction {} is not in [0, 1)", val_fraction));
  }
  ByteCorpus c;
  const std::vector<fs::path> files = list_files(path);
  for (const auto& f : files) append_file(f, c.bytes_);
  c.file_count_ = files.size();
  if (c.bytes_.empty()) {
    throw IoError(fmt::format("{}: no bytes to read ({} files, skipping .dat and .u8)", path,
                              files.size()));
  }
  const size_t n = c.bytes_.size();
  const size_t val = static_cast<size_t>(std::floor(static_cast<double>(n) * val_fraction));
  c.train_size_ = n - val;
  if (c.train_size_ < min_bytes) {
    throw InputError(fmt::format("{}: the training part is {} bytes, shorter than the {} a window needs",
                                 path, c.train_size_, min_bytes));
  }
  // With no validation part asked for, there is nothing to fit a window in.
  if (val_fraction > 0.0 && c.val_size() < min_bytes) {
    throw InputError(fmt::format("{}: the validation part is {} bytes, shorter than the {} a window needs",
                                 path, c.val_size(), min_bytes));
  }
  return c;
}

}  // namespace dpt
