// Sharded safetensors (io/safetensors_set.h): a set cut by a size cap reads
// back as the single file does, bit for bit and by element ranges across
// shards; every corruption of an index or its shards is refused with its
// sentence; nothing half-written is ever left; F16 tensors are read and
// written; and a GPT saved sharded (either layout) loads bitwise whole, by
// ZeRO-3's ranges, from its index or its directory.
#include <unistd.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compare.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_sharded_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }

  // Five tensors of 400, 240, 60, 1 and 200 bytes (F32, BF16, F32, F32, F16),
  // values exact in their dtype.
  static std::vector<NamedTensor> tensors() {
    std::vector<NamedTensor> t = {{"embed.weight", DType::F32, {10, 10}, {}},
                                  {"layers.0.weight", DType::BF16, {12, 10}, {}},
                                  {"layers.0.bias", DType::F32, {15}, {}},
                                  {"scale", DType::F32, {}, {}},
                                  {"head.weight", DType::F16, {10, 10}, {}}};
    int k = 0;  // values k/64 with |k| <= 50: exact in BF16 and F16 too
    for (NamedTensor& x : t) {
      x.data.resize(TensorSpec{x.name, x.dtype, x.shape}.numel());
      for (float& f : x.data) f = static_cast<float>((k++ * 37) % 101 - 50) / 64.0f;
    }
    return t;
  }
  static std::vector<TensorSpec> specs(const std::vector<NamedTensor>& t) {
    std::vector<TensorSpec> s;
    for (const NamedTensor& x : t) s.push_back({x.name, x.dtype, x.shape});
    return s;
  }
  // Writes tensors as a set at `index` with the cap; returns its names.
  static ShardNames write_set(const std::string& index, const std::vector<NamedTensor>& t, uint64_t cap,
                              const std::map<std::string, std::string>& meta = {{"k", "v"}}) {
    ShardedSafetensorsWriter w(index, specs(t), meta, cap);
    for (const NamedTensor& x : t) w.write(x.data.data(), x.data.size());
    w.commit();
    return w.names();
  }
  json index_json(const std::string& p) const {
    std::ifstream in(p);
    return json::parse(in);
  }
  void write_json(const std::string& p, const json& j) const { std::ofstream(p) << j.dump(2); }
  // The IoError message opening `p` as a set, or "(opened)".
  static std::string refusal(const std::string& p) {
    try {
      SafetensorsSet s(p);
    } catch (const IoError& e) {
      return e.what();
    }
    return "(opened)";
  }
  size_t files_in_dir() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  fs::path dir_;
};

TEST_F(Sharded, ACapCutsTensorsInOrderAsHuggingFaceDoes) {
  const std::vector<TensorSpec> s = specs(tensors());  // 400, 240, 60, 4, 200 bytes
  EXPECT_EQ(plan_shards(s, 0), (std::vector<size_t>{0}));
  EXPECT_EQ(plan_shards(s, 500), (std::vector<size_t>{0, 1, 4}));   // 400 | 240+60+4 | 200
  EXPECT_EQ(plan_shards(s, 100), (std::vector<size_t>{0, 1, 2, 4}));  // too big alone | ... | 60+4 | 200
  EXPECT_EQ(plan_shards(s, 1 << 20), (std::vector<size_t>{0}));
  const ShardNames n = shard_names("/x/model.safetensors", 3);
  EXPECT_EQ(n.index, "/x/model.safetensors.index.json");
  EXPECT_EQ(n.shards, (std::vector<std::string>{"/x/model-00001-of-00003.safetensors",
                                                "/x/model-00002-of-00003.safetensors",
                                                "/x/model-00003-of-00003.safetensors"}));
  EXPECT_EQ(shard_names("/x/model.safetensors.index.json", 1).shards[0], "/x/model-00001-of-00001.safetensors");
  EXPECT_THROW(shard_names("/x/model.bin", 2), InputError);
}

