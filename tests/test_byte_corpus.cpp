#include "data/byte_corpus.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

class ByteCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("dpt_corpus_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string str(const ByteCorpus& c) {
    return {reinterpret_cast<const char*>(c.bytes().data()), c.bytes().size()};
  }

  fs::path dir_;
};

TEST_F(ByteCorpusTest, DirectoryConcatenatesInNameOrderSkippingIndexes) {
  // Written out of order; c.dat and d.u8 are skipped, as is the subdirectory.
  write("b", "second\n");
  write("c.dat", "INDEX");
  write("a", "first\n");
  write("d.u8", "COPY");
  fs::create_directories(dir_ / "sub");
  std::ofstream(dir_ / "sub" / "x") << "nested";
  const ByteCorpus c = ByteCorpus::load(dir_.string(), 0.0, 1);
  EXPECT_EQ(str(c), "first\nsecond\n");
  EXPECT_EQ(c.file_count(), 2u);
  EXPECT_EQ(c.train_size(), 13u);
  EXPECT_EQ(c.val_size(), 0u);
}

TEST_F(ByteCorpusTest, SingleFileAndSymlinkedFile) {
  write("text", std::string("\x00\xff\x01zz", 5));
  const ByteCorpus c = ByteCorpus::load((dir_ / "text").string(), 0.0, 5);
  EXPECT_EQ(str(c), std::string("\x00\xff\x01zz", 5));
  EXPECT_EQ(c.file_count(), 1u);

  fs::create_directories(dir_ / "d");
  fs::create_symlink(dir_ / "text", dir_ / "d" / "link");
  EXPECT_EQ(ByteCorpus::load((dir_ / "d").string(), 0.0, 1).bytes().size(), 5u);
}

TEST_F(ByteCorpusTest, SplitSizes) {
  write("a", std::string(1000, 'x'));
  write("b", std::string(1, 'y'));
  const ByteCorpus c = ByteCorpus::load(dir_.string(), 0.1, 1);
  // 1001 * 0.1 = 100.1, floored: 100 validation bytes.
  EXPECT_EQ(c.val_size(), 100u);
  EXPECT_EQ(c.train_size(), 901u);
  EXPECT_EQ(c.train(), c.bytes().data());
  EXPECT_EQ(c.val(), c.bytes().data() + 901);
  EXPECT_EQ(c.val()[99], 'y');  // the tail is the validation part

  const ByteCorpus h = ByteCorpus::load(dir_.string(), 0.5, 1);
  EXPECT_EQ(h.val_size(), 500u);
  EXPECT_EQ(h.train_size(), 501u);
}

TEST_F(ByteCorpusTest, BadValFractionIsInputError) {
  write("a", "hello");
  for (double f : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THROW(ByteCorpus::load(dir_.string(), f, 1), InputError) << f;
  }
}

TEST_F(ByteCorpusTest, PartsShorterThanMinBytesAreInputErrors) {
  write("a", std::string(100, 'x'));
  EXPECT_NO_THROW(ByteCorpus::load(dir_.string(), 0.2, 20));
  EXPECT_THROW(ByteCorpus::load(dir_.string(), 0.2, 21), InputError);   // val is 20
  EXPECT_THROW(ByteCorpus::load(dir_.string(), 0.0, 101), InputError);  // train is 100
  EXPECT_NO_THROW(ByteCorpus::load(dir_.string(), 0.0, 100));
}

TEST_F(ByteCorpusTest, NothingToReadIsIoError) {
  EXPECT_THROW(ByteCorpus::load((dir_ / "missing").string(), 0.1, 1), IoError);
  EXPECT_THROW(ByteCorpus::load(dir_.string(), 0.1, 1), IoError);  // empty directory
  write("only.dat", "index");
  write("empty", "");
  try {
    ByteCorpus::load(dir_.string(), 0.1, 1);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir_.string() + ": ", 0), 0u) << e.what();
  }
}

TEST(ByteCorpusFortunes, LoadsRealCorpus) {
  if (!fs::is_directory(kFortunesDir)) GTEST_SKIP() << "fortunes not installed";
  // The expectation computed independently: regular non-index files.
  size_t files = 0, bytes = 0;
  for (const auto& e : fs::directory_iterator(kFortunesDir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name.ends_with(".dat") || name.ends_with(".u8")) continue;
    ++files;
    bytes += fs::file_size(e.path());
  }
  const ByteCorpus c = ByteCorpus::load(kFortunesDir, 0.1, 1024);
  EXPECT_EQ(c.file_count(), files);
  EXPECT_GT(c.file_count(), 10u);
  EXPECT_EQ(c.bytes().size(), bytes);
  EXPECT_GT(c.bytes().size(), 2'000'000u);
  EXPECT_EQ(c.val_size(), static_cast<size_t>(std::floor(bytes * 0.1)));
  EXPECT_EQ(c.train_size() + c.val_size(), bytes);
  // A .dat index starts with a binary version word; text files are
  // mostly printable, so the corpus should be too.
  size_t printable = 0;
  for (uint8_t b : c.bytes()) printable += (b >= 32 && b < 127) || b == '\n' || b == '\t';
  EXPECT_GT(printable, bytes * 95 / 100);
}

}  // namespace
}  // namespace dpt
