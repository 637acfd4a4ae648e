// Tensor parallelism end to end (docs/tensor_parallel.md): `dpt train --tp` jobs
// under mpirun against one process with the same global batch, compared on
// the weights they save (gathered from the slices into the same PyTorch-named
// file) and the losses they log.
//
//   tp 2 and 3 (6 heads), 20 steps of AdamW and of SGD: within 1e-5. The
//     row-parallel projections' outputs and the column-parallel ones' input
//     gradients are sums over the TP ranks, added in another order than one
//     GEMM adds them: rounding differs, nothing else. One exception, under
//     AdamW only: the key third of every c_attn.bias. Softmax ignores a key
//     bias, so its true gradient is 0 and what backward computes is rounding
//     noise; AdamW's update m / (sqrt(v) + eps) is about lr x sign(g) for
//     any gradient far above eps, so those elements take lr-sized steps of a
//     random sign and two runs that round differently part at once
//     (measured, tp 2: 1.9e-6 apart on values of 1.7e-6, 4.4e-4 of the
//     tensor's max; every other tensor within 4.7e-6). AdamW compares every
//     other element; SGD (momentum 0.9), which moves them by lr x noise,
//     compares all of them (measured worst 4.2e-7).
//   Meshes, 20 SGD steps clipped to a norm of 0.3 (so the global gradient
//     norm across TP, DP and PP groups decides every update), within 1e-5:
//     dp 2 x tp 2 under DDP and ZeRO-3 (the strategy over the DP group,
//     unchanged), tp 2 x pp 2 at M = 2, and dp 2 x tp 2 x pp 2 under ZeRO-3
//     (8 ranks); zero3 with --offload optimizer at dp 2 x tp 2.
//   bf16 (--precision bf16), tp 2 and dp 2 x tp 2 zero3 (also with
//     --offload params: fp32 masters on disk), 20 SGD steps:
//     within 1e-2 of one bf16 process. Every GEMM rounds its inputs to bf16
//     (8 bits of mantissa), so the fp32 rounding differences of the TP sums
//     move values across bf16 rounding boundaries (measured 4.1e-3; bf16
//     against fp32 in one process is 7.6e-3 apart); a missing all-reduce or
//     a wrong slice moves them by orders of magnitude more.
//   --load: each rank reads its slices of a whole model's file, in the
//     engine's layout and in Hugging Face's (Conv1D weights transposed), as
//     a whole tensor (local: load_weights) or a shard's range (zero3:
//     load_weight_range), and by the stages of tp 2 x pp 2; 10 SGD steps on
//     from it within 1e-5 of one process.
//   Checkpoints: pieces are placed by their place in the whole tensor, so a
//     tp 2 run resumed at step 5 of 10 ends bitwise where the uninterrupted
//     run does, and the same checkpoint resumed by one process and by dp 2 x
//     tp 2 zero3, and one process's checkpoint resumed at tp 3, end within
//     1e-5 of the uninterrupted runs (SGD).
//   The ledger: per step and micro-batch, each block's two all-reduces of
//     B x T x C floats in forward and two in backward, each sending what
//     the ring's chunking gives rank 0 (all but its own chunk in the
//     reduce-scatter, all but its successor's in the all-gather). With
//     --checkpoint-activations backward recomputes each block's forward,
//     its two all-reduces included: four in backward, and the weights still
//     within 1e-5 of one process.
//   Evaluation: a replica's TP ranks evaluate the same windows together;
//     the final validation loss within 1e-5 of one process's (every run
//     compared, --pp included).
//   Memory: a rank holds 1/tp of every block's matrices (and of c_attn's
//     and c_fc's biases), the rest whole; its gradients and AdamW state the same.
//   --tp-embedding vocab (wte's rows and the logits split, a parallel
//     cross-entropy): the same comparisons at tp 2 and 3 (256 rows padded
//     to 258 at tp 3), with ZeRO-3 and with pipeline stages; AdamW holds
//     c_attn's query and key rows to 1e-4 (their gradients are ~100x
//     smaller than the value rows', differences of larger terms, and AdamW
//     normalises them: measured 1.6e-5, against 7.9e-6 for the replicated
//     embedding); rows held, activations (no B x T x V buffer) and the
//     ledger exactly; checkpoints across layouts.
//   HSDP over the DP group: dp 2 x tp 2 (shard groups of 1, of 2) and dp 4
//     x tp 2 (groups of 2), within 1e-5, under a collective deadline.
//   The summary's 2(N-1)/N is the data-parallel group's.
//   Refusals: one sentence, exit 1, before any work.
//
// "Within r": per tensor, max|a - b| <= r x max|b|, and the same for every
// logged step's loss. Data: a generated text, so every world size sees the
// same sequences.
//
// Registered in tests/CMakeLists.txt (ctest names tp_cli.*).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "corpus_runs.h"
#include "comm/types.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::read_file;
using test::RunResult;

