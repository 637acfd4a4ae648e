// The Llama family under every strategy and mesh (issue 31): `dpt train
// --model llama` jobs under `dpt launch` against one process with the same
// global batch, compared on the weights they save (gathered into the same
// Hugging Face-named file), the losses they log and the final evaluation,
// at the GPT tests' tiny shapes: 2 blocks of width 32, 4 query heads and 2
// key/value heads of 8 channels (grouped-query attention), SwiGLU of 64,
// RMSNorm, rotary positions, an untied head (and a tied one where the
// pipeline's copy of the embedding is the subject), context 16.
//
//   Data parallel, 10 SGD steps (momentum 0.9) clipped to 0.3 so the
//     global norm decides every update: DDP and ZeRO-1 on 2 ranks, ZeRO-2 on
//     3, ZeRO-3 and HSDP (shard groups of 2) on 4: within 1e-5 (the ranks'
//     sums add in another order than one process's batch; measured worst
//     3.4e-7). AdamW, DDP and ZeRO-3 on 2 ranks: within 1e-5 as well
//     (measured 1.1e-7). AdamW turns a rounding difference of a
//     near-cancelling gradient into up to lr of an update, which is why the
//     GPT's comparisons leave out c_attn's key bias (tp_cli) or allow 5e-5
//     (dist_zero's kGptLocalTol); this configuration has no biases, so no
//     element's true gradient is 0 and AdamW compares every element tightly.
//   --tp 2 with GQA (each TP rank holds 2 query heads and their 1 key/value
//     head, half of SwiGLU's gate, up and down), 20 steps of AdamW and of
//     SGD: within 1e-5, as tp_cli's (measured 1.6e-6); the same with
//     --tp-embedding vocab (the untied head's rows split as the
//     embedding's; measured 1.5e-6). dp 2 x tp 2 under ZeRO-3, clipped:
//     within 1e-5 (measured 1.6e-7). --tp 4 (2 key/value heads) refused.
//   --pp 2, gpipe and 1f1b: one micro-batch byte for byte (AdamW, as
//     pp_cli's), four within 1e-6 (SGD; measured: untied 0, the head's
//     gradient is its own; tied 2.1e-7, the embedding's gradient summed in
//     another order, as pp_cli explains); the tied head's copy of the
//     embedding on the last stage (--tie-embeddings) the same, and its
//     copy's bytes in the summary; an untied head has none.
//   bf16, 20 SGD steps: DDP, --tp 2 and dp 2 x tp 2 ZeRO-3 within 1e-2 of
//     one bf16 process (tp_cli's bound, for tp_cli's reason: every GEMM
//     rounds its inputs to bf16, so the fp32 rounding differences of the
//     ranks' sums, DDP's all-reduce as TP's, move values across bf16
//     rounding boundaries and later steps carry them everywhere; measured
//     2.6e-3 DDP, 1.3e-3 tp 2 and dp 2 x tp 2; dist_zero's 1e-4 holds its 3
//     steps, not 20); --pp 2 at one micro-batch byte for byte.
//   --checkpoint-activations and --offload: byte for byte the same run
//     without them (local, DDP, ZeRO-3, tp 2, pp 2; fp32 and bf16; offload
//     of the optimizer state and, bf16 ZeRO-3, of the fp32 masters).
//   Checkpoints: resumed at the same layout, byte for byte (ZeRO-3 with
//     AdamW, tp 2, pp 2); resumed at another layout (ZeRO-3 on 4 ranks to
//     one process, DDP, tp 2, pp 2, dp 2 x tp 2 ZeRO-3; tp 2 and pp 2 to
//     one process), within 1e-5 of the uninterrupted run (SGD; measured
//     2.4e-7).
//   Bytes: a TP rank holds the embedding, the untied head, the norms whole
//     and 1/tp of q, k, v (GQA's smaller K/V), o and SwiGLU's three
//     matrices; the ledger has each block's two all-reduces (o_proj,
//     down_proj) each way per micro-batch, as the GPT's.
//
// "Within r": per tensor, max|a - b| <= r x max|b|, and the same for every
// logged loss and the validation loss. Data: a generated text, so every
// world size sees the same sequences (--synthetic draws a batch per rank).
//
// Registered in tests/CMakeLists.txt (ctest names llama_cli.*).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "corpus_runs.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::read_file;
using test::RunResult;

