#include "train/run_checks.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/agree.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "models/decoder_config.h"
#include "models/mlp.h"
#include "optim/file_tier.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"
#include "train/pipeline_executor.h"
#include "train/plan.h"
#include "train/rank_setup.h"
#include "train/sample.h"

namespace dpt {

void apply_defaults(TrainOptions& o) {
  const bool mlp = o.model == "mlp";
  if (o.model != "mlp" && o.model != "gpt" && o.model != "llama")
    throw InputError(fmt::format("unknown model '{}' (expected mlp, gpt or llama)", o.model));
  if (o.batch == 0) o.batch = mlp ? 256 : 16;
  if (o.optimizer.name.empty()) o.optimizer.name = mlp ? "sgd" : "adamw";
  if (o.schedule.lr <= 0.0f) o.schedule.lr = o.optimizer.name == "sgd" ? 0.05f : 3e-4f;
  if (o.schedule.kind == "cosine" && o.schedule.min_lr > o.schedule.lr)
    throw InputError(fmt::format("--min-lr {:g} is above the learning rate {:g}: the cosine schedule decays from "
                                 "--lr down to --min-lr",
                                 o.schedule.min_lr, o.schedule.lr));
  if (o.optimizer.weight_decay < 0.0f) o.optimizer.weight_decay = o.optimizer.name == "adamw" ? 0.1f : 0.0f;
  if (o.batch < 1) throw InputError(fmt::format("batch size {} must be positive", o.batch));
  if (o.grad_accum < 1) throw InputError(fmt::format("--grad-accum {} must be positive", o.grad_accum));
  if (o.steps < 0) throw InputError(fmt::format("steps {} must not be negative", o.steps));
  if (o.log_every < 1) o.log_every = 1;
}

int64_t micro_batch(const TrainOptions& o, int parts, const char* parts_name) {
  if (o.batch % (parts * o.grad_accum) != 0)
    throw InputError(fmt::format("global batch {} does not split into {} {} x {} equal micro-batches", o.batch,
                                 parts, parts_name, o.grad_accum));
  return o.batch / parts / o.grad_accum;
}

void check_outputs(const TrainOptions& o, comm::ProcessGroup& pg) {
  std::string problem;
  if (pg.rank() == 0)
    for (const std::string* path : {&o.save, &o.metrics_out, &o.summary_out, &o.trace_out}) {
      if (path->empty()) continue;
      try {
        check_creatable(*path);
      } catch (const IoError& e) {
        problem = e.what();
        break;
      }
    }
  comm::agree_on_error<IoError>(pg, problem);
}

void check_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                  comm::ProcessGroup& pg, int arenas, int world, size_t pipeline_bytes, size_t lead_bytes) {
  const size_t available = o.memory_budget > 0 ? o.memory_budget : host_available_bytes();
  if (available == 0) return;
  const auto here = static_cast<size_t>(std::max(1, ranks_on_host(world > 0 ? world : pg.size())));
  // check_fits multiplies one rank's figure by the host's ranks: the one
  // rank's extra goes in as its share per rank.
  check_fits(so, model,
             static_cast<size_t>(arenas) * model.activation_bytes_for(micro) + pipeline_bytes +
                 (lead_bytes + here - 1) / here,
             pg.size(), static_cast<int>(here), available);
}

void check_offload(const TrainOptions& o, const StrategyOptions& so, const Model& model, comm::ProcessGroup& pg,
                   comm::ProcessGroup& world) {
  if (o.offload == Offload::None) {
    if (!o.offload_dir.empty()) throw InputError("--offload-dir is given without --offload optimizer");
    return;
  }
  if (o.offload == Offload::Params) {
    // The fp32 masters leave RAM; what computes is their bf16 copy.
    if (o.precision != DType::BF16)
      throw InputError("--offload params moves the fp32 master weights to disk and computes on bf16 copies: it "
                       "needs --precision bf16");
    if (so.strategy->zero_stage == 0)
      throw InputError(fmt::format("--offload params needs a sharded strategy (zero1, zero2, zero3, hsdp), not {}",
                                   so.strategy.name()));
  }
  // A GPU run without a directory keeps the state in the host's memory.
  if (o.device != Device::CPU && o.offload_dir.empty()) return;
  // Every rank checks the directory it sees (ranks on other hosts see other
  // disks); any rank's refusal ends the run on every rank.
  std::string problem;
  try {
    const MemoryBytes b = rank_bytes(so, model, pg.size());
    check_offload_dir(o.offload_dir, static_cast<uint64_t>(b.offloaded) * ranks_on_host(world.size()));
  } catch (const InputError& e) {
    problem = e.what();
  }
  comm::agree_on_error<InputError>(world, problem);
}

