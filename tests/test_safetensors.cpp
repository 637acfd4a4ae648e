#include "io/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("dpt_safetensors_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  // A file from a header and raw data, with the length prefix filled in.
  static std::string make_file(const std::string& header, const std::string& data) {
    const uint64_t n = header.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
  }
  static std::string floats(std::initializer_list<float> v) {
    return {reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float)};
  }
  std::vector<std::string> dir_entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }
  // Loading the file must fail with an IoError that starts with the path and
  // mentions `needle`.
  void expect_corrupt(const std::string& bytes, const std::string& needle) {
    const std::string p = path("bad.safetensors");
    write_bytes(p, bytes);
    try {
      load_safetensors(p);
      FAIL() << "no error for a file that should mention '" << needle << "'";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

std::vector<NamedTensor> sample_tensors() {
  return {
      {"0.weight", DType::F32, {4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12.5f}},
      {"0.bias", DType::F32, {4}, {-1, 0, 1e-30f, 3e30f}},
      {"scale", DType::F32, {}, {0.25f}},
      {"empty", DType::F32, {0, 5}, {}},
  };
}

TEST_F(SafetensorsTest, RoundTripKeepsTensorsMetadataAndOrder) {
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}};
  save_safetensors(path("m.safetensors"), tensors, meta);

  const SafetensorsFile f = load_safetensors(path("m.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor* t = f.find(tensors[i].name);
    ASSERT_NE(t, nullptr) << tensors[i].name;
    EXPECT_EQ(t->dtype, DType::F32);
    EXPECT_EQ(t->shape, tensors[i].shape);
    EXPECT_EQ(t->data, tensors[i].data);
  }
  // Written in the order given, so file order (by offset) matches; the
  // zero-element tensor sorts before its same-offset neighbour.
  EXPECT_EQ(f.tensors[0].name, "0.weight");
  EXPECT_EQ(f.tensors[1].name, "0.bias");
  EXPECT_EQ(f.tensors[2].name, "scale");
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsTest, HeaderIsCompactPaddedAndInGivenOrder) {
  save_safetensors(path("m.safetensors"), {{"b", DType::F32, {1}, {1}}, {"a", DType::F32, {}, {2}}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(path("m.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  const std::string json =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[4,8]}})";
  std::string padded = json;
  padded.append((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(bytes.substr(8, n), padded);
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  save_safetensors(path("e.safetensors"), {}, {});
  const std::string bytes = read_bytes(path("e.safetensors"));
  EXPECT_EQ(bytes.substr(8), "{}      ");
  const SafetensorsFile f = load_safetensors(path("e.safetensors"));
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

TEST_F(SafetensorsTest, LoadsHandBuiltBf16AndSortsByOffset) {
  // bf16 is the top half of an f32: 1.0 = 0x3f80, -2.0 = 0xc000, 0.5 = 0x3f00.
  const std::string bf16("\x80\x3f\x00\xc0\x00\x3f", 6);
  const std::string header =
      R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[4,10]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  write_bytes(path("h.safetensors"), make_file(header, floats({7.0f}) + bf16));
  const SafetensorsFile f = load_safetensors(path("h.safetensors"));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "s");
  EXPECT_EQ(f.tensors[0].data, std::vector<float>{7.0f});
  EXPECT_EQ(f.tensors[1].name, "w");
  EXPECT_EQ(f.tensors[1].dtype, DType::BF16);
  EXPECT_EQ(f.tensors[1].data, (std::vector<float>{1.0f, -2.0f, 0.5f}));
}

TEST_F(SafetensorsTest, Bf16SaveRoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bf16 values and rounds to the even one
  // (1.0); 1 + 3*2^-8 rounds up to 1 + 2^-6.
  const std::vector<float> in = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -3.0f};
  save_safetensors(path("b.safetensors"), {{"x", DType::BF16, {3}, in}}, {});
  const SafetensorsFile f = load_safetensors(path("b.safetensors"));
  EXPECT_EQ(f.tensors.at(0).dtype, DType::BF16);
  EXPECT_EQ(f.tensors.at(0).data, (std::vector<float>{1.0f, 1.0f + 1.0f / 64, -3.0f}));
}

TEST_F(SafetensorsTest, OverwriteReplacesFileAndLeavesNoTemp) {
  save_safetensors(path("m.safetensors"), sample_tensors(), {});
  save_safetensors(path("m.safetensors"), {{"only", DType::F32, {2}, {3, 4}}}, {});
  const SafetensorsFile f = load_safetensors(path("m.safetensors"));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].name, "only");
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsTest, FailedWriteThrowsAndRemovesTemp) {
  // The rename onto a non-empty directory fails after the temp file is written.
  fs::create_directories(dir_ / "target" / "child");
  try {
    save_safetensors(path("target"), sample_tensors(), {});
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path("target") + ": ", 0), 0u) << e.what();
  }
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"target"});

  EXPECT_THROW(save_safetensors(path("no/such/dir/m.safetensors"), sample_tensors(), {}), IoError);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"target"});
}

