#include "train/resume.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder.h"
#include "train/stop_signal.h"

namespace dpt {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// A float as the user wrote it (0.9, not 0.8999999761581421).
json number(float f) { return json::parse(fmt::format("{}", f)); }

// The settings that decide a run's numbers, kept in its checkpoints: a run
// resumed with other values continues, but is told it is not the same run.
json run_settings(const TrainOptions& o) {
  const OptimizerConfig& opt = o.optimizer;
  const Schedule& s = o.schedule;
  return {{"model", o.model},
          {"data", o.data},
          {"synthetic", o.synthetic},
          {"batch", o.batch},
          {"grad_accum", o.grad_accum},
          {"precision", precision_name(o.precision)},
          {"reduce_dtype", precision_name(o.ddp.reduce_dtype)},
          {"seed", o.seed},
          {"clip", number(o.clip)},
          {"val_fraction", o.val_fraction},
          {"sampler_tail", o.sampler_tail},
          {"optimizer", {{"name", opt.name}, {"momentum", number(opt.momentum)}, {"beta1", number(opt.beta1)},
                         {"beta2", number(opt.beta2)}, {"eps", number(opt.eps)},
                         {"weight_decay", number(opt.weight_decay)}}},
          {"schedule", {{"kind", s.kind}, {"lr", number(s.lr)}, {"min_lr", number(s.min_lr)}, {"warmup", s.warmup},
                        {"total_steps", s.total_steps}}}};
}

// "batch: 16 in the checkpoint, 32 now" for every setting that differs.
std::vector<std::string> changed_settings(const json& saved, const json& now, const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const auto& [k, v] : now.items()) {
    const std::string name = prefix + k;
    if (!saved.contains(k)) {
      out.push_back(fmt::format("{}: not in the checkpoint, {} now", name, v.dump()));
    } else if (v.is_object() && saved[k].is_object()) {
      auto inner = changed_settings(saved[k], v, name + ".");
      out.insert(out.end(), inner.begin(), inner.end());
    } else if (saved[k] != v) {
      out.push_back(fmt::format("{}: {} in the checkpoint, {} now", name, saved[k].dump(), v.dump()));
    }
  }
  return out;
}

// Every rank stops at the same step: the first signal any rank got.
int agreed_signal(comm::ProcessGroup& pg) {
  float sig = static_cast<float>(StopSignals::received());
  if (pg.size() > 1) pg.all_reduce(&sig, 1, DType::F32, comm::ReduceOp::Max);
  return static_cast<int>(sig);
}

}  // namespace

CheckpointInfo checkpoint_info(const TrainOptions& o, const Model& model, const DataSource& data, int64_t step) {
  CheckpointInfo info;
  info.step = step;
  info.model = model.metadata();
  info.optimizer = o.optimizer.name;
  info.settings = run_settings(o);
  info.data = data.position();
  info.data["samples"] = step * o.batch;
  info.strategy = o.strategy.name();
  return info;
}

int64_t resume_from(const std::string& path, const CheckpointInfo& saved, const TrainOptions& o, Model& model,
                    Strategy& strategy, DataSource& data, comm::ProcessGroup& pg, int64_t steps, TrainResult& r) {
  if (saved.step >= steps)
    throw InputError(fmt::format("{}: the checkpoint is at step {}, and this run has {} steps: nothing to resume",
                                 path, saved.step, steps));
  const auto t0 = Clock::now();
  r.resume_bytes = load_checkpoint(path, saved, strategy, model, pg);
  r.resume_s = std::chrono::duration<double>(Clock::now() - t0).count();
  data.skip_steps(saved.step, o.batch, o.grad_accum);
  if (pg.rank() == 0 && !o.quiet) {
    std::printf("resuming %s at step %lld (written by %s on %d rank%s; %.1f MiB read in %.2f s)\n", path.c_str(),
                static_cast<long long>(saved.step), saved.strategy.c_str(), saved.world, saved.world == 1 ? "" : "s",
                static_cast<double>(r.resume_bytes) / (1 << 20), r.resume_s);
    for (const std::string& c : changed_settings(saved.settings, run_settings(o)))
      std::printf("note: %s; the run continues, but not as the run that wrote the checkpoint\n", c.c_str());
  }
  return saved.step;
}

std::string checkpoint_now(const TrainOptions& o, const Model& model, Strategy& strategy, const DataSource& data,
                           comm::ProcessGroup& pg, int64_t done, TrainResult& r) {
  const auto t0 = Clock::now();
  // A pipeline stage's ranks write its pieces; the manifest lists the whole model.
  std::optional<Decoder> whole;
  if (o.pp > 1) whole.emplace(dynamic_cast<const Decoder&>(model).config());
  const WrittenCheckpoint written =
      write_checkpoint(o.checkpoint_dir, checkpoint_info(o, model, data, done), strategy, model, pg, o.keep,
                       o.tp == 1 || pg.rank() % o.tp == 0,  // TP rank 0 writes the replicated tensors
                       whole ? &*whole : nullptr);
  ++r.checkpoints;
  r.checkpoint_s += std::chrono::duration<double>(Clock::now() - t0).count();
  r.checkpoint_bytes += written.bytes;
  return written.path;
}

std::optional<std::string> checkpoint_or_stop(const TrainOptions& o, const Model& model, Strategy& strategy,
                                              const DataSource& data, comm::ProcessGroup& pg, int64_t done,
                                              int64_t steps, TrainResult& r) {
  r.stopped_by = agreed_signal(pg);
  const bool due = o.checkpoint_every > 0 && done % o.checkpoint_every == 0 && done < steps;
  if (!r.stopped_by && !due) return std::nullopt;
  std::string path = checkpoint_now(o, model, strategy, data, pg, done, r);
  if (!r.stopped_by) return std::nullopt;
  return path;
}

}  // namespace dpt
