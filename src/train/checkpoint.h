// Checkpoints: everything a run needs to continue exactly, written by every
// rank in parallel, readable by any strategy at any world size
// (docs/checkpoints.md).
//
//   DIR/step-00000120/manifest.json     the run: step, model, settings, data
//                                       position, files with sizes and CRC-32s
//   DIR/step-00000120/rank-00000-of-00002.safetensors   one per writing rank
//   DIR/latest                          "step-00000120"
//
// A rank's file holds its strategy's spans (Strategy::state_spans) as 1-D
// float32 tensors named "<kind>/<parameter>/<first element>": kind "params"
// or an optimizer state ("exp_avg", "exp_avg_sq", "momentum_buffer"), the
// parameter's PyTorch name, and where in that parameter the piece starts. So
// pieces are placed by the model's names, not by who wrote them, and a
// reader takes whatever intersects its own spans: no converter between
// world sizes or strategies.
//
// A checkpoint exists only when complete: the files go into
// "step-N.tmp", each fsynced; rank 0 then writes the manifest, renames the
// directory, fsyncs its parent, and replaces `latest` atomically. A run
// killed while writing leaves the previous checkpoint intact.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/strategy.h"

namespace dpt {

// What a checkpoint says about its run, beside the tensors.
struct CheckpointInfo {
  int64_t step = 0;                          // optimizer steps done
  std::map<std::string, std::string> model;  // the model's hyper-parameters (Model::metadata)
  std::string optimizer;                     // "adamw" or "sgd"
  std::vector<std::string> state;            // the optimizer's state tensors
  nlohmann::json settings;                   // the run's settings that decide its numbers
  nlohmann::json data;                       // where the data stream stands
  std::string strategy;                      // that wrote it
  int world = 1;                             // the ranks that wrote files (hsdp: one shard group's)
};

// Collective. Writes DIR/step-N for info.step (replacing one of that step
// if there is one), points DIR/latest at it, and removes all but the
// `keep` newest (keep 0: none removed). Throws IoError naming the file on
// every rank if any rank fails; the previous checkpoint is then untouched.
// Only the ranks whose strategy writes_state() write a file (hsdp: the first
// shard group), numbered among themselves (info.world is set to their
// count); the others take part in every agreement. replicated = false: this
// rank leaves out the tensors it holds whole (a tensor-parallel rank other
// than TP rank 0; they are its copies). whole:
// the model the manifest lists, when `model` is one pipeline stage of it
// (each stage's ranks write their stage's pieces; null: `model` itself).
struct WrittenCheckpoint {
  std::string path;
  uint64_t bytes = 0;  // of all ranks' files
};
WrittenCheckpoint write_checkpoint(const std::string& dir, const CheckpointInfo& info, Strategy& strategy,
                             const Model& model, comm::ProcessGroup& pg, int keep, bool replicated = true,
                             const Model* whole = nullptr);

// The checkpoint a --resume path names: a checkpoint itself (it holds a
// manifest.json), or a directory of them (its latest complete one).
// InputError in one sentence when it is neither.
std::string find_checkpoint(const std::string& path);

// Reads and validates a checkpoint's manifest (IoError naming the file).
CheckpointInfo read_checkpoint_info(const std::string& checkpoint);

// Collective. Checks that the checkpoint matches `model` and the strategy's
// optimizer and that its files have their sizes; then each rank reads every
// piece that meets its spans, whole, checks it against its CRC-32 and copies
// what it needs, and the strategy completes itself (Strategy::restored).
// A pipeline stage skips the pieces of the parameters other stages hold
// (those the manifest lists and `model` does not).
// Throws IoError / InputError naming the file and what is wrong, on every
// rank (the run then ends before its first step). Returns the bytes of all
// its files.
uint64_t load_checkpoint(const std::string& checkpoint, const CheckpointInfo& info, Strategy& strategy,
                         const Model& model, comm::ProcessGroup& pg);


}  // namespace dpt