// Six heads of 8 channels: tp 2 and 3 both divide them. One thread
// everywhere, as one process would otherwise take all cores.
constexpr int64_t kLayers = 2, kWidth = 48, kContext = 16, kVocab = 256;
const std::string kGpt = fmt::format(
    "--model gpt --layers {} --heads 6 --width {} --context {} --seed 3 --quiet --log-every 1 --threads 1", kLayers,
    kWidth, kContext);

class TpCliTest : public test::CorpusRuns<TpCliTest> {
 protected:
  static void SetUpTestSuite() {
    make_folder("dpt_tp_cli", {"the", "tensor", "slice", "head", "column", "row", "reduce", "sum", "grad", "loss"});
  }

  // Per tensor and per loss a logs: max|a - b| <= r x max|b|; with
  // skip_key_biases, c_attn.bias's key third is left out (see the top);
  // with qk_r > 0, c_attn's query and key thirds are held to qk_r instead
  // (AdamW under --tp-embedding vocab, see the top).
  static void expect_within(const fs::path& a, const fs::path& b, double r, bool skip_key_biases = false,
                            double qk_r = 0.0) {
    const SafetensorsFile fa = load_safetensors(a.string() + ".st"), fb = load_safetensors(b.string() + ".st");
    ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
    double worst = 0.0;
    for (const NamedTensor& tb : fb.tensors) {
      const NamedTensor* ta = fa.find(tb.name);
      ASSERT_NE(ta, nullptr) << tb.name;
      ASSERT_EQ(ta->shape, tb.shape) << tb.name;
      const size_t third = tb.data.size() / 3;
      const bool key_bias = skip_key_biases && tb.name.ends_with("attn.c_attn.bias");
      const bool qk = qk_r > 0 && tb.name.find("attn.c_attn.") != std::string::npos;
      double diff = 0.0, diff_qk = 0.0, peak = 0.0;
      for (size_t i = 0; i < tb.data.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ta->data[i])) << tb.name;
        if (key_bias && i >= third && i < 2 * third) continue;
        peak = std::max(peak, std::fabs(static_cast<double>(tb.data[i])));
        double& d = qk && i < 2 * third ? diff_qk : diff;
        d = std::max(d, std::fabs(static_cast<double>(ta->data[i]) - tb.data[i]));
      }
      EXPECT_LE(diff, r * peak) << tb.name << " of " << a << " against " << b;
      EXPECT_LE(diff_qk, qk_r * peak) << tb.name << "'s query and key rows, of " << a << " against " << b;
      if (qk && peak > 0)
        std::printf("[ measure  ] %s: %s query and key rows %.3e\n", a.filename().c_str(), tb.name.c_str(),
                    diff_qk / peak);
      worst = std::max(worst, peak > 0 ? diff / peak : diff);
    }
    test::expect_losses_within(a, b, r);
    // The final evaluation.
    const nlohmann::json sa = summary(a), sb = summary(b);
    if (sa.contains("val_loss")) {
      const double va = sa["val_loss"].get<double>(), vb = sb.at("val_loss").get<double>();
      EXPECT_LE(std::fabs(va - vb), r * std::fabs(vb)) << "validation loss";
    }
    std::printf("[ measure  ] %s vs %s: worst tensor max|a-b|/max|b| %.3e\n", a.filename().c_str(),
                b.filename().c_str(), worst);
  }
};

