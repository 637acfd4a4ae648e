// What a rank trains with, built from the options: the model's
// hyper-parameters resolved once, this rank's model (its pipeline stage or
// tensor-parallel slice), the strategy's options, the tensor-parallel
// wiring and the executor that runs a step's micro-batches.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/model.h"
#include "parallel/context_ring.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "parallel/traffic.h"
#include "train/checkpoint.h"
#include "train/data_source.h"
#include "train/executor.h"
#include "train/train.h"

namespace dpt {

// The model's hyper-parameters: the flags over what --load's file describes
// (its metadata, read from the header alone, or a config.json beside it;
// see hparams_for_file), and the model's name. o.model_config once
// resolve_model has run, so the file is read once.
std::map<std::string, std::string> model_hparams(const TrainOptions& o);
// Sets o.model_config (model_hparams' answer), then refuses sizes past any
// machine (check_sizes, train/run_checks.h) before anything is built from it.
void resolve_model(TrainOptions& o);

// The checkpoint's model, with the flags over it (a flag that disagrees is
// then refused by load_checkpoint, naming both values).
std::map<std::string, std::string> resumed_hparams(const TrainOptions& o, const CheckpointInfo& saved);

// The strategy's share of the options.
StrategyOptions strategy_options(const TrainOptions& o);

// The run's model: loaded from o.load, or built from o.hparams and
// initialised from `seed` (naive DP's replicas).
std::unique_ptr<Model> build_model(const TrainOptions& o, uint64_t seed);

// Whether a transformer run computes fused attention: --attention as given,
// else the default. The default is the faster kernel (docs/memory.md,
// "Which attention runs by default"): on the CPU the fused one, measured
// faster than the unfused layer at every context from 16 to 8,192 tokens,
// with and without grouped heads (bench_kernels BM_attention_*); on CUDA
// the unfused one (cuBLAS GEMMs) until the fused kernel (fp32 CUDA cores)
// has been measured against it on a GPU (docs/gpu.md).
bool fused_attention_for(const TrainOptions& o);
// Whether the fused attention's products read bf16 copies: as
// --attention-products says, and by default wherever they can (a bf16 run's
// fused attention on the CPU), as PyTorch autocast's SDPA computes
// (docs/precision.md, "The fused attention in bf16").
bool bf16_attention_products_for(const TrainOptions& o);

// --attention on a transformer (nothing on the MLP, whose flag check
// refuses it).
void set_attention(const TrainOptions& o, Model& model);

// This rank's model: its stage under --pp (with every stage, cut as the
// flags ask), its slice of every block under --tp, else the whole model;
// its shape that of the checkpoint it resumes (saved), set up as the flags
// ask. Its parameters are the strategy's to fill.
struct RankModel {
  std::unique_ptr<Model> model;
  std::vector<DecoderStage> stages;  // under --pp
};
RankModel rank_model(const TrainOptions& o, const Mesh& mesh, const std::optional<CheckpointInfo>& saved);

// Under --tp the GPT sums (or maxes) its partial results over its TP group.
void connect_tensor_parallel(Model& model, comm::ProcessGroup* tpg);

// Who runs a step's micro-batches: a pipeline stage under --pp, else the
// sequential executor over the whole (or TP-sliced) model.
std::unique_ptr<Executor> make_executor(const TrainOptions& o, comm::ProcessGroup& pg, const Mesh& mesh,
                                        MeshGroups& groups, Model& model, Strategy& strategy, DataSource& data,
                                        float loss_scale, const std::vector<DecoderStage>& stages);

// Everything this rank trains with, made in order: the model's shape, the
// mesh's groups and tensor-parallel wiring, the strategy (after the offload
// and memory checks: it allocates), the data, a resume's state, then the
// executor. Where the parameters live, and their initial values, are the
// strategy's (a zero3 rank never holds them all); under --pp and --tp the
// strategy runs over the data-parallel group of the mesh.
struct RankSetup {
  Mesh mesh;
  int64_t micro = 0;           // samples per micro-batch on this rank
  std::unique_ptr<Model> model;
  std::unique_ptr<MeshGroups> groups;
  std::unique_ptr<GroupRing> ring;  // --cp: the decoder's ring over groups->cp()
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Executor> executor;
  int64_t steps = 0, start = 0;  // the run's steps, and the first this run takes (a resume's)
  CommPlan planned_comm;         // what this rank sends per step by the plan (run_report.h's count_comm)
  bool resumed = false;
};
// Sets o.schedule's total steps; a resume's time and bytes go into r.
RankSetup set_up_rank(TrainOptions& o, comm::ProcessGroup& pg, const Mesh& mesh, TrainResult& r);

}  // namespace dpt
