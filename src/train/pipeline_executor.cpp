#include "train/pipeline_executor.h"

#include <algorithm>
#include <array>
#include <chrono>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fault.h"
#include "models/weights.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/tensor_parallel.h"
#include "train/data_source.h"
#include "train/rank_setup.h"
#include "core/timeline.h"
#include "train/train.h"

namespace dpt {

using Clock = std::chrono::steady_clock;

namespace {

// A pipeline span's chunk, in the timeline's bytes field (core/timeline.h).
size_t chunk_tag(const PipeAction& a) { return static_cast<size_t>(a.chunk); }

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void wait(std::shared_ptr<comm::Work>& w) {
  if (w) w->wait();
  w.reset();
}

}  // namespace

namespace {

// Blocks per chunk: --pp-split's counts, or balanced by parameters (the
// embedding and learned positions with chunk 0, the final norm and the
// head, or the head's copy of the tied embedding, with the last).
std::vector<int64_t> chunk_blocks(const DecoderConfig& c, int chunks, int v, const std::string& split) {
  const int64_t C = c.width, V = c.rows();
  const int64_t norm = c.norm == NormKind::LayerNorm ? 2 * C : C;
  return pipe_split(split, chunks, c.layers, V * C + (c.rotary ? 0 : c.context * C), c.block_params(), V * C + norm, v);
}

// FLOPs per token of a block's F, B and W (attention's backward is all
// input gradient; checkpointing recomputes the block's forward in B).
std::array<double, 3> block_costs(const DecoderConfig& c, bool checkpoint) {
  const double T = static_cast<double>(c.context), a = static_cast<double>(c.heads * c.head_dim());
  const double G = c.block_gemm_params(), f = 2 * G + 4 * T * a;
  return {f, 2 * G + 8 * T * a + (checkpoint ? f : 0.0), 2 * G};
}

}  // namespace

std::vector<DecoderStage> pipe_stages(const DecoderConfig& c, const PipeProgram& program, const std::string& split) {
  const int S = program.chunks();
  const std::vector<int64_t> counts = chunk_blocks(c, S, program.v, split);
  std::vector<DecoderStage> stages(static_cast<size_t>(program.pp));
  for (auto& st : stages) st = DecoderStage{{}, false, false};
  int64_t first = 0;
  for (int k = 0; k < S; ++k) {
    DecoderStage& st = stages[static_cast<size_t>(program.rank_of_chunk[static_cast<size_t>(k)])];
    st.chunks.push_back({first, first + counts[static_cast<size_t>(k)]});
    st.embed = st.embed || k == 0;
    st.head = st.head || k == S - 1;
    first += counts[static_cast<size_t>(k)];
  }
  return stages;
}

PipeCosts pipe_chunk_costs(const DecoderConfig& c, int chunks, int v, const std::string& split, bool checkpoint) {
  const std::array<double, 3> block = block_costs(c, checkpoint);
  const double head = 2.0 * static_cast<double>(c.vocab * c.width);  // per token, each of F, B and W
  PipeCosts costs;
  const std::vector<int64_t> counts = chunk_blocks(c, chunks, v, split);
  for (int k = 0; k < chunks; ++k) {
    const double n = static_cast<double>(counts[static_cast<size_t>(k)]), h = k == chunks - 1 ? head : 0.0;
    costs.chunk.push_back({n * block[0] + h, n * block[1] + h, n * block[2] + h});
  }
  return costs;
}

PipeProgram run_program(const TrainOptions& o, int pp) {
  const int v = pipe_virtual_stages(o.pp_schedule, o.virtual_stages);
  const auto M = static_cast<int>(o.grad_accum);
  if (o.pp_schedule != "zb-h1" && o.pp_schedule != "zb-v") return pipe_program(o.pp_schedule, pp, v, M);
  // The zero-bubble lists are built by running them with the chunks' costs.
  const DecoderConfig c = DecoderConfig::from(model_hparams(o));
  return pipe_program(o.pp_schedule, pp, v, M,
                      pipe_chunk_costs(c, pp * v, v, o.pp_split, o.checkpoint_activations));
}

PipelineExecutor::PipelineExecutor(const Mesh& mesh, MeshGroups& groups, Decoder& model, Strategy& strategy,
                                   DataSource& data, float loss_scale, PipelineOptions options)
    : mesh_(mesh), groups_(groups), model_(model), strategy_(strategy), data_(data), loss_scale_(loss_scale),
      options_(std::move(options)), program_(options_.program) {
  const PipeCheck check = check_pipe_program(program_);
  if (!check.error.empty())
    throw InputError(fmt::format("the {} pipeline schedule cannot run: {}", program_.schedule, check.error));
  ops_ = program_.ranks[static_cast<size_t>(me())];
  slots_ = pipe_slot_table(program_, me());
  head_rank_ = rank_of(chunks() - 1);
  const int M = program_.micro_batches;
  batches_.resize(static_cast<size_t>(M));
  have_batch_.assign(static_cast<size_t>(M), 0);
  int arenas = 0;
  for (int c : slots_.count) arenas = std::max(arenas, c);
  sends_.resize(static_cast<size_t>(arenas) * slots_.chunks.size());
  recvs_.resize(ops_.size());
  op_ms_.assign(static_cast<size_t>(4 * chunks()), 0.0);
  op_count_.assign(op_ms_.size(), 0.0);
  const bool split = std::any_of(ops_.begin(), ops_.end(), [](const PipeAction& a) { return a.kind == PipeAction::W; });
  model_.set_split_backward(split);
  make_links();
  // The head's copy of wte is in the compute type: the head's GEMM reads
  // it as one process reads its own compute copy of wte. An untied head is
  // the last chunk's own parameter: nothing to share.
  const DType compute = model_.precision();
  if (model_.tied()) {
    if (holds_head() || first()) tied_g_ = FlatBuffer(wte_numel());
    if (first()) {
      embed_unit_ = FlatBuffer(model_.layout().units()[0].numel);
      if (compute != DType::F32) tied_w_ = FlatBuffer(wte_numel(), compute);
    } else if (holds_head()) {
      tied_w_ = FlatBuffer(wte_numel(), compute);
    }
    if (holds_head()) {
      // On rank 0 (a V) the head reads wte where the gather put it (the
      // unit's first slot), or its rounded copy.
      const void* copy = !first() || compute != DType::F32 ? static_cast<const void*>(tied_w_.f32()) : embed_unit_.f32();
      model_.set_tied_head(copy, tied_g_.f32());
    }
  }
  sync_tied_weights();
  eval_forward_ = [this](const Batch& b) {
    // One batch at a time through the rank's chunks in order, each in its
    // slot 0 (between steps every arena is free).
    ForwardStats stats;
    const size_t n = activation_elements(b);
    for (size_t i = 0; i < slots_.chunks.size(); ++i) {
      const int c = slots_.chunks[i];
      model_.use_slot(0, static_cast<int>(i));
      if (c > 0) {
        model_.prepare(b.B, b.T);
        if (rank_of(c - 1) == me()) {
          model_.k().copy(model_.stage_input(), model_.stage_output_of(0, slots_.local(c - 1)), n * sizeof(float));
        } else {
          const Link l = link(0, rank_of(c - 1), me());
          l.group->recv(model_.stage_input(), n, DType::F32, l.peer);
        }
      }
      const ForwardStats st = model_.forward(b);
      if (c == chunks() - 1) stats = st;
      if (c + 1 < chunks() && rank_of(c + 1) != me()) {
        const Link l = link(0, me(), rank_of(c + 1));
        l.group->send(model_.stage_output(), n, DType::F32, l.peer);
      }
    }
    return stats;
  };
}

PipelineExecutor::~PipelineExecutor() {
  // Nothing may still read or write an arena when the model outlives us.
  for (auto& w : sends_)
    if (w) w->wait();
  for (auto& w : recvs_)
    if (w) w->wait();
}

void PipelineExecutor::make_links() {
  if (program_.v == 1) return;  // one chunk per rank: MeshGroups' two groups
  // Every (kind, from, to) the program sends on, in the same order on every
  // rank (the program is the same everywhere): one split of the PP group
  // each, the sender ranked first.
  const int P = program_.pp;
  links_.assign(static_cast<size_t>(2 * P * P), Link{});
  std::vector<char> used(links_.size(), 0);
  for (size_t r = 0; r < program_.ranks.size(); ++r)
    for (const PipeAction& a : program_.ranks[r])
      if (const PipeMessage m = pipe_send(program_, a))
        used[static_cast<size_t>((m.kind * P + static_cast<int>(r)) * P + m.peer)] = 1;
  for (int kind = 0; kind < 2; ++kind)
    for (int from = 0; from < P; ++from)
      for (int to = 0; to < P; ++to) {
        const auto i = static_cast<size_t>((kind * P + from) * P + to);
        if (!used[i]) continue;
        const bool member = me() == from || me() == to;
        auto g = groups_.pp().split(member ? 0 : 1 + me(), me() == from ? 0 : 1,
                                    fmt::format("pp {} {}->{}", kind == 0 ? "activations" : "gradients", from, to));
        if (!member) continue;
        links_[i] = Link{g.get(), me() == from ? 1 : 0};
        link_groups_.push_back(std::move(g));
      }
}

PipelineExecutor::Link PipelineExecutor::link(int kind, int from, int to) {
  if (program_.v == 1) {
    comm::ProcessGroup& g = kind == 0 ? groups_.activations() : groups_.gradients();
    return Link{&g, from == me() ? to : from};
  }
  const Link l = links_[static_cast<size_t>((kind * program_.pp + from) * program_.pp + to)];
  DPT_CHECK(l.group != nullptr, "no {} link from pp rank {} to {}", kind == 0 ? "activation" : "gradient", from, to);
  return l;
}

size_t pipeline_buffer_bytes(const Decoder& stage, int pp) {
  if (pp == 1 || !stage.tied()) return 0;
  const size_t wte = static_cast<size_t>(stage.wte_rows() * stage.config().width);
  const size_t copy = dtype_size(stage.precision()) * wte;
  if (stage.stage().embed)
    return sizeof(float) * (wte + stage.layout().units()[0].numel) + (stage.precision() == DType::F32 ? 0 : copy);
  return stage.stage().head ? sizeof(float) * wte + copy : 0;
}

std::vector<ScheduleIdle> pipe_schedule_idles(const DecoderConfig& c, int pp, int M) {
  std::vector<ScheduleIdle> out;
  for (const std::string& name : pipe_program_names()) {
    const int v = pipe_virtual_stages(name, 0);
    if (c.layers < pp * v || (name == "interleaved" && M % pp != 0)) continue;
    const PipeCosts costs = pipe_chunk_costs(c, pp * v, v, "", false);
    const PipeSimulation sim = simulate_pipe_program(pipe_program(name, pp, v, M, costs), costs);
    double mean = 0.0;
    for (double i : sim.idle) mean += i / static_cast<double>(sim.idle.size());
    out.push_back({name, v, sim.idle[0], mean});
  }
  return out;
}

size_t pipeline_activation_bytes(const Decoder& stage, const PipeProgram& program, int rank, int64_t micro) {
  const PipeSlots t = pipe_slot_table(program, rank);
  size_t bytes = 0;
  for (size_t i = 0; i < t.chunks.size(); ++i)
    bytes += static_cast<size_t>(t.count[i]) * stage.activation_bytes_for(micro, static_cast<int>(i));
  return bytes;
}

size_t PipelineExecutor::wte_numel() const {
  return static_cast<size_t>(model_.wte_rows() * model_.config().width);  // this TP rank's rows
}

void PipelineExecutor::sync_tied_weights() {
  if (!model_.tied()) return;
  const DType compute = model_.precision();
  if (first()) {
    strategy_.gather_unit(0, embed_unit_.f32());  // wte is the unit's first slot (the fp32 masters)
    const void* values = embed_unit_.f32();
    if (compute == DType::BF16) {
      // Rounded here as every strategy rounds its compute copies: half the bytes.
      convert(tied_w_.b16(), embed_unit_.f32(), wte_numel());
      values = tied_w_.b16();
    }
    if (!holds_head()) groups_.pp().send(values, wte_numel(), compute, head_rank_);
  } else if (holds_head()) {
    groups_.pp().recv(tied_w_.f32(), wte_numel(), compute, 0);
  }
}

void PipelineExecutor::set_phase(const char* phase) {
  for (auto* g : {&groups_.activations(), &groups_.gradients(), &groups_.pp(), &groups_.dp(), &groups_.world(),
                  groups_.tp()})
    if (g) g->set_phase(phase);
  for (auto& g : link_groups_) g->set_phase(phase);
}

size_t PipelineExecutor::arena(size_t k) const {
  const PipeAction& a = ops_[k];
  const auto i = static_cast<size_t>(slots_.local(a.chunk));
  return static_cast<size_t>(slots_.of[i][static_cast<size_t>(a.micro)]) * slots_.chunks.size() + i;
}

void PipelineExecutor::use(size_t k) {
  const PipeAction& a = ops_[k];
  const int i = slots_.local(a.chunk);
  model_.use_slot(slots_.of[static_cast<size_t>(i)][static_cast<size_t>(a.micro)], i);
}

void PipelineExecutor::post_receive(size_t k) {
  if (k >= ops_.size() || recvs_[k]) return;
  const PipeMessage msg = pipe_receive(program_, ops_[k]);
  if (!msg) return;
  const PipeAction& a = ops_[k];
  const auto i = static_cast<size_t>(slots_.local(a.chunk));
  const auto m = static_cast<size_t>(a.micro);
  const Batch& b = batches_[0];
  if (a.kind == PipeAction::F) {
    // Its arena must be free already: freed by an operation before the
    // one about to run (k - 1), and laid out for the batch.
    if (slots_.free_at[i][m] >= static_cast<int>(k) - 1 || b.B == 0) return;
  } else if (arena(k) == arena(k - 1)) {
    return;  // the backward of the forward about to run: its arena is laid out by that forward
  }
  use(k);
  float* into;
  if (a.kind == PipeAction::F) {
    model_.prepare(b.B, b.T);
    into = model_.stage_input();
  } else {
    into = model_.output_grad();
  }
  const Link l = link(msg.kind, msg.peer, me());
  recvs_[k] = l.group->recv_async(into, activation_elements(b), DType::F32, l.peer);
  use(k - 1);  // back to the operation about to run
}

void PipelineExecutor::wait_receive(size_t k) {
  const PipeMessage msg = pipe_receive(program_, ops_[k]);
  if (!msg) return;
  if (!recvs_[k]) {
    const PipeAction& a = ops_[k];
    const Link l = link(msg.kind, msg.peer, me());
    float* into = a.kind == PipeAction::F ? model_.stage_input() : model_.output_grad();
    l.group->recv(into, activation_elements(batches_[static_cast<size_t>(a.micro)]), DType::F32, l.peer);
    return;
  }
  wait(recvs_[k]);
}

double PipelineExecutor::forward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl) {
  const PipeAction& a = ops_[k];
  const auto m = static_cast<size_t>(a.micro);
  const auto td = Clock::now();
  // Every rank reads the replica's batches (rank 0 for the tokens, the
  // head's rank for the targets), in micro-batch order: the rank's first
  // chunk's forwards come in that order.
  if (!have_batch_[m]) {
    data_.next(batches_[m]);
    have_batch_[m] = 1;
  }
  const Batch& batch = batches_[m];
  const auto tf = Clock::now();
  const size_t n = activation_elements(batch);
  use(k);
  finish_send(sends_[arena(k)]);  // the arena's last micro-batch's sends read it
  set_phase("forward");
  fault_point("forward", step + 1, groups_.world().rank());
  if (a.chunk > 0) {
    model_.prepare(batch.B, batch.T);
    if (rank_of(a.chunk - 1) == me()) {
      const int prev = slots_.local(a.chunk - 1);
      model_.k().copy(model_.stage_input(), model_.stage_output_of(slots_.of[static_cast<size_t>(prev)][m], prev),
                      n * sizeof(float));
    } else {
      wait_receive(k);
    }
  }
  const auto tc = Clock::now();  // waits before it are the bubble (and the transfer)
  post_receive(k + 1);
  const double loss = model_.forward(batch).loss;
  if (const PipeMessage msg = pipe_send(program_, a)) {
    const Link l = link(msg.kind, me(), msg.peer);
    sends_[arena(k)] = l.group->send_async(model_.stage_output(), n, DType::F32, l.peer);
  }
  const auto te = Clock::now();
  t.data_ms += ms(td, tf);
  t.comm_wait_ms += ms(tf, tc);
  t.forward_ms += ms(tc, te);
  time_op(a, ms(tc, te), ms(tf, tc));
  if (tl) {
    if (a.chunk > 0) tl->add(Timeline::CommWait, step, a.micro, chunk_tag(a), tf, tc);
    tl->add(Timeline::Forward, step, a.micro, chunk_tag(a), tc, te);
  }
  return loss;
}

