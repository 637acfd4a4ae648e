// Subcommands of `dpt`. Each registers its flags on construction and runs
// after parsing.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>

#include "train/train.h"

namespace dpt {

// Flags that size a model; shared by train and eval.
struct ModelFlags {
  std::string model;
  std::string sizes;                                  // mlp
  int64_t vocab = 0, layers = 0, heads = 0, width = 0, context = 0;  // gpt
  void add(CLI::App* cmd);
  std::map<std::string, std::string> hparams() const;  // only those given
};

class TrainCommand {
 public:
  explicit TrainCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  ModelFlags model_;
  TrainOptions opts_;
  int threads_ = 0;
};

class EvalCommand {
 public:
  explicit EvalCommand(CLI::App& app);
  bool chosen() const { return cmd_->parsed(); }
  int run();

 private:
  CLI::App* cmd_;
  ModelFlags model_;
  std::string weights_, data_;
  int64_t batch_ = 0;
  int threads_ = 0;
};

}  // namespace dpt
