#include "tools/run_flags.h"

#include <fmt/format.h>

#include "core/error.h"
#include "parallel/pipe_program.h"
#include "tools/flag_checks.h"

namespace dpt {

namespace {
TpEmbedding parse_tp_embedding(const std::string& s) {
  if (s == "vocab") return TpEmbedding::Vocab;
  if (s == "replicated") return TpEmbedding::Replicated;
  throw InputError(fmt::format("--tp-embedding must be replicated or vocab, not '{}'", s));
}
}  // namespace

void RunFlags::add(CLI::App* cmd, TrainOptions& o) {
  cmd->add_option("--batch", o.batch, "global samples per step (default 256 mlp, 16 gpt)")->check(positive());
  cmd->add_option("--grad-accum", o.grad_accum, "micro-batches per step")->check(positive());
  cmd->add_option("--micro-batches", micro_batches_, "micro-batches per step (--grad-accum under another name)")
      ->check(positive());
  cmd->add_option("--optimizer", o.optimizer.name, "sgd or adamw (default sgd mlp, adamw gpt)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  cmd->add_option("--momentum", o.optimizer.momentum, "sgd momentum (0: no state)")->check(fraction(0.0, 1.0));
  cmd->add_option("--zero-reduce", zero_reduce_, "zero1: reduce gradients by all-reduce (DDP's buckets) or scatter")
      ->check(CLI::IsMember({"all-reduce", "scatter"}));
  cmd->add_option("--zero-accumulate", zero_accumulate_,
                  "zero2/zero3 with --grad-accum: scatter (reduce-scatter every micro-step, less memory) or local "
                  "(full gradients kept until the last micro-step, less communication)")
      ->check(CLI::IsMember({"scatter", "local"}));
  cmd->add_option("--reshard-after-forward", o.reshard_after_forward,
                  "zero3: free a unit's gathered parameters after its forward (true) or keep them for backward")
      ->default_str("true");
  cmd->add_option("--reduce-dtype", reduce_dtype_,
                  "gradient reductions in fp32 (default) or bf16 (half the bytes; each rank's gradients are "
                  "converted for the wire and the sums widened back; docs/precision.md)");
  cmd->add_option("--tp", o.tp, "tensor-parallel degree: a GPT's heads and MLP split over this many adjacent ranks (1)")
      ->check(positive());
  cmd->add_option("--tp-embedding", tp_embedding_,
                  "--tp: replicated (wte and the head whole on every rank) or vocab (wte's rows split over the TP "
                  "ranks, a parallel cross-entropy: no rank holds whole logits; for large vocabularies)")
      ->check(CLI::IsMember({"replicated", "vocab"}));
  cmd->add_flag("--sequence-parallel", o.sequence_parallel,
                "--tp: Megatron's sequence parallelism: the norms and residual stream hold 1/tp of the micro-batch's "
                "B x T rows, all-gathered before the column-parallel linears and reduce-scattered after the "
                "row-parallel ones (TP's bytes; not with --pp)");
  cmd->add_option("--cp", o.cp,
                  "context parallelism: each sequence split into 2 x cp chunks over this many ranks (two each, "
                  "causal work balanced), keys and values passed round the ring; ZeRO shards over dp x cp "
                  "(docs/context_parallel.md)")
      ->check(positive());
  cmd->add_option("--pp", o.pp, "pipeline stages (gpt): each holds consecutive blocks; data parallelism over world / pp")
      ->check(positive());
  cmd->add_option("--pp-schedule", o.pp_schedule,
                  "--pp: gpipe, 1f1b (default), interleaved (--virtual-stages chunks per rank), zb-h1 or zb-v (zero "
                  "bubble: each backward split in two, the weight gradients moved into the bubble; docs/pipeline.md)")
      ->check(CLI::IsMember(pipe_program_names()));
  cmd->add_option("--virtual-stages", o.virtual_stages,
                  "--pp-schedule interleaved: chunks of blocks per rank (default 2; zb-v has 2); --pp-split then "
                  "counts blocks per chunk")
      ->check(positive());
  cmd->add_option("--pp-split", o.pp_split, "--pp: blocks per stage, e.g. 2,1,1 (default: balanced by parameter count)");
  cmd->add_option("--attention", attention_,
                  "causal attention: fused (tiles with an online softmax, only a log-sum-exp per row kept for backward; "
                  "the default on the CPU, where it is the faster) or unfused (every head's T x T probabilities "
                  "kept; the default with --device cuda, which has no fused kernel)")
      ->check(CLI::IsMember({"unfused", "fused"}));
  cmd->add_option("--attention-products", o.attention_products,
                  "--precision bf16 with the fused attention on the CPU: its products (QK^T, PV and their gradients) "
                  "on bf16 copies with fp32 sums (bf16, the default there: AVX-512 BF16 where the CPU has it, "
                  "1.2-1.35x the fp32 kernel; PyTorch autocast's SDPA) or in fp32 on the inputs as the GEMMs see "
                  "them (fp32, every other run's; docs/precision.md)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--offload-chunk-mb", offload_chunk_mb_,
                  "--offload: MiB of each state tensor per chunk (4 buffers of a chunk stay in RAM; default 4)")
      ->check(positive_mib());
}

void RunFlags::apply(const CLI::App* cmd, TrainOptions& o) const {
  if (micro_batches_ > 0) {
    if (cmd->count("--grad-accum") > 0 && o.grad_accum != micro_batches_)
      throw InputError(fmt::format("--micro-batches {} and --grad-accum {} are one setting under two names; give one",
                                   micro_batches_, o.grad_accum));
    o.grad_accum = micro_batches_;
  }
  // An empty value would read as no split at all (balanced by parameters).
  if (cmd->count("--pp-split") > 0 && o.pp_split.empty())
    throw InputError("--pp-split is empty: give each stage's blocks, e.g. 2,1,1, or leave the flag out");
  o.zero_scatter = zero_reduce_ == "scatter";
  o.zero_accumulate_locally = zero_accumulate_ == "local";
  o.ddp.reduce_dtype = parse_precision(reduce_dtype_, "--reduce-dtype");
  o.tp_embedding = parse_tp_embedding(tp_embedding_);
  o.offload_chunk_bytes = static_cast<size_t>(offload_chunk_mb_ * (1 << 20));
  o.attention = attention_;
}

}  // namespace dpt
