#include "train/rank_setup.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/hf_config.h"
#include "models/weights.h"
#include "parallel/tensor_parallel.h"
#include "train/pipeline_executor.h"
#include "parallel/catalog.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/resume.h"
#include "train/run_checks.h"

namespace dpt {

void resolve_model(TrainOptions& o) {
  o.model_config = model_hparams(o);
  check_sizes(o);
}

std::map<std::string, std::string> model_hparams(const TrainOptions& o) {
  if (!o.model_config.empty()) return o.model_config;
  std::map<std::string, std::string> flags = o.hparams;
  flags["dpt.model"] = o.model;
  return o.load.empty() ? flags : hparams_for_file(o.load, flags);
}

StrategyOptions strategy_options(const TrainOptions& o) {
  StrategyOptions so;
  so.strategy = o.strategy;
  so.optimizer = o.optimizer;
  so.ddp = o.ddp;
  so.zero_scatter = o.zero_scatter;
  so.accumulate_locally = o.zero_accumulate_locally;
  so.reshard_after_forward = o.reshard_after_forward;
  so.prefetch = o.prefetch;
  so.shard_group = o.shard_group;
  so.offload = {.what = o.offload, .dir = o.offload_dir, .chunk_bytes = o.offload_chunk_bytes};
  return so;
}

namespace {

// --save-format hf writes a llama model's config.json after training: a
// model its model_type cannot describe is refused now, before any step.
void check_hf_save(const TrainOptions& o, const Model& model) {
  if (!o.save.empty() && parse_weight_format(o.save_format) == WeightFormat::Hf && model.kind() == "llama")
    hf_config_from_hparams(model.metadata());
}

}  // namespace

bool fused_attention_for(const TrainOptions& o) {
  return o.attention.empty() ? o.device == Device::CPU : o.attention == "fused";
}

bool bf16_attention_products_for(const TrainOptions& o) {
  if (!o.attention_products.empty()) return o.attention_products == "bf16";
  return o.precision == DType::BF16 && o.device == Device::CPU && fused_attention_for(o);
}

void set_attention(const TrainOptions& o, Model& model) {
  if (auto* d = dynamic_cast<Decoder*>(&model)) {
    d->set_fused_attention(fused_attention_for(o));
    d->set_bf16_attention_products(bf16_attention_products_for(o));
  }
}

std::unique_ptr<Model> build_model(const TrainOptions& o, uint64_t seed) {
  std::map<std::string, std::string> hp = o.hparams;
  hp["dpt.model"] = o.model;
  std::unique_ptr<Model> model;
  if (!o.load.empty()) {
    model = model_from_file(o.load, hp, parse_weight_format(o.load_format));
  } else {
    model = make_model(hp);
    model->init_params(seed);
  }
  check_hf_save(o, *model);
  model->set_checkpoint_activations(o.checkpoint_activations);
  model->set_precision(o.precision);
  set_attention(o, *model);
  return model;
}

// The checkpoint's model, with the flags over it (a flag that disagrees is
// then refused by load_checkpoint, naming both values).
std::map<std::string, std::string> resumed_hparams(const TrainOptions& o, const CheckpointInfo& saved) {
  // Another family's settings would be refused one by one as this model's.
  if (const auto family = saved.model.find("dpt.model"); family != saved.model.end() && family->second != o.model)
    throw InputError(fmt::format("{}: the checkpoint holds a {} model, and this run's is {}", o.resume, family->second,
                                 o.model));
  std::map<std::string, std::string> hp = saved.model;
  for (const auto& [k, v] : o.hparams) hp[k] = v;
  hp["dpt.model"] = o.model;
  return hp;
}

RankModel rank_model(const TrainOptions& o, const Mesh& mesh, const std::optional<CheckpointInfo>& saved) {
  const std::map<std::string, std::string> hparams = saved ? resumed_hparams(o, *saved) : model_hparams(o);
  std::vector<DecoderStage> stages;
  const PipeProgram program = mesh.pp > 1 ? run_program(o, mesh.pp) : PipeProgram{};
  if (mesh.pp > 1) stages = pipe_stages(DecoderConfig::from(hparams), program, o.pp_split);
  if (saved && o.tp_embedding == TpEmbedding::Vocab) check_vocab_rows(DecoderConfig::from(hparams), mesh.tp);
  std::unique_ptr<Model> model;
  const DecoderTp tp{mesh.tp, mesh.tp_rank, o.tp_embedding == TpEmbedding::Vocab, o.sequence_parallel};
  if (mesh.pp > 1)
    model = std::make_unique<Decoder>(DecoderConfig::from(hparams), stages[static_cast<size_t>(mesh.pp_rank)], tp);
  else if (mesh.tp > 1)
    model = std::make_unique<Decoder>(DecoderConfig::from(hparams), DecoderStage{}, tp);
  else
    model = make_model(hparams);
  check_hf_save(o, *model);
  // A split backward's arenas keep what W needs (the memory check counts it).
  if (mesh.pp > 1) dynamic_cast<Decoder&>(*model).set_split_backward(pipe_splits_backward(program));
  model->set_checkpoint_activations(o.checkpoint_activations);
  model->set_precision(o.precision);
  set_attention(o, *model);
  model->set_device(o.device);
  // The arena's rows are this rank's chunks (the ring is connected later).
  if (mesh.cp > 1) dynamic_cast<Decoder&>(*model).set_context_parallel(mesh.cp, mesh.cp_rank, nullptr);
  return {std::move(model), std::move(stages)};
}

// Under --tp the decoder sums (or maxes) its partial results over its TP
// group; under --sequence-parallel it also reduce-scatters and all-gathers.
void connect_tensor_parallel(Model& model, comm::ProcessGroup* tpg) {
  if (!tpg) return;
  dynamic_cast<Decoder&>(model).set_tensor_reduce([tpg](float* x, size_t n, TpReduce op) {
    switch (op) {
      case TpReduce::ReduceScatter:
        tpg->reduce_scatter(x, n, DType::F32, comm::ReduceOp::Sum);
        return;
      case TpReduce::AllGather:
        tpg->all_gather(x, n, DType::F32);
        return;
      case TpReduce::AllGatherBf16:
        tpg->all_gather(x, n, DType::BF16);
        return;
      case TpReduce::Max:
        tpg->all_reduce(x, n, DType::F32, comm::ReduceOp::Max);
        return;
      case TpReduce::Sum:
        tpg->all_reduce(x, n, DType::F32, comm::ReduceOp::Sum);
        return;
    }
  });
}

// Who runs a step's micro-batches: a pipeline stage under --pp, else the
// sequential executor over the whole (or TP-sliced) model.
std::unique_ptr<Executor> make_executor(const TrainOptions& o, comm::ProcessGroup& pg, const Mesh& mesh,
                                        MeshGroups& groups, Model& model, Strategy& strategy, DataSource& data,
                                        float loss_scale, const std::vector<DecoderStage>& stages) {
  if (mesh.pp > 1)
    return std::make_unique<PipelineExecutor>(
        mesh, groups, dynamic_cast<Decoder&>(model), strategy, data, loss_scale,
        PipelineOptions{run_program(o, mesh.pp), stages});
  return std::make_unique<SequentialExecutor>(o, pg, model, strategy, data, loss_scale, mesh, groups.tp());
}

// What this rank sends per step by the plan: its strategy's traffic over the
// data-parallel group, and on a mesh its stage's (plan_stage, as `dpt plan`
// counts it for data-parallel rank 0: the tensor-parallel all-reduces and
// the pipeline's transfers too).
CommPlan planned_rank_comm(const TrainOptions& o, const StrategyOptions& so, const Model& model, const Mesh& mesh,
                           int64_t micro) {
  if (mesh.tp == 1 && mesh.pp == 1) {
    CommPlan c = planned_comm(so, model, mesh.dp_cp(), mesh.dp_rank * mesh.cp + mesh.cp_rank, o.grad_accum);
    if (mesh.cp > 1) {
      const auto& d = dynamic_cast<const Decoder&>(model);
      c += context_traffic(d, d.config().layers, micro, o.grad_accum);
    }
    return c;
  }
  PlanRequest request;
  request.run = o;
  request.grad_accum = o.grad_accum;
  request.world = mesh.world;
  return plan_stage(request, so, model, mesh, mesh.pp_rank, micro).comm;
}

RankSetup set_up_rank(TrainOptions& o, comm::ProcessGroup& pg, const Mesh& mesh, TrainResult& r) {
  RankSetup s;
  s.mesh = mesh;
  s.micro =
      micro_batch(o, mesh.dp, mesh.pp == 1 && mesh.tp == 1 && mesh.cp == 1 ? "ranks" : "data-parallel replicas");
  // Read now: a bad checkpoint must fail before training, not after it.
  const std::string resume_path = o.resume.empty() ? "" : find_checkpoint(o.resume);
  std::optional<CheckpointInfo> saved;
  if (!resume_path.empty()) saved = read_checkpoint_info(resume_path);
  auto [model, stages] = rank_model(o, mesh, saved);
  s.model = std::move(model);
  s.groups = std::make_unique<MeshGroups>(mesh, pg);
  comm::ProcessGroup& dpg = s.groups->dp();
  connect_tensor_parallel(*s.model, s.groups->tp());
  if (mesh.cp > 1) {
    s.ring = std::make_unique<GroupRing>(*s.groups->cp());
    dynamic_cast<Decoder&>(*s.model).set_context_parallel(mesh.cp, mesh.cp_rank, s.ring.get());
  }
  const StrategyOptions so = resolve_options(strategy_options(o), dpg);
  check_offload(o, so, *s.model, dpg, pg);
  check_rank_memory(o, so, *s.model, s.micro, mesh, dpg, pg);
  s.strategy = make_strategy(so, *s.model, dpg, {o.seed, o.load, parse_weight_format(o.load_format)});
  // All stages of a replica read the same sequences.
  s.data = std::make_unique<DataSource>(o, *s.model, load_datasets(o, *s.model), s.micro, mesh.dp_rank, mesh.dp);
  s.steps = s.data->steps(o);
  check_warmup(o, s.steps);
  o.schedule.total_steps = s.steps;
  if (pg.size() > 1) r.topology = topology_json(pg);
  s.planned_comm = planned_rank_comm(o, so, *s.model, mesh, s.micro);
  r.comm_formula = so.strategy->formula ? so.strategy->formula(so, mesh.dp_cp()) : "";
  s.resumed = saved.has_value();
  if (saved) s.start = resume_from(resume_path, *saved, o, *s.model, *s.strategy, *s.data, pg, s.steps, r);
  // The strategy's loss scale carries the 1/dp of the average, so every
  // reduction is a plain sum and every gradient element is scaled once.
  const float loss_scale = s.strategy->loss_scale() / static_cast<float>(o.grad_accum);
  // After the resume: a pipeline's last stage copies wte from the first.
  s.executor = make_executor(o, pg, mesh, *s.groups, *s.model, *s.strategy, *s.data, loss_scale, stages);
  return s;
}

}  // namespace dpt