void PipelineExecutor::backward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl) {
  const PipeAction& a = ops_[k];
  const auto m = static_cast<size_t>(a.micro);
  const auto tb = Clock::now();
  const bool final = a.micro == program_.micro_batches - 1;
  const size_t n = activation_elements(batches_[m]);
  use(k);
  set_phase("backward");
  fault_point("backward", step + 1, groups_.world().rank());
  strategy_.begin_micro_step(final);  // the reductions start with the last micro-batch's
  // (From a chunk of this rank, the gradient is in place already.)
  wait_receive(k);
  // The head's part of wte's gradient, before the embedding's backward of
  // the step's last micro-batch (the head's rank sent it after its own).
  const bool tied_in = a.chunk == 0 && final && model_.tied();
  if (tied_in) {
    if (!holds_head()) groups_.pp().recv(tied_g_.f32(), wte_numel(), DType::F32, head_rank_);
    model_.set_tied_grad_in(tied_g_.f32());
  }
  // B keeps a gradient over the chunk's output: its forward's send (long
  // received: this gradient came after it) must be done reading it.
  if (a.kind == PipeAction::B) finish_send(sends_[arena(k)]);
  const auto tc = Clock::now();
  post_receive(k + 1);
  if (a.kind == PipeAction::BW)
    model_.backward(loss_scale_);
  else
    model_.backward_input(loss_scale_);
  model_.set_tied_grad_in(nullptr);
  if (a.chunk > 0) {
    if (rank_of(a.chunk - 1) == me()) {
      // Into the previous chunk's arena, whose backward is still to come.
      const int prev = slots_.local(a.chunk - 1);
      model_.k().copy(model_.output_grad_of(slots_.of[static_cast<size_t>(prev)][m], prev), model_.input_grad(),
                      n * sizeof(float));
    } else {
      const PipeMessage msg = pipe_send(program_, a);
      const Link l = link(msg.kind, me(), msg.peer);
      sends_[arena(k)] = l.group->send_async(model_.input_grad(), n, DType::F32, l.peer);
    }
  }
  if (a.chunk == chunks() - 1 && final && model_.tied() && !first())
    tied_send_ = groups_.pp().send_async(tied_g_.f32(), wte_numel(), DType::F32, 0);
  const auto te = Clock::now();
  t.comm_wait_ms += ms(tb, tc);
  t.backward_ms += ms(tc, te);
  time_op(a, ms(tc, te), ms(tb, tc));
  if (tl) {
    if (a.chunk + 1 < chunks() || tied_in) tl->add(Timeline::CommWait, step, a.micro, chunk_tag(a), tb, tc);
    tl->add(a.kind == PipeAction::BW ? Timeline::Backward : Timeline::InputGrad, step, a.micro, chunk_tag(a), tc, te);
  }
}