TEST_F(TpCliTest, TensorParallelWithinOneProcess) {
  for (const bool adamw : {true, false}) {
    const std::string opt = adamw ? "adamw" : "sgd";
    const std::string args =
        kGpt + " --batch 4 --steps 20" + (adamw ? " --optimizer adamw" : " --optimizer sgd --lr 0.05 --momentum 0.9");
    const fs::path one = run_ok(1, "one_" + opt, args);
    for (int tp : {2, 3}) {
      SCOPED_TRACE(fmt::format("tp {} {}", tp, opt));
      const fs::path stem = run_ok(tp, fmt::format("tp{}_{}", tp, opt), fmt::format("{} --tp {}", args, tp));
      expect_within(stem, one, 1e-5, adamw);
      // TP ranks meet inside forward and backward: no lock-step split of
      // their comm wait (train/lockstep.h).
      const nlohmann::json j = summary(stem);
      EXPECT_FALSE(j.contains("lockstep"));
      for (const auto& rank : j["ranks"]) EXPECT_FALSE(rank.contains("comm_wait_slower_rank_ms")) << rank;
    }
  }
}

TEST_F(TpCliTest, MeshesWithinOneProcess) {
  const std::string args =
      kGpt + " --batch 4 --micro-batches 2 --steps 20 --optimizer sgd --lr 0.05 --momentum 0.9 --clip 0.3";
  const fs::path one = run_ok(1, "one_mesh", args);
  struct Mesh {
    int ranks;
    std::string name, flags;
  };
  for (const Mesh& m : std::vector<Mesh>{{4, "dp2_tp2_ddp", "--tp 2 --strategy ddp"},
                                         {4, "dp2_tp2_zero3", "--tp 2 --strategy zero3"},
                                         {4, "tp2_pp2", "--tp 2 --pp 2"},
                                         {8, "dp2_tp2_pp2_zero3", "--tp 2 --pp 2 --strategy zero3"}}) {
    SCOPED_TRACE(m.name);
    expect_within(run_ok(m.ranks, m.name, args + " " + m.flags), one, 1e-5);
  }
}

TEST_F(TpCliTest, OffloadWithinOneProcess) {
  const std::string args =
      kGpt + " --batch 4 --micro-batches 2 --steps 10 --optimizer sgd --lr 0.05 --momentum 0.9 --clip 0.3";
  const fs::path one = run_ok(1, "one_offload", args);
  fs::create_directories(dir_ / "offload");
  expect_within(run_ok(4, "dp2_tp2_zero3_offload",
                       args + " --tp 2 --strategy zero3 --offload optimizer --offload-dir " + q(dir_ / "offload")),
                one, 1e-5);
}

TEST_F(TpCliTest, Bf16WithinOneBf16Process) {
  const std::string args =
      kGpt + " --batch 4 --steps 20 --optimizer sgd --lr 0.05 --momentum 0.9 --precision bf16";
  const fs::path one = run_ok(1, "one_bf16", args);
  expect_within(run_ok(2, "tp2_bf16", args + " --tp 2"), one, 1e-2);
  expect_within(run_ok(4, "dp2_tp2_zero3_bf16", args + " --tp 2 --strategy zero3"), one, 1e-2);
  fs::create_directories(dir_ / "offload_params");
  expect_within(run_ok(4, "dp2_tp2_zero3_bf16_offload_params",
                       args + " --tp 2 --strategy zero3 --offload params --offload-dir " + q(dir_ / "offload_params")),
                one, 1e-2);
}

