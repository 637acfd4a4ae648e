// The `dpt` command end to end: train and eval runs, the files they write,
// and how bad input is reported (one "dpt: error:" line, exit code 1).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "device/kernels.h"
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "compare.h"
#include "core/rng.h"
#include "data/fashion_mnist.h"
#include "models/model.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::q;
using test::read_file;
using test::RunResult;

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}


class CliTest : public ::testing::Test {
 protected:
  // Shared by every test: a temp directory and two trained weight files
  // (training is the slow part, so it happens once).
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    mlp_weights_ = dir_ / "saved" / "mlp.safetensors";
    gpt_weights_ = dir_ / "saved" / "gpt.safetensors";
    fs::create_directories(dir_ / "saved");
    mlp_train_ = run("train --model mlp --steps 3 --synthetic --quiet --threads 1 --save " + q(mlp_weights_));
    gpt_train_ = run("train --model gpt " + std::string(kSmallGpt) +
                     " --steps 3 --synthetic --quiet --threads 1 --save " + q(gpt_weights_));
    // ~2 KB of text for GPT evaluation.
    std::string text;
    for (int i = 0; text.size() < 2048; ++i)
      text += fmt::format("line {}: the quick brown fox jumps over the lazy dog.\n", i);
    text_ = dir_ / "text.txt";
    write_file(text_, text);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Runs `dpt <args>`, capturing stdout, stderr and the exit code.
  static RunResult run(const std::string& args) {
    return test::run_shell(fmt::format("{}/dpt {}", DPT_BINARY_DIR, args), dir_);
  }

  // The command must fail the way user errors do: exit code 1 and exactly
  // one line on stderr, "dpt: error: ...", that mentions `keyword`.
  static void expect_user_error(const std::string& args, const std::string& keyword) {
    SCOPED_TRACE("dpt " + args);
    RunResult r = run(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("dpt: error: ")) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n') << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(keyword), std::string::npos) << "'" << keyword << "' not in: " << r.err;
  }

  static constexpr const char* kSmallGpt = "--layers 1 --width 32 --heads 2 --context 16";
  // vocab 256, C 32, T 16, one block: V*C + T*C + 12C^2 + 13C + 2C.
  static constexpr int64_t kSmallGptParams = 256 * 32 + 16 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32;

  static inline fs::path dir_, mlp_weights_, gpt_weights_, text_;
  static inline RunResult mlp_train_, gpt_train_;
};

// ---------------------------------------------------------------- success

TEST_F(CliTest, TrainWritesSummaryJson) {
  const fs::path f = dir_ / "summary.json";
  RunResult r = run("train --model mlp --steps 5 --threads 1 --synthetic --quiet --summary-out " + q(f));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");  // --quiet
  EXPECT_EQ(r.err, "");
  json j = json::parse(read_file(f));  // throws (fails the test) if not JSON
  for (const char* key : {"model", "steps", "step_ms_median", "samples_per_s", "gflops", "mfu", "bytes"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["steps"], 5);
  EXPECT_GT(j["step_ms_median"].get<double>(), 0.0);
  // The step's CPU time: positive, and on one thread it cannot exceed the
  // wall-clock time by more than the clocks' granularity.
  EXPECT_GT(j["step_cpu_ms_median"].get<double>(), 0.0);
  EXPECT_LE(j["step_cpu_ms_median"].get<double>(), 1.05 * j["step_ms_median"].get<double>() + 0.5);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["gflops"].get<double>(), 0.0);
  EXPECT_GE(j["mfu"].get<double>(), 0.0);
  // W-MLP, fp32, SGD momentum: one float of state per parameter.
  EXPECT_EQ(j["bytes"]["parameters"], 1863690 * 4);
  EXPECT_EQ(j["bytes"]["optimizer"], 1863690 * 4);
}

// The summary says how much of the run sat on transparent huge pages
// (core/host_alloc.h advises them for W-MLP's 7 MiB buffers). Whether the
// kernel grants them depends on its free memory, so the advised run is
// held to the RSS only; under THP "madvise" nothing unadvised gets them, so
// the run with the advice off must report none: the figure follows the
// advice, not something else in the process.
TEST_F(CliTest, SummaryCountsTheHugePages) {
  std::string mode;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), mode);
  const fs::path f = dir_ / "huge.json";
  for (const char* advice : {"1", "0"}) {
    SCOPED_TRACE(std::string("DPT_HUGE_PAGES=") + advice);
    RunResult r = test::run_shell(fmt::format("DPT_HUGE_PAGES={} {}/dpt train --model mlp --steps 2 --threads 1 "
                                              "--synthetic --quiet --summary-out {}",
                                              advice, DPT_BINARY_DIR, q(f)),
                                  dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    const json bytes = json::parse(read_file(f)).at("bytes");
    EXPECT_LE(bytes.at("huge_pages").get<uint64_t>(), bytes.at("peak_rss").get<uint64_t>());
    if (std::string(advice) == "0" && mode.find("[madvise]") != std::string::npos) {
      EXPECT_EQ(bytes.at("huge_pages").get<uint64_t>(), 0u);
    }
  }
}