void check_tensor_parallel(const TrainOptions& o, const Mesh& mesh) {
  if (mesh.tp == 1) {
    if (o.tp_embedding != TpEmbedding::Replicated) throw InputError("--tp-embedding vocab needs --tp 2 or more");
    if (o.sequence_parallel)
      throw InputError("--sequence-parallel splits the TP group's rows: it needs --tp 2 or more");
    return;
  }
  const std::string not_yet = fmt::format("with --tp {}", mesh.tp);
  if (o.model == "mlp")
    throw InputError(fmt::format("--tp splits a transformer's attention heads and MLP; the {} model has none", o.model));
  check_mesh_strategy(o.strategy, not_yet);
  if (o.device != Device::CPU) throw InputError(fmt::format("--device cuda is not built {} yet", not_yet));
  const DecoderConfig c = DecoderConfig::from(model_hparams(o));
  if (c.heads % mesh.tp != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's {} attention heads (a TP rank holds whole "
                                 "heads, and with them 1/tp of the MLP's {} columns)",
                                 mesh.tp, c.heads, c.ffn()));
  if (c.kv() % mesh.tp != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's {} key/value heads (a TP rank holds whole "
                                 "key/value heads, those its query heads read)",
                                 mesh.tp, c.kv()));
  if (c.ffn() % mesh.tp != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's MLP width {}", mesh.tp, c.ffn()));
  if (o.sequence_parallel) {
    if (mesh.pp > 1)
      throw InputError("--sequence-parallel is not built with --pp yet (a stage's boundary tensors are whole rows)");
    const int64_t rows = micro_batch(o, mesh.dp, "data-parallel replicas") * (c.context / mesh.cp);
    if (rows % mesh.tp != 0)
      throw InputError(fmt::format("--sequence-parallel splits a micro-batch's {} rows (batch x context) over --tp "
                                   "{}, which does not divide them",
                                   rows, mesh.tp));
  }
}

void check_context_parallel(const TrainOptions& o, const Mesh& mesh) {
  if (mesh.cp == 1) return;
  const std::string not_yet = fmt::format("with --cp {}", mesh.cp);
  if (o.model == "mlp")
    throw InputError(fmt::format("--cp splits a transformer's sequences for its causal attention; the {} model has "
                                 "none",
                                 o.model));
  check_mesh_strategy(o.strategy, not_yet);
  if (o.device != Device::CPU) throw InputError(fmt::format("--device cuda is not built {} yet", not_yet));
  if (o.attention == "unfused")
    throw InputError(fmt::format("--cp passes keys and values round a ring into the fused attention; --attention "
                                 "unfused is not built {}",
                                 not_yet));
  const int64_t T = DecoderConfig::from(model_hparams(o)).context;
  if (T % (2 * mesh.cp) != 0)
    throw InputError(fmt::format("--cp {} splits each sequence into {} equal chunks, and the context of {} tokens "
                                 "does not divide into them",
                                 mesh.cp, 2 * mesh.cp, T));
}

void check_pipeline(const TrainOptions& o, const Mesh& mesh) {
  if (mesh.pp == 1) {
    if (!o.pp_split.empty()) throw InputError("--pp-split needs --pp 2 or more");
    if (o.virtual_stages > 0) throw InputError("--virtual-stages needs --pp 2 or more");
    return;
  }
  const std::string not_yet = fmt::format("with --pp {}", mesh.pp);
  if (o.model == "mlp")
    throw InputError(fmt::format("--pp splits a transformer's blocks into stages; the {} model has none", o.model));
  check_mesh_strategy(o.strategy, not_yet);
  if (o.device != Device::CPU) throw InputError(fmt::format("--device cuda is not built {} yet", not_yet));
  // Before the program is built, whose size is pp x v x M: --virtual-stages
  // 2^30 overflowed pp x v (a crash), and --micro-batches 2^31 took 40 s to
  // end in "out of memory".
  const int v = pipe_virtual_stages(o.pp_schedule, o.virtual_stages);
  const int64_t layers = DecoderConfig::from(model_hparams(o)).layers;
  if (int64_t{mesh.pp} * v > layers)
    throw InputError(v == 1 ? fmt::format("--pp {} needs at least one block per stage, and the model has {}", mesh.pp,
                                          layers)
                            : fmt::format("--pp {} x --virtual-stages {} needs at least one block per chunk, and the "
                                          "model has {}",
                                          mesh.pp, v, layers));
  // More micro-batches than samples: the batch's split refuses them (in its
  // sentence, which it always throws then) before a program of that many.
  if (o.grad_accum > o.batch) micro_batch(o, mesh.dp, "data-parallel replicas");
  const PipeProgram program = run_program(o, mesh.pp);  // throws for a schedule that cannot be
  const PipeCheck valid = check_pipe_program(program);
  if (!valid.error.empty())
    throw InputError(fmt::format("the {} pipeline schedule cannot run: {}", program.schedule, valid.error));
  pipe_stages(DecoderConfig::from(model_hparams(o)), program, o.pp_split);  // throws for a split that cannot be
}