TEST_F(TpCliTest, LoadReadsTheRanksSlices) {
  const std::string args = kGpt + " --batch 4 --optimizer sgd --lr 0.05 --momentum 0.9";
  const fs::path start = dir_ / "start";
  for (const char* format : {"dpt", "hf"}) {
    const RunResult r = train(1, fmt::format("{} --steps 5 --save {} --save-format {}", args,
                                             q(fmt::format("{}_{}.st", start.string(), format)), format));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const std::string from = fmt::format(" --steps 10 --load {}_", start.string());
  const fs::path one = run_ok(1, "one_loaded", args + from + "dpt.st");
  expect_within(run_ok(2, "tp2_loaded_hf", args + from + "hf.st --tp 2"), one, 1e-5);
  expect_within(run_ok(4, "dp2_tp2_zero3_loaded", args + from + "dpt.st --tp 2 --strategy zero3"), one, 1e-5);
  expect_within(run_ok(4, "dp2_tp2_zero3_loaded_hf", args + from + "hf.st --tp 2 --strategy zero3"), one, 1e-5);
  expect_within(run_ok(4, "tp2_pp2_loaded_hf", args + from + "hf.st --tp 2 --pp 2"), one, 1e-5);
}

TEST_F(TpCliTest, CheckpointsResumeAtAnyLayout) {
  const std::string args = kGpt + " --batch 4 --steps 10 --optimizer sgd --lr 0.05 --momentum 0.9";
  const std::string ckpt = " --checkpoint-every 5 --checkpoint-dir ";
  const fs::path tp2 = run_ok(2, "tp2_ckpt_full", args + " --tp 2" + ckpt + q(dir_ / "ck_tp2"));
  const fs::path one = run_ok(1, "one_ckpt_full", args + ckpt + q(dir_ / "ck_one"));
  const std::string from_tp2 = " --resume " + q(dir_ / "ck_tp2" / "step-00000005");
  const fs::path resumed = run_ok(2, "tp2_resumed", args + " --tp 2" + from_tp2);
  EXPECT_TRUE(read_file(resumed.string() + ".st") == read_file(tp2.string() + ".st")) << "tp 2 resumed differs";
  expect_within(run_ok(1, "one_from_tp2", args + from_tp2), one, 1e-5);
  expect_within(run_ok(4, "dp2_tp2_zero3_from_tp2", args + " --tp 2 --strategy zero3" + from_tp2), tp2, 1e-5);
  expect_within(run_ok(3, "tp3_from_one", args + " --tp 3 --resume " + q(dir_ / "ck_one" / "step-00000005")), one,
                1e-5);
}

// The ledger: forward and backward send only the TP all-reduces (one
// replica, so no data-parallel reduction), two per block each way per
// micro-batch, each of B x T x C floats.
TEST_F(TpCliTest, LedgerHoldsFourAllReducesPerBlock) {
  const int64_t M = 2, B = 4 / M;
  const size_t count = static_cast<size_t>(B * kContext * kWidth);
  for (int tp : {2, 3}) {
    SCOPED_TRACE(fmt::format("tp {}", tp));
    const fs::path stem =
        run_ok(tp, fmt::format("ledger_tp{}", tp), fmt::format("{} --batch 4 --micro-batches {} --steps 3 --tp {}", kGpt, M, tp));
    // Rank 0 sits at ring position 0: it sends every chunk but its own in
    // the reduce-scatter, and every chunk but its successor's (position 1)
    // in the all-gather.
    const uint64_t per_all_reduce =
        4 * (2 * count - comm::chunk_range(count, tp, 0).size - comm::chunk_range(count, tp, 1).size);
    EXPECT_EQ(per_all_reduce * tp, 4 * 2 * count * static_cast<uint64_t>(tp - 1));  // 2(tp-1)/tp of each
    const nlohmann::json phases = summary(stem)["comm_bytes_per_phase"];
    EXPECT_EQ(phases["forward"].get<uint64_t>(), 2 * kLayers * M * per_all_reduce) << phases;
    EXPECT_EQ(phases["backward"].get<uint64_t>(), 2 * kLayers * M * per_all_reduce) << phases;
  }
}

TEST_F(TpCliTest, CheckpointedActivationsRecomputeTheirAllReduces) {
  const int64_t M = 2, B = 4 / M;
  const size_t count = static_cast<size_t>(B * kContext * kWidth);
  const std::string args =
      kGpt + " --batch 4 --micro-batches 2 --steps 10 --optimizer sgd --lr 0.05 --momentum 0.9 --checkpoint-activations";
  const fs::path one = run_ok(1, "one_ckpt", args);
  const fs::path tp = run_ok(2, "tp2_ckpt", args + " --tp 2");
  expect_within(tp, one, 1e-5);
  const uint64_t per_all_reduce = 4 * count;  // tp 2: half the buffer in each of the ring's two phases
  const nlohmann::json phases = summary(tp)["comm_bytes_per_phase"];
  EXPECT_EQ(phases["forward"].get<uint64_t>(), 2 * kLayers * M * per_all_reduce) << phases;
  EXPECT_EQ(phases["backward"].get<uint64_t>(), 4 * kLayers * M * per_all_reduce) << phases;
}

// Each rank holds 1/tp of c_attn, attn.c_proj, c_fc and mlp.c_proj (and
// c_attn's and c_fc's biases, sliced with their rows); the LayerNorms, the
// row-parallel biases, the embeddings and ln_f whole. Gradients and AdamW's
// two moments follow the parameters.
TEST_F(TpCliTest, RankHoldsItsSlice) {
  const int64_t C = kWidth, L = kLayers;
  const int64_t replicated = kVocab * C + kContext * C + L * (6 * C) + 2 * C;
  const int64_t sliced = L * (12 * C * C + 7 * C);
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("tp {}", tp));
    const std::string tp_flag = tp == 1 ? "" : fmt::format(" --tp {}", tp);
    const fs::path stem = run_ok(tp, fmt::format("bytes_tp{}", tp), kGpt + " --batch 4 --steps 1" + tp_flag);
    const nlohmann::json s = summary(stem);
    const int64_t held = replicated + sliced / tp;
    EXPECT_EQ(s["params"].get<int64_t>(), held);
    EXPECT_EQ(s["bytes"]["parameters"].get<int64_t>(), 4 * held);
    EXPECT_EQ(s["bytes"]["gradients"].get<int64_t>(), 4 * held);
    EXPECT_EQ(s["bytes"]["optimizer"].get<int64_t>(), 8 * held);
  }
}