TEST_F(CliTest, SummaryNamesTheBlasKernelsThatRan) {
  // OPENBLAS_CORETYPE forces OpenBLAS's kernel set; the summary reports it.
  const fs::path f = dir_ / "summary_blas.json";
  RunResult r = test::run_shell(fmt::format("OPENBLAS_CORETYPE=Haswell {}/dpt train --model mlp --steps 2 "
                                            "--threads 1 --synthetic --quiet --summary-out {}",
                                            DPT_BINARY_DIR, q(f)),
                                dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(read_file(f))["blas_core"], "Haswell");
}

TEST_F(CliTest, SummaryNamesTheGemmBackendAndItsPeak) {
  for (const char* backend : {"openblas", "onednn"}) {
    SCOPED_TRACE(backend);
    const fs::path f = dir_ / fmt::format("summary_{}.json", backend);
    RunResult r = run(fmt::format("train --model mlp --steps 2 --threads 1 --synthetic --gemm {} --summary-out {}",
                                  backend, q(f)));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(fmt::format("measured {} GEMM peak", backend)), std::string::npos) << r.out;
    json j = json::parse(read_file(f));
    EXPECT_EQ(j["gemm"], backend);
    EXPECT_GT(j["gemm_gflops"].get<double>(), 0.0);
    EXPECT_NE(j["gemm_detail"].get<std::string>().find(backend == std::string("onednn") ? "oneDNN" : "OpenBLAS"),
              std::string::npos);
  }
}

// The step budget: the median step's time inside GEMM calls, on both
// backends and in bf16; W-MLP's step is nearly all GEMMs, so the share must
// be large, and it can never exceed the step.
TEST_F(CliTest, StepBudgetSplitsTheStepIntoGemmsAndTheRest) {
  for (const char* backend : {"openblas", "onednn"})
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(fmt::format("{} {}", backend, precision));
      const fs::path f = dir_ / fmt::format("summary_budget_{}_{}.json", backend, precision);
      RunResult r = run(fmt::format("train --model mlp --steps 6 --threads 1 --synthetic --gemm {} --precision {} "
                                    "--summary-out {}",
                                    backend, precision, q(f)));
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.out.find("step budget (the median step"), std::string::npos) << r.out;
      const json j = json::parse(read_file(f));
      const double gemm = j["step_gemm_ms_median"].get<double>(), step = j["step_ms_median"].get<double>();
      EXPECT_GT(gemm, 0.3 * step) << "W-MLP's step is mostly its GEMMs";
      EXPECT_LE(gemm, step);
      // W-MLP's FLOPs are all GEMMs': their rate is the model's work over
      // the time inside them.
      const double work = j["gflops"].get<double>() * step;
      EXPECT_NEAR(j["step_gemm_gflops"].get<double>(), work / gemm, 1e-6 * work / gemm);
    }
}

TEST_F(CliTest, DeviceAndHsdpAreChecked) {
  // A build without CUDA, or a machine without a GPU, says which; the MLP
  // and the threaded DP never run on GPUs.
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --device tpu", kSmallGpt), "--device");
  if (!dpt::cuda_built())
    expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --device cuda", kSmallGpt),
                      "without CUDA");
  expect_user_error("train --model mlp --strategy dp --steps 1 --device cuda", "dp");
  // --attention fused runs with --device cuda (the GPU's own kernels): where
  // no GPU is, what stops it is the missing GPU, not the attention.
  const RunResult fused = run(fmt::format(
      "train --model gpt {} --synthetic --steps 1 --threads 1 --device cuda --attention fused", kSmallGpt));
  if (fused.code != 0) {
    EXPECT_TRUE(fused.err.find("no CUDA device") != std::string::npos ||
                fused.err.find("without CUDA") != std::string::npos)
        << fused.err;
  }
  // --attention-products bf16: a bf16 run's fused attention on the CPU, refused
  // elsewhere in one sentence each; it trains (loss falls) where it runs.
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --attention-products bf16", kSmallGpt),
                    "this run is fp32");
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --precision bf16 --attention unfused "
                                "--attention-products bf16",
                                kSmallGpt),
                    "this run's attention is unfused");
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --precision bf16 --device cuda "
                                "--attention fused --attention-products bf16",
                                kSmallGpt),
                    test::cuda_refusal("runs on the CPU only"));
  const RunResult products = run(fmt::format(
      "train --model gpt {} --synthetic --steps 30 --threads 1 --precision bf16 --attention-products bf16", kSmallGpt));
  ASSERT_EQ(products.code, 0) << products.err;
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(products.out, loss, std::regex(R"(train loss ([0-9.]+) -> ([0-9.]+))"))) << products.out;
  EXPECT_LT(std::stod(loss[2]), std::stod(loss[1]));
  // hsdp's shard groups: only hsdp has them, and they must divide the ranks
  // (one rank here: a group of 2 cannot).
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --strategy zero3 --shard-group 1", kSmallGpt),
                    "--shard-group");
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --strategy hsdp --shard-group 2", kSmallGpt),
                    "does not divide");
}

