#include "data/fashion_mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// Big-endian IDX header: magic then dimensions.
std::string idx_header(uint32_t magic, std::initializer_list<uint32_t> dims) {
  std::string out;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift & 0xff));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("dpt_idx_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes, bool gzip) {
    const std::string p = (dir_ / name).string();
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
      EXPECT_EQ(gzclose(f), Z_OK);
    } else {
      std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    return p;
  }

  // Three 2x3 images whose pixels count up, and their labels.
  static std::string images() {
    std::string s = idx_header(0x803, {3, 2, 3});
    for (int i = 0; i < 18; ++i) s.push_back(static_cast<char>(i * 10));
    return s;
  }
  static std::string labels() { return idx_header(0x801, {3}) + std::string("\x09\x00\x04", 3); }

  // load_idx must throw an IoError that names `bad` and mentions `needle`.
  void expect_bad(const std::string& imgs, const std::string& lbls, const std::string& bad,
                  const std::string& needle) {
    try {
      load_idx(imgs, lbls);
      FAIL() << "no error; expected one mentioning '" << needle << "'";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(bad + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

void expect_small_set(const ImageSet& s) {
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.rows, 2);
  EXPECT_EQ(s.cols, 3);
  ASSERT_EQ(s.pixels.size(), 18u);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(s.pixels[i], i * 10);
  EXPECT_EQ(s.labels, (std::vector<uint8_t>{9, 0, 4}));
}

TEST_F(IdxTest, LoadsPlainAndGzippedFiles) {
  expect_small_set(load_idx(write("i", images(), false), write("l", labels(), false)));
  expect_small_set(load_idx(write("i.gz", images(), true), write("l.gz", labels(), true)));
  expect_small_set(load_idx(write("i2.gz", images(), true), write("l2", labels(), false)));
}

TEST_F(IdxTest, EmptySetLoads) {
  const ImageSet s = load_idx(write("i", idx_header(0x803, {0, 28, 28}), true),
                              write("l", idx_header(0x801, {0}), true));
  EXPECT_EQ(s.count, 0);
  EXPECT_TRUE(s.pixels.empty());
  EXPECT_TRUE(s.labels.empty());
}

TEST_F(IdxTest, CorruptFilesAreIoErrors) {
  const std::string li = write("li", labels(), false);
  const std::string ii = write("ii", images(), true);
  for (bool gz : {false, true}) {
    const std::string i = images(), l = labels();
    std::string p = write("magic", l, gz);  // a label file where images belong
    expect_bad(p, li, p, "magic number 0x00000801");
    p = write("swapped", i, gz);
    expect_bad(ii, p, p, "magic number 0x00000803");
    p = write("header", i.substr(0, 10), gz);
    expect_bad(p, li, p, "header");
    p = write("short", i.substr(0, i.size() - 1), gz);
    expect_bad(p, li, p, "payload is 17 bytes but the header declares 18");
    p = write("long", i + "x", gz);
    expect_bad(p, li, p, "bytes after");
    p = write("lshort", l.substr(0, l.size() - 2), gz);
    expect_bad(ii, p, p, "payload is 1 bytes");
    p = write("llong", l + "\x01", gz);
    expect_bad(ii, p, p, "bytes after");
    p = write("count", idx_header(0x801, {2}) + std::string("\x01\x02", 2), gz);
    expect_bad(ii, p, p, "holds 2 labels but");
    p = write("label", idx_header(0x801, {3}) + std::string("\x01\x0a\x02", 3), gz);
    expect_bad(ii, p, p, "label 10 of item 1");
    p = write("dims", idx_header(0x803, {1, 0, 28}), gz);
    expect_bad(p, li, p, "0x28");
    p = write("empty", "", gz);
    expect_bad(p, li, p, "header");
  }
  // A header claiming a huge payload must fail on the short read, not on an
  // allocation of the claimed size.
  const std::string huge = write("huge", idx_header(0x803, {4000000000u, 28, 28}) + "abc", true);
  expect_bad(huge, li, huge, "payload is 3 bytes");
}

TEST_F(IdxTest, TruncatedGzipStreamIsIoError) {
  std::string big = idx_header(0x803, {100, 28, 28});
  for (int i = 0; i < 100 * 28 * 28; ++i) big.push_back(static_cast<char>(i * 7 % 251));
  const std::string full = write("full.gz", big, true);
  std::ifstream in(full, std::ios::binary);
  const std::string gz{std::istreambuf_iterator<char>(in), {}};
  const std::string li = write("li", idx_header(0x801, {100}) + std::string(100, '\x01'), false);
  ASSERT_EQ(load_idx(full, li).count, 100);
  for (size_t len : {gz.size() / 2, gz.size() - 4, gz.size() - 1}) {
    const std::string p = write("cut", "", false);
    std::ofstream(p, std::ios::binary).write(gz.data(), static_cast<std::streamsize>(len));
    EXPECT_THROW(load_idx(p, li), IoError) << "cut at " << len << " of " << gz.size();
  }
  // A flipped byte in the compressed data is caught by zlib's checks.
  std::string flipped = gz;
  flipped[flipped.size() / 2] ^= 0x55;
  const std::string p = write("flipped", "", false);
  std::ofstream(p, std::ios::binary).write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  EXPECT_THROW(load_idx(p, li), IoError);
}

TEST_F(IdxTest, MissingFilesAndUnknownSplit) {
  const std::string li = write("li", labels(), false);
  const std::string missing = (dir_ / "nope.gz").string();
  expect_bad(missing, li, missing, "cannot open");
  try {
    load_fashion_mnist(dir_.string(), "train");
    FAIL() << "no error";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind((dir_ / "train-images-idx3-ubyte.gz").string() + ": no such file", 0), 0u) << msg;
    EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  }
  EXPECT_THROW(load_fashion_mnist(kFashionMnistDir, "validation"), InputError);
}

TEST_F(IdxTest, FashionMnistDirAcceptsUnpackedFiles) {
  write("t10k-images-idx3-ubyte", images(), false);
  write("t10k-labels-idx1-ubyte.gz", labels(), true);
  expect_small_set(load_fashion_mnist(dir_.string(), "test"));
}

class RealFashionMnist : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
    }
  }
};

TEST_F(RealFashionMnist, TrainSplit) {
  const ImageSet s = load_fashion_mnist(kFashionMnistDir, "train");
  EXPECT_EQ(s.count, 60000);
  EXPECT_EQ(s.rows, 28);
  EXPECT_EQ(s.cols, 28);
  EXPECT_EQ(s.pixels.size(), 60000u * 28 * 28);
  ASSERT_EQ(s.labels.size(), 60000u);
  std::array<int, 10> hist{};
  for (uint8_t l : s.labels) ++hist[l];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(hist[c], 6000) << "class " << c;
}

TEST_F(RealFashionMnist, TestSplit) {
  const ImageSet s = load_fashion_mnist(kFashionMnistDir, "test");
  EXPECT_EQ(s.count, 10000);
  EXPECT_EQ(s.rows, 28);
  EXPECT_EQ(s.cols, 28);
  EXPECT_EQ(s.pixels.size(), 10000u * 28 * 28);
  std::array<int, 10> hist{};
  for (uint8_t l : s.labels) ++hist[l];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(hist[c], 1000) << "class " << c;
}

}  // namespace
}  // namespace dpt