TEST_F(Sharded, ASetReadsBackAsTheSingleFileBitwise) {
  const std::vector<NamedTensor> t = tensors();
  save_safetensors(path("single.safetensors"), t, {{"k", "v"}});
  const ShardNames names = write_set(path("model.safetensors.index.json"), t, 500);
  ASSERT_EQ(names.shards.size(), 3u);
  // The index as Hugging Face writes it.
  const json index = index_json(names.index);
  EXPECT_EQ(index["metadata"]["total_size"], 400 + 240 + 60 + 4 + 200);
  EXPECT_EQ(index["weight_map"]["embed.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["scale"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["head.weight"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"].size(), t.size());
  EXPECT_EQ(files_in_dir(), 5u);  // single, index, 3 shards: no temporaries

  const SafetensorsSet single(path("single.safetensors")), set(names.index), dir(dir_.string());
  EXPECT_FALSE(single.sharded());
  EXPECT_TRUE(set.sharded());
  EXPECT_EQ(dir.path(), names.index);  // the directory's index wins over nothing else there
  EXPECT_EQ(set.files(), names.shards);
  EXPECT_EQ(set.metadata(), single.metadata());
  ASSERT_EQ(set.tensors().size(), single.tensors().size());
  for (size_t i = 0; i < t.size(); ++i) {
    const TensorSpec& a = set.tensors()[i];
    EXPECT_EQ(a.name, t[i].name);
    EXPECT_EQ(a.dtype, t[i].dtype);
    EXPECT_EQ(a.shape, t[i].shape);
    std::vector<float> got(a.numel()), want(a.numel());
    set.read(a.name, 0, got.size(), got.data());
    single.read(a.name, 0, want.size(), want.data());
    EXPECT_TRUE(test::bitwise_equal(got.data(), want.data(), got.size())) << a.name;
    EXPECT_TRUE(test::bitwise_equal(got.data(), t[i].data.data(), got.size())) << a.name;
    // Every element range, one element to all of them.
    for (uint64_t b = 0; b < got.size(); b += 7)
      for (uint64_t n : {uint64_t{1}, uint64_t{5}, got.size() - b}) {
        n = std::min<uint64_t>(n, got.size() - b);
        std::vector<float> piece(n);
        set.read(a.name, b, n, piece.data());
        ASSERT_TRUE(test::bitwise_equal(piece.data(), want.data() + b, n)) << a.name << " " << b << "+" << n;
      }
  }
  EXPECT_EQ(set.file_of("scale"), names.shards[1]);
  EXPECT_EQ(set.find("nope"), nullptr);
  EXPECT_THROW(set.read("nope", 0, 1, nullptr), InputError);
}

TEST_F(Sharded, ADirectoryOpensItsIndexOrItsSingleFile) {
  const std::vector<NamedTensor> t = tensors();
  save_safetensors(path("model.safetensors"), t, {});
  EXPECT_FALSE(SafetensorsSet(dir_.string()).sharded());
  write_set(path("model.safetensors.index.json"), t, 500);
  EXPECT_TRUE(SafetensorsSet(dir_.string()).sharded());
  fs::create_directories(dir_ / "empty");
  EXPECT_EQ(refusal(path("empty")), path("empty") + ": a directory holding neither model.safetensors.index.json "
                                                    "nor model.safetensors");
}