// A bf16 run's fused attention on the CPU takes bf16 products unless told
// otherwise (the same run as --attention-products bf16, bit for bit, and
// not the fp32 products' run); every other run fp32; the summary says which.
// What a GPU run's checkpoints and offload take (docs/gpu.md): refused in
// one sentence where not built; elsewhere what stops them here is the
// missing GPU, not the flags.
TEST_F(CliTest, GpuCheckpointsAndOffloadAreRefusedOnlyWhereNotBuilt) {
  const std::string gpu = fmt::format("train --model gpt {} --synthetic --steps 1 --device cuda", kSmallGpt);
  expect_user_error(gpu + " --precision bf16 --strategy zero1 --offload params",
                    test::cuda_refusal("--offload params is not built"));
  const std::string dir = (dir_ / "gpu_ck").string();
  for (const std::string& flags : {std::string(" --offload optimizer"), std::string(" --strategy zero3 --offload optimizer"),
                                   " --checkpoint-dir " + dir, " --resume " + dir}) {
    SCOPED_TRACE(flags);
    const RunResult r = run(gpu + flags);
    if (r.code == 0) continue;  // a GPU is here
    EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos || r.err.find("without CUDA") != std::string::npos ||
                r.err.find("no such checkpoint directory") != std::string::npos)
        << r.err;
  }
}

TEST_F(CliTest, AttentionProductsAreBf16WhereTheyCanRun) {
  const auto products = [&](const std::string& name, const std::string& flags) {
    const fs::path summary = dir_ / (name + ".json"), weights = dir_ / (name + ".st");
    const RunResult r = run(fmt::format("train --synthetic --steps 2 --threads 1 {} --summary-out {} --save {}", flags,
                                        q(summary), q(weights)));
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    const std::string said = json::parse(read_file(summary))["attention_products"].get<std::string>();
    // The run's first line says it too, for a bf16 transformer.
    if (flags.find("bf16") != std::string::npos && flags.find("mlp") == std::string::npos) {
      EXPECT_NE(r.out.find("(attention products in " + said + ")"), std::string::npos) << name << ": " << r.out;
    }
    return said;
  };
  const std::string gpt = fmt::format("--model gpt {}", kSmallGpt);
  EXPECT_EQ(products("bf16_default", gpt + " --precision bf16"), "bf16");
  EXPECT_EQ(products("bf16_given", gpt + " --precision bf16 --attention-products bf16"), "bf16");
  EXPECT_EQ(products("bf16_fp32_products", gpt + " --precision bf16 --attention-products fp32"), "fp32");
  EXPECT_EQ(products("bf16_unfused", gpt + " --precision bf16 --attention unfused"), "fp32");
  EXPECT_EQ(products("fp32", gpt), "fp32");
  EXPECT_EQ(products("mlp", "--model mlp --batch 8"), "none");
  const std::string by_default = read_file(dir_ / "bf16_default.st");
  EXPECT_EQ(by_default, read_file(dir_ / "bf16_given.st"));
  EXPECT_NE(by_default, read_file(dir_ / "bf16_fp32_products.st"));
}

TEST_F(CliTest, PrecisionIsCheckedAndReported) {
  expect_user_error(fmt::format("train --model gpt {} --synthetic --steps 1 --precision fp16", kSmallGpt), "--precision");
  expect_user_error("train --model mlp --strategy dp --steps 1 --precision bf16", "bf16");
  const fs::path summary = dir_ / "bf16_summary.json";
  RunResult r = run(fmt::format("train --model gpt {} --synthetic --steps 2 --threads 1 --precision bf16 --summary-out {}",
                                kSmallGpt, q(summary)));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("bf16 mixed precision"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(read_file(summary));
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["bytes"]["parameters"].get<int64_t>(), 2 * kSmallGptParams);
}

TEST_F(CliTest, EvalInBf16DiffersFromFp32ByRounding) {
  auto loss = [&](const char* precision) {
    RunResult r = run(fmt::format("eval --threads 1 --weights {} --data {} --precision {}", q(gpt_weights_), q(text_),
                                  precision));
    EXPECT_EQ(r.code, 0) << r.err;
    return std::stod(r.out.substr(r.out.find("loss ") + 5));
  };
  const double f = loss("fp32"), h = loss("bf16");
  EXPECT_NE(f, h);
  EXPECT_NEAR(h, f, 0.01 * f);
}