// --tp-embedding vocab: wte's rows (and the head's logits) split over the
// TP ranks, with tp 3 padding the 256 rows to 258. The same comparisons as
// the replicated embedding's: 20 AdamW and SGD steps at tp 2 and 3, and
// tp 2 with ZeRO-3 over dp 2 and with two pipeline stages (the last
// stage's head on its TP rank's rows of the first stage's wte), clipped.
TEST_F(TpCliTest, VocabParallelWithinOneProcess) {
  for (const bool adamw : {true, false}) {
    const std::string opt = adamw ? "adamw" : "sgd";
    const std::string args =
        kGpt + " --batch 4 --steps 20" + (adamw ? " --optimizer adamw" : " --optimizer sgd --lr 0.05 --momentum 0.9");
    const fs::path one = run_ok(1, "one_vocab_" + opt, args);
    for (int tp : {2, 3}) {
      SCOPED_TRACE(fmt::format("tp {} {}", tp, opt));
      expect_within(run_ok(tp, fmt::format("tp{}_vocab_{}", tp, opt),
                           fmt::format("{} --tp {} --tp-embedding vocab", args, tp)),
                    one, 1e-5, adamw, adamw ? 1e-4 : 0.0);
    }
  }
  const std::string mesh =
      kGpt + " --batch 4 --micro-batches 2 --steps 20 --optimizer sgd --lr 0.05 --momentum 0.9 --clip 0.3";
  const fs::path one = run_ok(1, "one_vocab_mesh", mesh);
  expect_within(run_ok(4, "dp2_tp2_zero3_vocab", mesh + " --tp 2 --strategy zero3 --tp-embedding vocab"), one, 1e-5);
  for (int tp : {2, 3}) {
    const fs::path pp = run_ok(2 * tp, fmt::format("tp{}_pp2_vocab", tp),
                               fmt::format("{} --tp {} --pp 2 --tp-embedding vocab", mesh, tp));
    expect_within(pp, one, 1e-5);
    // The last stage's copy of wte, and its gradient, are its TP rank's rows.
    const int64_t rows = (kVocab + tp - 1) / tp;
    EXPECT_EQ(summary(pp)["pipeline"]["stages"][1]["tied_copy_bytes"].get<int64_t>(), 2 * rows * kWidth * 4);
  }
}

// --load into a vocabulary-parallel wte: each rank picks its rows out of a
// one-process file (Hugging Face's layout), the last tp 3 rank's 2 pad rows
// zero, whole (load_weights) and by a ZeRO-3 shard's ranges
// (load_weight_range, dp 2 x tp 3); 10 SGD steps on within 1e-5. And bf16:
// tp 2 within 1e-2 of one bf16 process, as the replicated embedding.
TEST_F(TpCliTest, VocabParallelLoadsAndComputesInBf16) {
  const std::string args = kGpt + " --batch 4 --optimizer sgd --lr 0.05 --momentum 0.9";
  const fs::path start = dir_ / "vocab_start_hf.st";
  const RunResult r = train(1, fmt::format("{} --steps 5 --save {} --save-format hf", args, q(start)));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string from = " --steps 10 --load " + q(start);
  const fs::path one = run_ok(1, "one_vocab_loaded", args + from);
  expect_within(run_ok(3, "tp3_vocab_loaded", args + from + " --tp 3 --tp-embedding vocab"), one, 1e-5);
  expect_within(run_ok(6, "dp2_tp3_zero3_vocab_loaded", args + from + " --tp 3 --strategy zero3 --tp-embedding vocab"),
                one, 1e-5);
  const std::string bf16 = args + " --steps 20 --precision bf16";
  expect_within(run_ok(2, "tp2_vocab_bf16", bf16 + " --tp 2 --tp-embedding vocab"), run_ok(1, "one_vocab_bf16", bf16),
                1e-2);
}