namespace {

// --attention fused runs on the CPU (nn/flash_attention.h, fp32 and bf16)
// and with --device cuda (cuda/flash_attention.cu; head sizes up to 256,
// checked by the decoder, which knows its head size).
void check_attention(const TrainOptions& o) {
  if (o.attention_products == "bf16") {
    if (o.precision != DType::BF16)
      throw InputError("--attention-products bf16 rounds a bf16 run's attention inputs; this run is fp32 (add "
                       "--precision bf16)");
    if (!fused_attention_for(o))
      throw InputError("--attention-products bf16 is the fused attention's setting; this run's attention is unfused");
    if (o.device != Device::CPU)
      throw InputError("--attention-products bf16 runs on the CPU only (the CUDA fused attention computes in fp32)");
  }
  if (o.attention != "fused") return;
  if (o.model == "mlp") throw InputError("--attention is a transformer's setting; the mlp model has no attention");
}

// What --device cuda runs today (docs/gpu.md). The rest is refused before
// anything starts.
void check_placement(const TrainOptions& o) {
  if (o.device == Device::CPU) return;
  if (o.strategy->in_threads())
    throw InputError("--device cuda: --strategy dp (threads over one process) runs on the CPU only");
  if (o.ddp.reduce_dtype != DType::F32)
    throw InputError("--device cuda: --reduce-dtype bf16 is not built for GPU runs yet");
  if (o.offload == Offload::Params)
    throw InputError("--device cuda: --offload params is not built for GPU runs yet (--offload optimizer is)");
}

}  // namespace

void check_samples(const TrainOptions& o) {
  if (o.sample_every == 0) return;
  const auto it = o.model_config.find("dpt.model");
  const std::string model = it == o.model_config.end() ? o.model : it->second;
  if (model != "gpt" && model != "llama")
    throw InputError(fmt::format("--sample-every samples a gpt or llama model's text, and this is an {}", model));
  sample_text_setup(o, DecoderConfig::from(o.model_config));
}

