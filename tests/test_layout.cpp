// Layouts of named parameters, the MLP's and GPT's parameter lists (PyTorch
// and nanoGPT names), the order in which backward finishes units, model
// construction from hyper-parameters, and weight files.
#include "tensor/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/error.h"
#include "data/batches.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/mlp.h"
#include "models/model.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

using Shape = std::vector<int64_t>;

// Slots are back to back from offset 0; units are back to back, cover the
// whole buffer, and hold exactly their slots.
void expect_well_formed(const Layout& l) {
  size_t at = 0;
  for (size_t i = 0; i < l.slots().size(); ++i) {
    const Slot& s = l.slots()[i];
    EXPECT_EQ(s.offset, at) << s.name;
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    EXPECT_EQ(s.numel, n) << s.name;
    at += s.numel;
  }
  EXPECT_EQ(at, l.numel());
  size_t unit_at = 0;
  int slot_at = 0;
  for (size_t u = 0; u < l.units().size(); ++u) {
    const Unit& unit = l.units()[u];
    EXPECT_EQ(unit.offset, unit_at) << unit.name;
    EXPECT_EQ(unit.first_slot, slot_at) << unit.name;
    size_t n = 0;
    for (int i = unit.first_slot; i < unit.first_slot + unit.slot_count; ++i) {
      EXPECT_EQ(l.slot(i).unit, static_cast<int>(u)) << l.slot(i).name;
      n += l.slot(i).numel;
    }
    EXPECT_EQ(unit.numel, n) << unit.name;
    unit_at += unit.numel;
    slot_at += unit.slot_count;
  }
  EXPECT_EQ(unit_at, l.numel());
  EXPECT_EQ(slot_at, static_cast<int>(l.slots().size()));
}

std::vector<std::string> names_of(const Layout& l) {
  std::vector<std::string> v;
  for (const Slot& s : l.slots()) v.push_back(s.name);
  return v;
}

std::vector<std::string> unit_names_of(const Layout& l) {
  std::vector<std::string> v;
  for (const Unit& u : l.units()) v.push_back(u.name);
  return v;
}

// ---------------------------------------------------------------- Layout

TEST(Layout, SlotsAndUnitsAreContiguous) {
  Layout l;
  l.begin_unit("a");
  EXPECT_EQ(l.add("x", {2, 3}, true), 0);
  EXPECT_EQ(l.add("y", {4}, false), 1);
  l.begin_unit("b");
  EXPECT_EQ(l.add("z", {5}, false), 2);
  expect_well_formed(l);
  EXPECT_EQ(l.numel(), 15u);
  EXPECT_EQ(l.slot(0).offset, 0u);
  EXPECT_EQ(l.slot(1).offset, 6u);
  EXPECT_EQ(l.slot(2).offset, 10u);
  EXPECT_EQ(l.slot(2).unit, 1);
  EXPECT_TRUE(l.slot(0).decay);
  EXPECT_FALSE(l.slot(1).decay);
  ASSERT_EQ(l.units().size(), 2u);
  EXPECT_EQ(l.units()[0].numel, 10u);
  EXPECT_EQ(l.units()[0].slot_count, 2);
  EXPECT_EQ(l.units()[1].offset, 10u);
  EXPECT_EQ(l.units()[1].numel, 5u);
  EXPECT_EQ(l.units()[1].first_slot, 2);
}

TEST(Layout, FindReturnsIndexOrMinusOne) {
  Layout l;
  l.begin_unit("a");
  l.add("x", {2}, false);
  l.add("y", {3}, false);
  EXPECT_EQ(l.find("x"), 0);
  EXPECT_EQ(l.find("y"), 1);
  EXPECT_EQ(l.find("z"), -1);
  EXPECT_EQ(l.find(""), -1);
}

TEST(Layout, DuplicateNameIsAnInternalError) {
  Layout l;
  l.begin_unit("a");
  l.add("x", {2}, false);
  l.begin_unit("b");
  EXPECT_THROW(l.add("x", {3}, false), InternalError);
  EXPECT_EQ(l.numel(), 2u);  // the refused slot was not added
}

