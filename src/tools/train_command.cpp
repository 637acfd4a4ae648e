#include <cstdlib>

#include "core/error.h"
#include "core/threads.h"
#include "comm/agree.h"
#include "comm/process_group.h"
#include "io/safetensors.h"
#include "models/hf_gpt2.h"
#include "parallel/catalog.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/flag_conflicts.h"
#include "tools/launch_job.h"
#include "train/run_checks.h"

namespace dpt {

namespace {

DType parse_save_dtype(const std::string& t) {
  return t == "bf16" ? DType::BF16 : t == "fp16" ? DType::F16 : DType::F32;
}

}  // namespace

TrainCommand::TrainCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("train", "train a model: one process, or one rank of a job under a launcher (dpt launch)");
  model_.add(cmd_);
  add_data_flags();
  add_optimizer_flags();
  run_flags_.add(cmd_, opts_);
  cmd_->add_option("--threads", threads_, "threads for GEMM and kernels (default: all cores)")
      ->check(non_negative());
  add_gemm_flag(cmd_, gemm_);
  add_precision_flag(cmd_, precision_);
  add_device_flag(cmd_, device_);
  add_output_flags();
  add_parallel_flags();
}

// What it reads, and how much of it per step.
void TrainCommand::add_data_flags() {
  auto& o = opts_;
  cmd_->add_option("--data", o.data,
                   "mlp: Fashion-MNIST IDX directory; gpt: text (file or directory) or token shards (file, "
                   "directory or glob)");
  cmd_->add_option("--data-format", o.data_format,
                   "gpt: llmc (llm.c shards), u16 (raw uint16 tokens), bytes (text); default: llmc when the "
                   "first file starts with llm.c's magic number, else bytes")
      ->check(CLI::IsMember({"llmc", "u16", "bytes"}));
  cmd_->add_option("--val-data", o.val_data,
                   "gpt: held-out shards or text (default: the last --val-fraction of --data)");
  cmd_->add_flag("--synthetic", o.synthetic, "random batches (measures compute, not data)");
  cmd_->add_flag("--checkpoint-activations", o.checkpoint_activations,
                 "keep only each unit's input in forward, recompute the unit in backward (less activation "
                 "memory, about one more forward of compute)");
  // Positive: 0 is the field's "not given", so --steps 0 ran the default.
  cmd_->add_option("--steps", o.steps, "optimizer steps (default: 3 epochs for mlp, 200 for gpt)")
      ->check(positive());
  cmd_->add_option("--epochs", o.epochs, "mlp: epochs when --steps is not given")->check(positive());
}

