#include "train/pipeline_executor.h"

#include <chrono>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fault.h"
#include "models/weights.h"
#include "parallel/tensor_parallel.h"
#include "train/data_source.h"
#include "core/timeline.h"
#include "train/train.h"

namespace dpt {

using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void wait(std::shared_ptr<comm::Work>& w) {
  if (w) w->wait();
  w.reset();
}

}  // namespace

std::vector<DecoderStage> gpt_stages(const DecoderConfig& c, int pp, const std::string& split) {
  const int64_t C = c.width, V = c.rows();
  // Parameters held: the embedding (and learned positions) on the first
  // stage, the final norm and the head (or the head's copy of the tied
  // embedding) on the last.
  const int64_t norm = c.norm == NormKind::LayerNorm ? 2 * C : C;
  const std::vector<int64_t> counts =
      pipe_split(split, pp, c.layers, V * C + (c.rotary ? 0 : c.context * C), c.block_params(), V * C + norm);
  std::vector<DecoderStage> stages;
  int64_t first = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    stages.push_back({first, first + counts[s], s == 0, s + 1 == counts.size()});
    first += counts[s];
  }
  return stages;
}

PipelineExecutor::PipelineExecutor(const Mesh& mesh, MeshGroups& groups, Decoder& model, Strategy& strategy,
                                   DataSource& data, float loss_scale, PipelineOptions options)
    : mesh_(mesh), groups_(groups), model_(model), strategy_(strategy), data_(data), loss_scale_(loss_scale),
      options_(std::move(options)) {
  const int M = options_.micro_batches;
  ops_ = pipe_ops(options_.schedule, mesh_.pp, mesh_.pp_rank, M);
  slots_ = pipe_slots(options_.schedule, mesh_.pp, mesh_.pp_rank, M);
  sends_.resize(static_cast<size_t>(slots_));
  // The head's copy of wte is in the compute type: the head's GEMM reads
  // it as one process reads its own compute copy of wte.
  const DType compute = model_.precision();
  // An untied head is the last stage's own parameter: nothing to share.
  if (last() && model_.tied()) {
    tied_w_ = FlatBuffer(wte_numel(), compute);
    tied_g_ = FlatBuffer(wte_numel());
    model_.set_tied_head(tied_w_.f32(), tied_g_.f32());
  }
  if (first() && model_.tied()) {
    tied_g_ = FlatBuffer(wte_numel());
    embed_unit_ = FlatBuffer(model_.layout().units()[0].numel);
    if (compute != DType::F32) tied_w_ = FlatBuffer(wte_numel(), compute);
  }
  sync_tied_weights();
  eval_forward_ = [this](const Batch& b) {
    // One batch at a time, in slot 0 (between steps every arena is free).
    model_.use_slot(0);
    const size_t n = static_cast<size_t>(b.B * b.T * model_.config().width);
    if (!first()) {
      model_.prepare(b.B, b.T);
      groups_.activations().recv(model_.stage_input(), n, DType::F32, mesh_.pp_rank - 1);
    }
    const ForwardStats st = model_.forward(b);
    if (!last()) groups_.activations().send(model_.stage_output(), n, DType::F32, mesh_.pp_rank + 1);
    return st;
  };
}

size_t pipeline_buffer_bytes(const Decoder& stage, int pp, int s) {
  if (pp == 1 || !stage.tied()) return 0;
  const size_t wte = static_cast<size_t>(stage.wte_rows() * stage.config().width);
  const size_t copy = dtype_size(stage.precision()) * wte;
  if (s == 0)
    return sizeof(float) * (wte + stage.layout().units()[0].numel) + (stage.precision() == DType::F32 ? 0 : copy);
  return s + 1 == pp ? sizeof(float) * wte + copy : 0;
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
    groups_.pp().send(values, wte_numel(), compute, mesh_.pp - 1);
  } else if (last()) {
    groups_.pp().recv(tied_w_.f32(), wte_numel(), compute, 0);
  }
}

void PipelineExecutor::set_phase(const char* phase) {
  for (auto* g : {&groups_.activations(), &groups_.gradients(), &groups_.pp(), &groups_.dp(), &groups_.world(),
                  groups_.tp()})
    if (g) g->set_phase(phase);
}

