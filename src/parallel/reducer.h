// DDP's gradient reducer (PyTorch's c10d Reducer, docs/ddp.md).
//
// Gradients are cut into buckets from the end of the flat buffer to its
// start, the order in which backward produces them: a small first bucket (so
// communication starts early), then buckets of the cap. Because the gradient
// buffer is flat, a bucket is just a range of it, cut at the cap even inside
// a tensor (PyTorch keeps tensors whole because it copies them into bucket
// memory; here nothing is copied): the all-reduce runs on the gradients in
// place.
//
// During backward the model reports ranges of gradients as they become final
// (Model::on_grads_ready); each bucket counts down its elements, and a bucket
// that reaches zero is handed to the communication thread at once, buckets
// strictly in index order (so every rank issues the same collectives in the
// same order). The optimizer step waits for all of them (finish()).
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
  // BF16: each bucket is converted into a bf16 copy, all-reduced in bf16
  // (half the bytes) and widened back into the fp32 gradients after the
  // wait (--reduce-dtype bf16; the gradients themselves stay fp32).
  DType reduce_dtype = DType::F32;
};

struct Bucket {
  size_t offset = 0, numel = 0;  // range of the flat gradient buffer
  size_t pending = 0;            // elements whose gradient is not final yet
  std::shared_ptr<comm::Work> work;
};

class Reducer {
 public:
  Reducer(Model& model, comm::ProcessGroup& pg, ReducerOptions options);
  ~Reducer();

  // Before each micro-step's backward. sync = false accumulates gradients
  // locally without communicating (PyTorch's no_sync). The counts restart
  // at the first sync = true after finish(), so backwards of several
  // pipeline chunks can alternate between the two.
  void prepare(bool sync);
  // After the last micro-step's backward: launches what is left and waits
  // for every bucket. Returns the seconds spent waiting (exposed
  // communication).
  double finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bytes of the bf16 copy the reductions run on (0 when they run in fp32).
  size_t wire_bytes() const { return wire_.bytes(); }
  // Whether the buffer the buckets are reduced in is a shared window, so
  // the all-reduces run in place (comm/shm_window.h).
  bool in_place() const { return in_place_; }
  // Bucket assignment alone, for tests and docs: the buckets a layout gets.
  // Caps are rounded down to whole 64-byte lines (16 floats), at least one,
  // and bucket 0 gives up the few floats (< 16) that put its start on a line
  // boundary, so every bucket starts on a cache line of the buffer and the
  // communication thread never shares a line with the one still writing the
  // neighbouring gradients. per_param: one bucket per slot.
  static std::vector<Bucket> assign(const Layout& layout, const ReducerOptions& options);

 private:
  void on_grads_ready(size_t offset, size_t numel);
  void launch_ready();

  Model& model_;
  comm::ProcessGroup& pg_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;  // descending offsets
  FlatBuffer wire_{0, DType::BF16};  // reduce_dtype bf16: the whole gradient buffer's bf16 copy
  size_t next_launch_ = 0;
  bool sync_ = true;
  bool counting_ = false;  // between the step's first synchronising prepare and finish
  bool in_place_ = false;
};

}  // namespace dpt
