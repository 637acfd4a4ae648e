#include "train/train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/gemm_peak.h"
#include "core/memory.h"
#include "core/threads.h"
#include "data/batches.h"
#include "data/byte_corpus.h"
#include "data/fashion_mnist.h"
#include "io/atomic_file.h"
#include "models/mlp.h"
#include "models/weights.h"
#include "train/evaluate.h"
#include "train/progress.h"

namespace dpt {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void apply_defaults(TrainOptions& o) {
  const bool mlp = o.model == "mlp";
  if (o.model != "mlp" && o.model != "gpt")
    throw InputError(fmt::format("unknown model '{}' (expected mlp or gpt)", o.model));
  if (o.batch == 0) o.batch = mlp ? 256 : 16;
  if (o.optimizer.name.empty()) o.optimizer.name = mlp ? "sgd" : "adamw";
  if (o.schedule.lr <= 0.0f) o.schedule.lr = o.optimizer.name == "sgd" ? 0.05f : 3e-4f;
  if (o.optimizer.weight_decay < 0.0f) o.optimizer.weight_decay = o.optimizer.name == "adamw" ? 0.1f : 0.0f;
  if (o.batch < 1) throw InputError(fmt::format("batch size {} must be positive", o.batch));
  if (o.grad_accum < 1 || o.batch % o.grad_accum != 0)
    throw InputError(fmt::format("batch {} does not split into {} equal micro-batches", o.batch,
                                 o.grad_accum));
  if (o.steps < 0) throw InputError(fmt::format("steps {} must not be negative", o.steps));
  if (o.log_every < 1) o.log_every = 1;
}

namespace {

// Where batches come from: the dataset of the model, or synthetic ones.
struct DataSource {
  std::optional<ImageSet> train_images, test_images;
  std::optional<ByteCorpus> corpus;
  std::unique_ptr<ImageEpochs> epochs;
  std::unique_ptr<WindowSampler> windows;
  Batch synthetic;
  bool is_synthetic = false;

  void next(Batch& b, int64_t micro) {
    if (is_synthetic) {
      b = synthetic;  // same sizes every step: copying reuses b's storage
    } else if (epochs) {
      epochs->next(b);
    } else {
      windows->next(b, micro);
    }
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

TrainResult run_training(TrainOptions o) {
  apply_defaults(o);
  std::map<std::string, std::string> hp = o.hparams;
  hp["dpt.model"] = o.model;
  std::unique_ptr<Model> model;
  if (!o.load.empty()) {
    model = model_from_file(o.load, hp);
  } else {
    model = make_model(hp);
    model->init_params(o.seed);
  }
  const bool mlp = o.model == "mlp";
  const int64_t micro = o.batch / o.grad_accum;

  DataSource data;
  data.is_synthetic = o.synthetic;
  if (o.synthetic) {
    fill_synthetic(*model, micro, o.seed, data.synthetic);
  } else if (mlp) {
    std::string dir = o.data.empty() ? kFashionMnistDir : o.data;
    data.train_images = load_fashion_mnist(dir, "train");
    data.test_images = load_fashion_mnist(dir, "test");
    const int64_t pixels = static_cast<int64_t>(data.train_images->rows) * data.train_images->cols;
    const int64_t inputs = dynamic_cast<const Mlp&>(*model).config().sizes.front();
    if (inputs != pixels)
      throw InputError(fmt::format("the MLP takes {} inputs but the images have {} pixels", inputs, pixels));
    data.epochs = std::make_unique<ImageEpochs>(*data.train_images, micro, o.seed);
  } else {
    std::string path = o.data.empty() ? kFortunesDir : o.data;
    const int64_t T = model->positions();
    data.corpus = ByteCorpus::load(path, o.val_fraction, static_cast<size_t>(T + 1));
    data.windows = std::make_unique<WindowSampler>(data.corpus->train(), data.corpus->train_size(), T,
                                                   o.seed);
  }
  int64_t steps = o.steps;
  if (steps == 0) steps = (mlp && data.epochs) ? o.epochs * data.epochs->steps_per_epoch() / o.grad_accum
                                               : (mlp ? 702 : 200);
  o.schedule.total_steps = steps;

  auto opt = make_optimizer(o.optimizer, model->layout(), 0, model->param_count());

  auto evaluate = [&]() -> std::optional<EvalResult> {
    if (o.synthetic) return std::nullopt;
    if (mlp) return evaluate_images(*model, *data.test_images, 1000);
    return evaluate_text(*model, data.corpus->val(), data.corpus->val_size(), o.batch, o.eval_windows);
  };

  std::unique_ptr<AtomicFile> metrics;
  if (!o.metrics_out.empty()) metrics = std::make_unique<AtomicFile>(o.metrics_out);
  Progress progress(steps, o.quiet, mlp ? "samples/s" : "tokens/s");
  if (!o.quiet)
    std::printf("dpt train: %s, %zu parameters, %s, batch %lld%s, %lld steps, %d thread%s\n",
                o.model.c_str(), model->param_count(), o.optimizer.name.c_str(),
                static_cast<long long>(o.batch),
                o.grad_accum > 1 ? fmt::format(" ({} x {})", o.grad_accum, micro).c_str() : "",
                static_cast<long long>(steps), threads(), threads() == 1 ? "" : "s");

  TrainResult r;
  Batch batch;
  std::vector<double> step_ms;
  step_ms.reserve(static_cast<size_t>(steps));
  const double per_step = static_cast<double>(o.batch * (mlp ? 1 : model->positions()));
  auto run_start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    auto t0 = Clock::now();
    model->zero_grads();
    double loss = 0.0;
    for (int64_t k = 0; k < o.grad_accum; ++k) {
      data.next(batch, micro);
      loss += model->forward(batch).loss;
      model->backward(1.0f / static_cast<float>(o.grad_accum));
    }
    loss /= static_cast<double>(o.grad_accum);
    // The global gradient norm is needed to clip, and logged; it costs a
    // pass over the gradients, so it is skipped on other steps.
    const bool log_step = (step + 1) % o.log_every == 0 || step + 1 == steps;
    double grad_norm = 0.0;
    if (o.clip > 0.0f || log_step) grad_norm = std::sqrt(sum_of_squares(model->grads(), model->param_count()));
    if (o.clip > 0.0f) scale(model->grads(), model->param_count(), clip_factor(grad_norm, o.clip));
    const float lr = o.schedule.at(step);
    opt->step(model->params(), model->grads(), lr);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    step_ms.push_back(ms);
    if (step == 0) r.first_loss = loss;
    r.final_loss = loss;
    if (!std::isfinite(loss))
      throw InputError(fmt::format("training diverged: loss is {} at step {}", loss, step));

    std::optional<EvalResult> ev;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < steps) ev = evaluate();
    if (log_step || ev) {
      double rate = per_step * 1000.0 / ms;
      progress.update(step + 1, loss, rate);
      if (ev) progress.line(mlp ? fmt::format("step {}: test loss {:.4f}, accuracy {:.2f}%", step + 1,
                                              ev->loss, 100.0 * ev->accuracy)
                                : fmt::format("step {}: validation loss {:.4f}", step + 1, ev->loss));
      if (metrics) {
        json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                  {"step_ms", ms}, {mlp ? "samples_per_s" : "tokens_per_s", rate}};
        if (ev) {
          j[mlp ? "test_loss" : "val_loss"] = ev->loss;
          if (mlp) j["test_accuracy"] = ev->accuracy;
        }
        metrics->write(j.dump() + "\n");
        metrics->flush();
      }
    }
  }
  progress.finish();
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  r.steps = steps;