void PipelineExecutor::weights_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl) {
  const PipeAction& a = ops_[k];
  use(k);
  set_phase("backward");
  fault_point("backward", step + 1, groups_.world().rank());
  strategy_.begin_micro_step(a.micro == program_.micro_batches - 1);
  const auto tc = Clock::now();
  post_receive(k + 1);
  model_.backward_weights();
  const auto te = Clock::now();
  t.backward_ms += ms(tc, te);
  time_op(a, ms(tc, te), 0.0);
  if (tl) tl->add(Timeline::WeightGrad, step, a.micro, chunk_tag(a), tc, te);
}

double PipelineExecutor::mean_transfer_ms() const {
  return transfers_ > 0 ? transfer_ms_ / static_cast<double>(transfers_) : 0.0;
}

void PipelineExecutor::finish_send(std::shared_ptr<comm::Work>& w) {
  if (!w) return;
  w->wait();
  // From the send's issue (the sending operation's end) to the receiver
  // having it: the communication threads' wake-ups and the copy, the
  // receives being posted early. The mean: the simulator adds one per
  // crossing, and the rare slow wake-up is part of what the ranks wait.
  if (timing_) {
    transfer_ms_ += std::chrono::duration<double, std::milli>(w->finished_at() - w->queued_at()).count();
    ++transfers_;
  }
  w.reset();
}

