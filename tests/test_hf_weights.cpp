// Hugging Face GPT-2 weights: the layout told by names and shapes, saved and
// loaded bit for bit, read by ranges as ZeRO-3 reads them, and, against
// PyTorch (tests/parity/hf_gpt2_reference.py), `dpt eval` of a file in the
// published layout gives GPT-2's loss within 1e-5 relative, as does a
// 2-rank zero3 run that loads it and saves it back in that layout.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "compare.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

class HfLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_hf_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  static std::unique_ptr<Decoder> small_gpt() {
    auto m = std::make_unique<Decoder>(DecoderConfig{.vocab = 40, .layers = 2, .heads = 2, .width = 8, .context = 6});
    m->init_params(5);
    return m;
  }
  fs::path dir_;
};

TEST_F(HfLayout, SavedInHfLayoutLoadsBackBitwise) {
  auto m = small_gpt();
  save_weights(*m, path("hf.safetensors"), WeightFormat::Hf);
  SafetensorsReader r(path("hf.safetensors"));
  ASSERT_NE(r.find("h.0.attn.c_attn.weight"), nullptr);  // published names: no prefix
  EXPECT_EQ(r.find("h.0.attn.c_attn.weight")->shape, (std::vector<int64_t>{8, 24}));  // Conv1D [in, out]
  EXPECT_EQ(r.find("h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(r.find("transformer.wte.weight"), nullptr);
  auto back = model_from_file(path("hf.safetensors"), {});  // the engine's metadata describes it
  ASSERT_EQ(back->param_count(), m->param_count());
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
  // A stored value lands where a Linear's [out, in] puts it: c_fc's
  // element (out 3, in 5) is the file's (in 5, out 3).
  std::vector<float> v(1);
  r.read("h.0.mlp.c_fc.weight", 5 * 32 + 3, 1, v.data());
  const Slot& s = m->layout().slot(m->layout().find("transformer.h.0.mlp.c_fc.weight"));
  EXPECT_EQ(v[0], m->params()[s.offset + 3 * 8 + 5]);
}

TEST_F(HfLayout, RangesReadAsZero3ReadsThemEqualTheWholeLoad) {
  auto m = small_gpt();
  save_weights(*m, path("hf.safetensors"), WeightFormat::Hf);
  SafetensorsSet r(path("hf.safetensors"));
  check_weight_file(*m, r);
  const size_t n = m->param_count();
  // Pieces that start and end inside rows of the transposed weights.
  for (size_t piece : {size_t{1}, size_t{7}, size_t{333}, n}) {
    std::vector<float> got(n);
    for (size_t at = 0; at < n; at += piece) load_weight_range(*m, r, at, std::min(piece, n - at), got.data() + at);
    EXPECT_TRUE(test::bitwise_equal(got.data(), m->params(), n)) << "pieces of " << piece;
  }
}

TEST_F(HfLayout, PrefixedNamesAreToldByShapeAndTheFormatOverrides) {
  auto m = small_gpt();
  save_weights(*m, path("hf.safetensors"), WeightFormat::Hf);
  // Rename to GPT2LMHeadModel's names: now the same names as the engine's.
  SafetensorsFile f = load_safetensors(path("hf.safetensors"));
  for (NamedTensor& t : f.tensors) t.name = "transformer." + t.name;
  save_safetensors(path("prefixed.safetensors"), f.tensors, f.metadata);
  auto back = model_from_file(path("prefixed.safetensors"), {});
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
  try {
    model_from_file(path("prefixed.safetensors"), {}, WeightFormat::Dpt);
    FAIL() << "an hf file read as dpt must be refused";
  } catch (const InputError& e) {
    EXPECT_TRUE(has(e.what(), "transformer.h.0.attn.c_attn.weight' has shape [8, 24] but the model expects [24, 8]"))
        << e.what();
  }
  // The engine's own file is not taken for HF's.
  save_weights(*m, path("dpt.safetensors"));
  auto own = model_from_file(path("dpt.safetensors"), {});
  EXPECT_TRUE(test::bitwise_equal(own->params(), m->params(), m->param_count()));
}

TEST_F(HfLayout, AFileThatNothingDescribesIsRefused) {
  auto m = small_gpt();
  save_weights(*m, path("hf.safetensors"), WeightFormat::Hf);
  SafetensorsFile f = load_safetensors(path("hf.safetensors"));
  save_safetensors(path("bare.safetensors"), f.tensors, {{"format", "pt"}});
  try {
    model_from_file(path("bare.safetensors"), {{"dpt.model", "gpt"}});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_TRUE(has(e.what(), "carries no hyper-parameters")) << e.what();
  }
  const std::map<std::string, std::string> flags = {{"dpt.model", "gpt"}, {"vocab_size", "40"}, {"n_layer", "2"},
                                                    {"n_head", "2"}, {"n_embd", "8"}, {"block_size", "6"}};
  auto back = model_from_file(path("bare.safetensors"), flags);
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
  // config.json beside it describes it too.
  std::ofstream(path("config.json")) << R"({"n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 6, "vocab_size": 40})";
  back = model_from_file(path("bare.safetensors"), {});
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
}