// The optimizer, its schedule and the initialisation seed.
void TrainCommand::add_optimizer_flags() {
  auto& o = opts_;
  cmd_->add_option("--lr", o.schedule.lr, "learning rate (default 0.05 sgd, 3e-4 adamw)")
      ->check(positive());
  cmd_->add_option("--beta1", o.optimizer.beta1, "adamw beta1")->check(fraction_below(0.0, 1.0));
  cmd_->add_option("--beta2", o.optimizer.beta2, "adamw beta2")->check(fraction_below(0.0, 1.0));
  cmd_->add_option("--eps", o.optimizer.eps, "adamw epsilon")->check(positive());
  cmd_->add_option("--weight-decay", o.optimizer.weight_decay,
                   "weight decay on matrices (default 0.1 adamw, 0 sgd)")
      ->check(non_negative());
  cmd_->add_option("--schedule", o.schedule.kind, "constant or cosine (after --warmup)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  cmd_->add_option("--warmup", o.schedule.warmup, "steps of linear warm-up")->check(non_negative());
  cmd_->add_option("--min-lr", o.schedule.min_lr, "cosine: final learning rate")->check(non_negative());
  cmd_->add_option("--clip", o.clip, "clip the global gradient norm to this (0: off)")
      ->check(non_negative());
  cmd_->add_option("--seed", o.seed, "seed of initialisation and sampling");
}

// Evaluation, weights in and out, checkpoints, and the files a run writes.
void TrainCommand::add_output_flags() {
  auto& o = opts_;
  cmd_->add_option("--val-fraction", o.val_fraction, "gpt: held-out tail of the data (windows of token shards)")
      ->check(fraction(0.0, 0.99));
  cmd_->add_option("--eval-every", o.eval_every, "steps between evaluations (0: at the end only)")
      ->check(non_negative());
  cmd_->add_option("--sample-every", o.sample_every,
                   "print a sample of the model's text every N steps (0: never); rank 0 generates from the whole "
                   "model, gathered, while the other ranks wait")
      ->check(non_negative());
  cmd_->add_option("--sample-prompt", o.sample_prompt, "the samples' prompt (a newline)");
  cmd_->add_option("--sample-tokens", o.sample_tokens, "tokens per sample (64)")->check(positive());
  cmd_->add_option("--tokenizer", o.sample_tokenizer,
                   "--sample-every: tokenizer.json (or vocab.json with merges.txt, or their directory) that encodes "
                   "the prompt and decodes the samples of a model trained on its tokens (dpt tokens --tokenizer); "
                   "without it the model must be byte-level (vocabulary 256)");
  cmd_->add_option("--eval-windows", o.eval_windows, "gpt: validation windows per evaluation (0: all)")
      ->check(non_negative());
  cmd_->add_option("--log-every", o.log_every, "steps between progress updates")->check(positive());
  cmd_->add_option("--load", o.load, "start from these safetensors weights");
  cmd_->add_option("--load-format", o.load_format,
                   "--load's layout: dpt (the engine's, nanoGPT's names) or hf (Hugging Face GPT-2, Conv1D "
                   "weights [in, out]); default: told by names and shapes")
      ->check(CLI::IsMember({"dpt", "hf"}));
  cmd_->add_option("--save", o.save, "write the trained weights (safetensors)");
  cmd_->add_option("--save-format", o.save_format,
                   "--save's layout: dpt (default) or hf (Hugging Face's: GPT-2's Conv1D weights; llama: "
                   "config.json beside them)")
      ->check(CLI::IsMember({"dpt", "hf"}));
  cmd_->add_option_function<double>(
          "--save-shard-mb",
          [&o](double mb) { o.save_shard_bytes = static_cast<uint64_t>(mb * 1e6); },
          "--save as a sharded set, as published models ship (model-0000k-of-0000n.safetensors and an "
          "index .json), of at most this many MB of tensors per file; a --save path ending in "
          ".safetensors.index.json shards at 5000 MB without it")
      ->check(positive_mib());
  cmd_->add_option_function<std::string>(
          "--save-dtype", [&o](const std::string& t) { o.save_dtype = parse_save_dtype(t); },
          "--save's tensors: fp32 (default), bf16 or fp16 (half the bytes; rounded to nearest even, fp16 "
          "refusing a value beyond its range; loading converts any of them to fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd_->add_option("--checkpoint-dir", o.checkpoint_dir,
                   "write checkpoints here (every --checkpoint-every steps, and when SIGTERM or SIGINT stops the run)");
  cmd_->add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: only on a signal)")
      ->check(non_negative());
  cmd_->add_option("--keep", o.keep, "checkpoints kept, the newest (0: all)")->check(non_negative());
  cmd_->add_option("--resume", o.resume,
                   "continue from a checkpoint: a --checkpoint-dir (its latest) or one step-N directory in it");
  cmd_->add_option("--metrics-out", o.metrics_out, "write one JSON line per logged step");
  cmd_->add_option("--summary-out", o.summary_out, "write the end-of-run summary as JSON");
  cmd_->add_option("--trace-out", o.trace_out,
                   "write a timeline of the last steps (every rank's compute and communication) as a Chrome "
                   "trace: open in ui.perfetto.dev, or draw with bench/plot_timeline.py");
  cmd_->add_option("--trace-steps", o.trace_steps, "steps in the --trace-out timeline (the last ones)")
      ->check(positive());
  cmd_->add_option("--baseline", o.baseline, "a 1-rank run's --summary-out: report scaling efficiency against it");
  cmd_->add_flag("--quiet", o.quiet, "print nothing but errors");
}

