#include <cstdio>

#include "core/error.h"
#include "core/threads.h"
#include "data/byte_corpus.h"
#include "data/fashion_mnist.h"
#include "data/file_kind.h"
#include "data/shard_sampler.h"
#include "data/token_shards.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "train/evaluate.h"

namespace dpt {

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
    ImageSet test = load_fashion_mnist(data_.empty() ? kFashionMnistDir : data_, "test");
    EvalResult r = evaluate_images(*model, test, batch_ > 0 ? batch_ : 1000);
    std::printf("loss %.4f accuracy %.2f%% (%lld images)\n", r.loss(), 100.0 * r.accuracy(),
                static_cast<long long>(r.count));
    return 0;
  }
  const std::string path = data_.empty() ? kFortunesDir : data_;
  const TokenFormat format = resolve_format(path, parse_token_format(format_), data_format_flags());
  if (format != TokenFormat::Bytes) {
    // Every window of context+1 tokens at multiples of the context, once.
    const TokenShards shards(path, format, dynamic_cast<const Decoder&>(*model).config().vocab);
    const ShardWindows windows(shards, model->positions());
    if (windows.size() == 0)
      throw InputError(fmt::format("{}: no shard holds one window of {} tokens", path, model->positions() + 1));
    EvalResult r = evaluate_windows(*model, windows, batch_ > 0 ? batch_ : 16, 0);
    std::printf("loss %.6f (%lld positions)\n", r.loss(), static_cast<long long>(r.count));
  } else {
    // The whole file: every non-overlapping window of context+1 bytes.
    ByteCorpus text = ByteCorpus::load(path, 0.0,
                                       static_cast<size_t>(model->positions() + 1));
    EvalResult r = evaluate_text(*model, text.train(), text.train_size(), batch_ > 0 ? batch_ : 16, 0);
    std::printf("loss %.6f (%lld positions)\n", r.loss(), static_cast<long long>(r.count));
  }
  return 0;
}

}  // namespace dpt