namespace {

// A flag that sets what only some strategies read, and what it sets.
struct StrategyFlag {
  const char* flag;
  Setting setting;
  const char* sets;  // "<flag> <sets>, and <the strategy> <unread>"
  const char* unread;
};

constexpr const char* kBuckets = "shapes DDP's gradient buckets";
constexpr StrategyFlag kStrategyFlags[] = {
    {"--bucket-mb", Setting::Buckets, kBuckets, "reduces in none"},
    {"--first-bucket-mb", Setting::Buckets, kBuckets, "reduces in none"},
    {"--no-overlap", Setting::Buckets, kBuckets, "reduces in none"},
    {"--per-param", Setting::Buckets, kBuckets, "reduces in none"},
    {"--zero-reduce", Setting::ZeroReduce, "sets how zero1 reduces its gradients", "does not read it"},
    {"--zero-accumulate", Setting::ZeroAccumulate,
     "sets how a sharded strategy keeps its gradients over --grad-accum's micro-batches", "does not read it"},
    {"--prefetch", Setting::Prefetch, "sets when a sharded strategy gathers its next unit's parameters",
     "does not read it"},
    {"--reshard-after-forward", Setting::Reshard,
     "sets whether a sharded strategy frees a unit's gathered parameters", "does not read it"},
    {"--dp-replicas", Setting::Replicas, "sets the replica threads of the single-process dp strategy",
     "does not read it"},
};

// "zero2, zero3 or hsdp": the strategies that read s, each with what stops
// it ("zero1 without --zero-reduce scatter").
std::string readers_of(Setting s) {
  std::vector<std::string> names;
  for (const StrategyRecord* r : strategies())
    if (const SettingRead* read = r->read_of(s))
      names.push_back(r->name + (read->unless.empty() ? "" : " without " + read->unless));
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

}  // namespace

std::vector<std::string> strategy_flags() {
  std::vector<std::string> flags;
  for (const StrategyFlag& f : kStrategyFlags) flags.emplace_back(f.flag);
  return flags;
}

void check_strategy_flags(const TrainOptions& o, bool named, int dp) {
  const StrategyRecord& r = *o.strategy;
  const RunAsk ask{.zero_scatter = o.zero_scatter};
  const auto given = [&](const char* flag) {
    return std::find(o.strategy_flags.begin(), o.strategy_flags.end(), flag) != o.strategy_flags.end();
  };
  for (const StrategyFlag& f : kStrategyFlags) {
    if (!given(f.flag)) continue;
    const SettingRead* read = r.read_of(f.setting);
    const bool stopped = read && read->unless_asked && read->unless_asked(ask);
    if (read && !stopped) continue;
    const std::string who =
        named ? fmt::format("--strategy {}{}", o.strategy.name(), stopped ? " " + read->unless : "")
              : fmt::format("the default strategy ({}: {} data-parallel rank{})", r.name,
                            dp == 1 ? "one" : std::to_string(dp), dp == 1 ? "" : "s");
    throw InputError(
        fmt::format("{} {}, and {} {} (only {} does)", f.flag, f.sets, who, f.unread, readers_of(f.setting)));
  }
  check_zero_accumulate(o, given("--zero-accumulate"));
}

void check_zero_accumulate(const TrainOptions& o, bool given) {
  // One micro-batch per step: nothing is accumulated, so the setting would
  // pass unread.
  if (given && o.grad_accum == 1)
    throw InputError("--zero-accumulate sets how a sharded strategy keeps its gradients over --grad-accum's "
                     "micro-batches, and this run has one micro-batch per step (give --grad-accum 2 or more, or "
                     "leave --zero-accumulate out)");
}

void check_warmup(const TrainOptions& o, int64_t steps) {
  if (o.schedule.warmup <= steps) return;
  // --resume continues the same --steps (the run's whole length, not what
  // is left of it), so a warm-up past them is as wrong there.
  const std::string run = o.steps > 0 ? fmt::format("--steps {}", steps)
                                      : fmt::format("the run's {} steps (--steps is not given)", steps);
  throw InputError(fmt::format("--warmup {} is longer than {}: the learning rate would never reach --lr {:g}; give "
                               "--warmup at most {}, or more --steps",
                               o.schedule.warmup, run, o.schedule.lr, steps));
}

void check_sizes(const TrainOptions& o) {
  constexpr double kMostBytes = 0x1p56;  // 64 PiB: past any cluster, and 2^7 short of int64's range
  constexpr int64_t kMostBlocks = 65536;
  const double B = static_cast<double>(o.batch);
  double params = 0, activations = 0;  // activations: one step's, all layers
  std::vector<std::pair<const char*, int64_t>> dims;  // each a GEMM dimension, or a factor of one
  if (o.model == "mlp") {
    const std::vector<int64_t> sizes = MlpConfig::from(o.model_config).sizes;
    for (size_t i = 0; i < sizes.size(); ++i) {
      dims.emplace_back("layer size", sizes[i]);
      activations += 2 * B * static_cast<double>(sizes[i]);
      if (i > 0) params += static_cast<double>(sizes[i - 1] + 1) * static_cast<double>(sizes[i]);
    }
  } else {
    const DecoderConfig c = DecoderConfig::from(o.model_config);
    if (c.layers > kMostBlocks)
      throw InputError(fmt::format("{} blocks are more than {}, the most the engine builds (a named slot for each "
                                   "tensor of each block)",
                                   c.layers, kMostBlocks));
    dims = {{"vocabulary", c.rows()}, {"width", c.width}, {"context", c.context}, {"head size", c.head_dim()},
            {"MLP width", c.ffn()}};
    const double C = static_cast<double>(c.width), T = static_cast<double>(c.context),
                 H = static_cast<double>(c.heads), hd = static_cast<double>(c.head_dim()),
                 KV = static_cast<double>(c.kv()), F = static_cast<double>(c.ffn()), L = static_cast<double>(c.layers);
    params = 2 * static_cast<double>(c.rows()) * C + T * C + L * ((2 * H + 2 * KV) * hd * C + 3 * C * F + 4 * C);
    activations = L * B * T * (16 * C + 3 * F + H * T) + B * T * static_cast<double>(c.rows());
  }
  for (const auto& [what, n] : dims)
    if (n > INT32_MAX)
      throw InputError(fmt::format("the model's {} of {} is past 2^31 - 1, the largest matrix side the GEMMs take",
                                   what, n));
  // fp32 parameters, gradients and two optimizer moments, and the activations.
  const double bytes = 16 * params + 4 * activations;
  if (bytes > kMostBytes)
    throw InputError(fmt::format("the model and a batch of {} need about {:.3g} bytes, past 2^56 (64 PiB): no "
                                 "machine holds them; shrink the batch or the model",
                                 o.batch, bytes));
}

Mesh checked_flags(TrainOptions& o, int world, int rank, comm::ProcessGroup* pg) {
  apply_defaults(o);
  // The default length is known only once the data is (DataSource::steps):
  // it is checked again there.
  if (o.steps > 0) check_warmup(o, o.steps);
  const Mesh mesh = Mesh::layout(world, rank, o.tp, o.pp, o.cp);
  const bool named = o.strategy.set();
  if (!named) o.strategy = default_strategy(mesh.dp_cp());
  check_strategy_flags(o, named, mesh.dp_cp());
  // The mesh's checks read the model's shape (--load's header): once.
  if (mesh.tp > 1 || mesh.pp > 1 || mesh.cp > 1) resolve_model(o);
  check_pipeline(o, mesh);
  check_context_parallel(o, mesh);
  check_tensor_parallel(o, mesh);
  if (pg) check_outputs(o, *pg);
  check_placement(o);
  check_attention(o);
  check_shard_group(o.strategy, o.shard_group);
  if (!o.load.empty() && !o.resume.empty())
    throw InputError("--load and --resume both give the starting weights; give one");
  if (o.strategy->refuse)
    o.strategy->refuse({.world = mesh.world, .dp = mesh.dp_cp(), .fp32 = o.precision == DType::F32,
                        .fp32_reduce = o.ddp.reduce_dtype == DType::F32,
                        .checkpoints = !o.checkpoint_dir.empty() || !o.resume.empty(), .trace = !o.trace_out.empty(),
                        .offload = o.offload != Offload::None});
  if (o.model_config.empty()) resolve_model(o);
  check_samples(o);
  return mesh;
}

Mesh checked_mesh(TrainOptions& o, comm::ProcessGroup& pg) { return checked_flags(o, pg.size(), pg.rank(), &pg); }

void check_launch(TrainOptions o, int world) {
  Mesh mesh;
  try {
    mesh = checked_flags(o, world, 0, nullptr);
  } catch (const IoError&) {
    // --load's file unreadable here: it may exist on the hosts the ranks
    // run on (node-local scratch), so they read it and judge.
    if (!o.load.empty()) return;
    throw;
  }
  if (!o.strategy->in_threads())
    micro_batch(o, mesh.dp, mesh.pp == 1 && mesh.tp == 1 && mesh.cp == 1 ? "ranks" : "data-parallel replicas");
}

// check_memory for this rank. Under --pp the stages hold different parts of
// the model, their arenas and the pipeline's buffers: one that does not fit
// ends the run on every rank, with its sentence.
void check_rank_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                       const Mesh& mesh, comm::ProcessGroup& dpg, comm::ProcessGroup& pg) {
  const auto* decoder = dynamic_cast<const Decoder*>(&model);
  const size_t samples = o.sample_every > 0 && pg.rank() == 0 && decoder
                             ? sample_bytes(decoder->config(), o.precision)
                             : 0;
  if (mesh.pp == 1 && o.sample_every == 0) {  // the same branch on every rank
    check_memory(o, so, model, micro, dpg, 1, pg.size());
    return;
  }
  // Only some ranks hold the extra (a stage's buffers, rank 0's samples):
  // one that does not fit ends the run on every rank, with its sentence.
  std::string too_big;
  try {
    // Under --pp: the arenas (per chunk, as the schedule holds them) with
    // the pipeline's buffers.
    if (mesh.pp == 1) {
      check_memory(o, so, model, micro, dpg, 1, pg.size(), 0, samples);
    } else {
      const auto& stage = dynamic_cast<const Decoder&>(model);
      check_memory(o, so, model, micro, dpg, 0, pg.size(),
                   pipeline_activation_bytes(stage, run_program(o, mesh.pp), mesh.pp_rank, micro) +
                       pipeline_buffer_bytes(stage, mesh.pp),
                   samples);
    }
  } catch (const InputError& e) {
    too_big = e.what();
  }
  comm::agree_on_error<InputError>(pg, too_big);
}

}  // namespace dpt