constexpr int64_t kLayers = 2, kWidth = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kFfn = 64, kContext = 16,
                  kVocab = 256;
// One thread everywhere: the kernels' row reductions split by thread, and
// one process would otherwise take all cores where a rank takes one.
const std::string kLlama = fmt::format(
    "--model llama --layers {} --width {} --heads {} --kv-heads {} --intermediate {} --context {} --vocab {} "
    "--seed 3 --quiet --log-every 1 --threads 1",
    kLayers, kWidth, kHeads, kKvHeads, kFfn, kContext, kVocab);
const std::string kSgd = " --optimizer sgd --lr 0.05 --momentum 0.9";

class LlamaCliTest : public test::CorpusRuns<LlamaCliTest> {
 protected:
  static void SetUpTestSuite() {
    make_folder("dpt_llama_cli", {"the", "rotary", "query", "key", "group", "gate", "up", "down", "norm", "head"});
  }

  static void expect_bitwise(const fs::path& a, const fs::path& b) {
    const std::string wa = read_file(a.string() + ".st");
    EXPECT_FALSE(wa.empty()) << a;
    EXPECT_TRUE(wa == read_file(b.string() + ".st")) << a << " and " << b << " saved different weights";
  }

  // Per tensor, per logged loss and the validation loss: max|a - b| <=
  // r x max|b|.
  static void expect_within(const fs::path& a, const fs::path& b, double r) {
    const double worst = test::expect_tensors_within(a.string() + ".st", b.string() + ".st", r);
    test::expect_losses_within(a, b, r);
    const double va = summary(a).at("val_loss").get<double>(), vb = summary(b).at("val_loss").get<double>();
    EXPECT_LE(std::fabs(va - vb), r * std::fabs(vb)) << "validation loss";
    std::printf("[ measure  ] %s vs %s: worst tensor max|a-b|/max|b| %.3e\n", a.filename().c_str(),
                b.filename().c_str(), worst);
  }
};

struct Layout {
  int ranks;
  std::string name, flags;
};

TEST_F(LlamaCliTest, DataParallelWithinOneProcess) {
  const std::string args = kLlama + kSgd + " --batch 12 --steps 10 --clip 0.3";
  const fs::path one = run_ok(1, "one_dp", args);
  for (const Layout& l : std::vector<Layout>{{2, "ddp2", "--strategy ddp"},
                                             {2, "zero1_2", "--strategy zero1"},
                                             {3, "zero2_3", "--strategy zero2"},
                                             {4, "zero3_4", "--strategy zero3"},
                                             {4, "hsdp4", "--strategy hsdp --shard-group 2 --comm-timeout 30"}}) {
    SCOPED_TRACE(l.name);
    expect_within(run_ok(l.ranks, l.name, args + " " + l.flags), one, 1e-5);
  }
  const std::string adamw = kLlama + " --optimizer adamw --batch 8 --steps 10";
  const fs::path one_adamw = run_ok(1, "one_dp_adamw", adamw);
  for (const char* strategy : {"ddp", "zero3"}) {
    SCOPED_TRACE(strategy);
    expect_within(run_ok(2, fmt::format("{}2_adamw", strategy), adamw + " --strategy " + strategy), one_adamw, 1e-5);
  }
}

TEST_F(LlamaCliTest, TensorParallelGqaWithinOneProcess) {
  for (const bool adamw : {true, false}) {
    const std::string opt = adamw ? "adamw" : "sgd";
    const std::string args = kLlama + " --batch 4 --steps 20" + (adamw ? " --optimizer adamw" : kSgd);
    const fs::path one = run_ok(1, "one_tp_" + opt, args);
    for (const char* embedding : {"replicated", "vocab"}) {
      SCOPED_TRACE(fmt::format("tp 2 {} {}", embedding, opt));
      expect_within(run_ok(2, fmt::format("tp2_{}_{}", embedding, opt),
                           fmt::format("{} --tp 2 --tp-embedding {}", args, embedding)),
                    one, 1e-5);
    }
  }
  const std::string mesh = kLlama + kSgd + " --batch 4 --micro-batches 2 --steps 20 --clip 0.3";
  const fs::path one = run_ok(1, "one_mesh", mesh);
  expect_within(run_ok(4, "dp2_tp2_zero3", mesh + " --tp 2 --strategy zero3"), one, 1e-5);
  test::expect_one_refusal(train(4, kLlama + " --batch 4 --steps 2 --tp 4"),
                           "--tp 4 does not divide the model's 2 key/value heads");
}

