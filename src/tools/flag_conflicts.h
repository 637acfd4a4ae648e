// `dpt train`'s flags that contradict each other: given together, one of
// them would be ignored without a word (--synthetic with --data trained on
// random batches and never read the file). Each is refused in one sentence.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "train/train.h"

namespace dpt {

// Throws InputError for the first contradiction among the flags given on
// `cmd` (`dpt train`'s subcommand), o.model resolved (--model or --load's).
void refuse_contradicting_flags(const CLI::App& cmd, const TrainOptions& o);

}  // namespace dpt