TEST_F(Sharded, EveryCorruptionIsRefusedWithItsSentence) {
  const std::vector<NamedTensor> t = tensors();
  const ShardNames names = write_set(path("model.safetensors.index.json"), t, 500);
  const std::string index = names.index;
  const json good = index_json(index);
  auto with = [&](auto edit) {
    json j = good;
    edit(j);
    write_json(index, j);
    return refusal(index);
  };
  // A tensor named in the index but absent from its shard.
  EXPECT_EQ(with([](json& j) { j["weight_map"]["ghost.weight"] = "model-00002-of-00003.safetensors"; }),
            index + ": tensor 'ghost.weight' is mapped to model-00002-of-00003.safetensors, which does not hold it");
  // ...or mapped to the wrong shard.
  EXPECT_EQ(with([](json& j) { j["weight_map"]["scale"] = "model-00001-of-00003.safetensors"; }),
            index + ": tensor 'scale' is mapped to model-00001-of-00003.safetensors, which does not hold it");
  // A tensor in a shard that the index does not name.
  EXPECT_EQ(with([](json& j) { j["weight_map"].erase("layers.0.bias"); }),
            names.shards[1] + ": tensor 'layers.0.bias' is not in the index " + index);
  // A shard file missing.
  EXPECT_EQ(with([](json& j) { j["weight_map"]["head.weight"] = "model-00004-of-00004.safetensors"; }),
            index + ": shard model-00004-of-00004.safetensors is missing (the index maps 1 tensor to it, "
                    "'head.weight' first)");
  // Not a file beside the index.
  EXPECT_EQ(with([](json& j) { j["weight_map"]["head.weight"] = "../model-00003-of-00003.safetensors"; }),
            index + ": weight_map gives tensor 'head.weight' the shard \"../model-00003-of-00003.safetensors\", "
                    "which is not the name of a file beside the index");
  EXPECT_EQ(with([](json& j) { j["weight_map"]["head.weight"] = 3; }),
            index + ": weight_map gives tensor 'head.weight' the shard 3, which is not the name of a file beside "
                    "the index");
  // No weight_map, an empty one, not JSON at all.
  EXPECT_EQ(with([](json& j) { j.erase("weight_map"); }),
            index + ": not a safetensors index: it has no \"weight_map\" object mapping each tensor name to its "
                    "shard file");
  EXPECT_EQ(with([](json& j) { j["weight_map"] = json::object(); }),
            index + ": the index's weight_map names no tensor");
  std::ofstream(index) << "{\"weight_map\": {";
  EXPECT_TRUE(refusal(index).starts_with(index + ": not a safetensors index: not valid JSON (byte ")) << refusal(index);
  write_json(index, good);
  EXPECT_EQ(refusal(index), "(opened)");
  // A shard removed from the disk.
  fs::rename(names.shards[2], path("aside"));
  EXPECT_EQ(refusal(index), index + ": shard model-00003-of-00003.safetensors is missing (the index maps 1 tensor "
                                    "to it, 'head.weight' first)");
  fs::rename(path("aside"), names.shards[2]);
  // The same tensor in two shards: shard 3 rewritten with scale beside head.
  std::vector<NamedTensor> third = {t[3], t[4]};
  save_safetensors(names.shards[2], third, {{"k", "v"}});
  EXPECT_EQ(refusal(index), index + ": tensor 'scale' is in two shards, model-00002-of-00003.safetensors and "
                                    "model-00003-of-00003.safetensors");
  // Shards whose metadata disagree.
  save_safetensors(names.shards[2], {t[4]}, {{"k", "w"}});
  EXPECT_EQ(refusal(index), names.shards[2] + ": metadata 'k' is 'w' here but 'v' in another shard of " + index);
  // A shard's own damage is its reader's sentence, naming the shard.
  std::ofstream(names.shards[2]) << "not safetensors";
  EXPECT_NE(refusal(index).find(names.shards[2] + ": not a safetensors file"), std::string::npos) << refusal(index);
}

TEST_F(Sharded, NothingHalfWrittenIsLeft) {
  const std::vector<NamedTensor> t = tensors();
  {  // too few values: commit refuses, and no file at all remains
    ShardedSafetensorsWriter w(path("model.safetensors"), specs(t), {}, 500);
    w.write(t[0].data.data(), t[0].data.size());
    w.write(t[1].data.data(), 3);
    EXPECT_THROW(w.commit(), IoError);
  }
  EXPECT_EQ(files_in_dir(), 0u);
  {  // abandoned after the first shards were complete
    ShardedSafetensorsWriter w(path("model.safetensors"), specs(t), {}, 500);
    for (size_t i = 0; i < 3; ++i) w.write(t[i].data.data(), t[i].data.size());
  }
  EXPECT_EQ(files_in_dir(), 0u);
  // A missing directory fails at once, before any value is given.
  EXPECT_THROW(ShardedSafetensorsWriter(path("no/such/model.safetensors"), specs(t), {}, 500), IoError);
  // Repeated names across shards are refused up front.
  std::vector<TensorSpec> twice = specs(t);
  twice[4].name = twice[0].name;
  EXPECT_THROW(ShardedSafetensorsWriter(path("model.safetensors"), twice, {}, 500), InputError);
  EXPECT_EQ(files_in_dir(), 0u);
  // A set written over an older one at the same names reads as the new one.
  write_set(path("model.safetensors"), t, 500);
  std::vector<NamedTensor> newer = t;
  for (NamedTensor& x : newer)
    for (float& f : x.data) f = -f;
  write_set(path("model.safetensors"), newer, 500);
  const SafetensorsSet set(path("model.safetensors.index.json"));
  std::vector<float> got(100);
  set.read("head.weight", 0, 100, got.data());
  EXPECT_TRUE(test::bitwise_equal(got.data(), newer[4].data.data(), 100));
  EXPECT_EQ(files_in_dir(), 4u);
}

