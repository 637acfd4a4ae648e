// GPT-2 presets and the padded vocabulary: the presets' shapes and counts,
// a padded model computing exactly what the unpadded one does (loss and
// gradients; the pad rows get none), and files holding only the true rows.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compare.h"
#include "core/threads.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "models/decoder.h"
#include "models/presets.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

TEST(Presets, HaveGpt2ShapesAndPadTheVocabulary) {
  // Layouts only: make_model allocates no parameters.
  const std::pair<const char*, size_t> expected[] = {{"gpt2", 124'439'808},
                                                     {"gpt2-medium", 354'823'168},
                                                     {"gpt2-large", 774'030'080},
                                                     {"gpt2-xl", 1'557'611'200}};
  for (const auto& [name, params] : expected) {
    auto hp = gpt_preset(name);
    ASSERT_TRUE(hp) << name;
    auto m = make_model(*hp);
    const DecoderConfig& c = dynamic_cast<const Decoder&>(*m).config();
    EXPECT_EQ(c.vocab, 50257);
    EXPECT_EQ(c.rows(), 50304);
    EXPECT_EQ(c.context, 1024);
    // In memory: the pad rows too (llm.c's 124,475,904 for gpt2).
    EXPECT_EQ(m->param_count(), params + (50304 - 50257) * static_cast<size_t>(c.width)) << name;
  }
  EXPECT_FALSE(gpt_preset("gpt3"));
  EXPECT_THROW(make_model({{"dpt.model", "gpt"}, {"vocab_size", "100"}, {"padded_vocab_size", "64"}}), InputError);
}

class PaddedVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    set_threads(1);
    dir_ = fs::temp_directory_path() / fmt::format("dpt_padded_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }

  static constexpr DecoderConfig kConfig{.vocab = 40, .layers = 2, .heads = 2, .width = 8, .context = 6};
  // The unpadded model (seed 3) and a padded one with the same weights.
  static std::pair<std::unique_ptr<Decoder>, std::unique_ptr<Decoder>> pair() {
    auto plain = std::make_unique<Decoder>(kConfig);
    plain->init_params(3);
    DecoderConfig pc = kConfig;
    pc.padded_vocab = 64;
    auto padded = std::make_unique<Decoder>(pc);
    padded->init_params(9);  // other values: every one must be overwritten or zero
    for (const Slot& s : plain->layout().slots()) {
      const Slot& t = padded->layout().slot(padded->layout().find(s.name));
      std::copy(plain->params() + s.offset, plain->params() + s.offset + s.numel, padded->params() + t.offset);
      std::fill(padded->params() + t.offset + s.numel, padded->params() + t.offset + t.numel, 0.0f);
    }
    return {std::move(plain), std::move(padded)};
  }
  static Batch batch() {
    Batch b;
    b.B = 3;
    b.T = 6;
    for (int i = 0; i < 18; ++i) {
      b.tokens.push_back((7 * i + 1) % 40);
      b.targets.push_back((5 * i + 39) % 40);  // 39: the last true token
    }
    return b;
  }
  fs::path dir_;
};

TEST_F(PaddedVocab, ComputesWhatTheUnpaddedModelDoes) {
  auto [plain, padded] = pair();
  const Batch b = batch();
  plain->zero_grads();
  padded->zero_grads();
  const ForwardStats a = plain->forward(b), p = padded->forward(b);
  EXPECT_TRUE(test::near(p.loss, a.loss, 1e-6 * a.loss)) << p.loss << " vs " << a.loss;
  EXPECT_EQ(p.correct, a.correct);
  plain->backward(1.0f);
  padded->backward(1.0f);
  for (const Slot& s : plain->layout().slots()) {
    const Slot& t = padded->layout().slot(padded->layout().find(s.name));
    EXPECT_TRUE(test::all_close(padded->grads() + t.offset, plain->grads() + s.offset, s.numel, 1e-7, 1e-5))
        << s.name;
    // The pad rows get no gradient at all: their logits are not in the loss.
    for (size_t i = s.numel; i < t.numel; ++i) ASSERT_EQ(padded->grads()[t.offset + i], 0.0f) << s.name << " " << i;
  }
  Batch bad = b;
  bad.targets[4] = 40;  // a pad row's index is not a token
  EXPECT_THROW(padded->forward(bad), InputError);
  // Initialised from a seed, the pad rows are zero too.
  DecoderConfig pc = kConfig;
  pc.padded_vocab = 64;
  Decoder fresh(pc);
  fresh.init_params(1);
  const Slot& wte = fresh.layout().slot(fresh.layout().find("transformer.wte.weight"));
  for (size_t i = 40 * 8; i < wte.numel; ++i) ASSERT_EQ(fresh.params()[wte.offset + i], 0.0f);
  EXPECT_NE(fresh.params()[wte.offset + 40 * 8 - 1], 0.0f);
}

TEST_F(PaddedVocab, FilesHoldTheTrueRowsOnly) {
  auto [plain, padded] = pair();
  for (WeightFormat f : {WeightFormat::Dpt, WeightFormat::Hf}) {
    const std::string file = path(f == WeightFormat::Hf ? "hf.safetensors" : "dpt.safetensors");
    save_weights(*padded, file, f);
    SafetensorsSet r(file);
    const TensorSpec* wte = r.find(f == WeightFormat::Hf ? "wte.weight" : "transformer.wte.weight");
    ASSERT_NE(wte, nullptr);
    EXPECT_EQ(wte->shape, (std::vector<int64_t>{40, 8}));
    EXPECT_EQ(r.metadata().at("padded_vocab_size"), "64");
    auto back = model_from_file(file, {});  // padded again, from the metadata
    ASSERT_EQ(back->param_count(), padded->param_count());
    EXPECT_TRUE(test::bitwise_equal(back->params(), padded->params(), padded->param_count()));
    auto unpadded = model_from_file(file, {{"padded_vocab_size", "40"}});
    EXPECT_TRUE(test::bitwise_equal(unpadded->params(), plain->params(), plain->param_count()));
    // By ranges, as ZeRO-3 reads: the pad rows come back zero.
    std::vector<float> got(padded->param_count(), 1.0f);
    check_weight_file(*padded, r);
    for (size_t at = 0; at < got.size(); at += 100)
      load_weight_range(*padded, r, at, std::min<size_t>(100, got.size() - at), got.data() + at);
    EXPECT_TRUE(test::bitwise_equal(got.data(), padded->params(), got.size()));
  }
}

}  // namespace
}  // namespace dpt