TEST_F(SafetensorsTest, SaveRefusesBadTensors) {
  const std::string p = path("m.safetensors");
  EXPECT_THROW(save_safetensors(p, {{"x", DType::F32, {2, 2}, {1, 2, 3}}}, {}), InputError);
  EXPECT_THROW(save_safetensors(p, {{"x", DType::F32, {1}, {1}}, {"x", DType::F32, {1}, {2}}}, {}),
               InputError);
  EXPECT_THROW(save_safetensors(p, {{"__metadata__", DType::F32, {1}, {1}}}, {}), InputError);
  EXPECT_THROW(save_safetensors(p, {{"", DType::F32, {1}, {1}}}, {}), InputError);
  EXPECT_THROW(save_safetensors(p, {{"x", DType::F32, {-1}, {}}}, {}), InputError);
  EXPECT_THROW(save_safetensors(p, {}, {{"k", "\xff"}}), InputError);
  EXPECT_TRUE(dir_entries().empty());
}

TEST_F(SafetensorsTest, MissingFileIsIoError) {
  try {
    load_safetensors(path("nope.safetensors"));
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), path("nope.safetensors") + ": cannot open (No such file or directory)");
  }
  EXPECT_THROW(load_safetensors(dir_.string()), IoError);  // a directory
}

TEST_F(SafetensorsTest, EveryTruncationIsIoError) {
  save_safetensors(path("m.safetensors"), sample_tensors(), {{"k", "v"}});
  const std::string good = read_bytes(path("m.safetensors"));
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(path("t.safetensors"), good.substr(0, len));
    EXPECT_THROW(load_safetensors(path("t.safetensors")), IoError) << "length " << len;
  }
  // Extra bytes after the last tensor are refused too, as the reference does.
  write_bytes(path("t.safetensors"), good + "x");
  EXPECT_THROW(load_safetensors(path("t.safetensors")), IoError);
}