void PipelineExecutor::time_op(const PipeAction& a, double busy_ms, double wait_ms) {
  if (!timing_) return;
  const size_t at = static_cast<size_t>(a.kind * chunks() + a.chunk);
  op_ms_[at] += busy_ms;
  op_count_[at] += 1.0;
  busy_ms_ += busy_ms;
  waited_ms_ += wait_ms;
}

double PipelineExecutor::run(int64_t step, StepBreakdown& t, Timeline* tl) {
  if (first_step_ < 0) first_step_ = step;
  timing_ = step > first_step_;  // the first step allocates and records: not counted
  if (holds_head() && model_.tied()) tied_g_.zero();
  tied_send_.reset();
  std::fill(have_batch_.begin(), have_batch_.end(), 0);
  for (auto& r : recvs_) r.reset();
  double loss = 0.0;
  for (size_t k = 0; k < ops_.size(); ++k) {
    switch (ops_[k].kind) {
      case PipeAction::F: loss += forward_op(k, step, t, tl); break;
      case PipeAction::B:
      case PipeAction::BW: backward_op(k, step, t, tl); break;
      case PipeAction::W: weights_op(k, step, t, tl); break;
    }
  }
  // The wait for the last transfers and the loss: the end of the bubble
  // (the head's rank is done long before rank 0's last backward).
  const auto tw = Clock::now();
  for (auto& w : sends_) finish_send(w);
  wait(tied_send_);
  // The loss is the head's rank's; every rank reports it.
  double mean = loss / static_cast<double>(program_.micro_batches);
  groups_.pp().broadcast(&mean, 2, DType::F32, head_rank_);  // a double as two floats' bytes
  const auto tend = Clock::now();
  t.comm_wait_ms += ms(tw, tend);
  if (timing_) waited_ms_ += ms(tw, tend);
  if (tl) tl->add(Timeline::CommWait, step, tw, tend);
  return mean;
}