TEST(Layout, SlotBeforeAnyUnitOrEmptyDimensionIsAnInternalError) {
  Layout l;
  EXPECT_THROW(l.add("x", {2}, false), InternalError);
  l.begin_unit("a");
  EXPECT_THROW(l.add("y", {2, 0}, false), InternalError);
}

TEST(Layout, ShapeString) {
  EXPECT_EQ(shape_str({3, 4}), "[3, 4]");
  EXPECT_EQ(shape_str({7}), "[7]");
  EXPECT_EQ(shape_str({}), "[]");
}

// ---------------------------------------------------------------- MLP

TEST(MlpLayout, DefaultHasPyTorchSequentialNames) {
  Mlp m{MlpConfig{}};
  const Layout& l = m.layout();
  expect_well_formed(l);
  EXPECT_EQ(names_of(l), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias",
                                                   "4.weight", "4.bias"}));
  EXPECT_EQ(l.slot(0).shape, (Shape{1024, 784}));
  EXPECT_EQ(l.slot(1).shape, (Shape{1024}));
  EXPECT_EQ(l.slot(2).shape, (Shape{1024, 1024}));
  EXPECT_EQ(l.slot(3).shape, (Shape{1024}));
  EXPECT_EQ(l.slot(4).shape, (Shape{10, 1024}));
  EXPECT_EQ(l.slot(5).shape, (Shape{10}));
  EXPECT_EQ(unit_names_of(l), (std::vector<std::string>{"0", "2", "4"}));
  for (const Slot& s : l.slots()) EXPECT_EQ(s.decay, s.shape.size() == 2) << s.name;
  EXPECT_EQ(m.param_count(), 1863690u);
  EXPECT_EQ(m.kind(), "mlp");
}

// ---------------------------------------------------------------- GPT

// nanoGPT's parameter names and shapes, in order, for a config.
std::vector<std::pair<std::string, Shape>> nanogpt_params(const DecoderConfig& c) {
  const int64_t C = c.width;
  std::vector<std::pair<std::string, Shape>> v = {{"transformer.wte.weight", {c.vocab, C}},
                                                  {"transformer.wpe.weight", {c.context, C}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    v.push_back({p + "ln_1.weight", {C}});
    v.push_back({p + "ln_1.bias", {C}});
    v.push_back({p + "attn.c_attn.weight", {3 * C, C}});
    v.push_back({p + "attn.c_attn.bias", {3 * C}});
    v.push_back({p + "attn.c_proj.weight", {C, C}});
    v.push_back({p + "attn.c_proj.bias", {C}});
    v.push_back({p + "ln_2.weight", {C}});
    v.push_back({p + "ln_2.bias", {C}});
    v.push_back({p + "mlp.c_fc.weight", {4 * C, C}});
    v.push_back({p + "mlp.c_fc.bias", {4 * C}});
    v.push_back({p + "mlp.c_proj.weight", {C, 4 * C}});
    v.push_back({p + "mlp.c_proj.bias", {C}});
  }
  v.push_back({"transformer.ln_f.weight", {C}});
  v.push_back({"transformer.ln_f.bias", {C}});
  return v;
}

void expect_nanogpt_layout(const Decoder& g) {
  const Layout& l = g.layout();
  expect_well_formed(l);
  const auto want = nanogpt_params(g.config());
  ASSERT_EQ(l.slots().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(l.slot(static_cast<int>(i)).name, want[i].first) << "slot " << i;
    EXPECT_EQ(l.slot(static_cast<int>(i)).shape, want[i].second) << want[i].first;
    // Weight decay on matrices (embeddings included), never on vectors.
    EXPECT_EQ(l.slot(static_cast<int>(i)).decay, want[i].second.size() == 2) << want[i].first;
  }
  std::vector<std::string> units = {"transformer.embed"};
  for (int64_t i = 0; i < g.config().layers; ++i) units.push_back("transformer.h." + std::to_string(i));
  units.push_back("transformer.ln_f");
  EXPECT_EQ(unit_names_of(l), units);
  // Every block unit holds exactly its own 12 slots.
  for (const Unit& u : l.units())
    for (int i = u.first_slot; i < u.first_slot + u.slot_count; ++i)
      EXPECT_TRUE(l.slot(i).name.starts_with(u.name == "transformer.embed" ? "transformer.w" : u.name))
          << l.slot(i).name << " in " << u.name;
}

TEST(GptLayout, DefaultIsWGptWithNanoGptNames) {
  Decoder g{DecoderConfig{}};
  EXPECT_EQ(g.config().vocab, 256);
  EXPECT_EQ(g.config().layers, 4);
  EXPECT_EQ(g.config().heads, 4);
  EXPECT_EQ(g.config().width, 256);
  EXPECT_EQ(g.config().context, 128);
  expect_nanogpt_layout(g);
  const int64_t V = 256, C = 256, T = 128, L = 4;
  EXPECT_EQ(g.param_count(), static_cast<size_t>(V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C));
  EXPECT_EQ(g.param_count(), 3257856u);
  EXPECT_EQ(g.kind(), "gpt");
}

TEST(GptLayout, SmallConfigFromHyperParameters) {
  auto m = make_model({{"dpt.model", "gpt"}, {"vocab_size", "50"}, {"n_layer", "3"},
                       {"n_head", "2"}, {"n_embd", "12"}, {"block_size", "9"}});
  auto* g = dynamic_cast<Decoder*>(m.get());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->config().vocab, 50);
  EXPECT_EQ(g->config().layers, 3);
  EXPECT_EQ(g->config().heads, 2);
  EXPECT_EQ(g->config().width, 12);
  EXPECT_EQ(g->config().context, 9);
  expect_nanogpt_layout(*g);
  const int64_t V = 50, C = 12, T = 9, L = 3;
  EXPECT_EQ(g->param_count(), static_cast<size_t>(V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C));
}

