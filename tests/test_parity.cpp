// Parity with PyTorch, in the spirit of llm.c's test_gpt2.c: a script using
// Debian's python3-torch writes a small GPT and MLP with their inputs, loss,
// every gradient and a 3-step optimizer trajectory; the engine loads the same
// weights and must reproduce all of it.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/threads.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "optim/optimizer.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// Generates the reference files once per test program, at test time.
class Parity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("dpt_parity_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const char* py = std::getenv("DPT_PYTHON");
    std::string cmd = std::string(py ? py : "/usr/bin/python3") + " " DPT_SOURCE_DIR
                      "/tests/parity/make_reference.py --out " + dir_.string() + " > /dev/null";
    status_ = std::system(cmd.c_str());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    ASSERT_EQ(status_, 0) << "tests/parity/make_reference.py failed: it needs Debian's "
                             "python3-torch (the README's test command installs it)";
    set_threads(2);
  }
  static std::string file(const std::string& name) { return (dir_ / name).string(); }

  static inline fs::path dir_;
  static inline int status_ = -1;
};

// Every element of `got` finite and within atol + rtol * max|want| of `want`.
void expect_close(const std::string& what, const float* got, const NamedTensor& want, double atol,
                  double rtol) {
  EXPECT_TRUE(test::all_close(got, want.data.data(), want.data.size(), atol, rtol)) << what;
}

Batch batch_from(const SafetensorsFile& io, bool gpt) {
  Batch b;
  if (gpt) {
    const NamedTensor& tok = *io.find("tokens");
    b.B = tok.shape[0];
    b.T = tok.shape[1];
    for (float v : tok.data) b.tokens.push_back(static_cast<int32_t>(v));
    for (float v : io.find("targets")->data) b.targets.push_back(static_cast<int32_t>(v));
  } else {
    const NamedTensor& x = *io.find("x");
    b.B = x.shape[0];
    b.features = x.data;
    for (float v : io.find("labels")->data) b.targets.push_back(static_cast<int32_t>(v));
  }
  return b;
}

float meta_float(const SafetensorsFile& f, const std::string& key) {
  return std::stof(f.metadata.at(key));
}

// Loss and gradients at the initial weights, then the optimizer trajectory.
void check_parity(const std::string& weights, const std::string& io_path, bool gpt) {
  auto model = model_from_file(weights, {});
  SafetensorsFile io = load_safetensors(io_path);
  Batch batch = batch_from(io, gpt);

  model->zero_grads();
  float loss = model->forward(batch).loss;
  EXPECT_NEAR(loss, io.find("loss")->data[0], 1e-5);
  model->backward(1.0f);
  for (const Slot& s : model->layout().slots()) {
    const NamedTensor* g = io.find("grad." + s.name);
    ASSERT_NE(g, nullptr) << s.name;
    expect_close("grad " + s.name, model->grads() + s.offset, *g, 1e-7, 1e-4);
  }

  OptimizerConfig oc;
  oc.name = io.metadata.at("optimizer");
  if (oc.name == "adamw") {
    oc.beta1 = meta_float(io, "beta1");
    oc.beta2 = meta_float(io, "beta2");
    oc.eps = meta_float(io, "eps");
    oc.weight_decay = meta_float(io, "weight_decay");
  } else {
    oc.momentum = meta_float(io, "momentum");
  }
  const float lr = meta_float(io, "lr"), clip = meta_float(io, "clip");
  auto opt = make_optimizer(oc, model->layout(), 0, model->param_count());
  const NamedTensor& losses = *io.find("losses");
  const NamedTensor* norms = io.find("grad_norms");
  const int steps = std::stoi(io.metadata.at("steps"));
  for (int step = 0; step < steps; ++step) {
    model->zero_grads();
    float l = model->forward(batch).loss;
    EXPECT_NEAR(l, losses.data[static_cast<size_t>(step)], 2e-5) << "step " << step;
    model->backward(1.0f);
    double norm = std::sqrt(sum_of_squares(model->grads(), model->param_count()));
    if (norms) {
      EXPECT_NEAR(norm, norms->data[static_cast<size_t>(step)], 1e-4) << "step " << step;
    }
    if (clip > 0) scale(model->grads(), model->param_count(), clip_factor(norm, clip));
    opt->step(model->params(), model->grads(), lr);
  }
  EXPECT_NEAR(model->forward(batch).loss, losses.data[static_cast<size_t>(steps)], 2e-5);
  for (const Slot& s : model->layout().slots())
    expect_close("final " + s.name, model->params() + s.offset, *io.find("final." + s.name), 2e-6, 1e-4);
}

TEST_F(Parity, GptMatchesPyTorch) {
  check_parity(file("gpt_weights.safetensors"), file("gpt_io.safetensors"), true);
}

TEST_F(Parity, MlpMatchesPyTorch) {
  check_parity(file("mlp_weights.safetensors"), file("mlp_io.safetensors"), false);
}

}  // namespace
}  // namespace dpt