double PipelineExecutor::forward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl) {
  const PipeOp& op = ops_[k];
  const int slot = pipe_slot(op.micro, slots_), s = mesh_.pp_rank;
  const auto td = Clock::now();
  data_.next(batch_);  // every stage reads the replica's batch: the first its tokens, the last its targets
  const auto tf = Clock::now();
  const size_t n = activation_elements();
  // (Not this forward's own backward: its arena is laid out by the forward.)
  if (!last() && k + 1 < ops_.size() && !ops_[k + 1].forward && ops_[k + 1].micro != op.micro) {
    grad_recv_micro_ = ops_[k + 1].micro;
    model_.use_slot(pipe_slot(grad_recv_micro_, slots_));
    grad_recv_ = groups_.gradients().recv_async(model_.output_grad(), n, DType::F32, s + 1);
    model_.use_slot(slot);
  }
  set_phase("forward");
  fault_point("forward", step + 1, groups_.world().rank());
  if (!first()) {
    model_.prepare(batch_.B, batch_.T);
    groups_.activations().recv(model_.stage_input(), n, DType::F32, s - 1);
  }
  const auto tc = Clock::now();  // waits before it are the bubble (and the transfer)
  const double loss = model_.forward(batch_).loss;
  if (!last())
    sends_[static_cast<size_t>(slot)] = groups_.activations().send_async(model_.stage_output(), n, DType::F32, s + 1);
  const auto te = Clock::now();
  t.data_ms += ms(td, tf);
  t.comm_wait_ms += ms(tf, tc);
  t.forward_ms += ms(tc, te);
  if (tl) {
    if (!first()) tl->add(Timeline::CommWait, step, op.micro, 0, tf, tc);
    tl->add(Timeline::Forward, step, op.micro, 0, tc, te);
  }
  return loss;
}

void PipelineExecutor::backward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl) {
  const PipeOp& op = ops_[k];
  const int slot = pipe_slot(op.micro, slots_), s = mesh_.pp_rank;
  const auto tb = Clock::now();
  const bool final = op.micro == options_.micro_batches - 1;
  const size_t n = activation_elements();
  set_phase("backward");
  fault_point("backward", step + 1, groups_.world().rank());
  strategy_.begin_micro_step(final);  // the reductions start in the last backward
  if (grad_recv_micro_ == op.micro)
    wait(grad_recv_);
  else if (!last())
    groups_.gradients().recv(model_.output_grad(), n, DType::F32, s + 1);
  // The head's part of wte's gradient, before the embedding's backward of
  // the step's last micro-batch (the last stage sent it after its own last
  // backward).
  if (first() && final && model_.tied()) {
    groups_.pp().recv(tied_g_.f32(), wte_numel(), DType::F32, mesh_.pp - 1);
    model_.set_tied_grad_in(tied_g_.f32());
  }
  const auto tc = Clock::now();
  model_.backward(loss_scale_);
  model_.set_tied_grad_in(nullptr);
  if (!first())
    sends_[static_cast<size_t>(slot)] = groups_.gradients().send_async(model_.input_grad(), n, DType::F32, s - 1);
  if (last() && final && model_.tied()) tied_send_ = groups_.pp().send_async(tied_g_.f32(), wte_numel(), DType::F32, 0);
  const auto te = Clock::now();
  t.comm_wait_ms += ms(tb, tc);
  t.backward_ms += ms(tc, te);
  if (tl) {
    if (!last() || (first() && final)) tl->add(Timeline::CommWait, step, op.micro, 0, tb, tc);
    tl->add(Timeline::Backward, step, op.micro, 0, tc, te);
  }
}