TEST_F(Sharded, F16TensorsAreReadAndWrittenExactly) {
  // Every finite half, written from its float value and read back: the same
  // bits (round to nearest even is exact on representable values).
  std::vector<float> halves;
  for (uint32_t h = 0; h < 0x10000; ++h)
    if ((h & 0x7c00u) != 0x7c00u) {  // not infinity or NaN
      const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
      const float mag = e ? std::ldexp(1.0f + f / 1024.0f, static_cast<int>(e) - 15) : std::ldexp(float(f), -24);
      halves.push_back(std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign));
    }
  save_safetensors(path("h.safetensors"), {{"h", DType::F16, {static_cast<int64_t>(halves.size())}, halves}}, {});
  const SafetensorsFile back = load_safetensors(path("h.safetensors"));
  EXPECT_EQ(back.tensors[0].dtype, DType::F16);
  EXPECT_TRUE(test::bitwise_equal(back.tensors[0].data.data(), halves.data(), halves.size()));
  // Rounding: ties to even, subnormals, and the largest half.
  const float ulp = std::ldexp(1.0f, -10);
  const std::vector<float> in = {1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + ulp / 64, std::ldexp(1.5f, -24),
                                 std::ldexp(1.0f, -26), 65504.0f, -65519.0f};
  const std::vector<float> want = {1, 1 + 2 * ulp, 1 + ulp, std::ldexp(2.0f, -24), 0, 65504.0f, -65504.0f};
  save_safetensors(path("r.safetensors"), {{"r", DType::F16, {7}, in}}, {});
  const SafetensorsFile r = load_safetensors(path("r.safetensors"));
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(r.tensors[0].data[i], want[i]) << in[i];
  // A value beyond F16's range is refused, naming it, and no file appears.
  try {
    save_safetensors(path("big.safetensors"), {{"w", DType::F16, {2}, {1.0f, 70000.0f}}}, {});
    FAIL() << "70000 does not fit F16";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path("big.safetensors") + ": tensor 'w' holds 70000 at element 1, beyond "
                                                               "F16's largest value 65504: write it as F32 or BF16");
  }
  EXPECT_FALSE(fs::exists(path("big.safetensors")));
}

// A GPT saved as a sharded set, in the engine's layout and in Hugging
// Face's (transposed Conv1D weights), loads bitwise from its index and its
// directory, whole and by ZeRO-3's ranges.
TEST_F(Sharded, AGptSavedShardedLoadsBitwise) {
  auto m = std::make_unique<Decoder>(DecoderConfig{.vocab = 40, .layers = 2, .heads = 2, .width = 8, .context = 6});
  m->init_params(11);
  const size_t n = m->param_count();
  for (WeightFormat f : {WeightFormat::Dpt, WeightFormat::Hf}) {
    const fs::path sub = dir_ / (f == WeightFormat::Hf ? "hf" : "dpt");
    fs::create_directories(sub);
    const std::string index = (sub / "model.safetensors.index.json").string();
    save_weights(*m, index, f, 1500);  // about 6 KB of weights: several shards
    const SafetensorsSet set(index);
    EXPECT_GE(set.files().size(), 2u);
    for (const std::string& where : {index, sub.string()}) {
      auto back = model_from_file(where, {});  // the engine's metadata, in every shard
      ASSERT_EQ(back->param_count(), n);
      EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), n)) << where;
    }
    check_weight_file(*m, set);
    for (size_t piece : {size_t{7}, size_t{333}}) {
      std::vector<float> got(n);
      for (size_t at = 0; at < n; at += piece) load_weight_range(*m, set, at, std::min(piece, n - at), got.data() + at);
      EXPECT_TRUE(test::bitwise_equal(got.data(), m->params(), n)) << "pieces of " << piece;
    }
  }
  // A sharded set without the engine's metadata, described by GPT-2's
  // config.json beside its index.
  const SafetensorsSet hf((dir_ / "hf").string());
  std::vector<NamedTensor> plain;
  for (const TensorSpec& s : hf.tensors()) {
    plain.push_back({s.name, s.dtype, s.shape, std::vector<float>(s.numel())});
    hf.read(s.name, 0, s.numel(), plain.back().data.data());
  }
  fs::create_directories(dir_ / "bare");
  ShardedSafetensorsWriter w((dir_ / "bare" / "model.safetensors").string(), specs(plain), {{"format", "pt"}}, 1500);
  for (const NamedTensor& t : plain) w.write(t.data.data(), t.data.size());
  w.commit();
  std::ofstream(dir_ / "bare" / "config.json")
      << R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 6, "vocab_size": 40})";
  auto back = model_from_file((dir_ / "bare").string(), {});
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), n));
  // One file when no cap is asked for.
  save_weights(*m, path("one.safetensors"));
  EXPECT_FALSE(SafetensorsSet(path("one.safetensors")).sharded());
  EXPECT_FALSE(fs::exists(path("one.safetensors.index.json")));
}

}  // namespace
}  // namespace dpt
