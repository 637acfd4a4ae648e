// Subcommands of `dpt`. Each registers its flags on construction and runs
// after parsing.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "models/sampling.h"
#include "tools/run_flags.h"
#include "train/train.h"

namespace dpt {

// Flags that size a model; shared by train and eval.
struct ModelFlags {
  std::string model;
  std::string sizes;                                  // mlp
  int64_t vocab = 0, padded_vocab = 0, layers = 0, heads = 0, width = 0, context = 0;  // gpt, llama
  int64_t kv_heads = 0, head_dim = 0, intermediate = 0;                                // llama
  int tie = 0;  // llama: --tie-embeddings +1, --untie-embeddings -1, neither 0 (the preset's or untied)
  void add(CLI::App* cmd);
  std::map<std::string, std::string> hparams() const;  // a preset's, then those given
  std::string kind() const;  // mlp, gpt or llama (a preset's family), or "" when --model is not given
};

// --gemm onednn|openblas: the GEMM backend, and --bf16-gemm
// auto|native|widened: how bf16 GEMMs run (nn/gemm.h), on every command
// that multiplies. Left empty, the defaults (or DPT_GEMM, DPT_BF16_GEMM)
// stand; anything else is an InputError from set_gemm_flag, as is native
// where oneDNN has no bf16 kernels for this CPU.
struct GemmFlags {
  std::string backend, bf16;
};
void add_gemm_flag(CLI::App* cmd, GemmFlags& gemm);
void set_gemm_flag(const GemmFlags& gemm);
// --precision fp32|bf16, parsed by parse_precision (core/dtype.h) for the
// engine's one-sentence error.
void add_precision_flag(CLI::App* cmd, std::string& precision);
void add_device_flag(CLI::App* cmd, std::string& device);

class TrainCommand {
 public:
  explicit TrainCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  // The flags, by topic (the constructor adds them all).
  void add_data_flags();
  void add_optimizer_flags();
  void add_output_flags();
  void add_parallel_flags();
  CLI::App* cmd_;
  ModelFlags model_;
  TrainOptions opts_;
  int threads_ = 0;
  double bucket_mb_ = 25.0, first_bucket_mb_ = 1.0, comm_timeout_s_ = 0.0;
  bool no_overlap_ = false;
  RunFlags run_flags_;  // the flags train shares with plan
  std::string strategy_, prefetch_ = "both", offload_;
  double memory_budget_mb_ = 0.0;
  GemmFlags gemm_;
  std::string comm_algo_, transport_, precision_ = "fp32", device_ = "cpu";
};

class EvalCommand {
 public:
  explicit EvalCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  ModelFlags model_;
  std::string weights_, data_, format_, load_format_, logits_out_;
  int64_t batch_ = 0;
  int threads_ = 0;
  GemmFlags gemm_;
  std::string precision_ = "fp32", device_ = "cpu";
};

// `dpt generate`: text from saved weights over the decoder's key/value
// cache (docs/generate.md).
class GenerateCommand {
 public:
  explicit GenerateCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  // The tokenizer (none: raw bytes or ids) and the prompt's ids, or the
  // one-sentence refusal.
  std::optional<BpeTokenizer> tokenizer(int64_t vocab) const;
  std::vector<int32_t> prompt(const BpeTokenizer* tok) const;

  CLI::App* cmd_;
  CLI::Option *prompt_opt_ = nullptr, *prompt_file_opt_ = nullptr, *prompt_ids_opt_ = nullptr;
  ModelFlags model_;
  std::string weights_, load_format_, tokenizer_, prompt_, prompt_file_, prompt_ids_, output_ = "text";
  int64_t max_new_ = 128;
  SamplingOptions sampling_;
  uint64_t seed_ = 1337;
  bool ignore_eos_ = false, no_cache_ = false;
  int threads_ = 0;
  GemmFlags gemm_;
  std::string precision_ = "fp32";
};

// `dpt tokens`: llm.c-format shards from text or uint16 tokens.
class TokensCommand {
 public:
  explicit TokensCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  int run_tokenizer();  // --tokenizer: BPE (data/corpus_tokenizer.h)

  CLI::App* cmd_;
  CLI::Option* from_opt_ = nullptr;
  std::string input_, from_ = "bytes", out_, name_ = "data", tokenizer_;
  int64_t shard_tokens_ = 100'000'000, val_tokens_ = 0;
};

// `dpt launch`: runs a command as N ranks under mpirun (docs/launch.md).
class LaunchCommand {
 public:
  explicit LaunchCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();
  std::vector<std::string> mpirun_args() const;  // the command line run() runs (tools/launch_job.h)

 private:
  int run_with_restarts(const std::vector<std::string>& args) const;

  CLI::App* cmd_;
  int ranks_ = 0;
  int max_restarts_ = 0;
  std::string hostfile_, bind_ = "none";
  bool dry_run_ = false;
  bool verbose_ = false;  // every line of the job's output as it came (tools/launch_output.h)
  std::vector<std::string> command_;
};

// `dpt plan`: bytes, traffic and time of each strategy; the fastest that
// fits (train/plan.h).
class PlanCommand {
 public:
  explicit PlanCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  ModelFlags model_;
  TrainOptions opts_;  // batch, micro-batches, optimizer: as train fills them
  RunFlags run_flags_;  // the flags plan shares with train
  int ranks_ = 1, ranks_per_host_ = 0, threads_ = 0;
  GemmFlags gemm_;
  std::string memory_;
  std::vector<std::string> strategies_;
  double gemm_gflops_ = 0, copy_gbs_ = 0, disk_gbs_ = 0;
  std::string offload_dir_ = "/var/tmp";
  bool json_ = false, meshes_ = false;
};

// `dpt bench`, created by the first of its subcommands to ask for it.
CLI::App* bench_subcommand(CLI::App& app);

// `dpt bench comm`: times and checks the collectives (W-COMM).
class BenchCommCommand {
 public:
  explicit BenchCommCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  std::string ops_ = "all_reduce,reduce_scatter,all_gather,broadcast", algos_ = "ring,mpi";
  std::string sizes_ = "4K,64K,1M,16M,64M,256M", transport_, json_;
  std::string memory_ = "private,shared";
  int iters_ = 20, warmup_ = 5;
  double timeout_s_ = 0;
};

// `dpt bench data`: the sampler's read rate from token shards.
class BenchDataCommand {
 public:
  explicit BenchDataCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  std::string data_, format_, json_;
  int64_t vocab_ = 50257, context_ = 128, batch_ = 16;
  double seconds_ = 3.0;
};

}  // namespace dpt