TEST_F(CliTest, EvalUnderEitherGemmBackendGivesTheSameLoss) {
  RunResult a = run("eval --weights " + q(gpt_weights_) + " --data " + q(text_) + " --threads 1 --gemm openblas");
  RunResult b = run("eval --weights " + q(gpt_weights_) + " --data " + q(text_) + " --threads 1 --gemm onednn");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  // Printed to 4 decimals: the backends round differently in the last bits only.
  EXPECT_EQ(a.out, b.out);
}

TEST_F(CliTest, MlpEvalReportsTheLoadedModelsLossAndAccuracy) {
  // A model made here, not trained: a linear classifier (sizes 784,10) by
  // nearest class mean of the test images, logits s (mu_k . x - |mu_k|^2/2).
  // Its loss and accuracy on the 10,000 test images are computed below in
  // double from the same float weights; `dpt eval` must print them. An eval
  // that ignored the file's weights would print another loss (and an
  // accuracy near 10%, not this model's ~68%).
  const ImageSet set = load_fashion_mnist(kFashionMnistDir, "test");
  constexpr int64_t K = 10;
  const int64_t D = static_cast<int64_t>(set.rows) * set.cols;
  auto pixel = [&](int64_t i, int64_t d) {  // as the engine scales them
    return static_cast<float>(set.pixels[static_cast<size_t>(i * D + d)]) * (1.0f / 255.0f);
  };
  std::vector<double> mu(static_cast<size_t>(K * D), 0.0), count(K, 0.0);
  for (int64_t i = 0; i < set.count; ++i) {
    const int64_t k = set.labels[static_cast<size_t>(i)];
    count[static_cast<size_t>(k)] += 1;
    for (int64_t d = 0; d < D; ++d) mu[static_cast<size_t>(k * D + d)] += pixel(i, d);
  }
  auto model = make_model({{"dpt.model", "mlp"}, {"sizes", fmt::format("{},{}", D, K)}});
  const double s = 0.2;
  float* w = model->params() + model->layout().slot(model->layout().find("0.weight")).offset;
  float* b = model->params() + model->layout().slot(model->layout().find("0.bias")).offset;
  for (int64_t k = 0; k < K; ++k) {
    double sq = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double m = mu[static_cast<size_t>(k * D + d)] / count[static_cast<size_t>(k)];
      w[k * D + d] = static_cast<float>(s * m);
      sq += m * m;
    }
    b[k] = static_cast<float>(-0.5 * s * sq);
  }
  const fs::path weights = dir_ / "centroids.safetensors";
  save_weights(*model, weights.string());

  double loss_sum = 0.0;
  int64_t correct = 0, near_ties = 0;
  for (int64_t i = 0; i < set.count; ++i) {
    double logits[K], top = -INFINITY, second = -INFINITY;
    int64_t arg = 0;
    for (int64_t k = 0; k < K; ++k) {
      double z = b[k];
      for (int64_t d = 0; d < D; ++d) z += static_cast<double>(w[k * D + d]) * pixel(i, d);
      logits[k] = z;
      if (z > top) second = top, top = z, arg = k;
      else if (z > second) second = z;
    }
    double sum = 0.0;
    for (double z : logits) sum += std::exp(z - top);
    loss_sum += top + std::log(sum) - logits[set.labels[static_cast<size_t>(i)]];
    correct += arg == set.labels[static_cast<size_t>(i)];
    near_ties += top - second < 1e-4;  // fp32 may pick the other class
  }
  const double want_loss = loss_sum / static_cast<double>(set.count);
  const double want_acc = 100.0 * static_cast<double>(correct) / static_cast<double>(set.count);

  RunResult r = run("eval --weights " + q(weights) + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  double loss = NAN, acc = NAN;
  long long images = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "loss %lf accuracy %lf%% (%lld images)", &loss, &acc, &images), 3) << r.out;
  EXPECT_EQ(images, set.count);
  std::printf("[ measure  ] dpt eval: %s           want loss %.6f accuracy %.2f%% (%lld near ties)\n",
              r.out.substr(0, r.out.find('\n')).c_str(), want_loss, want_acc, static_cast<long long>(near_ties));
  // Printed to 4 decimals (loss) and 2 (percent): half a unit of the last
  // digit, plus fp32's own rounding.
  EXPECT_TRUE(test::near(loss, want_loss, 5e-5 + 1e-5 * want_loss)) << r.out << "want loss " << want_loss;
  EXPECT_TRUE(test::near(acc, want_acc, 0.005 + 0.01 * static_cast<double>(near_ties)))
      << r.out << "want accuracy " << want_acc << "% (" << near_ties << " near ties)";
}