double PipelineExecutor::run(int64_t step, StepBreakdown& t, Timeline* tl) {
  if (last() && model_.tied()) tied_g_.zero();
  tied_send_.reset();
  grad_recv_.reset();
  grad_recv_micro_ = -1;
  double loss = 0.0;
  for (size_t k = 0; k < ops_.size(); ++k) {
    const int slot = pipe_slot(ops_[k].micro, slots_);
    model_.use_slot(slot);
    wait(sends_[static_cast<size_t>(slot)]);  // the slot's arena is about to be rewritten
    if (ops_[k].forward)
      loss += forward_op(k, step, t, tl);
    else
      backward_op(k, step, t, tl);
  }
  // The wait for the last transfers and the loss: the end of the bubble
  // (the last stage is done long before the first one's last backward).
  const auto tw = Clock::now();
  for (auto& w : sends_) wait(w);
  wait(tied_send_);
  // The loss is the last stage's; every stage reports it.
  double mean = loss / static_cast<double>(options_.micro_batches);
  groups_.pp().broadcast(&mean, 2, DType::F32, mesh_.pp - 1);  // a double as two floats' bytes
  const auto tend = Clock::now();
  t.comm_wait_ms += ms(tw, tend);
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
  const auto s = static_cast<size_t>(mesh_.pp_rank);
  std::vector<double> all(kFields * static_cast<size_t>(mesh_.pp), 0.0);
  all[kFields * s] = static_cast<double>(model_.param_count());
  all[kFields * s + 1] = static_cast<double>(model_.arenas_held());
  all[kFields * s + 2] = static_cast<double>(model_.arena_bytes_held());
  all[kFields * s + 3] = static_cast<double>(model_.activation_bytes_for(batch_.B));
  all[kFields * s + 4] = static_cast<double>(last() ? tied_w_.bytes() + tied_g_.bytes() : 0);
  groups_.pp().all_gather(all.data(), all.size() * 2, DType::F32);
  nlohmann::json stages = nlohmann::json::array();
  for (size_t k = 0; k < static_cast<size_t>(mesh_.pp); ++k) {
    const DecoderStage& st = options_.stages[k];
    stages.push_back({{"first_block", st.first}, {"last_block", st.last - 1}, {"embedding", st.embed},
                      {"head", st.head}, {"params", static_cast<int64_t>(all[kFields * k])},
                      {"arenas", static_cast<int64_t>(all[kFields * k + 1])},
                      {"activation_bytes", static_cast<int64_t>(all[kFields * k + 2])},
                      {"arena_bytes", static_cast<int64_t>(all[kFields * k + 3])},
                      {"tied_copy_bytes", static_cast<int64_t>(all[kFields * k + 4])}});
  }
  return {{"pp", mesh_.pp}, {"dp", mesh_.dp}, {"tp", mesh_.tp}, {"schedule", pipe_schedule_name(options_.schedule)},
          {"micro_batches", options_.micro_batches}, {"bubble_formula", pipe_bubble(mesh_.pp, options_.micro_batches)},
          {"stages", stages}};
}

void PipelineExecutor::after_step() {
  groups_.pp().set_phase("optimizer");  // the ledger counts wte's new values there
  sync_tied_weights();
}

void PipelineExecutor::save(const std::string& path, const SaveOptions& options) {
  // Each stage's parameters gathered over its data-parallel group (and its
  // slices over its TP group); replica 0's stages (their TP rank 0) send
  // theirs to the first, which writes the whole model (it holds all of it
  // for the while: a GPT that needs a pipeline to train still fits one
  // rank's memory as weights alone).
  const Decoder held = stage_model(mesh_.pp_rank);  // the stage, its tensors whole
  FlatBuffer mine(held.param_count());
  comm::ProcessGroup* tp = groups_.tp();
  FlatBuffer unit(tp ? model_.param_count() : 0), scratch;
  for (size_t u = 0; u < model_.layout().units().size(); ++u) {
    float* whole_unit = mine.f32() + held.layout().units()[u].offset;
    if (!tp) {
      strategy_.gather_unit(static_cast<int>(u), whole_unit);
      continue;
    }
    strategy_.gather_unit(static_cast<int>(u), unit.f32());
    if (mesh_.dp_rank == 0) gather_slices(model_, held, *tp, static_cast<int>(u), unit.f32(), whole_unit, scratch);
  }
  if (mesh_.dp_rank != 0 || mesh_.tp_rank != 0) return;
  comm::ProcessGroup& pp = groups_.pp();
  if (!first()) {
    pp.send(mine.f32(), held.param_count(), DType::F32, 0);
    return;
  }
  const Decoder whole(model_.config());
  std::vector<float> all(whole.param_count());
  auto place = [&](const Layout& stage, const float* values) {
    for (const Slot& slot : stage.slots())
      std::copy(values + slot.offset, values + slot.offset + slot.numel,
                all.begin() + static_cast<long>(whole.layout().slot(whole.layout().find(slot.name)).offset));
  };
  place(held.layout(), mine.f32());
  for (int s = 1; s < mesh_.pp; ++s) {
    const Decoder stage = stage_model(s);
    FlatBuffer theirs(stage.param_count());
    pp.recv(theirs.f32(), stage.param_count(), DType::F32, s);
    place(stage.layout(), theirs.f32());
  }
  WeightWriter file(path, whole, options);
  for (size_t u = 0; u < whole.layout().units().size(); ++u)
    file.write_unit(static_cast<int>(u), all.data() + whole.layout().units()[u].offset);
  file.commit();
}

}  // namespace dpt