// Strategy, mesh and communication.
void TrainCommand::add_parallel_flags() {
  auto& o = opts_;
  cmd_->add_option("--strategy", strategy_, strategy_help())->check(CLI::IsMember(strategy_names()));
  cmd_->add_option("--shard-group", o.shard_group,
                   "hsdp: ranks per shard group, consecutive ranks (default: the ranks of one host)")
      ->check(positive());
  cmd_->add_option("--prefetch", prefetch_, "zero3: all-gather the next unit early in none, forward, backward, both")
      ->check(CLI::IsMember({"none", "forward", "backward", "both"}));
  cmd_->add_option("--memory-budget-mb", memory_budget_mb_,
                   "refuse a run whose ranks on this host would need more than this (default: available memory)")
      ->check(positive_mib());
  cmd_->add_option("--offload", offload_,
                   "optimizer: keep the optimizer state (AdamW's m and v, SGD's momentum) in a file per rank under "
                   "--offload-dir, streamed through RAM in chunks during the optimizer step (same results, less "
                   "memory, one read and one write of the state per step); params: the fp32 master weights too "
                   "(--precision bf16 and a ZeRO strategy: RAM keeps only their bf16 copies). With --device cuda: "
                   "optimizer keeps the state in pinned host memory (or the --offload-dir file) and runs the update "
                   "on the CPU cores")
      ->check(CLI::IsMember({"optimizer", "params"}));
  cmd_->add_option("--offload-dir", o.offload_dir,
                   "--offload: an existing directory on a local disk (not tmpfs) with room for the state; the file "
                   "is removed when the run ends, however it ends");
  cmd_->add_option("--dp-replicas", o.dp_replicas, "dp: replica threads")->check(positive());
  cmd_->add_option("--bucket-mb", bucket_mb_, "ddp: bucket cap in MiB")->check(positive_mib());
  cmd_->add_option("--first-bucket-mb", first_bucket_mb_, "ddp: cap of the first bucket in MiB")
      ->check(positive_mib());
  cmd_->add_flag("--no-overlap", no_overlap_, "ddp: all-reduce the buckets after backward, not during it");
  cmd_->add_flag("--per-param", o.ddp.per_param, "ddp: one all-reduce per parameter tensor, no buckets");
  cmd_->add_option("--sampler-tail", o.sampler_tail,
                   "samples left when the dataset does not divide by the ranks: drop or pad")
      ->check(CLI::IsMember({"drop", "pad"}));
  cmd_->add_option("--verify-every", o.verify_every, "steps between checks that all replicas are identical")
      ->check(non_negative());
  cmd_->add_option("--comm-algo", comm_algo_, "collectives: ring (the engine's) or mpi (MPI's)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  cmd_->add_option("--transport", transport_, "ring links: auto, shm or mpi")
      ->check(CLI::IsMember({"auto", "shm", "mpi"}));
  cmd_->add_option("--comm-timeout", comm_timeout_s_, "seconds before a stalled collective is an error")
      ->check(positive_seconds());
}

int TrainCommand::run() {
  set_gemm_flag(gemm_);
  opts_.precision = parse_precision(precision_);
  opts_.device = parse_device(device_);
  opts_.hparams = model_.hparams();
  opts_.hparams.erase("dpt.model");
  opts_.model = model_.kind();
  if (opts_.model.empty()) {
    if (opts_.load.empty()) throw InputError("--model is required (mlp or gpt) unless --load gives a file");
    auto meta = weight_file_hparams(opts_.load);
    if (!meta.count("dpt.model"))
      throw InputError(fmt::format("{}: no dpt.model in the metadata and no config.json beside it; pass --model",
                                   opts_.load));
    opts_.model = meta["dpt.model"];
  }
  run_flags_.apply(cmd_, opts_);
  refuse_contradicting_flags(*cmd_, opts_);
  for (const std::string& flag : strategy_flags())
    if (cmd_->get_option(flag)->count() > 0) opts_.strategy_flags.push_back(flag);
  if (!strategy_.empty()) opts_.strategy = strategy_;
  opts_.prefetch = parse_prefetch(prefetch_);
  opts_.offload = parse_offload(offload_);
  opts_.ddp.bucket_bytes = static_cast<size_t>(bucket_mb_ * (1 << 20));
  opts_.ddp.first_bucket_bytes = static_cast<size_t>(first_bucket_mb_ * (1 << 20));
  opts_.ddp.overlap = !no_overlap_;
  opts_.memory_budget = static_cast<size_t>(memory_budget_mb_ * (1 << 20));
  comm::Config config = comm::Config::from_env();
  if (!comm_algo_.empty()) config.algo = comm::parse_algo(comm_algo_);
  if (!transport_.empty()) config.transport = comm::parse_transport(transport_);
  if (comm_timeout_s_ > 0) config.timeout = std::chrono::milliseconds(static_cast<int64_t>(comm_timeout_s_ * 1000));
  // dpt launch's check before it starts any rank (tools/launch_job.h).
  if (const char* world = std::getenv(kPrecheckWorld)) {
    check_launch(opts_, std::atoi(world));
    return 0;
  }
  auto pg = comm::ProcessGroup::create(config);
  comm::agree_on_bf16_dot_rate(*pg);  // one bf16 GEMM path on every rank
  // Threads per rank: all cores for one process; with several ranks on a
  // host, the launcher's OMP_NUM_THREADS (dpt launch sets cores / ranks).
  set_threads(threads_ > 0 ? threads_ : (pg->size() > 1 ? omp_threads_from_env() : 0));
  const TrainResult r = run_training(opts_, *pg);
  return r.stopped_by ? 128 + r.stopped_by : 0;  // as a shell reports a signalled process
}

}  // namespace dpt
