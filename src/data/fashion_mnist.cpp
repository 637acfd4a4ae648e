#include "data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace dpt {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr uint32_t kMaxSide = 1u << 15;        // keeps count*rows*cols inside 64 bits

// A gzip or plain file (zlib reads plain files through unchanged).
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) {
      throw IoError(fmt::format("{}: cannot open ({})", path,
                                errno ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(f_, 1 << 17);
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; fewer only at the end of the data. A corrupt or
  // cut-off gzip stream is an error, not a short read.
  size_t read(void* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, INT_MAX));
      const int r = gzread(f_, static_cast<char*>(buf) + got, chunk);
      int errnum = Z_OK;
      const char* msg = gzerror(f_, &errnum);
      if (r < 0 || (errnum != Z_OK && errnum != Z_BUF_ERROR)) {
        // zlib's message already starts with "<path>: ".
        std::string m = msg;
        if (m.starts_with(path_ + ": ")) m.erase(0, path_.size() + 2);
        throw IoError(fmt::format("{}: read failed ({})", path_, m));
      }
      if (errnum == Z_BUF_ERROR) {
        throw IoError(fmt::format("{}: gzip stream is cut off (the file is truncated)", path_));
      }
      got += static_cast<size_t>(r);
      if (static_cast<unsigned>(r) < chunk) break;
    }
    return got;
  }

  uint32_t read_be32(const char* what) {
    unsigned char b[4];
    if (read(b, 4) != 4) {
      throw IoError(fmt::format("{}: file ends inside the IDX header ({})", path_, what));
    }
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
  }

  // Reads exactly n payload bytes and checks nothing follows them. Grows the
  // buffer as data arrives, so a corrupt header cannot make us allocate more
  // than the file holds.
  std::vector<uint8_t> read_payload(uint64_t n) {
    std::vector<uint8_t> out;
    constexpr uint64_t kChunk = 1 << 20;
    while (out.size() < n) {
      const size_t old = out.size();
      const size_t want = static_cast<size_t>(std::min(kChunk, n - old));
      out.resize(old + want);
      const size_t got = read(out.data() + old, want);
      out.resize(old + got);
      if (got < want) {
        throw IoError(fmt::format("{}: payload is {} bytes but the header declares {}", path_,
                                  out.size(), n));
      }
    }
    uint8_t extra = 0;
    if (read(&extra, 1) != 0) {
      throw IoError(fmt::format("{}: has bytes after the {}-byte payload the header declares",
                                path_, n));
    }
    return out;
  }

  void expect_magic(uint32_t want, const char* kind) {
    const uint32_t magic = read_be32("magic number");
    if (magic != want) {
      throw IoError(fmt::format("{}: magic number 0x{:08x} is not that of an IDX {} file (0x{:08x})",
                                path_, magic, kind, want));
    }
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

}  // namespace

ImageSet load_idx(const std::string& images_path, const std::string& labels_path) {
  ImageSet set;
  {
    GzFile f(images_path);
    f.expect_magic(kImagesMagic, "image");
    const uint32_t count = f.read_be32("image count");
    const uint32_t rows = f.read_be32("row count");
    const uint32_t cols = f.read_be32("column count");
    if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide) {
      throw IoError(fmt::format("{}: image size {}x{} is not plausible", images_path, rows, cols));
    }
    set.count = count;
    set.rows = static_cast<int>(rows);
    set.cols = static_cast<int>(cols);
    set.pixels = f.read_payload(uint64_t{count} * rows * cols);
  }
  GzFile f(labels_path);
  f.expect_magic(kLabelsMagic, "label");
  const uint32_t count = f.read_be32("label count");
  if (count != set.count) {
    throw IoError(fmt::format("{}: holds {} labels but {} holds {} images", labels_path, count,
                              images_path, set.count));
  }
  set.labels = f.read_payload(count);
  for (size_t i = 0; i < set.labels.size(); ++i) {
    if (set.labels[i] >= 10) {
      throw IoError(fmt::format("{}: label {} of item {} is not a class in [0, 10)", labels_path,
                                set.labels[i], i));
    }
  }
  return set;
}

ImageSet load_fashion_mnist(const std::string& dir, const std::string& split) {
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test") {
    prefix = "t10k";
  } else {
    throw InputError(fmt::format("unknown Fashion-MNIST split '{}' (expected 'train' or 'test')", split));
  }
  // The usual names are gzipped; an unpacked copy under the bare name works too.
  auto locate = [&](const std::string& stem) {
    const std::string base = (std::filesystem::path(dir) / stem).string();
    std::error_code ec;
    if (std::filesystem::exists(base + ".gz", ec)) return base + ".gz";
    if (std::filesystem::exists(base, ec)) return base;
    throw IoError(fmt::format("{}.gz: no such file (install Debian's dataset-fashion-mnist or "
                              "point to a directory holding the Fashion-MNIST files)", base));
  };
  // Sequenced so a missing images file is reported before a missing labels file.
  const std::string images = locate(prefix + "-images-idx3-ubyte");
  const std::string labels = locate(prefix + "-labels-idx1-ubyte");
  return load_idx(images, labels);
}

}  // namespace dpt
