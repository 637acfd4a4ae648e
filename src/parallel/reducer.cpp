#include "parallel/reducer.h"

#include <chrono>

#include "core/error.h"

namespace dpt {

std::vector<Bucket> Reducer::assign(const Layout& layout, const ReducerOptions& options) {
  std::vector<Bucket> buckets;
  const auto& slots = layout.slots();
  // Walk the slots backwards, closing a bucket when the next slot would push
  // it past its cap (a slot larger than the cap gets a bucket of its own).
  for (int s = static_cast<int>(slots.size()) - 1; s >= 0; --s) {
    const Slot& slot = slots[static_cast<size_t>(s)];
    bool open_new = buckets.empty() || options.per_param;
    if (!open_new) {
      const size_t cap = buckets.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
      open_new = (buckets.back().numel + slot.numel) * sizeof(float) > cap;
    }
    if (open_new) {
      Bucket b;
      b.last_slot = s;
      buckets.push_back(b);
    }
    Bucket& b = buckets.back();
    b.first_slot = s;
    b.offset = slot.offset;
    b.numel += slot.numel;
  }
  return buckets;
}

Reducer::Reducer(Model& model, comm::ProcessGroup& pg, ReducerOptions options)
    : model_(model), pg_(pg), options_(options) {
  buckets_ = assign(model.layout(), options_);
  bucket_of_slot_.assign(model.layout().slots().size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int s = buckets_[b].first_slot; s <= buckets_[b].last_slot; ++s)
      bucket_of_slot_[static_cast<size_t>(s)] = static_cast<int>(b);
  model_.on_unit_ready = [this](int unit) { on_unit_ready(unit); };
}

Reducer::~Reducer() {
  model_.on_unit_ready = nullptr;
  // Never leave the communication thread writing into gradients we no
  // longer own; errors here were already reported by finish().
  for (Bucket& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (const std::exception&) {
      }
}

void Reducer::prepare(bool sync) {
  sync_ = sync;
  next_launch_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = b.last_slot - b.first_slot + 1;
    b.work.reset();
  }
}

void Reducer::on_unit_ready(int unit) {
  if (!sync_) return;
  const Unit& u = model_.layout().units()[static_cast<size_t>(unit)];
  for (int s = u.first_slot; s < u.first_slot + u.slot_count; ++s) {
    Bucket& b = buckets_[static_cast<size_t>(bucket_of_slot_[static_cast<size_t>(s)])];
    DPT_CHECK(b.pending > 0, "slot {} reported ready twice", s);
    --b.pending;
  }
  if (options_.overlap) launch_ready();
}

void Reducer::launch_ready() {
  // Strictly in index order: a bucket that is ready early waits for the
  // ones before it, so every rank issues the same sequence.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    // Sum: the 1/world of the average is already in the loss scale.
    b.work = pg_.all_reduce_async(model_.grads() + b.offset, b.numel, DType::F32, comm::ReduceOp::Sum);
  }
}

double Reducer::finish() {
  if (!sync_) return 0.0;
  for (const Bucket& b : buckets_)
    DPT_CHECK(b.pending == 0, "bucket of slots {}..{} still waits for gradients after backward",
              b.first_slot, b.last_slot);
  launch_ready();
  auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) b.work->wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dpt
