#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "data/batches.h"
#include "data/byte_corpus.h"
#include "data/fashion_mnist.h"
#include "data/file_kind.h"
#include "data/shard_sampler.h"
#include "data/token_shards.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "train/evaluate.h"

namespace dpt {

namespace {

// Makes `batch` hold windows [first, first + n) of the evaluated data.
using FillWindows = std::function<void(int64_t first, int64_t n, Batch& batch)>;

// --logits-out (docs/models.md): the logits of windows [0, windows) of T
// positions, `per_forward` windows a forward, as one float32 tensor
// "logits" [windows x T, vocab] (row w T + t: position t of window w).
void write_logits(const std::string& path, Decoder& model, int64_t windows, int64_t T, int64_t per_forward,
                  const FillWindows& fill, const std::map<std::string, std::string>& metadata) {
  const int64_t V = model.config().vocab;
  SafetensorsWriter out(path, {{"logits", DType::F32, {windows * T, V}}}, metadata);
  Batch b;
  for (int64_t w = 0; w < windows; w += per_forward) {
    fill(w, std::min(per_forward, windows - w), b);
    const std::vector<float> logits = model.logits(b);
    out.write(logits.data(), logits.size());
  }
  out.commit();
}

}  // namespace

EvalCommand::EvalCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("eval", "evaluate saved weights");
  model_.add(cmd_);
  cmd_->add_option("--weights", weights_, "safetensors file to evaluate")->required();
  cmd_->add_option("--data", data_,
                   "mlp: Fashion-MNIST directory (its 10,000 test images); gpt: text, or token shards (file, "
                   "directory or glob)");
  cmd_->add_option("--data-format", format_, "gpt: llmc, u16 or bytes (default: llmc by its magic, else bytes)")
      ->check(CLI::IsMember({"llmc", "u16", "bytes"}));
  cmd_->add_option("--load-format", load_format_, "--weights' layout: dpt or hf (default: told by names and shapes)")
      ->check(CLI::IsMember({"dpt", "hf"}));
  cmd_->add_option("--batch", batch_, "samples per forward pass")->check(positive());
  cmd_->add_option("--threads", threads_, "threads (default: all cores)")->check(non_negative());
  cmd_->add_option("--logits-out", logits_out_,
                   "gpt, llama: also write the logits of every evaluated window, [windows x context, vocab] "
                   "float32, to this safetensors file");
  add_gemm_flag(cmd_, gemm_);
  add_precision_flag(cmd_, precision_);
  add_device_flag(cmd_, device_);
}

int EvalCommand::run() {
  set_gemm_flag(gemm_);
  set_threads(threads_);
  auto model = model_from_file(weights_, model_.hparams(), parse_weight_format(load_format_));
  model->set_precision(parse_precision(precision_));
  model->set_device(parse_device(device_));
  if (model->kind() == "mlp") {
    // As dpt train refuses them (tools/flag_conflicts.cpp): read by nothing here.
    if (!format_.empty())
      throw InputError("--data-format contradicts the mlp model, which is evaluated on Fashion-MNIST's images: it is a "
                       "GPT's flag");
    if (load_format_ == "hf")
      throw InputError("--load-format hf contradicts the mlp model: Hugging Face's layout is the GPT-2 and Llama "
                       "decoders'; the mlp's dpt layout already has PyTorch's nn.Sequential names");
    if (!logits_out_.empty())
      throw InputError("--logits-out writes a gpt or llama model's logits per position, and an mlp has none");
    ImageSet test = load_fashion_mnist(data_.empty() ? kFashionMnistDir : data_, "test");
    EvalResult r = evaluate_images(*model, test, batch_ > 0 ? batch_ : 1000);
    std::printf("loss %.4f accuracy %.2f%% (%lld images)\n", r.loss(), 100.0 * r.accuracy(),
                static_cast<long long>(r.count));
    return 0;
  }
  auto& decoder = dynamic_cast<Decoder&>(*model);
  const std::string path = data_.empty() ? kFortunesDir : data_;
  const TokenFormat format = resolve_format(path, parse_token_format(format_), data_format_flags());
  const int64_t T = model->positions(), per_forward = batch_ > 0 ? batch_ : 16;
  const std::map<std::string, std::string> meta = {
      {"weights", weights_}, {"data", path}, {"context", std::to_string(T)}};
  EvalResult r;
  if (format != TokenFormat::Bytes) {
    // Every window of context+1 tokens at multiples of the context, once.
    const TokenShards shards(path, format, decoder.config().vocab);
    const ShardWindows windows(shards, T);
    if (windows.size() == 0)
      throw InputError(fmt::format("{}: no shard holds one window of {} tokens", path, T + 1));
    const FillWindows fill = [&](int64_t first, int64_t n, Batch& b) {
      b.B = n;
      b.T = T;
      b.tokens.resize(static_cast<size_t>(n * T));
      b.targets.resize(static_cast<size_t>(n * T));
      for (int64_t i = 0; i < n; ++i) windows.fill(first + i, b, i);
    };
    if (!logits_out_.empty()) write_logits(logits_out_, decoder, windows.size(), T, per_forward, fill, meta);
    r = evaluate_windows(*model, windows, per_forward, 0);
  } else {
    // The whole file: every non-overlapping window of context+1 bytes.
    ByteCorpus text = ByteCorpus::load(path, 0.0, static_cast<size_t>(T + 1));
    const FillWindows fill = [&](int64_t first, int64_t n, Batch& b) {
      fill_sequential_windows(text.train(), text.train_size(), T, first, n, b);
    };
    const auto windows = static_cast<int64_t>(text.train_size()) / (T + 1);
    if (!logits_out_.empty() && windows > 0)
      write_logits(logits_out_, decoder, windows, T, per_forward, fill, meta);
    r = evaluate_text(*model, text.train(), text.train_size(), per_forward, 0);
  }
  std::printf("loss %.6f (%lld positions)\n", r.loss(), static_cast<long long>(r.count));
  if (!logits_out_.empty()) std::printf("logits written to %s\n", logits_out_.c_str());
  return 0;
}

}  // namespace dpt