// A rank holds wte's V/tp rows (V padded to a multiple of tp), its
// gradient and optimizer state; its activations hold B x T x V/tp logits
// and 3 B x T floats for the cross-entropy's reductions in place of the
// B x T x V logits (nothing else changes); the ledger has one all-reduce of
// B x T x C more each way per micro-batch (the embedding's lookups, the
// head's input gradient) and the loss's Max of B x T and Sum of 2 B x T.
TEST_F(TpCliTest, VocabParallelHoldsItsRows) {
  const int64_t C = kWidth, L = kLayers, M = 2, B = 4 / M, N = B * kContext;
  const int64_t others = kContext * C + L * (6 * C) + 2 * C, blocks = L * (12 * C * C + 7 * C);
  // What rank 0 sends in one ring all-reduce of `count` floats.
  auto sent = [](size_t count, int tp) {
    return 4 * (2 * count - comm::chunk_range(count, tp, 0).size - comm::chunk_range(count, tp, 1).size);
  };
  const std::string args = fmt::format("{} --batch 4 --micro-batches {} --steps 2", kGpt, M);
  for (int tp : {2, 3}) {
    SCOPED_TRACE(fmt::format("tp {}", tp));
    const int64_t rows = (kVocab + tp - 1) / tp;  // 128, 86
    const nlohmann::json vocab =
        summary(run_ok(tp, fmt::format("rows_tp{}", tp), fmt::format("{} --tp {} --tp-embedding vocab", args, tp)));
    const nlohmann::json replicated =
        summary(run_ok(tp, fmt::format("rows_tp{}_replicated", tp), fmt::format("{} --tp {}", args, tp)));
    const int64_t held = rows * C + others + blocks / tp;
    EXPECT_EQ(vocab["params"].get<int64_t>(), held);
    EXPECT_EQ(vocab["bytes"]["parameters"].get<int64_t>(), 4 * held);
    EXPECT_EQ(vocab["bytes"]["gradients"].get<int64_t>(), 4 * held);
    EXPECT_EQ(vocab["bytes"]["optimizer"].get<int64_t>(), 8 * held);
    EXPECT_EQ(vocab["bytes"]["activations"].get<int64_t>(),
              replicated["bytes"]["activations"].get<int64_t>() - 4 * N * kVocab + 4 * N * rows + 4 * 3 * N);
    const uint64_t block = sent(static_cast<size_t>(N * C), tp);
    const uint64_t loss = sent(static_cast<size_t>(N), tp) + sent(static_cast<size_t>(2 * N), tp);
    const nlohmann::json phases = vocab["comm_bytes_per_phase"];
    EXPECT_EQ(phases["forward"].get<uint64_t>(), M * ((2 * kLayers + 1) * block + loss)) << phases;
    EXPECT_EQ(phases["backward"].get<uint64_t>(), M * (2 * kLayers + 1) * block) << phases;
  }
}