TEST_F(CliTest, GptEvalReportsTheLoadedModelsLoss) {
  // Weights made here, far from any initialisation (N(0, 0.02) plus noise
  // of 0.3: a loss of 6.82, not the ln 256 = 5.55 of an initialisation), so
  // an eval that ignored them cannot come close. The expected loss is the model's own forward (checked
  // against PyTorch in test_parity) on every whole window of the text, one
  // window at a time: this checks what `dpt eval` adds, loading the file,
  // cutting the windows and averaging over positions.
  auto model = make_model({{"dpt.model", "gpt"}, {"n_layer", "1"}, {"n_embd", "32"}, {"n_head", "2"},
                           {"block_size", "16"}});
  model->init_params(1);
  Rng rng(2);
  for (size_t i = 0; i < model->param_count(); ++i) model->params()[i] += 0.3f * rng.normal();
  const fs::path weights = dir_ / "rough_gpt.safetensors";
  save_weights(*model, weights.string());
  const std::string text = read_file(text_);
  const int64_t T = 16, windows = static_cast<int64_t>(text.size()) / (T + 1);
  double loss_sum = 0.0;
  Batch batch;
  batch.B = 1;
  batch.T = T;
  for (int64_t w = 0; w < windows; ++w) {
    batch.tokens.clear();
    batch.targets.clear();
    for (int64_t t = 0; t < T; ++t) {
      batch.tokens.push_back(static_cast<uint8_t>(text[static_cast<size_t>(w * (T + 1) + t)]));
      batch.targets.push_back(static_cast<uint8_t>(text[static_cast<size_t>(w * (T + 1) + t + 1)]));
    }
    loss_sum += model->forward(batch).loss;
  }
  const double want = loss_sum / static_cast<double>(windows);

  RunResult r = run("eval --weights " + q(weights) + " --data " + q(text_) + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  double loss = NAN;
  long long positions = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "loss %lf (%lld positions)", &loss, &positions), 2) << r.out;
  // Every whole window of context + 1 = 17 bytes, 16 targets each.
  EXPECT_EQ(positions, windows * T);
  std::printf("[ measure  ] dpt eval: %s           want loss %.6f\n", r.out.substr(0, r.out.find('\n')).c_str(),
              want);
  // Printed to 6 decimals; fp32 means of batches of 16 windows against
  // means of one.
  EXPECT_TRUE(test::near(loss, want, 5e-5 + 1e-5 * want)) << r.out << "want loss " << want;
  EXPECT_GT(want, std::log(256.0) + 1.0) << "the weights must be far from an initialisation";
}

TEST_F(CliTest, TrainFromLoadReadsModelFromMetadata) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const fs::path f = dir_ / "load_summary.json";
  RunResult r = run("train --load " + q(gpt_weights_) +
                    " --steps 1 --synthetic --quiet --threads 1 --summary-out " + q(f));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(read_file(f));
  EXPECT_EQ(j["model"], "gpt");
  // The file's small model, not W-GPT's defaults.
  EXPECT_EQ(j["params"], kSmallGptParams);
}

// Another family's weights: both families named, not the first tensor the
// other family misses (llama) or the first setting it does not have (mlp).
TEST_F(CliTest, LoadOfAnotherFamilyNamesBoth) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  for (const char* model : {"llama", "mlp"}) {
    expect_user_error(fmt::format("train --model {} --load {} --steps 1 --synthetic --quiet --threads 1", model,
                                  q(gpt_weights_)),
                      fmt::format("the file holds a gpt model, and --model says {}", model));
  }
}

TEST_F(CliTest, MetricsOutHasOneLinePerLoggedStep) {
  const fs::path m = dir_ / "metrics.jsonl";
  RunResult r = run("train --model mlp --steps 4 --log-every 1 --synthetic --quiet --threads 1 "
                    "--metrics-out " + q(m));
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(read_file(m));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    json j = json::parse(line);
    EXPECT_EQ(j["step"], n);
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
    EXPECT_FLOAT_EQ(j["lr"].get<float>(), 0.05f) << line;  // SGD's default, constant
  }
  EXPECT_EQ(n, 4);
}

TEST_F(CliTest, SavingLeavesNoTemporaryFiles) {
  ASSERT_EQ(mlp_train_.code, 0) << mlp_train_.err;
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "saved")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"gpt.safetensors", "mlp.safetensors"}));
  for (const auto& n : names) EXPECT_EQ(n.find(".tmp."), std::string::npos) << n;
}

// ---------------------------------------------------------------- user errors

TEST_F(CliTest, EvalOfMissingWeightsFile) {
  expect_user_error("eval --threads 1 --weights " + q(dir_ / "nothing_here.safetensors"),
                    "nothing_here.safetensors");
}