double PipelineExecutor::grad_norm_squared() {
  // Each stage's sum over its data-parallel group and its TP group (where
  // the replicated tensors count once), then over the stages in stage order
  // (a gather of doubles, summed the same way on every rank).
  std::vector<double> all(static_cast<size_t>(mesh_.pp), 0.0);
  double stage = strategy_.grad_norm_squared();
  if (comm::ProcessGroup* tp = groups_.tp()) {
    tp->set_phase("optimizer");
    stage = sum_in_rank_order(*tp, stage, norm_parts_);
  }
  all[static_cast<size_t>(mesh_.pp_rank)] = stage;
  groups_.pp().set_phase("optimizer");
  groups_.pp().all_gather(all.data(), all.size() * 2, DType::F32);
  double sum = 0.0;
  for (double v : all) sum += v;
  return sum;
}

nlohmann::json PipelineExecutor::detail() {
  constexpr size_t kFields = 5;
  const auto s = static_cast<size_t>(me());
  std::vector<double> all(kFields * static_cast<size_t>(mesh_.pp), 0.0);
  all[kFields * s] = static_cast<double>(model_.param_count());
  all[kFields * s + 1] = static_cast<double>(model_.arenas_held());
  all[kFields * s + 2] = static_cast<double>(model_.arena_bytes_held());
  all[kFields * s + 3] = static_cast<double>(model_.activation_bytes_for(batches_[0].B));
  all[kFields * s + 4] = static_cast<double>(holds_head() && !first() ? tied_w_.bytes() + tied_g_.bytes() : 0);
  groups_.pp().all_gather(all.data(), all.size() * 2, DType::F32);
  nlohmann::json stages = nlohmann::json::array();
  for (size_t k = 0; k < static_cast<size_t>(mesh_.pp); ++k) {
    const DecoderStage& st = options_.stages[k];
    nlohmann::json chunks = nlohmann::json::array();
    for (const BlockRange& r : st.chunks) chunks.push_back({r.first, r.last - 1});
    stages.push_back({{"first_block", st.chunks.front().first}, {"last_block", st.chunks.back().last - 1},
                      {"chunks", chunks}, {"embedding", st.embed}, {"head", st.head},
                      {"params", static_cast<int64_t>(all[kFields * k])},
                      {"arenas", static_cast<int64_t>(all[kFields * k + 1])},
                      {"activation_bytes", static_cast<int64_t>(all[kFields * k + 2])},
                      {"arena_bytes", static_cast<int64_t>(all[kFields * k + 3])},
                      {"tied_copy_bytes", static_cast<int64_t>(all[kFields * k + 4])}});
  }
  // The operations' costs (each chunk's, measured on its rank) and each
  // rank's idle fraction, gathered over the PP group.
  const size_t K = op_ms_.size(), per = 2 * K + 3, P = static_cast<size_t>(mesh_.pp);
  std::vector<double> times(per * P, 0.0);
  std::copy(op_ms_.begin(), op_ms_.end(), times.begin() + static_cast<std::ptrdiff_t>(per * s));
  std::copy(op_count_.begin(), op_count_.end(), times.begin() + static_cast<std::ptrdiff_t>(per * s + K));
  times[per * s + 2 * K] = waited_ms_;
  times[per * s + 2 * K + 1] = busy_ms_;
  times[per * s + 2 * K + 2] = mean_transfer_ms();
  groups_.pp().all_gather(times.data(), times.size() * 2, DType::F32);
  std::vector<double> sum(K, 0.0), count(K, 0.0);
  for (size_t r = 0; r < P; ++r)
    for (size_t k = 0; k < K; ++k) sum[k] += times[per * r + k], count[k] += times[per * r + K + k];
  const auto S = static_cast<size_t>(chunks());
  auto mean = [&](int kind, size_t chunk_or_all) {  // chunk_or_all == S: over every chunk
    double t = 0.0, n = 0.0;
    for (size_t c = 0; c < S; ++c)
      if (chunk_or_all == S || c == chunk_or_all) t += sum[kind * S + c], n += count[kind * S + c];
    return n > 0 ? t / n : 0.0;
  };
  nlohmann::json op_ms = {{"F", mean(PipeAction::F, S)}, {"B", mean(PipeAction::B, S)},
                          {"W", mean(PipeAction::W, S)}, {"BW", mean(PipeAction::BW, S)}};
  // Each chunk's own costs for the simulator (a BW's split evenly: it only adds B and W).
  PipeCosts costs;
  for (size_t r = 0; r < P; ++r)  // the slowest link's
    costs.transfer = std::max(costs.transfer, times[per * r + 2 * K + 2]);
  const bool split = pipe_splits_backward(program_);
  for (size_t c = 0; c < S; ++c) {
    const double bw = mean(PipeAction::BW, c);
    costs.chunk.push_back({mean(PipeAction::F, c), split ? mean(PipeAction::B, c) : bw / 2,
                           split ? mean(PipeAction::W, c) : bw / 2});
  }
  const bool timed = mean(PipeAction::F, S) > 0.0;
  const PipeSimulation sim = timed ? simulate_pipe_program(program_, costs) : PipeSimulation{};
  for (size_t k = 0; k < P; ++k) {
    const double waited = times[per * k + 2 * K], busy = times[per * k + 2 * K + 1];
    stages[k]["idle_measured"] = busy + waited > 0 ? waited / (busy + waited) : 0.0;
    stages[k]["idle_predicted"] = timed ? sim.idle[k] : 0.0;
  }
  const int M = program_.micro_batches;
  return {{"pp", mesh_.pp}, {"dp", mesh_.dp}, {"tp", mesh_.tp}, {"schedule", program_.schedule},
          {"virtual_stages", program_.v}, {"micro_batches", M},
          {"bubble_formula", pipe_bubble_of(program_)}, {"op_ms", op_ms}, {"chunk_op_ms", costs.chunk},
          {"transfer_ms", costs.transfer},
          {"stages", stages}};
}

void PipelineExecutor::after_step() {
  groups_.pp().set_phase("optimizer");  // the ledger counts wte's new values there
  sync_tied_weights();
}

void PipelineExecutor::save(const std::string& path, const SaveOptions& options) {
  // Every rank's parameters gathered to rank 0 (train/pipeline_gather.h),
  // which writes the whole model (it holds all of it for the while: a
  // decoder that needs a pipeline to train still fits one rank's memory as
  // weights alone).
  const bool writer = me() == 0 && mesh_.dp_rank == 0 && mesh_.tp_rank == 0;
  const Decoder whole(model_.config());
  std::vector<float> all(writer ? whole.param_count() : 0);
  gather_pipeline_weights(mesh_, groups_, model_, strategy_, options_.stages, writer ? all.data() : nullptr);
  if (!writer) return;
  WeightWriter file(path, whole, options);
  for (size_t u = 0; u < whole.layout().units().size(); ++u)
    file.write_unit(static_cast<int>(u), all.data() + whole.layout().units()[u].offset);
  file.commit();
}

}  // namespace dpt
