// The flags `dpt train` and `dpt plan` share, declared once: the batch and
// its micro-batches, the mesh, the optimizer's kind, the ZeRO and reduction
// options and the offload chunk. Each is bound to a string or number here
// and parsed into TrainOptions' enums by apply(), the command line's edge.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "train/train.h"

namespace dpt {

class RunFlags {
 public:
  // Adds the flags to cmd; their values land in o (directly, or at apply).
  void add(CLI::App* cmd, TrainOptions& o);
  // Parses what add() bound to strings into o, and checks what two flags
  // say together (--micro-batches and --grad-accum).
  void apply(const CLI::App* cmd, TrainOptions& o) const;

 private:
  int64_t micro_batches_ = 0;  // --micro-batches: --grad-accum under another name
  std::string zero_reduce_ = "all-reduce", zero_accumulate_ = "scatter", reduce_dtype_ = "fp32";
  std::string tp_embedding_ = "replicated", attention_;
  double offload_chunk_mb_ = 4.0;
};

}  // namespace dpt