TEST_F(CliTest, EvalOfCorruptWeightsFile) {
  Rng rng(42);
  std::string junk(4096, '\0');
  for (char& c : junk) c = static_cast<char>(rng.below(256));
  const fs::path p = dir_ / "corrupt.safetensors";
  write_file(p, junk);
  expect_user_error("eval --threads 1 --weights " + q(p), "corrupt.safetensors");
  expect_user_error("eval --threads 1 --weights " + q(p), "header");
}

TEST_F(CliTest, EvalOfTruncatedWeightsFile) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const std::string whole = read_file(gpt_weights_);
  const fs::path p = dir_ / "truncated.safetensors";
  write_file(p, whole.substr(0, whole.size() / 2));
  expect_user_error("eval --threads 1 --weights " + q(p) + " --data " + q(text_), "truncated.safetensors");
}

TEST_F(CliTest, EvalWithFlagsThatDisagreeWithFileNamesTheTensor) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  expect_user_error("eval --threads 1 --weights " + q(gpt_weights_) + " --width 64 --data " + q(text_),
                    "transformer.wte.weight");
}

TEST_F(CliTest, TrainMlpOnNonexistentData) {
  expect_user_error("train --model mlp --data /nonexistent --steps 1 --quiet --threads 1", "/nonexistent");
}

TEST_F(CliTest, TraceOutInAMissingDirectoryFailsBeforeTraining) {
  RunResult r = run("train --model mlp --synthetic --steps 100000 --quiet --threads 1 --trace-out "
                    "/nonexistent/trace.json");
  EXPECT_LT(r.seconds, 10.0);  // not after 100,000 steps
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("dpt: error: /nonexistent/trace.json")) << r.err;
}

// Building a model looked each new slot's name up by a linear search: a
// 20,000-block GPT (240,000 slots) took minutes before the memory check
// could refuse it; now a second.
TEST_F(CliTest, ADeepModelIsRefusedByTheMemoryCheckWithoutHanging) {
  const RunResult r = test::run_shell(
      fmt::format("{}/dpt train --model gpt --layers 20000 --width 32 --heads 2 --context 4 --batch 1 --synthetic "
                  "--steps 1 --quiet --threads 1 --memory-budget-mb 1",
                  DPT_BINARY_DIR),
      dir_, 60);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--strategy local needs about"), std::string::npos) << r.err;
}

// Sizes no machine holds, refused before anything is built from them: a
// batch of 2^62 overflowed the byte counts (an internal check, "gemm with K
// = 0"), 2^63 - 1 blocks looped building their slots (a hang), an MLP width
// of 2^63 - 1 reached oneDNN ("could not construct a memory descriptor").
TEST_F(CliTest, SizesPastAnyMachineAreRefusedBeforeAnythingIsBuilt) {
  const std::string gpt = "--model gpt --layers 2 --heads 2 --width 32 --synthetic --steps 1 --quiet --threads 1 ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"train " + gpt + "--batch 4611686018427387904 --context 1024",
            "the model and a batch of 4611686018427387904 need about 1.16e+26 bytes, past 2^56 (64 PiB)"},
           {"train --model gpt --heads 2 --width 32 --synthetic --steps 1 --quiet --threads 1 --batch 1 --context 4 "
            "--layers 9223372036854775807",
            "9223372036854775807 blocks are more than 65536, the most the engine builds"},
           {"train --model llama --layers 2 --width 32 --heads 2 --kv-heads 1 --synthetic --steps 1 --quiet "
            "--threads 1 --batch 1 --context 4 --intermediate 9223372036854775807",
            "the model's MLP width of 9223372036854775807 is past 2^31 - 1"},
           {"plan --model gpt --ranks 2 --batch 4611686018427387904 --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1",
            "past 2^56 (64 PiB)"}}) {
    SCOPED_TRACE(args);
    const RunResult r = test::run_shell(fmt::format("{}/dpt {}", DPT_BINARY_DIR, args), dir_, 20);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("dpt: error: ")) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(CliTest, GptEvalOnTextShorterThanOneWindow) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const fs::path p = dir_ / "short.txt";
  write_file(p, "too short");  // 9 bytes; a window is 17
  expect_user_error("eval --threads 1 --weights " + q(gpt_weights_) + " --data " + q(p), "window");
}

TEST_F(CliTest, GradAccumThatDoesNotDivideBatch) {
  expect_user_error("train --model mlp --synthetic --steps 1 --quiet --threads 1 --batch 256 --grad-accum 3",
                    "micro-batches");
}

TEST_F(CliTest, UnknownGemmBackend) {
  expect_user_error("train --model mlp --synthetic --steps 1 --quiet --threads 1 --gemm foo", "GEMM backend 'foo'");
  expect_user_error("eval --weights " + q(mlp_weights_) + " --gemm blas", "GEMM backend 'blas'");
}