TEST_F(SafetensorsTest, CorruptHeadersAreIoErrors) {
  const std::string w12 = floats({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& off) {
    return fmt::format(R"({{"0.weight":{{"dtype":"{}","shape":{},"data_offsets":{}}}}})", dtype,
                       shape, off);
  };
  expect_corrupt("short", "too short");
  {
    std::string huge(8, '\0');
    const uint64_t n = 200'000'000;
    std::memcpy(huge.data(), &n, 8);
    expect_corrupt(huge + "{}", "100 MB");
  }
  {
    std::string past(8, '\0');
    const uint64_t n = 1000;
    std::memcpy(past.data(), &n, 8);
    expect_corrupt(past + "{}", "runs past the end");
  }
  expect_corrupt(make_file("{not json", ""), "not valid JSON");
  expect_corrupt(make_file("[1, 2]", ""), "not a JSON object");
  expect_corrupt(make_file(R"({"x": 3})", ""), "not a JSON object");
  expect_corrupt(make_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", floats({1})), "'dtype'");
  expect_corrupt(make_file(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", floats({1})), "'shape'");
  expect_corrupt(make_file(R"({"x":{"dtype":"F32","shape":[1]}})", floats({1})), "data_offsets");
  expect_corrupt(make_file(entry("F32", "[12]", "[0]"), w12), "data_offsets");
  expect_corrupt(make_file(entry("F32", "[12]", "[-4,44]"), w12), "data_offsets");
  expect_corrupt(make_file(entry("F32", "[12]", R"(["0","48"])"), w12), "data_offsets");
  expect_corrupt(make_file(entry("F32", "[-12]", "[0,48]"), w12), "shape entry");
  expect_corrupt(make_file(entry("F32", "[1.5]", "[0,48]"), w12), "shape entry");
  expect_corrupt(make_file(entry("I16", "[4,3]", "[0,24]"), w12.substr(0, 24)),
                 "tensor '0.weight' has dtype I16, which is not supported (supported: F32, BF16, F16)");
  expect_corrupt(make_file(entry("I64", "[4,3]", "[0,96]"), w12 + w12), "dtype I64");
  expect_corrupt(make_file(entry("F32", "[4,3]", "[0,40]"), w12.substr(0, 40)),
                 "tensor '0.weight' has shape [4, 3] (12 elements) but 40 bytes of F32 data");
  expect_corrupt(make_file(entry("F32", "[12]", "[0,52]"), w12), "past the end");
  expect_corrupt(make_file(entry("F32", "[12]", "[48,0]"), w12), "end before they begin");
  expect_corrupt(
      make_file(entry("F32", "[4294967296,4294967296,4]", "[0,48]"), w12), "overflows");
  expect_corrupt(make_file(entry("F32", "[4611686018427387904]", "[0,48]"), w12), "but 48 bytes");
  // Overlapping and gapped regions.
  expect_corrupt(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           floats({1, 2, 3})),
                 "tensor 'b' data [4, 12] overlaps");
  expect_corrupt(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           floats({1, 2})),
                 "leaves a gap");
  expect_corrupt(make_file(entry("F32", "[2]", "[0,8]"), w12), "tensors cover 8 bytes");
  // Metadata must map strings to strings.
  expect_corrupt(make_file(R"({"__metadata__":{"step":3}})", ""), "metadata value for 'step'");
  expect_corrupt(make_file(R"({"__metadata__":["a"]})", ""), "__metadata__ is not");
}

// ---- Streaming writer and range reader ----

std::vector<TensorSpec> specs_of(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

// All values in file order, as the writer takes them.
std::vector<float> concat(const std::vector<NamedTensor>& tensors) {
  std::vector<float> all;
  for (const auto& t : tensors) all.insert(all.end(), t.data.begin(), t.data.end());
  return all;
}

// F32 and BF16 tensors, with zero-element ones in the middle and at the end,
// and BF16 values that need rounding.
std::vector<NamedTensor> mixed_tensors() {
  auto t = sample_tensors();
  t.insert(t.begin() + 2,
           NamedTensor{"half", DType::BF16, {2, 3},
                       {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -3.0f, 0.1f, 1e-3f, 65504.0f}});
  t.push_back({"h2", DType::BF16, {5}, {1, 2, 3, 4, 5}});
  t.push_back({"none", DType::BF16, {0}, {}});
  return t;
}

TEST_F(SafetensorsTest, ChunkedWriterIsByteIdenticalToSave) {
  const auto tensors = mixed_tensors();
  const std::map<std::string, std::string> meta = {{"dpt.model", "mlp"}};
  save_safetensors(path("ref.safetensors"), tensors, meta);
  const std::string ref = read_bytes(path("ref.safetensors"));
  const std::vector<float> all = concat(tensors);

  // 1 and 7 end inside tensors and span their boundaries; 0-sized chunks are
  // harmless; all.size() is the whole model in one call.
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{11}, all.size()}) {
    SafetensorsWriter w(path("w.safetensors"), specs_of(tensors), meta);
    for (size_t i = 0; i < all.size(); i += chunk) {
      w.write(all.data() + i, std::min(chunk, all.size() - i));
      w.write(all.data(), 0);
    }
    w.commit();
    EXPECT_EQ(read_bytes(path("w.safetensors")), ref) << "chunk " << chunk;
  }
  EXPECT_EQ(dir_entries().size(), 2u);  // no temporaries left
}

TEST_F(SafetensorsTest, WriterCommitWithWrongCountThrowsAndLeavesNothing) {
  const auto tensors = mixed_tensors();
  std::vector<float> all = concat(tensors);
  const std::string p = path("m.safetensors");
  for (size_t n : {all.size() - 1, all.size() + 1, size_t{0}}) {
    all.resize(std::max(all.size(), n));
    SafetensorsWriter w(p, specs_of(tensors), {});
    w.write(all.data(), n);
    try {
      w.commit();
      FAIL() << "no error for " << n << " values";
    } catch (const IoError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
    }
    EXPECT_TRUE(dir_entries().empty()) << n << " values";  // while w is still alive
  }

  // An older file under the name is left as it was.
  save_safetensors(p, sample_tensors(), {});
  const std::string old = read_bytes(p);
  {
    SafetensorsWriter w(p, specs_of(tensors), {});
    w.write(all.data(), 3);
    EXPECT_THROW(w.commit(), IoError);
  }
  EXPECT_EQ(read_bytes(p), old);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsTest, WriterDestroyedWithoutCommitRemovesTemporary) {
  {
    SafetensorsWriter w(path("m.safetensors"), specs_of(sample_tensors()), {});
    w.write(concat(sample_tensors()).data(), 5);
    ASSERT_EQ(dir_entries().size(), 1u);  // the temporary, not the final name
    EXPECT_NE(dir_entries()[0], "m.safetensors");
  }
  EXPECT_TRUE(dir_entries().empty());
}

TEST_F(SafetensorsTest, WriterConstructorChecksPathAndTensors) {
  const std::string bad = "/nonexistent/x.safetensors";
  try {
    SafetensorsWriter w(bad, specs_of(sample_tensors()), {});
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
  }
  const std::string p = path("m.safetensors");
  EXPECT_THROW(SafetensorsWriter(p, {{"x", DType::F32, {1}}, {"x", DType::F32, {2}}}, {}),
               InputError);
  EXPECT_THROW(SafetensorsWriter(p, {{"", DType::F32, {1}}}, {}), InputError);
  EXPECT_THROW(SafetensorsWriter(p, {{"__metadata__", DType::F32, {1}}}, {}), InputError);
  EXPECT_THROW(SafetensorsWriter(p, {{"x", DType::F32, {2, -1}}}, {}), InputError);
  EXPECT_THROW(SafetensorsWriter(p, {{"x", DType::F32, {int64_t{1} << 62, 4}}}, {}), InputError);
  EXPECT_THROW(SafetensorsWriter(p, {{"x", DType::BF16, {int64_t{1} << 62, 2}}}, {}),
               InputError);  // 2^63 elements fit 64 bits, their 2^64 bytes do not
  EXPECT_TRUE(dir_entries().empty());
}

TEST_F(SafetensorsTest, ReaderRangesEqualWholeFileValues) {
  std::vector<NamedTensor> tensors = mixed_tensors();
  NamedTensor big{"big", DType::F32, {10, 100}, {}};
  NamedTensor big16{"big16", DType::BF16, {300}, {}};
  for (int i = 0; i < 1000; ++i) big.data.push_back(std::sin(0.01f * i));
  for (int i = 0; i < 300; ++i) big16.data.push_back(std::cos(0.02f * i));
  tensors.insert(tensors.begin() + 3, big16);
  tensors.insert(tensors.begin() + 1, big);
  save_safetensors(path("m.safetensors"), tensors, {{"k", "v"}});
  const SafetensorsFile whole = load_safetensors(path("m.safetensors"));

  const SafetensorsReader r(path("m.safetensors"));
  EXPECT_EQ(r.metadata(), whole.metadata);
  ASSERT_EQ(r.tensors().size(), whole.tensors.size());
  for (size_t i = 0; i < whole.tensors.size(); ++i) {
    const TensorSpec& s = r.tensors()[i];
    const NamedTensor& t = whole.tensors[i];
    EXPECT_EQ(s.name, t.name);
    EXPECT_EQ(s.dtype, t.dtype);
    EXPECT_EQ(s.shape, t.shape);
    EXPECT_EQ(s.numel(), t.data.size());
    ASSERT_EQ(r.find(t.name), &s);
    // Start, middle, end, the whole, and empty ranges at either end.
    const uint64_t n = t.data.size();
    const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
        {0, std::min<uint64_t>(n, 3)}, {n / 3, n / 2 - n / 3}, {n - n / 4, n / 4},
        {0, n}, {0, 0}, {n, 0}};
    for (const auto& [begin, count] : ranges) {
      std::vector<float> got(count, -99.0f);
      r.read(t.name, begin, count, got.data());
      const std::vector<float> want(t.data.begin() + begin, t.data.begin() + begin + count);
      EXPECT_EQ(got, want) << t.name << " [" << begin << ", +" << count << ")";
    }
  }
  EXPECT_EQ(r.find("missing"), nullptr);
  // The BF16 values read back rounded, as written.
  float x = 0;
  r.read("half", 1, 1, &x);
  EXPECT_EQ(x, 1.0f + 1.0f / 64);
}