// ---------------------------------------------------------------- on_grads_ready

// Runs one forward/backward and records every range as it is reported, with
// a copy of its gradients then. Checks: the ranges tile the whole buffer
// from its end to its start (each ends where the previous one began), so
// every element is reported exactly once; each range already holds a
// non-zero gradient; nothing in it changes afterwards (so a strategy may
// reduce it right away). Returns the number of ranges.
size_t expect_grads_final_when_ready(Model& m, int64_t B) {
  m.init_params(11);
  Batch batch;
  fill_synthetic(m, B, 5, batch);
  m.zero_grads();
  struct Report {
    size_t offset, numel;
    std::vector<float> values;
  };
  std::vector<Report> reports;
  m.on_grads_ready = [&](size_t offset, size_t numel) {
    reports.push_back({offset, numel, std::vector<float>(m.grads() + offset, m.grads() + offset + numel)});
    const float* g = m.grads() + offset;
    EXPECT_TRUE(std::any_of(g, g + numel, [](float x) { return x != 0.0f; }))
        << "range " << offset << "+" << numel << " has no gradient when reported";
  };
  m.forward(batch);
  m.backward(1.0f);
  m.on_grads_ready = nullptr;

  size_t end = m.param_count();
  for (const Report& r : reports) {
    EXPECT_GT(r.numel, 0u);
    EXPECT_EQ(r.offset + r.numel, end) << "range " << r.offset << "+" << r.numel << " is out of order";
    end = r.offset;
    EXPECT_TRUE(test::bitwise_equal(m.grads() + r.offset, r.values.data(), r.numel))
        << "gradients " << r.offset << "+" << r.numel << " changed after they were reported ready";
  }
  EXPECT_EQ(end, 0u) << "gradients [0, " << end << ") were never reported";
  return reports.size();
}

TEST(OnGradsReady, GptReportsEveryLayerOnceFinalFromTheEnd) {
  Decoder g{DecoderConfig{.vocab = 32, .layers = 3, .heads = 2, .width = 16, .context = 8}};
  // ln_f, six parameter pairs per block, the embeddings.
  EXPECT_EQ(expect_grads_final_when_ready(g, 3), 1u + 3 * 6 + 1);
}

TEST(OnGradsReady, MlpReportsEveryLayerOnceFinalFromTheEnd) {
  Mlp m{MlpConfig{{20, 16, 12, 5}}};
  EXPECT_EQ(expect_grads_final_when_ready(m, 7), 3u * 2);  // bias, weight per layer
}

