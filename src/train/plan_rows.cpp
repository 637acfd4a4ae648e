// make_plan: the grid of configurations, each row's bytes, traffic and
// time, and the recommendation with its reason (train/plan.h).
#include <algorithm>

#include <fmt/format.h>

#include "comm/types.h"
#include "core/error.h"
#include "models/decoder.h"
#include "parallel/rank_bytes.h"
#include "train/pipeline_executor.h"
#include "parallel/catalog.h"
#include "train/plan.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"

namespace dpt {

namespace {

// The grid's dimensions besides the strategy and checkpointing. Precision
// is set on the model (Model::set_precision), which rank_bytes, the arena
// and planned_comm read; offload is set in the strategy's options
// (options_for), which rank_bytes reads.
const std::vector<std::string> kPrecisions = {"fp32", "bf16"};
const std::vector<std::string> kOffloads = {"none", "optimizer", "params"};

// The offloads `dpt train` runs: the optimizer state under every strategy;
// the fp32 masters only where they are not what computes (bf16) and not
// the replica itself (a sharded strategy).
bool offload_makes_sense(const std::string& offload, const StrategyRef& strategy, const std::string& precision) {
  return offload != "params" || (precision == "bf16" && strategy->zero_stage > 0);
}

// What a rank holds besides its accounted buffers that a plan cannot see in
// its own process: Open MPI's runtime and the shared-memory links between
// ranks (measured: 11 MiB more peak RSS for the same tiny model at 2 ranks
// than in one process, Open MPI 4.1).
constexpr size_t kMpiRuntimeBytes = size_t{11} << 20;

// Bytes of memory traffic of an optimizer step over n parameters (reads
// and writes): AdamW reads p, g, m, v and writes p, m, v; SGD with momentum
// reads p, g, b and writes p, b; plain SGD reads p, g and writes p. Mixed
// precision writes the bf16 copy too.
double optimizer_traffic_bytes(const OptimizerConfig& o, size_t n, bool mixed) {
  const double per = sizeof(float) * (3.0 + 2.0 * static_cast<double>(state_floats(o))) + (mixed ? 2.0 : 0.0);
  return per * static_cast<double>(n);
}

// The options a row's run would get (its precision is the model's).
StrategyOptions options_for(const PlanRequest& r, const PlanPoint& p) {
  StrategyOptions so = r.base;
  so.strategy = p.strategy;
  so.offload.what = parse_offload(p.offload);
  so.offload.dir = r.offload_dir;
  return so;
}

// The parameters a rank's optimizer steps: all of them, or its shard.
size_t stepped_elements(const StrategyOptions& so, const Layout& layout, int world) {
  if (so.strategy->zero_stage == 0) return layout.numel();
  size_t n = 0;
  for (const Unit& u : layout.units()) n += comm::chunk_range(u.numel, world, 0).size;
  return n;
}

// One row: every stage's bytes and traffic (plan_stage), time from the
// machine's rates. On a CPU the collectives' copies and the optimizer's
// sweep run on the same cores and memory as the compute, so the three add
// up (docs/zero.md: overlap hides waiting for a peer, not the copying). A
// pipeline's step is its slowest stage's, stretched by the bubble: M + pp - 1
// micro-batch slots of which M compute. The disk is another device: the
// file tier overlaps its reads and writes with the sweep, so the larger
// counts. `stages`: each stage's model (the whole model without --pp).
PlanRow make_row(const PlanRequest& r, const std::vector<const Model*>& stages, const Mesh& mesh, const PlanPoint& p,
                 int64_t micro) {
  const StrategyOptions so = options_for(r, p);
  const MachineRates& m = r.machine;
  PlanRow row;
  row.point = p;
  row.bubble = mesh.pp > 1 ? pipe_bubble_of(run_program(r.run, mesh.pp)) : 0.0;
  const int64_t per_replica = micro * r.grad_accum;
  const bool mixed = stages[0]->precision() == DType::BF16;
  const double rate = mixed && m.gemm_bf16_gflops > 0 ? m.gemm_bf16_gflops : m.gemm_gflops;
  for (size_t s = 0; s < stages.size(); ++s) {
    const Model& model = *stages[s];
    StagePlan st = plan_stage(r, so, model, mesh, static_cast<int>(s), micro);
    const double flops = model.train_flops(per_replica) + model.recompute_flops(per_replica);
    st.compute_s = rate > 0 ? flops / (rate * 1e9) : 0.0;
    // A shared-memory ring copies each byte sent into a segment and the
    // receiver copies it out: two copies per byte. In place (every rank on
    // one host, comm/shm_window.h) a rank reads and writes its peers'
    // buffers directly: one.
    const int dp = mesh.dp_cp();  // the strategy's group: replicas and their CP ranks
    const bool one_host = dp > 1 && r.in_place && r.ranks_here >= r.world && model.device() == Device::CPU;
    const SharedWindows windows = one_host ? shared_windows(so, model) : SharedWindows{};
    st.window_peer = windows.bytes / static_cast<size_t>(dp) * static_cast<size_t>(dp - 1);
    st.comm_s = m.copy_gbs > 0 ? (windows.every_collective ? 1.0 : 2.0) * static_cast<double>(st.comm.per_step()) /
                                     (m.copy_gbs * 1e9)
                               : 0.0;
    // A copy of B bytes moves 2B of memory traffic.
    const double traffic = optimizer_traffic_bytes(so.optimizer, stepped_elements(so, model.layout(), dp), mixed);
    st.optimizer_s = m.copy_gbs > 0 ? traffic / (2.0 * m.copy_gbs * 1e9) : 0.0;
    if (s == 0 || st.need > row.need) {
      row.bytes = st.bytes;
      row.activations = st.activations;
      row.pipeline = st.pipeline;
      row.need = st.need;
      row.window_peer = st.window_peer;
    }
    if (s == 0 || st.comm.per_step() > row.comm.per_step()) row.comm = st.comm;
    row.compute_s = std::max(row.compute_s, st.compute_s / (1.0 - row.bubble));
    row.comm_s = std::max(row.comm_s, st.comm_s);
    row.optimizer_s = std::max(row.optimizer_s, st.optimizer_s);
    row.stages.push_back(st);
  }
  row.peak_rss = row.need + row.window_peer + m.runtime_bytes + (r.world > 1 ? kMpiRuntimeBytes : 0);
  const uint64_t here = static_cast<uint64_t>(std::max(1, r.ranks_here));
  const uint64_t streamed = here * row.bytes.offloaded;  // the host's ranks share its disk
  row.fits = fits_on_host(row.need, r.ranks_here, r.available) && streamed <= r.disk_free;
  if (streamed > 0 && m.disk_write_gbs > 0 && m.disk_read_gbs > 0)
    row.disk_s = static_cast<double>(streamed) / (m.disk_read_gbs * 1e9) +
                 static_cast<double>(streamed) / (m.disk_write_gbs * 1e9);
  row.step_s = row.compute_s + row.comm_s + std::max(row.optimizer_s, row.disk_s);
  return row;
}

// Whether `dpt train` runs this row on the request's mesh: training's own
// checks (check_pipeline, check_tensor_parallel) on the run with the row's
// settings. Nothing to check without a mesh.
bool mesh_runs(const PlanRequest& r, const Mesh& mesh, const PlanPoint& p) {
  if (mesh.tp == 1 && mesh.pp == 1 && mesh.cp == 1) return true;
  TrainOptions o = r.run;
  o.strategy = p.strategy;
  o.precision = parse_precision(p.precision);
  o.checkpoint_activations = p.checkpoint;
  o.offload = parse_offload(p.offload);
  try {
    check_pipeline(o, mesh);
    check_tensor_parallel(o, mesh);
    check_context_parallel(o, mesh);
  } catch (const InputError&) {
    return false;
  }
  return true;
}

// Seed 000's "when to use what", computed: its row is decided by the least
// sharded strategy that fits here (rows are in the grid's order: without
// offload first, then ddp, zero1, zero2, zero3, each without checkpointing
// first), and when that is not the plan's choice, what it would cost.
// Called with a best row.
std::string seed_verdict(const Plan& plan) {
  for (const PlanRow& row : plan.rows) {
    if (!row.fits) continue;
    const std::string why = row.point.strategy->fits_because(row.point.tp > 1 || row.point.pp > 1);
    std::string verdict = fmt::format("{}{}", why, row.point.checkpoint ? ", with activation checkpointing" : "");
    if (row.point.offload != "none")
      verdict += row.point.offload == "params" ? ", with the optimizer state and fp32 masters offloaded to disk"
                                               : ", with the optimizer state offloaded to disk";
    const PlanRow& best = plan.rows[static_cast<size_t>(plan.best)];
    if (&row != &best)
      verdict += fmt::format(" ({}: about {:.3g} s per step, {:.0f}% slower)", row_name(row.point), row.step_s,
                             100.0 * (row.step_s / best.step_s - 1.0));
    return verdict;
  }
  return "nothing fits";
}

// Why the best row, from the numbers: what it needs against what is
// available, which faster rows do not fit and by how much, and the seed's
// row it answers; or, when nothing fits, the smallest need.
std::string reason_for(const PlanRequest& r, const Plan& plan) {
  const size_t here = static_cast<size_t>(std::max(1, r.ranks_here));
  if (plan.best < 0) {
    const auto smallest = std::min_element(plan.rows.begin(), plan.rows.end(),
                                           [](const PlanRow& a, const PlanRow& b) { return a.need < b.need; });
    return fmt::format("nothing fits in {} for {} rank{}: the smallest, {}, needs {} per rank ({} for the host); "
                       "add ranks on other hosts, or shrink the model or the batch",
                       human_bytes(r.available), here, here == 1 ? "" : "s", row_name(smallest->point),
                       human_bytes(smallest->need), human_bytes(smallest->need * here));
  }
  const PlanRow& best = plan.rows[static_cast<size_t>(plan.best)];
  std::string why = fmt::format("{} fits: {} per rank ({} for {} rank{} of {} available), about {:.3g} s per step, "
                                "{} sent per step",
                                row_name(best.point), human_bytes(best.need), human_bytes(best.need * here), here,
                                here == 1 ? "" : "s", human_bytes(r.available), best.step_s,
                                human_bytes(best.comm.per_step()));
  if (best.bytes.offloaded > 0)
    why += fmt::format(", {} offloaded to {} for the host ({} free)", human_bytes(best.bytes.offloaded * here),
                       r.offload_dir, human_bytes(r.disk_free));
  std::vector<std::string> close, too_big;
  for (const PlanRow& row : plan.rows) {
    if (row.step_s >= best.step_s) continue;
    const std::string what = fmt::format("{} ({:.3g} s, {} per rank)", row_name(row.point), row.step_s,
                                         human_bytes(row.need));
    (row.fits ? close : too_big).push_back(what);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
    return out;
  };
  if (!close.empty())
    why += fmt::format("; estimated faster by less than the estimates can tell ({:.0f}%), so the simpler: {}",
                       100.0 * kTieMargin, list(close));
  else
    why += "; the fastest that fits";
  if (!too_big.empty()) why += "; faster but too big: " + list(too_big);
  return why + "; seed 000, from what fits here: " + seed_verdict(plan);
}

// The strategies asked for (fsdp is zero3), or every one that makes sense on
// this many data-parallel replicas. With --meshes a mesh of one replica has
// the local row, and the others the data-parallel strategies asked for.
std::vector<StrategyRef> plan_strategies(const PlanRequest& r, int dp) {
  std::vector<StrategyRef> out;
  for (const StrategyRef& s : r.strategies) {
    if (s->trains_one_replica() && dp > 1) {
      if (r.all_meshes) continue;
      throw InputError(dp == r.world
                           ? fmt::format("--strategy {} trains one process, not {} ranks", s.name(), r.world)
                           : fmt::format("--strategy {} trains one replica, not {} data-parallel replicas", s.name(),
                                         dp));
    }
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  if (r.strategies.empty() || (r.all_meshes && dp == 1)) {
    if (dp == 1) return {default_strategy(1)};
    out.clear();
    for (const StrategyRecord* d : data_parallel_strategies()) out.push_back(*d);
  }
  return out;
}

}  // namespace

std::string row_name(const PlanPoint& p) {
  std::string s = (p.tp > 1 ? fmt::format("tp{} ", p.tp) : "") + (p.pp > 1 ? fmt::format("pp{} ", p.pp) : "") +
                  (p.cp > 1 ? fmt::format("cp{} ", p.cp) : "") + p.strategy.name();
  if (p.precision != "fp32") s += " " + p.precision;
  if (p.checkpoint) s += " +ckpt";
  if (p.offload != "none") s += " +offload " + p.offload;
  return s;
}

namespace {

// One mesh and its stages: each stage's model as training builds it (its
// blocks, rank 0's slices of them), or the model itself without a mesh.
struct MeshStages {
  Mesh mesh;
  int64_t micro = 0;
  std::vector<std::unique_ptr<Model>> built;
  std::vector<Model*> stages;
};

// tp x pp as training lays the mesh out and refuses it (rank 0's
// coordinates): InputError, training's sentence, when it cannot run.
MeshStages mesh_stages(const PlanRequest& r, int tp, int pp, int cp, Model& model) {
  TrainOptions run = r.run;
  run.batch = r.batch;
  run.grad_accum = r.grad_accum;
  if (r.all_meshes && tp == 1) {  // --tp-embedding vocab and --sequence-parallel are for the tp > 1 meshes
    run.tp_embedding = TpEmbedding::Replicated;
    run.sequence_parallel = false;
  }
  MeshStages m;
  m.mesh = Mesh::layout(r.world, 0, tp, pp, cp);
  check_pipeline(run, m.mesh);
  check_tensor_parallel(run, m.mesh);
  check_context_parallel(run, m.mesh);
  m.micro = micro_batch(run, m.mesh.dp, tp == 1 && pp == 1 && cp == 1 ? "ranks" : "data-parallel replicas");
  if (tp == 1 && pp == 1 && cp == 1) {
    m.stages.push_back(&model);
    return m;
  }
  const DecoderConfig config = DecoderConfig::from(model_hparams(run));
  const PipeProgram program = pp > 1 ? run_program(run, pp) : PipeProgram{};
  const std::vector<DecoderStage> split =
      pp > 1 ? pipe_stages(config, program, run.pp_split) : std::vector<DecoderStage>{DecoderStage{}};
  for (const DecoderStage& st : split) {
    const DecoderTp dtp{tp, 0, run.tp_embedding == TpEmbedding::Vocab, run.sequence_parallel};
    auto stage = std::make_unique<Decoder>(config, st, dtp);
    if (pp > 1) stage->set_split_backward(pipe_splits_backward(program));
    set_attention(run, *stage);
    if (cp > 1) stage->set_context_parallel(cp, 0, nullptr);  // CP rank 0's rows (every rank's count)
    m.built.push_back(std::move(stage));
    m.stages.push_back(m.built.back().get());
  }
  return m;
}

// The meshes a plan covers: the one asked for (refused in training's
// sentence when it cannot run), or with --meshes every tp x pp whose
// product divides the world and that training runs, data parallelism alone
// first.
std::vector<MeshStages> plan_meshes(const PlanRequest& r, Model& model) {
  std::vector<MeshStages> out;
  if (!r.all_meshes) {
    out.push_back(mesh_stages(r, r.run.tp, r.run.pp, r.run.cp, model));
    return out;
  }
  std::string first_refusal;  // data parallelism alone's, tried first
  for (int cp = 1; cp <= r.world; ++cp)
    for (int tp = 1; tp * cp <= r.world; ++tp)
      for (int pp = 1; tp * pp * cp <= r.world; ++pp) {
        if (r.world % (tp * pp * cp) != 0) continue;
        try {
          out.push_back(mesh_stages(r, tp, pp, cp, model));
        } catch (const InputError& e) {
          // Not a layout training runs for this model: no rows.
          if (first_refusal.empty()) first_refusal = e.what();
        }
      }
  // No layout runs (a batch no mesh of a prime world splits): training's
  // sentence for the plainest one, not a plan of no rows.
  if (out.empty()) throw InputError(first_refusal);
  return out;
}

}  // namespace

Plan make_plan(const PlanRequest& r, Model& model) {
  if (r.world < 1) throw InputError(fmt::format("--ranks must be at least 1 (got {})", r.world));
  std::vector<MeshStages> meshes = plan_meshes(r, model);
  const bool was = model.checkpoint_activations();
  const DType was_precision = model.precision();
  // Checkpointing makes sense only where it drops something (not the MLP).
  model.set_checkpoint_activations(false);
  const size_t plain = model.activation_bytes_for(1);
  model.set_checkpoint_activations(true);
  const bool ckpt_helps = model.activation_bytes_for(1) < plain;
  // Offload outermost: the rows that keep everything in RAM come first, so
  // among estimates too close to tell apart the plan never picks a disk.
  Plan plan;
  for (const std::string& offload : kOffloads)
    for (MeshStages& m : meshes) {
      const std::vector<const Model*> views(m.stages.begin(), m.stages.end());
      for (const StrategyRef& s : plan_strategies(r, m.mesh.dp_cp()))
        for (const std::string& precision : kPrecisions)
          for (bool ckpt : {false, true}) {
            const PlanPoint point{s, precision, ckpt, offload, m.mesh.tp, m.mesh.pp, m.mesh.cp};
            if ((ckpt && !ckpt_helps) || !offload_makes_sense(offload, s, precision) || !mesh_runs(r, m.mesh, point))
              continue;
            for (Model* stage : m.stages) {
              stage->set_checkpoint_activations(ckpt);
              stage->set_precision(parse_precision(precision));
            }
            plan.rows.push_back(make_row(r, views, m.mesh, point, m.micro));
          }
    }
  model.set_checkpoint_activations(was);
  model.set_precision(was_precision);
  // The fastest that fits, or the first in the grid's order (no offload,
  // less sharded, no checkpointing) whose estimate is within kTieMargin of it.
  double fastest = -1;
  for (const PlanRow& row : plan.rows)
    if (row.fits && (fastest < 0 || row.step_s < fastest)) fastest = row.step_s;
  for (size_t i = 0; i < plan.rows.size() && plan.best < 0; ++i)
    if (plan.rows[i].fits && plan.rows[i].step_s <= fastest * (1.0 + kTieMargin)) plan.best = static_cast<int>(i);
  if (plan.rows.empty())
    throw InputError(fmt::format("nothing to plan: no strategy asked for runs {} rank{} of this model", r.world,
                                 r.world == 1 ? "" : "s"));
  plan.reason = reason_for(r, plan);
  return plan;
}

namespace {

nlohmann::json comm_json(const CommPlan& c) {
  return {{"per_step", c.per_step()}, {"forward", c.forward}, {"backward", c.backward}, {"optimizer", c.optimizer},
          {"first_step", c.first_step}, {"logged_other", c.logged_other}, {"logged_optimizer", c.logged_optimizer}};
}

// Every stage's rank (one without --pp): what it holds and sends.
nlohmann::json stages_json(const PlanRow& row) {
  nlohmann::json out = nlohmann::json::array();
  for (const StagePlan& st : row.stages) {
    const MemoryBytes& b = st.bytes;
    out.push_back({{"bytes", {{"parameters", b.parameters}, {"gradients", b.gradients}, {"optimizer", b.optimizer},
                              {"gathered", b.gathered}, {"scratch", b.scratch}, {"activations", st.activations},
                              {"offloaded", b.offloaded}, {"pipeline", st.pipeline}, {"total", st.need}}},
                   {"arenas", st.arenas}, {"arena_bytes", st.arena}, {"comm", comm_json(st.comm)},
                   {"time", {{"compute_s", st.compute_s}, {"comm_s", st.comm_s}, {"optimizer_s", st.optimizer_s}}}});
  }
  return out;
}

}  // namespace

nlohmann::json plan_json(const PlanRequest& r, const Model& model, const Plan& plan) {
  using nlohmann::json;
  json schedules = json::array();  // under --pp: every schedule's simulated idle
  if (r.run.pp > 1 && !r.all_meshes)
    for (const ScheduleIdle& s :
         pipe_schedule_idles(DecoderConfig::from(model_hparams(r.run)), r.run.pp, static_cast<int>(r.grad_accum)))
      schedules.push_back({{"schedule", s.schedule}, {"virtual_stages", s.v}, {"idle_rank0", s.idle_first},
                           {"idle_mean", s.idle_mean}});
  json rows = json::array();
  for (const PlanRow& row : plan.rows) {
    const MemoryBytes& b = row.bytes;
    rows.push_back(
        {{"strategy", row.point.strategy.name()}, {"tp", row.point.tp}, {"pp", row.point.pp}, {"cp", row.point.cp},
         {"dp", r.world / (row.point.tp * row.point.pp * row.point.cp)}, {"precision", row.point.precision},
         {"checkpoint_activations", row.point.checkpoint}, {"offload", row.point.offload},
         {"bytes", {{"parameters", b.parameters}, {"gradients", b.gradients}, {"optimizer", b.optimizer},
                    {"gathered", b.gathered}, {"scratch", b.scratch}, {"activations", row.activations},
                    {"offloaded", b.offloaded}, {"pipeline", row.pipeline}, {"total", row.need},
                    {"peak_rss", row.peak_rss}}},
         {"comm", comm_json(row.comm)},
         {"time", {{"compute_s", row.compute_s}, {"comm_s", row.comm_s}, {"optimizer_s", row.optimizer_s},
                   {"disk_s", row.disk_s}, {"step_s", row.step_s}}},
         {"fits", row.fits}, {"bubble", row.bubble}, {"stages", stages_json(row)}});
  }
  json j = {{"model", model.kind()}, {"params", model.param_count()}, {"world", r.world},
            {"ranks_here", r.ranks_here}, {"batch", r.batch}, {"grad_accum", r.grad_accum},
            {"optimizer", r.base.optimizer.name}, {"available", r.available},
            {"offload_dir", r.offload_dir}, {"disk_free", r.disk_free},
            {"machine", {{"gemm_gflops", r.machine.gemm_gflops}, {"gemm_bf16_gflops", r.machine.gemm_bf16_gflops},
                         {"copy_gbs", r.machine.copy_gbs}, {"disk_write_gbs", r.machine.disk_write_gbs},
                         {"disk_read_gbs", r.machine.disk_read_gbs},
                         {"threads", r.machine.threads}, {"runtime_bytes", r.machine.runtime_bytes}}},
            {"mesh", {{"tp", r.run.tp}, {"pp", r.run.pp}, {"cp", r.run.cp},
                      {"dp", r.world / (r.run.tp * r.run.pp * r.run.cp)},
                      {"pp_schedule", r.run.pp > 1 || r.all_meshes ? r.run.pp_schedule : ""},
                      {"all", r.all_meshes}, {"schedules", schedules}}},
            {"rows", rows}, {"reason", plan.reason}, {"tie_margin", kTieMargin}};
  j["recommended"] = plan.best < 0 ? json(nullptr) : json(plan.best);
  return j;
}

}  // namespace dpt