// One micro-batch: every addition is one process's, in its order, so the
// stages end byte for byte where one process does; four micro-batches add
// the (tied) head's part of the embedding's gradient in another order.
TEST_F(LlamaCliTest, PipelineBothSchedulesTiedAndUntied) {
  for (const char* head : {"--untie-embeddings", "--tie-embeddings"}) {
    const bool tied = std::string(head) == "--tie-embeddings";
    const std::string m1 = fmt::format("{} {} --batch 4 --steps 3", kLlama, head);
    const std::string m4 = fmt::format("{} {}{} --batch 8 --micro-batches 4 --steps 10", kLlama, head, kSgd);
    const fs::path one = run_ok(1, fmt::format("one_pp_{}", tied), m1);
    const fs::path one_m4 = run_ok(1, fmt::format("one_pp_m4_{}", tied), m4);
    for (const char* schedule : {"gpipe", "1f1b"}) {
      SCOPED_TRACE(fmt::format("{} {}", head, schedule));
      const std::string pp = fmt::format(" --pp 2 --pp-schedule {}", schedule);
      const fs::path piped = run_ok(2, fmt::format("pp2_{}_{}", schedule, tied), m1 + pp);
      expect_bitwise(piped, one);
      EXPECT_EQ(test::logged_losses(piped), test::logged_losses(one));
      EXPECT_EQ(summary(piped)["val_loss"], summary(one)["val_loss"]);
      // The last stage's copy of the embedding and its gradient: tied only.
      EXPECT_EQ(summary(piped)["pipeline"]["stages"][1]["tied_copy_bytes"].get<int64_t>(),
                tied ? 2 * kVocab * kWidth * 4 : 0);
      expect_within(run_ok(2, fmt::format("pp2_{}_m4_{}", schedule, tied), m4 + pp), one_m4, 1e-6);
    }
  }
}

// At lr 0.02: at the other tests' 0.05 this Llama's 20 bf16 steps amplify
// the layouts' rounding differences through a loss spike, and where the
// weights land is a lottery (bench/bf16_layout_seeds.py over seeds 1-9: some
// layout past 1e-2 on 4 seeds with 5a4f33a's kernels, 5 with the AVX-512
// sigmoid, 8 with bf16 attention products too (the default since); at 0.02
// none, the worst 5.6e-3; bench/results/bf16_layout_seeds*.json).
TEST_F(LlamaCliTest, Bf16WithinOneBf16Process) {
  const std::string args = kLlama + " --optimizer sgd --lr 0.02 --momentum 0.9 --batch 4 --steps 20 --precision bf16";
  const fs::path one = run_ok(1, "one_bf16", args);
  expect_within(run_ok(2, "ddp2_bf16", args + " --strategy ddp"), one, 1e-2);
  expect_within(run_ok(2, "tp2_bf16", args + " --tp 2"), one, 1e-2);
  expect_within(run_ok(4, "dp2_tp2_zero3_bf16", args + " --tp 2 --strategy zero3"), one, 1e-2);
  const std::string m1 = kLlama + " --batch 4 --steps 3 --precision bf16";
  expect_bitwise(run_ok(2, "pp2_bf16", m1 + " --pp 2"), run_ok(1, "one_bf16_m1", m1));
}