// Checkpoints of a vocabulary-parallel run hold wte's rows by their place
// in the whole tensor, as every slice: tp 3 (258 rows) resumed by tp 3
// ends bitwise where the uninterrupted run does, and by one process and by
// dp 2 x tp 2 zero3 within 1e-5; one process's checkpoint resumed at tp 2;
// and at tp 3, which cannot split its 256 rows, refused in one sentence.
TEST_F(TpCliTest, VocabParallelCheckpointsResumeAtAnyLayout) {
  const std::string args = kGpt + " --batch 4 --steps 10 --optimizer sgd --lr 0.05 --momentum 0.9";
  const std::string ckpt = " --checkpoint-every 5 --checkpoint-dir ";
  const std::string vocab = " --tp-embedding vocab";
  const fs::path tp3 = run_ok(3, "tp3_vocab_ckpt_full", args + " --tp 3" + vocab + ckpt + q(dir_ / "ck_vocab_tp3"));
  const fs::path one = run_ok(1, "one_vocab_ckpt_full", args + ckpt + q(dir_ / "ck_vocab_one"));
  const std::string from_tp3 = " --resume " + q(dir_ / "ck_vocab_tp3" / "step-00000005");
  const std::string from_one = " --resume " + q(dir_ / "ck_vocab_one" / "step-00000005");
  const fs::path resumed = run_ok(3, "tp3_vocab_resumed", args + " --tp 3" + vocab + from_tp3);
  EXPECT_TRUE(read_file(resumed.string() + ".st") == read_file(tp3.string() + ".st")) << "tp 3 resumed differs";
  expect_within(run_ok(1, "one_from_tp3_vocab", args + from_tp3), one, 1e-5);
  expect_within(run_ok(4, "dp2_tp2_zero3_vocab_from_tp3", args + " --tp 2 --strategy zero3" + vocab + from_tp3), one,
                1e-5);
  expect_within(run_ok(2, "tp2_vocab_from_one", args + " --tp 2" + vocab + from_one), one, 1e-5);
  test::expect_one_refusal(train(3, args + " --tp 3" + vocab + from_one),
                           "the checkpoint holds wte as 256 rows, which --tp-embedding vocab cannot split over --tp 3");
}

// HSDP over the DP group (ZeRO-3 inside shard groups, their shards
// all-reduced across groups), clipped so the global norm decides every
// update: dp 2 x tp 2 with shard groups of 1 (two replica groups' all-
// reduces) and of 2 (one shard group's reduce-scatters and gathers), and
// dp 4 x tp 2 with shard groups of 2 (both at once; 8 ranks), the
// vocabulary-parallel embedding in one of each. A deadline ends a hang.
TEST_F(TpCliTest, HsdpWithinOneProcess) {
  const std::string args = kGpt +
      " --batch 8 --micro-batches 2 --steps 20 --optimizer sgd --lr 0.05 --momentum 0.9 --clip 0.3 --comm-timeout 30";
  const fs::path one = run_ok(1, "one_hsdp", args);
  const std::string hsdp = " --tp 2 --strategy hsdp --shard-group ";
  expect_within(run_ok(4, "dp2_tp2_hsdp1", args + hsdp + "1"), one, 1e-5);
  expect_within(run_ok(4, "dp2_tp2_hsdp2_vocab", args + hsdp + "2 --tp-embedding vocab"), one, 1e-5);
  expect_within(run_ok(8, "dp4_tp2_hsdp2", args + hsdp + "2"), one, 1e-5);
  expect_within(run_ok(8, "dp4_tp2_hsdp2_vocab", args + hsdp + "2 --tp-embedding vocab"), one, 1e-5);
}

// The summary's ring factor is the data-parallel group's: at dp 2 x tp 2
// (4 ranks) the gradients' all-reduce runs over 2 ranks, 2(N-1)/N = 1.
TEST_F(TpCliTest, SummaryRingFactorIsTheDataParallelGroups) {
  std::string args = kGpt + " --batch 4 --steps 1 --tp 2";
  args.replace(args.find(" --quiet"), 8, "");
  const RunResult r = train(4, args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ring all-reduce over N = 2 data-parallel ranks: 2(N-1)/N = 1.000"), std::string::npos)
      << r.out;
}

TEST_F(TpCliTest, ImpossibleLayoutsAreRefused) {
  struct Case {
    int ranks;
    std::string args, says;
  };
  const std::string gpt = kGpt + " --batch 4 --steps 2";
  const std::vector<Case> cases = {
      {4, gpt + " --tp 4", "--tp 4 does not divide the model's 6 attention heads"},
      {3, gpt + " --tp 2", "3 ranks do not split into --tp 2 x --pp 1"},
      {2, "--model mlp --batch 4 --steps 2 --tp 2", "the mlp model has none"},
      {2, gpt + " --tp 2 --strategy dp", "--strategy dp keeps its replicas in threads of one process and does not run with --tp 2"},
      {1, gpt + " --tp-embedding vocab", "--tp-embedding vocab needs --tp 2 or more"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    test::expect_one_refusal(train(c.ranks, c.args), c.says);
  }
}

}  // namespace
}  // namespace dpt