  // Steady state: skip the first 20 steps (warm-up of caches and allocator)
  // when there are enough steps, else just the first.
  size_t skip = step_ms.size() > 40 ? 20 : (step_ms.size() > 1 ? 1 : 0);
  r.step_ms_median = median(std::vector<double>(step_ms.begin() + static_cast<long>(skip), step_ms.end()));
  if (r.step_ms_median > 0) {
    r.samples_per_s = static_cast<double>(o.batch) * 1000.0 / r.step_ms_median;
    if (!mlp) r.tokens_per_s = r.samples_per_s * static_cast<double>(model->positions());
    r.gflops = model->train_flops(o.batch) / (r.step_ms_median * 1e-3) / 1e9;
  }
  r.sgemm_gflops = measure_sgemm_gflops();
  r.mfu = r.sgemm_gflops > 0 ? r.gflops / r.sgemm_gflops : 0.0;

  if (auto ev = evaluate()) {
    r.eval_loss = ev->loss;
    r.eval_accuracy = ev->accuracy;
  }
  if (!o.save.empty()) save_weights(*model, o.save);
  if (metrics) metrics->commit();
  r.peak_rss = peak_rss_bytes();

  const double MB = 1.0 / (1 << 20);
  const size_t param_bytes = model->param_count() * sizeof(float);
  if (!o.quiet) {
    std::printf("done: %lld steps in %.1f s, train loss %.4f -> %.4f", static_cast<long long>(steps),
                total_s, r.first_loss, r.final_loss);
    if (!o.synthetic) {
      if (mlp)
        std::printf(", test accuracy %.2f%% (loss %.4f)", 100.0 * r.eval_accuracy, r.eval_loss);
      else
        std::printf(", validation loss %.4f", r.eval_loss);
    }
    std::printf("\nthroughput: %.0f %s (median step %.2f ms after step %zu), %.1f GFLOP/s = %.0f%% "
                "of measured sgemm peak %.1f GFLOP/s\n",
                mlp ? r.samples_per_s : r.tokens_per_s, mlp ? "samples/s" : "tokens/s",
                r.step_ms_median, skip, r.gflops, 100.0 * r.mfu, r.sgemm_gflops);
    std::printf("memory: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, activations "
                "%.1f MiB, peak RSS %.1f MiB\n",
                param_bytes * MB, param_bytes * MB, opt->state_bytes() * MB,
                model->activation_bytes() * MB, r.peak_rss * MB);
    if (!o.save.empty()) std::printf("saved %s\n", o.save.c_str());
  }
  if (!o.summary_out.empty()) {
    json j = {{"model", o.model}, {"threads", threads()}, {"steps", steps}, {"batch", o.batch},
              {"grad_accum", o.grad_accum}, {"params", model->param_count()},
              {"first_loss", r.first_loss}, {"final_loss", r.final_loss},
              {"step_ms_median", r.step_ms_median}, {"samples_per_s", r.samples_per_s},
              {"gflops", r.gflops}, {"sgemm_gflops", r.sgemm_gflops}, {"mfu", r.mfu},
              {"seconds", total_s}, {"synthetic", o.synthetic},
              {"bytes", {{"parameters", param_bytes}, {"gradients", param_bytes},
                         {"optimizer", opt->state_bytes()}, {"activations", model->activation_bytes()},
                         {"peak_rss", r.peak_rss}}}};
    if (!mlp) j["tokens_per_s"] = r.tokens_per_s;
    if (!o.synthetic) {
      j[mlp ? "test_loss" : "val_loss"] = r.eval_loss;
      if (mlp) j["test_accuracy"] = r.eval_accuracy;
    }
    AtomicFile f(o.summary_out);
    f.write(j.dump(2) + "\n");
    f.commit();
  }
  return r;
}

}  // namespace dpt