// Weights written by another tool with the engine's own hyper-parameter
// keys in the metadata but no dpt.model: read with the kind from the flags
// (this was refused as "carries no hyper-parameters"), and a file holding
// only some of them is told what it lacks, never that it has nothing.
TEST_F(HfLayout, MetadataWithTheEnginesKeysButNoModelKindIsRead) {
  auto m = small_gpt();
  save_weights(*m, path("dpt.safetensors"));
  SafetensorsFile f = load_safetensors(path("dpt.safetensors"));
  std::map<std::string, std::string> meta = f.metadata;
  ASSERT_EQ(meta.erase("dpt.model"), 1u);
  ASSERT_TRUE(meta.count("n_head"));
  save_safetensors(path("keys.safetensors"), f.tensors, meta);
  auto back = model_from_file(path("keys.safetensors"), {{"dpt.model", "gpt"}});  // `--model gpt`
  ASSERT_EQ(back->param_count(), m->param_count());
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
  // Without the head count the sentence names the keys the file has.
  meta.erase("n_head");
  save_safetensors(path("no_heads.safetensors"), f.tensors, meta);
  try {
    model_from_file(path("no_heads.safetensors"), {{"dpt.model", "gpt"}});
    FAIL() << "a GPT file without a head count must be refused";
  } catch (const InputError& e) {
    EXPECT_FALSE(has(e.what(), "carries no hyper-parameters")) << e.what();
    EXPECT_TRUE(has(e.what(), "give vocab_size, n_layer, n_embd, block_size but no n_head")) << e.what();
  }
  back = model_from_file(path("no_heads.safetensors"), {{"dpt.model", "gpt"}, {"n_head", "2"}});
  EXPECT_TRUE(test::bitwise_equal(back->params(), m->params(), m->param_count()));
}