// With and without --checkpoint-activations (backward recomputes each
// block's forward, its TP all-reduces included) and --offload (the state
// streamed through a file): the same arithmetic, the same bytes.
TEST_F(LlamaCliTest, CheckpointedActivationsAndOffloadAreBitwise) {
  const fs::path off = dir_ / "offload";
  fs::create_directories(off);
  const std::string to = " --offload-dir " + q(off);
  const std::string base = kLlama + " --batch 8 --micro-batches 2 --steps 4";
  for (const char* precision : {"fp32", "bf16"})
    for (const Layout& l : std::vector<Layout>{{1, "local", ""},
                                               {2, "ddp", "--strategy ddp"},
                                               {2, "zero3", "--strategy zero3"},
                                               {2, "tp2", "--tp 2"},
                                               {2, "pp2", "--pp 2"}}) {
      SCOPED_TRACE(fmt::format("{} {}", l.name, precision));
      const std::string args = fmt::format("{} {} --precision {}", base, l.flags, precision);
      const std::string stem = fmt::format("{}_{}", l.name, precision);
      const fs::path plain = run_ok(l.ranks, stem, args);
      expect_bitwise(run_ok(l.ranks, stem + "_ckpt", args + " --checkpoint-activations"), plain);
      if (l.name == "tp2") continue;
      expect_bitwise(run_ok(l.ranks, stem + "_offload", args + " --offload optimizer" + to), plain);
      if (l.name == "zero3" && std::string(precision) == "bf16")
        expect_bitwise(run_ok(l.ranks, stem + "_offload_params", args + " --offload params" + to), plain);
    }
  EXPECT_TRUE(fs::is_empty(off)) << "an offload file was left behind";
}

TEST_F(LlamaCliTest, ResumeIsBitwise) {
  const std::string ckpt = " --checkpoint-every 5 --checkpoint-dir ";
  for (const Layout& l : std::vector<Layout>{{2, "zero3", " --optimizer adamw --strategy zero3"},
                                             {2, "tp2", kSgd + " --tp 2"},
                                             {2, "pp2", kSgd + " --pp 2 --micro-batches 2"}}) {
    SCOPED_TRACE(l.name);
    const std::string args = kLlama + l.flags + " --batch 8 --steps 10";
    const fs::path full = run_ok(l.ranks, l.name + "_full", args + ckpt + q(dir_ / ("ck_" + l.name)));
    const fs::path resumed = run_ok(
        l.ranks, l.name + "_resumed", args + " --resume " + q(dir_ / ("ck_" + l.name) / "step-00000005"));
    expect_bitwise(resumed, full);
    EXPECT_EQ(test::logged_losses(resumed).begin()->first, 6);
  }
}

// A checkpoint's pieces are placed by their place in the whole tensors, so
// any layout resumes any other's (SGD: within 1e-5 of the uninterrupted
// one-process run).
TEST_F(LlamaCliTest, CheckpointsReshardAcrossLayouts) {
  const std::string args = kLlama + kSgd + " --batch 8 --micro-batches 2 --steps 10";
  const std::string ckpt = " --checkpoint-every 5 --checkpoint-dir ";
  const fs::path one = run_ok(1, "one_full", args);
  const fs::path zero3 = run_ok(4, "zero3_4_full", args + " --strategy zero3" + ckpt + q(dir_ / "ck_zero3"));
  const fs::path tp2 = run_ok(2, "tp2_full", args + " --tp 2" + ckpt + q(dir_ / "ck_tp2"));
  const fs::path pp2 = run_ok(2, "pp2_full", args + " --pp 2" + ckpt + q(dir_ / "ck_pp2"));
  for (const fs::path& full : {zero3, tp2, pp2}) expect_within(full, one, 1e-5);
  const auto from = [](const char* ck) { return " --resume " + q(dir_ / ck / "step-00000005"); };
  for (const Layout& l : std::vector<Layout>{{1, "one_from_zero3", from("ck_zero3")},
                                             {2, "ddp2_from_zero3", " --strategy ddp" + from("ck_zero3")},
                                             {2, "tp2_from_zero3", " --tp 2" + from("ck_zero3")},
                                             {2, "pp2_from_zero3", " --pp 2" + from("ck_zero3")},
                                             {4, "dp2_tp2_zero3_from_zero3", " --tp 2 --strategy zero3" + from("ck_zero3")},
                                             {1, "one_from_tp2", from("ck_tp2")},
                                             {2, "zero3_2_from_pp2", " --strategy zero3" + from("ck_pp2")},
                                             {1, "one_from_pp2", from("ck_pp2")}}) {
    SCOPED_TRACE(l.name);
    expect_within(run_ok(l.ranks, l.name, args + l.flags), one, 1e-5);
  }
}

