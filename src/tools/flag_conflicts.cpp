#include "tools/flag_conflicts.h"

#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {
namespace {

// Two flags that cannot both be meant, and why.
struct Conflict {
  const char* a;
  const char* b;
  const char* why;
};

constexpr const char* kNoEval = "a synthetic run is not evaluated";
constexpr const char* kNoBucket = "--per-param all-reduces each tensor alone, in no bucket";

constexpr Conflict kConflicts[] = {
    {"--synthetic", "--data", "--synthetic trains on random batches and reads no data"},
    {"--synthetic", "--val-data", "--synthetic trains on random batches and reads no data"},
    {"--synthetic", "--data-format", "--synthetic trains on random batches and reads no data"},
    {"--synthetic", "--val-fraction", kNoEval},
    {"--synthetic", "--eval-every", kNoEval},
    {"--synthetic", "--eval-windows", kNoEval},
    {"--val-data", "--val-fraction", "--val-data is the held-out set, so no fraction of --data is held out"},
    {"--steps", "--epochs", "--epochs sets the run's length only when --steps is not given"},
    {"--per-param", "--bucket-mb", kNoBucket},
    {"--per-param", "--first-bucket-mb", kNoBucket},
};

bool given(const CLI::App& cmd, const char* flag) {
  const CLI::Option* opt = cmd.get_option_no_throw(flag);
  return opt != nullptr && opt->count() > 0;
}

// Flags that only one model reads, or only one optimizer.
void refuse_unread_flags(const CLI::App& cmd, const TrainOptions& o) {
  const bool mlp = o.model == "mlp";
  if (mlp)
    for (const char* flag : {"--data-format", "--val-data", "--val-fraction", "--eval-windows"})
      if (given(cmd, flag))
        throw InputError(fmt::format("{} contradicts the mlp model, which trains and is evaluated on Fashion-MNIST's "
                                     "images: it is a GPT's flag",
                                     flag));
  if (mlp && o.save_format == "hf")
    throw InputError("--save-format hf contradicts the mlp model: Hugging Face's layout is the GPT-2 and Llama "
                     "decoders'; the mlp's dpt layout already has PyTorch's nn.Sequential names");
  if (!mlp && given(cmd, "--epochs"))
    throw InputError("--epochs contradicts the gpt model: a GPT run's length is --steps (--epochs counts Fashion-MNIST "
                     "epochs)");
  const bool sgd = o.optimizer.name.empty() ? mlp : o.optimizer.name == "sgd";
  if (sgd)
    for (const char* flag : {"--beta1", "--beta2", "--eps"})
      if (given(cmd, flag))
        throw InputError(fmt::format("{} contradicts the sgd optimizer: it is AdamW's; give --optimizer adamw", flag));
  if (!sgd && given(cmd, "--momentum"))
    throw InputError("--momentum contradicts the adamw optimizer: it is SGD's; give --optimizer sgd");
  if (given(cmd, "--min-lr") && o.schedule.kind == "constant")
    throw InputError("--min-lr contradicts the constant schedule, which never decays; give --schedule cosine");
}

// Flags that only --sample-every reads.
void refuse_sample_flags_alone(const CLI::App& cmd) {
  if (given(cmd, "--sample-every")) return;
  for (const char* flag : {"--tokenizer", "--sample-prompt", "--sample-tokens"})
    if (given(cmd, flag))
      throw InputError(fmt::format("{} sets the samples of --sample-every, which is not given (training reads "
                                   "token shards already tokenized: dpt tokens --tokenizer makes them)",
                                   flag));
}

// Flags that only shape what another flag writes: without it they would be
// dropped silently.
struct Dependent {
  const char* flag;
  const char* needs;
  const char* sets;
};

constexpr Dependent kDependents[] = {
    {"--save-format", "--save", "how --save writes the trained weights"},
    {"--save-dtype", "--save", "how --save writes the trained weights"},
    {"--save-shard-mb", "--save", "how --save writes the trained weights"},
    {"--checkpoint-every", "--checkpoint-dir", "when checkpoints are written into --checkpoint-dir"},
    {"--keep", "--checkpoint-dir", "how many checkpoints --checkpoint-dir keeps"},
};

}  // namespace

void refuse_contradicting_flags(const CLI::App& cmd, const TrainOptions& o) {
  for (const Conflict& c : kConflicts)
    if (given(cmd, c.a) && given(cmd, c.b))
      throw InputError(fmt::format("{} and {} contradict each other: {}; give one", c.a, c.b, c.why));
  refuse_unread_flags(cmd, o);
  refuse_sample_flags_alone(cmd);
  for (const Dependent& d : kDependents)
    if (given(cmd, d.flag) && !given(cmd, d.needs))
      throw InputError(fmt::format("{} sets {}, and {} is not given", d.flag, d.sets, d.needs));
}

}  // namespace dpt