// Against PyTorch: the reference script's files, made once per test program.
class HfParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_hf_parity_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* py = std::getenv("DPT_PYTHON");
    status_ = std::system((std::string(py ? py : "/usr/bin/python3") +
                           " " DPT_SOURCE_DIR "/tests/parity/hf_gpt2_reference.py --out " + q(dir_) + " > /dev/null")
                              .c_str());
    if (status_ == 0) {
      std::ifstream in(dir_ / "hf_loss.json");
      reference_ = nlohmann::json::parse(in)["loss"].get<double>();
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    ASSERT_EQ(status_, 0) << "tests/parity/hf_gpt2_reference.py failed: it needs Debian's python3-torch";
  }
  static test::RunResult dpt(const std::string& args, int limit_s = 120) {
    return test::run_shell(fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT OMP_NUM_THREADS=1 {}/dpt {}",
                                       DPT_BINARY_DIR, args),
                           dir_, limit_s);
  }
  // The loss `dpt eval` prints, NaN if it printed none.
  static double eval_loss(const std::string& args) {
    const test::RunResult r = dpt("eval --threads 1 --data " + q(dir_ / "tokens.bin") + " " + args);
    EXPECT_EQ(r.code, 0) << r.all();
    double loss = NAN;
    if (r.code == 0 && std::sscanf(r.out.c_str(), "loss %lf", &loss) != 1) ADD_FAILURE() << r.out;
    return loss;
  }
  static void expect_reference(double loss, const char* what) {
    EXPECT_TRUE(test::near(loss, reference_, 1e-5 * reference_))
        << what << ": " << fmt::format("{:.8f}", loss) << " against PyTorch's " << fmt::format("{:.8f}", reference_);
  }
  static inline fs::path dir_;
  static inline int status_ = -1;
  static inline double reference_ = NAN;
};

TEST_F(HfParity, EvalOfThePublishedLayoutMatchesPyTorch) {
  expect_reference(eval_loss("--weights " + q(dir_ / "hf" / "model.safetensors")), "hf/ with config.json");
  // The vocabulary of 300 held as 320 rows in memory: the same loss.
  expect_reference(eval_loss("--weights " + q(dir_ / "hf" / "model.safetensors") + " --padded-vocab 320"),
                   "padded to 320");
}

TEST_F(HfParity, PrefixedFileWithLmHeadNeedsSizesFromFlags) {
  const std::string file = q(dir_ / "prefixed" / "model.safetensors");
  const test::RunResult bare = dpt("eval --data " + q(dir_ / "tokens.bin") + " --weights " + file + " --model gpt");
  EXPECT_EQ(bare.code, 1) << bare.all();
  EXPECT_TRUE(has(bare.err, "carries no hyper-parameters")) << bare.err;
  expect_reference(eval_loss("--weights " + file + " --model gpt --vocab 300 --layers 2 --heads 4 --width 32 "
                             "--context 16"),
                   "prefixed/ with flags");
  const test::RunResult wrong = dpt("eval --data " + q(dir_ / "tokens.bin") + " --weights " + file +
                                    " --model gpt --vocab 300 --layers 2 --heads 4 --width 32 --context 16 "
                                    "--load-format dpt");
  EXPECT_EQ(wrong.code, 1);
  EXPECT_TRUE(has(wrong.err, "has shape [32, 96] but the model expects [96, 32]")) << wrong.err;
}

TEST_F(HfParity, Zero3OnTwoRanksLoadsAndSavesTheHfLayout) {
  // One step at a learning rate of 1e-9 moves no weight by more than ~1e-9,
  // so the run's validation loss over every window is the file's loss.
  const fs::path saved = dir_ / "saved" / "model.safetensors";
  fs::create_directories(saved.parent_path());
  const std::string tokens = q(dir_ / "tokens.bin");
  const test::RunResult r =
      dpt(fmt::format("launch -n 2 -- {}/dpt train --load {} --strategy zero3 --steps 1 --batch 4 --lr 1e-9 "
                      "--data {} --val-data {} --eval-windows 0 --quiet --summary-out {} --save {} --save-format hf",
                      DPT_BINARY_DIR, q(dir_ / "hf" / "model.safetensors"), tokens, tokens, q(dir_ / "s.json"),
                      q(saved)));
  ASSERT_EQ(r.code, 0) << r.all();
  std::ifstream in(dir_ / "s.json");
  expect_reference(nlohmann::json::parse(in)["val_loss"].get<double>(), "zero3 validation");
  SafetensorsReader back(saved.string());
  ASSERT_NE(back.find("h.1.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(back.find("h.1.mlp.c_fc.weight")->shape, (std::vector<int64_t>{32, 128}));
  expect_reference(eval_loss("--weights " + q(saved)), "saved by zero3 in hf layout");
}

}  // namespace
}  // namespace dpt