// --save-shard-mb writes a sharded set as published models ship (shards of
// at most the cap, an index); it loads under ZeRO-3 (each rank reads its
// shard's bytes across files) and under --tp 2, and a run on it saves what a
// run on the single file saves, bit for bit.
TEST_F(LlamaCliTest, ShardedSaveLoadsUnderEveryLayoutBitwise) {
  const std::string args = kLlama + kSgd + " --batch 8 --steps 2";
  const fs::path set = dir_ / "sharded";
  fs::create_directories(set);
  const RunResult made = train(1, args + " --save-format hf --save-shard-mb 0.03 --save " + q(set / "model.safetensors"));
  ASSERT_EQ(made.code, 0) << made.err;
  int shards = 0;
  for (const auto& e : fs::directory_iterator(set)) {
    if (e.path().extension() != ".safetensors") continue;
    ++shards;
    EXPECT_LE(fs::file_size(e.path()), 30000u + 8000u) << e.path();  // the cap, plus a header
  }
  EXPECT_GE(shards, 3);
  ASSERT_TRUE(fs::exists(set / "model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(set / "config.json"));
  const fs::path single = run_ok(1, "single_source", args);
  const std::string more = kLlama + kSgd + " --batch 8 --steps 3 --load ";
  const fs::path from_single = run_ok(1, "from_single", more + q(single.string() + ".st"));
  for (const Layout& l : std::vector<Layout>{{1, "one_from_set", ""}, {2, "zero3_from_set", " --strategy zero3"},
                                             {2, "tp2_from_set", " --tp 2"}}) {
    SCOPED_TRACE(l.name);
    const fs::path run = run_ok(l.ranks, l.name, more + q(set) + l.flags);
    if (l.ranks == 1) expect_bitwise(run, from_single);
    else expect_within(run, from_single, 1e-5);
  }
}

// --save-dtype bf16: the file holds BF16 tensors (about half the bytes),
// each value the fp32 weight rounded to nearest even, and a run loads it.
TEST_F(LlamaCliTest, SaveDtypeBf16RoundsEachWeightAndLoads) {
  const std::string args = kLlama + kSgd + " --batch 8 --steps 2";
  const fs::path f32 = run_ok(1, "save_f32", args);
  const fs::path b16 = run_ok(1, "save_b16", args + " --save-dtype bf16");
  EXPECT_LT(fs::file_size(b16.string() + ".st"), fs::file_size(f32.string() + ".st") * 55 / 100);
  EXPECT_NE(read_file(b16.string() + ".st").find("\"BF16\""), std::string::npos);
  const SafetensorsFile a = load_safetensors(f32.string() + ".st"), b = load_safetensors(b16.string() + ".st");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const NamedTensor& ta : a.tensors) {
    const NamedTensor* tb = b.find(ta.name);
    ASSERT_NE(tb, nullptr) << ta.name;
    for (size_t i = 0; i < ta.data.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &ta.data[i], 4);
      bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;  // round to nearest even
      float want;
      std::memcpy(&want, &bits, 4);
      ASSERT_EQ(tb->data[i], want) << ta.name << "[" << i << "]";
    }
  }
  const RunResult r = train(1, args + " --load " + q(b16.string() + ".st"));
  EXPECT_EQ(r.code, 0) << r.err;
}