TEST(OnGradsReady, WMlpReportsLargeWeightsInRowBlocks) {
  // 1024x784 and 1024x1024 weights exceed the 2^18-element block: four
  // blocks of 256 rows each; the 10x1024 head is one. Plus three biases.
  Mlp m{MlpConfig{}};
  EXPECT_EQ(expect_grads_final_when_ready(m, 4), 3u + 4 + 4 + 1);
}

// ---------------------------------------------------------------- make_model

void expect_input_error(const std::map<std::string, std::string>& hp, const std::string& needle) {
  try {
    make_model(hp);
    FAIL() << "expected InputError mentioning '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MakeModel, BuildsEachKindWithDefaults) {
  EXPECT_EQ(make_model({{"dpt.model", "mlp"}})->param_count(), 1863690u);
  EXPECT_EQ(make_model({{"dpt.model", "gpt"}})->param_count(), 3257856u);
  auto mlp = make_model({{"dpt.model", "mlp"}, {"sizes", "4,3,2"}});
  EXPECT_EQ(mlp->param_count(), 4u * 3 + 3 + 3 * 2 + 2);
  EXPECT_EQ(mlp->metadata().at("sizes"), "4,3,2");
}

TEST(MakeModel, UnknownOrMissingModelIsAnInputError) {
  expect_input_error({{"dpt.model", "rnn"}}, "rnn");
  EXPECT_THROW(make_model({}), InputError);
}

TEST(MakeModel, NonIntegerSizeIsAnInputError) {
  expect_input_error({{"dpt.model", "gpt"}, {"n_layer", "2x"}}, "n_layer");
  expect_input_error({{"dpt.model", "gpt"}, {"n_embd", "1.5"}}, "n_embd");
  expect_input_error({{"dpt.model", "gpt"}, {"block_size", "0"}}, "block_size");
  expect_input_error({{"dpt.model", "gpt"}, {"n_head", "-2"}}, "n_head");
  expect_input_error({{"dpt.model", "gpt"}, {"vocab_size", ""}}, "vocab_size");
  expect_input_error({{"dpt.model", "mlp"}, {"sizes", "784,abc,10"}}, "784,abc,10");
  expect_input_error({{"dpt.model", "mlp"}, {"sizes", "784"}}, "784");
}

TEST(MakeModel, WidthNotDivisibleByHeadsIsAnInputError) {
  expect_input_error({{"dpt.model", "gpt"}, {"n_embd", "30"}, {"n_head", "4"}}, "30");
}

// ---------------------------------------------------------------- weights

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("dpt_layout_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::unique_ptr<Model> small_gpt() {
    auto m = make_model({{"dpt.model", "gpt"}, {"vocab_size", "40"}, {"n_layer", "2"},
                         {"n_head", "2"}, {"n_embd", "8"}, {"block_size", "6"}});
    m->init_params(3);
    return m;
  }
  static std::unique_ptr<Model> small_mlp() {
    auto m = make_model({{"dpt.model", "mlp"}, {"sizes", "6,4,3"}});
    m->init_params(4);
    return m;
  }
  // The model's parameters as tensors, as save_weights writes them.
  static std::vector<NamedTensor> tensors_of(const Model& m) {
    std::vector<NamedTensor> v;
    for (const Slot& s : m.layout().slots()) {
      NamedTensor t;
      t.name = s.name;
      t.shape = s.shape;
      t.data.assign(m.params() + s.offset, m.params() + s.offset + s.numel);
      v.push_back(std::move(t));
    }
    return v;
  }
  // Loading `p` must fail with an InputError mentioning every needle.
  static void expect_load_error(const std::string& p, const std::vector<std::string>& needles) {
    try {
      model_from_file(p, {});
      FAIL() << "expected InputError";
    } catch (const InputError& e) {
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
  }
  static void expect_params_equal(const Model& a, const Model& b) {
    ASSERT_EQ(a.param_count(), b.param_count());
    EXPECT_TRUE(test::bitwise_equal(a.params(), b.params(), a.param_count()));
  }

  fs::path dir_;
};

TEST_F(WeightsTest, GptRoundTripIsBitwise) {
  auto m = small_gpt();
  save_weights(*m, path("g.safetensors"));
  auto back = model_from_file(path("g.safetensors"), {});
  EXPECT_EQ(back->kind(), "gpt");
  EXPECT_EQ(back->metadata(), m->metadata());
  expect_params_equal(*m, *back);
  // The tied output projection is not written (safetensors refuses shared tensors).
  EXPECT_EQ(load_safetensors(path("g.safetensors")).find("lm_head.weight"), nullptr);
}

TEST_F(WeightsTest, MlpRoundTripIsBitwise) {
  auto m = small_mlp();
  save_weights(*m, path("m.safetensors"));
  auto back = model_from_file(path("m.safetensors"), {});
  EXPECT_EQ(back->kind(), "mlp");
  EXPECT_EQ(back->metadata().at("sizes"), "6,4,3");
  expect_params_equal(*m, *back);
}

TEST_F(WeightsTest, WrongShapeNamesTensorAndBothShapes) {
  auto m = small_mlp();
  auto t = tensors_of(*m);
  ASSERT_EQ(t[0].name, "0.weight");
  t[0].shape = {6, 4};  // same count, transposed: the model expects [4, 6]
  save_safetensors(path("w.safetensors"), t, m->metadata());
  expect_load_error(path("w.safetensors"), {"0.weight", "[6, 4]", "[4, 6]"});
}

TEST_F(WeightsTest, OverridesThatDisagreeWithFileNameTheTensor) {
  auto m = small_gpt();
  save_weights(*m, path("g.safetensors"));
  try {
    model_from_file(path("g.safetensors"), {{"n_embd", "16"}});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("transformer.wte.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[40, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[40, 16]"), std::string::npos) << msg;
  }
}