TEST_F(SafetensorsTest, ReaderRefusesUnknownNamesAndOutOfRangeReads) {
  save_safetensors(path("m.safetensors"), mixed_tensors(), {});
  const SafetensorsReader r(path("m.safetensors"));
  std::vector<float> buf(64);
  auto expect_refused = [&](const std::string& name, uint64_t begin, uint64_t n) {
    try {
      r.read(name, begin, n, buf.data());
      FAIL() << "no error for " << name << " [" << begin << ", +" << n << ")";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  };
  expect_refused("nope", 0, 1);
  expect_refused("0.bias", 0, 5);  // 4 elements
  expect_refused("0.bias", 3, 2);
  expect_refused("0.bias", 5, 0);
  expect_refused("half", 1, std::numeric_limits<uint64_t>::max());  // begin + n wraps
  expect_refused("empty", 0, 1);
  r.read("0.bias", 3, 1, buf.data());  // the last element is in range
  EXPECT_EQ(buf[0], 3e30f);

  // The reader checks the header as load_safetensors does.
  const std::string good = read_bytes(path("m.safetensors"));
  write_bytes(path("t.safetensors"), good.substr(0, good.size() - 1));
  EXPECT_THROW(SafetensorsReader{path("t.safetensors")}, IoError);
  EXPECT_THROW(SafetensorsReader{path("missing.safetensors")}, IoError);
}

}  // namespace
}  // namespace dpt
