#include "parallel/reducer.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dpt {

namespace {
// A cap in bytes as a whole number of 64-byte lines of floats, at least one.
size_t cap_elements(size_t bytes) {
  constexpr size_t kLine = 64 / sizeof(float);
  return std::max(kLine, bytes / sizeof(float) / kLine * kLine);
}
}  // namespace

std::vector<Bucket> Reducer::assign(const Layout& layout, const ReducerOptions& options) {
  std::vector<Bucket> buckets;
  if (options.per_param) {
    for (size_t s = layout.slots().size(); s-- > 0;) {
      Bucket b;
      b.offset = layout.slots()[s].offset;
      b.numel = layout.slots()[s].numel;
      buckets.push_back(b);
    }
    return buckets;
  }
  // From the end of the buffer backwards: bucket 0 takes the first cap, less
  // the part of a line that puts its start on a line boundary; the others
  // take the regular cap (whole lines, so their starts stay aligned); the
  // last one takes what is left.
  constexpr size_t kLine = 64 / sizeof(float);
  for (size_t end = layout.numel(); end > 0;) {
    const size_t cap = cap_elements(buckets.empty() ? options.first_bucket_bytes : options.bucket_bytes);
    Bucket b;
    b.offset = end > cap ? (end - cap + kLine - 1) / kLine * kLine : 0;
    b.numel = end - b.offset;
    end = b.offset;
    buckets.push_back(b);
  }
  return buckets;
}

Reducer::Reducer(Model& model, comm::ProcessGroup& pg, ReducerOptions options)
    : model_(model), pg_(pg), options_(options) {
  buckets_ = assign(model.layout(), options_);
  // On one host the buffer the buckets are reduced in (the gradients, or
  // their bf16 copy) goes into a shared window: the all-reduce then reads
  // the peers' gradients where they lie instead of copying them through the
  // transport (comm/shm_window.h). Elsewhere nothing changes.
  const size_t n = model.param_count();
  const bool wire = options_.reduce_dtype == DType::BF16;
  auto shared = model.device() == Device::CPU ? pg_.shared_memory(n * dtype_size(options_.reduce_dtype)) : nullptr;
  in_place_ = shared != nullptr;
  if (wire)
    wire_ = shared ? FlatBuffer(std::move(shared), n, DType::BF16) : FlatBuffer(n, DType::BF16);
  else if (shared)
    model_.place_grads(FlatBuffer(std::move(shared), n));
  model_.on_grads_ready = [this](size_t offset, size_t numel) { on_grads_ready(offset, numel); };
}

Reducer::~Reducer() {
  model_.on_grads_ready = nullptr;
  // Never leave the communication thread writing into gradients we no
  // longer own; errors here were already reported by finish().
  for (Bucket& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (const std::exception&) {
      }
}

void Reducer::prepare(bool sync) {
  // The buckets count down from the step's first synchronising backward to
  // finish(). A pipeline rank with several chunks calls prepare before each
  // chunk's backward, the last micro-batch's of one chunk (sync) between
  // earlier ones of another (not): those neither count nor restart the count.
  if (sync && !counting_) {
    counting_ = true;
    next_launch_ = 0;
    for (Bucket& b : buckets_) {
      b.pending = b.numel;
      b.work.reset();
    }
  }
  sync_ = sync;
}

void Reducer::on_grads_ready(size_t offset, size_t numel) {
  if (!sync_) return;
  const size_t end = offset + numel;
  DPT_CHECK(end <= model_.param_count(), "gradients {}..{} reported ready are outside the buffer", offset, end);
  // Buckets are in descending offsets; a range usually touches one or two.
  for (Bucket& b : buckets_) {
    const size_t lo = std::max(offset, b.offset), hi = std::min(end, b.offset + b.numel);
    if (lo >= hi) continue;
    DPT_CHECK(b.pending >= hi - lo, "gradients {}..{} reported ready twice", lo, hi);
    b.pending -= hi - lo;
  }
  if (options_.overlap) launch_ready();
}

void Reducer::launch_ready() {
  // Strictly in index order: a bucket that is ready early waits for the
  // ones before it, so every rank issues the same sequence.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    // Sum: the 1/world of the average is already in the loss scale.
    if (options_.reduce_dtype == DType::BF16) {
      convert(wire_.b16() + b.offset, model_.grads() + b.offset, b.numel);
      b.work = pg_.all_reduce_async(wire_.b16() + b.offset, b.numel, DType::BF16, comm::ReduceOp::Sum);
    } else {
      b.work = pg_.all_reduce_async(model_.grads() + b.offset, b.numel, DType::F32, comm::ReduceOp::Sum);
    }
  }
}

double Reducer::finish() {
  if (!sync_) return 0.0;
  for (const Bucket& b : buckets_)
    DPT_CHECK(b.pending == 0, "bucket {}..{} still waits for {} gradients after backward", b.offset,
              b.offset + b.numel, b.pending);
  launch_ready();
  counting_ = false;
  auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) b.work->wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (options_.reduce_dtype == DType::BF16)
    for (const Bucket& b : buckets_) convert(model_.grads() + b.offset, wire_.b16() + b.offset, b.numel);
  return waited;
}

}  // namespace dpt
