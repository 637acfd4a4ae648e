// Fashion-MNIST from its gzipped IDX files (Debian's dataset-fashion-mnist
// installs them in /usr/share/datasets/fashion-mnist/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct ImageSet {
  int64_t count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count x rows x cols, row-major
  std::vector<uint8_t> labels;  // count, each in [0, 10)
};

// Reads one IDX3 image file and one IDX1 label file (gzip or plain, told
// apart by the gzip magic). Checks the magic numbers (0x00000803 and
// 0x00000801), that the counts agree, that the payload is exactly as long as
// the header says, and that labels are < 10. Throws IoError naming the file
// and the problem otherwise.
ImageSet load_idx(const std::string& images_path, const std::string& labels_path);

// split is "train" (60,000 images) or "test" (10,000); dir holds the four
// files under their usual names (train-images-idx3-ubyte.gz, ...).
ImageSet load_fashion_mnist(const std::string& dir, const std::string& split);

}  // namespace dpt
