// DDP's gradient reducer (PyTorch's c10d Reducer, docs/ddp.md).
//
// Gradients are cut into buckets in reverse parameter order, the order in
// which backward produces them: a small first bucket (so communication
// starts early), then buckets up to a cap. Because the gradient buffer is
// flat and slots are contiguous, a bucket is a range of it: the all-reduce
// runs on the gradients in place, nothing is copied.
//
// During backward the model reports each unit whose gradients are final;
// every slot of a bucket counts down, and a bucket that reaches zero is
// handed to the communication thread at once, buckets strictly in index
// order (so every rank issues the same collectives in the same order). The
// optimizer step waits for all of them (finish()).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"

namespace dpt {

struct ReducerOptions {
  size_t bucket_bytes = 25u << 20;       // cap of every bucket but the first
  size_t first_bucket_bytes = 1u << 20;  // cap of bucket 0
  bool overlap = true;    // false: all-reduce every bucket after backward
  bool per_param = false; // one all-reduce per parameter tensor, no buckets
};

struct Bucket {
  size_t offset = 0, numel = 0;  // range of the flat gradient buffer
  int first_slot = 0, last_slot = 0;  // slots [first_slot, last_slot]
  int pending = 0;                // slots whose gradient is not final yet
  std::shared_ptr<comm::Work> work;
};

class Reducer {
 public:
  Reducer(Model& model, comm::ProcessGroup& pg, ReducerOptions options);
  ~Reducer();

  // Before each micro-step's backward. sync = false accumulates gradients
  // locally without communicating (PyTorch's no_sync).
  void prepare(bool sync);
  // After the last micro-step's backward: launches what is left and waits
  // for every bucket. Returns the seconds spent waiting (exposed
  // communication).
  double finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bucket assignment alone, for tests and docs: the buckets a layout gets.
  static std::vector<Bucket> assign(const Layout& layout, const ReducerOptions& options);

 private:
  void on_unit_ready(int unit);
  void launch_ready();

  Model& model_;
  comm::ProcessGroup& pg_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_slot_;
  size_t next_launch_ = 0;
  bool sync_ = true;
};

}  // namespace dpt