// --attention fused (nn/flash_attention.h) trains the same model under
// every layout: one process, ZeRO-3, tp 2, pp 2 and checkpointing against
// one unfused process within 1e-5 (measured 6e-8); its arena holds each
// block's log-sum-exps, B x heads x T, where unfused holds B x heads x T x T
// probabilities; bf16 and the MLP are refused in one sentence.
TEST_F(LlamaCliTest, FusedAttentionUnderEveryLayout) {
  const std::string args = kLlama + kSgd + " --batch 8 --steps 6";
  const fs::path one = run_ok(1, "unfused_one", args + " --attention unfused");
  // On the CPU the default is fused (train/rank_setup.h): the same bits as
  // asking for it.
  const fs::path by_default = run_ok(1, "default_one", args);
  EXPECT_EQ(summary(one)["attention"], "unfused");
  EXPECT_EQ(summary(by_default)["attention"], "fused");
  for (const Layout& l : std::vector<Layout>{{1, "fused_one", ""},
                                             {2, "fused_zero3", " --strategy zero3"},
                                             {2, "fused_tp2", " --tp 2"},
                                             {2, "fused_pp2", " --pp 2"},
                                             {1, "fused_ckpt", " --checkpoint-activations"}}) {
    SCOPED_TRACE(l.name);
    expect_within(run_ok(l.ranks, l.name, args + " --attention fused" + l.flags), one, 1e-5);
  }
  expect_bitwise(by_default, dir_ / "fused_one");
  const int64_t probabilities = kLayers * 8 * kHeads * (kContext * kContext - kContext) * 4;
  EXPECT_EQ(summary(one)["bytes"]["activations"].get<int64_t>() -
                summary(dir_ / "fused_one")["bytes"]["activations"].get<int64_t>(),
            probabilities);
  // bf16: every layout fused against one unfused bf16 process, within
  // bf16's 1.6e-2.
  const fs::path one16 = run_ok(1, "unfused_one_bf16", args + " --precision bf16 --attention unfused");
  for (const Layout& l : std::vector<Layout>{{1, "fused_one_bf16", ""},
                                             {2, "fused_zero3_bf16", " --strategy zero3"},
                                             {2, "fused_tp2_bf16", " --tp 2"},
                                             {2, "fused_pp2_bf16", " --pp 2"},
                                             {1, "fused_ckpt_bf16", " --checkpoint-activations"}}) {
    SCOPED_TRACE(l.name);
    expect_within(run_ok(l.ranks, l.name, args + " --precision bf16 --attention fused" + l.flags), one16, 1.6e-2);
  }
}

// A TP rank holds the embedding, the untied head, the norms whole; 1/tp
// of q_proj (heads x head_dim rows), k_proj and v_proj (kv_heads x
// head_dim rows each: GQA's smaller K/V), o_proj, and SwiGLU's gate, up
// and down; gradients and AdamW's two moments the same. The ledger: each
// block's two all-reduces of B x T x C (o_proj's and down_proj's outputs)
// each way per micro-batch, as the GPT's.
TEST_F(LlamaCliTest, RankHoldsItsSliceAndTheLedgerItsAllReduces) {
  const int64_t C = kWidth, L = kLayers, M = 2, B = 4 / M;
  const int64_t replicated = 2 * kVocab * C + L * 2 * C + C;
  const int64_t attention = (kHeads + 2 * kKvHeads) * kHeadDim * C + kHeads * kHeadDim * C;
  const int64_t sliced = L * (attention + 3 * C * kFfn);
  const size_t count = static_cast<size_t>(B * kContext * C);
  for (int tp : {1, 2}) {
    SCOPED_TRACE(fmt::format("tp {}", tp));
    const fs::path stem = run_ok(tp, fmt::format("bytes_tp{}", tp),
                                 fmt::format("{} --batch 4 --micro-batches {} --steps 3 --tp {}", kLlama, M, tp));
    const nlohmann::json s = summary(stem);
    const int64_t held = replicated + sliced / tp;
    EXPECT_EQ(s["params"].get<int64_t>(), held);
    EXPECT_EQ(s["bytes"]["parameters"].get<int64_t>(), 4 * held);
    EXPECT_EQ(s["bytes"]["gradients"].get<int64_t>(), 4 * held);
    EXPECT_EQ(s["bytes"]["optimizer"].get<int64_t>(), 8 * held);
    if (tp == 1) continue;
    // Rank 0 of a ring of 2 sends half the buffer in each of its two phases.
    const uint64_t per_all_reduce = 4 * count;
    const nlohmann::json phases = s["comm_bytes_per_phase"];
    EXPECT_EQ(phases["forward"].get<uint64_t>(), 2 * L * M * per_all_reduce) << phases;
    EXPECT_EQ(phases["backward"].get<uint64_t>(), 2 * L * M * per_all_reduce) << phases;
  }
}

}  // namespace
}  // namespace dpt