TEST_F(WeightsTest, MissingTensorIsAnInputError) {
  auto m = small_mlp();
  auto t = tensors_of(*m);
  t.erase(t.begin() + 3);  // "2.bias"
  save_safetensors(path("w.safetensors"), t, m->metadata());
  expect_load_error(path("w.safetensors"), {"2.bias", "missing"});
}

TEST_F(WeightsTest, UnexpectedTensorIsAnInputError) {
  auto m = small_mlp();
  auto t = tensors_of(*m);
  t.push_back({"extra.weight", DType::F32, {2}, {1.0f, 2.0f}});
  save_safetensors(path("w.safetensors"), t, m->metadata());
  expect_load_error(path("w.safetensors"), {"extra.weight"});
}

TEST_F(WeightsTest, MissingModelKindIsAnInputError) {
  auto m = small_mlp();
  save_safetensors(path("w.safetensors"), tensors_of(*m), {{"sizes", "6,4,3"}});
  expect_load_error(path("w.safetensors"), {"dpt.model"});
  // A flag naming the model is enough.
  auto back = model_from_file(path("w.safetensors"), {{"dpt.model", "mlp"}});
  expect_params_equal(*m, *back);
}

TEST_F(WeightsTest, LmHeadEqualToWteIsAccepted) {
  auto m = small_gpt();
  auto t = tensors_of(*m);
  NamedTensor head = t[0];
  ASSERT_EQ(head.name, "transformer.wte.weight");
  head.name = "lm_head.weight";
  t.push_back(head);
  save_safetensors(path("w.safetensors"), t, m->metadata());
  auto back = model_from_file(path("w.safetensors"), {});
  expect_params_equal(*m, *back);
}

TEST_F(WeightsTest, LmHeadUnequalToWteIsRefused) {
  auto m = small_gpt();
  auto t = tensors_of(*m);
  NamedTensor head = t[0];
  head.name = "lm_head.weight";
  head.data[5] += 0.25f;
  t.push_back(head);
  save_safetensors(path("w.safetensors"), t, m->metadata());
  expect_load_error(path("w.safetensors"), {"lm_head.weight"});
}

TEST_F(WeightsTest, LmHeadWithWrongShapeIsRefused) {
  auto m = small_gpt();
  auto t = tensors_of(*m);
  NamedTensor head = t[0];
  head.name = "lm_head.weight";
  head.shape = {8, 40};
  t.push_back(head);
  save_safetensors(path("w.safetensors"), t, m->metadata());
  expect_load_error(path("w.safetensors"), {"lm_head.weight"});
}

}  // namespace
}  // namespace dpt