TEST_F(CliTest, Bf16GemmModeIsCheckedAndReported) {
  expect_user_error("train --model mlp --synthetic --steps 1 --quiet --threads 1 --bf16-gemm fast",
                    "bf16 GEMM mode 'fast'");
  expect_user_error("train --model mlp --synthetic --steps 1 --quiet --threads 1 --gemm openblas --bf16-gemm native",
                    "--bf16-gemm native needs oneDNN's bf16 kernels: the openblas backend has none");
  // Widened on request, whatever the CPU: the summary and the throughput
  // line say so, and the bf16 run differs from fp32 only by rounding.
  const fs::path f = dir_ / "summary_widened.json";
  RunResult r = run(fmt::format("train --model gpt {} --synthetic --steps 3 --threads 1 --precision bf16 --gemm onednn "
                                "--bf16-gemm widened --summary-out {}",
                                kSmallGpt, q(f)));
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["bf16_gemm"], "widened");
  EXPECT_NE(r.out.find("bf16 widened to fp32 (--bf16-gemm widened)"), std::string::npos) << r.out;
  EXPECT_NE(j["gemm_detail"].get<std::string>().find("widened"), std::string::npos);
}

// ---------------------------------------------------------------- flag errors
// A bad command line is a user error like any other: one sentence, exit 1.

TEST_F(CliTest, UnknownFlagIsAUserError) {
  expect_user_error("train --model mlp --steps 1 --threads 1 --no-such-flag", "--no-such-flag");
}

TEST_F(CliTest, UnknownModelIsAUserError) { expect_user_error("train --model foo --steps 1 --threads 1", "foo"); }

TEST_F(CliTest, NegativeStepsIsAUserError) {
  expect_user_error("train --model mlp --steps -1 --threads 1", "--steps: must be a positive number, not -1");
  // 0 is what "not given" is held as: --steps 0 trained the default 200 steps.
  expect_user_error("train --model gpt --steps 0 --synthetic --threads 1", "--steps: must be a positive number, not 0");
}

TEST_F(CliTest, NoSubcommandIsAUserError) { expect_user_error("", "subcommand"); }

// Every whole-number flag of every command (as --help lists them, INT or
// UINT): CLI11 read 99999999999999999999 as 2^63 - 1 for a 64-bit variable
// (--steps: a run that never ended) and said "Could not convert: --tp =
// ..." for a 32-bit one; 1e30 was "Could not convert" too. Now one sentence
// naming the flag and the range of its variable.
TEST_F(CliTest, EveryWholeNumberFlagRefusesAValueOutOfItsRange) {
  const std::string int64 = "a whole number from -9223372036854775808 to 9223372036854775807";
  const std::string int32 = "a whole number from -2147483648 to 2147483647";
  const std::string uint64 = "a whole number from 0 to 18446744073709551615";
  const std::string uint32 = "a whole number from 0 to 4294967295";
  const std::regex listed(R"(^\s+(?:-\w,)?(--[\w-]+) (U?INT)\b)");
  int flags = 0;
  for (const char* command : {"train", "eval", "generate", "tokens", "launch", "plan", "bench comm", "bench data"}) {
    std::istringstream help(run(fmt::format("{} --help", command)).out);
    for (std::string line; std::getline(help, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, listed)) continue;
      const std::string flag = m[1], type = m[2];
      SCOPED_TRACE(fmt::format("{} {}", command, flag));
      ++flags;
      const RunResult r = run(fmt::format("{} {} 99999999999999999999", command, flag));
      EXPECT_EQ(r.code, 1) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      const std::string says = fmt::format("dpt: error: {}: 99999999999999999999 is out of range (", flag);
      EXPECT_TRUE(r.err == says + (type == "INT" ? int64 : uint64) + ")\n" ||
                  r.err == says + (type == "INT" ? int32 : uint32) + ")\n")
          << r.err;
      expect_user_error(fmt::format("{} {} 1e30", command, flag),
                        fmt::format("{}: '1e30' is not a whole number (write it in decimal digits)", flag));
      expect_user_error(fmt::format("{} {} abc", command, flag), fmt::format("{}: 'abc' is not a number", flag));
    }
  }
  EXPECT_GE(flags, 60);
  // Each variable's own range: --steps is 64 bits, --tp 32, --seed unsigned.
  expect_user_error("train --model mlp --steps 9223372036854775808", "--steps: 9223372036854775808 is out of range (" +
                                                                          int64 + ")");
  expect_user_error("train --model mlp --tp 2147483648", "--tp: 2147483648 is out of range (" + int32 + ")");
  expect_user_error("train --model mlp --seed -1", "--seed: -1 is out of range (" + uint64 + ")");
  expect_user_error("train --model mlp --steps 0x10", "--steps: '0x10' is not a whole number");
}

// strtoll in base 0 read a leading zero as octal: --steps 010 trained 8.
TEST_F(CliTest, AWholeNumberWithLeadingZerosIsDecimal) {
  const std::string f = (dir_ / "octal.json").string();
  const RunResult r = run(fmt::format("train --model mlp --sizes 784,8,10 --synthetic --quiet --threads 1 --steps 010 "
                                      "--summary-out {}",
                                      test::q(f)));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(read_file(f)).at("steps"), 10);
}

TEST_F(CliTest, NonFiniteNumbersAreRefusedInEveryFloatFlag) {
  for (const char* flag : {"--lr", "--momentum", "--beta1", "--beta2", "--eps", "--weight-decay", "--min-lr", "--clip",
                           "--val-fraction", "--bucket-mb", "--first-bucket-mb", "--comm-timeout",
                           "--memory-budget-mb", "--save-shard-mb", "--offload-chunk-mb"})
    for (const char* value : {"nan", "inf", "-inf"})
      expect_user_error(fmt::format("train --model gpt --steps 1 --threads 1 {} {}", flag, value),
                        fmt::format("{}: must be", flag));
}

// Sizes and a timeout given in decimal become 64-bit byte and millisecond
// counts: 1e30 made an undefined conversion, and ran.
TEST_F(CliTest, DecimalSizesPastAnyMachineAreRefused) {
  for (const char* flag : {"--bucket-mb", "--first-bucket-mb", "--memory-budget-mb", "--save-shard-mb",
                           "--offload-chunk-mb"})
    expect_user_error(fmt::format("train --model gpt --steps 1 --threads 1 {} 1e30", flag),
                      fmt::format("{}: must be a positive size of at most 1073741824 MiB (1 PiB), not 1e30", flag));
  expect_user_error("train --model gpt --steps 1 --threads 1 --comm-timeout 1e300",
                    "--comm-timeout: must be a positive number of seconds, at most 10000000 (116 days), not 1e300");
  expect_user_error("bench comm --timeout 1e300",
                    "--timeout: must be a positive number of seconds, at most 10000000 (116 days), not 1e300");
}

// The mlp read no transformer setting and the GPT no --sizes: each was
// dropped silently. A final comma in --sizes read as the sizes before it.
TEST_F(CliTest, ModelSettingsOfAnotherModelAreRefused) {
  const std::string train = "train --synthetic --steps 1 --quiet --threads 1 ";
  expect_user_error(train + "--model mlp --layers 3", "model setting n_layer is a transformer's, not the mlp's");
  expect_user_error(train + "--model mlp --vocab 100", "model setting vocab_size is a transformer's, not the mlp's");
  expect_user_error(train + "--model gpt " + kSmallGpt + " --sizes 784,10", "model setting sizes is the mlp's, not gpt's");
  expect_user_error(train + "--model mlp --sizes 784,10,", "MLP sizes '784,10,' must be positive integers");
  expect_user_error("eval --threads 1 --layers 3 --weights " + q(mlp_weights_), "n_layer is a transformer's");
}

// dpt bench data took its sizes unchecked: --context 0 divided by zero
// counting windows (SIGFPE), a NaN --seconds read nothing.
TEST_F(CliTest, BenchDataSizesAreChecked) {
  const fs::path shards = dir_ / "bench_shards";
  ASSERT_EQ(run(fmt::format("tokens --input {} --out {}", q(text_), q(shards))).code, 0);
  for (const char* flag : {"--context", "--batch", "--vocab", "--seconds"})
    for (const char* value : {"0", "-1", "nan"})
      expect_user_error(fmt::format("bench data --data {} {} {}", q(shards), flag, value),
                        fmt::format("{}: ", flag));
}

TEST_F(CliTest, OutOfRangeFlagsSayTheRangeReadably) {
  const RunResult r = run("train --model mlp --steps 1 --momentum 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "dpt: error: --momentum: must be between 0 and 1, not 2\n");
  expect_user_error("train --model gpt --steps 1 --beta2 1", "--beta2: must be at least 0 and below 1, not 1");
  expect_user_error("train --model gpt --steps abc", "--steps: 'abc' is not a number");
  expect_user_error("launch -n 0 -- true", "-n must be at least 1");
}

TEST_F(CliTest, TrainHelpDescribesMultiRankRuns) {
  const RunResult r = run("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("on one process"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("launcher"), std::string::npos) << r.out;
}

TEST_F(CliTest, WeightsHoldingNaNAreRefused) {
  const SafetensorsFile good = load_safetensors(gpt_weights_.string());
  SafetensorsFile bad = good;
  bad.tensors[1].data[3] = std::nanf("");
  const fs::path path = dir_ / "nan.safetensors";
  save_safetensors(path.string(), bad.tensors, bad.metadata);
  expect_user_error(fmt::format("eval --weights {} --data {} --threads 1", q(path), q(text_)), "values must be finite");
  expect_user_error(fmt::format("train --load {} --data {} --steps 1 --threads 1", q(path), q(text_)),
                    "values must be finite");
}

}  // namespace
}  // namespace dpt
