#include "train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "data/batches.h"

namespace dpt {

EvalResult evaluate_images(Model& model, const ImageSet& set, int64_t batch, int rank, int world) {
  const comm::Range share = comm::chunk_range(static_cast<size_t>(set.count), world, rank);
  const int64_t begin = static_cast<int64_t>(share.begin), end = begin + static_cast<int64_t>(share.size);
  EvalResult r;
  Batch b;
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  for (int64_t start = begin; start < end; start += batch) {
    int64_t n = std::min(batch, end - start);
    std::iota(idx.begin(), idx.begin() + n, start);
    fill_image_batch(set, idx.data(), n, b);
    ForwardStats st = model.forward(b);
    r.loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
    r.correct += st.correct;
    r.count += st.count;
  }
  return r;
}

EvalResult evaluate_text(Model& model, const uint8_t* data, size_t n, int64_t batch, int64_t max_windows,
                         int rank, int world, const ForwardFn* forward) {
  const int64_t T = model.positions();
  int64_t windows = static_cast<int64_t>(n) / (T + 1);
  if (windows == 0)
    throw InputError(fmt::format("text of {} bytes is shorter than one window of {} bytes", n, T + 1));
  if (max_windows > 0) windows = std::min(windows, max_windows);
  const comm::Range share = comm::chunk_range(static_cast<size_t>(windows), world, rank);
  const int64_t begin = static_cast<int64_t>(share.begin), end = begin + static_cast<int64_t>(share.size);
  EvalResult r;
  Batch b;
  for (int64_t w = begin; w < end; w += batch) {
    fill_sequential_windows(data, n, T, w, std::min(batch, end - w), b);
    ForwardStats st = forward ? (*forward)(b) : model.forward(b);
    r.loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
    r.correct += st.correct;
    r.count += st.count;
  }
  return r;
}

EvalResult evaluate_windows(Model& model, const ShardWindows& windows, int64_t batch, int64_t max_windows,
                            int rank, int world, const ForwardFn* forward) {
  const int64_t T = windows.T();
  const int64_t count = max_windows > 0 ? std::min(windows.size(), max_windows) : windows.size();
  const comm::Range share = comm::chunk_range(static_cast<size_t>(count), world, rank);
  const int64_t begin = static_cast<int64_t>(share.begin), end = begin + static_cast<int64_t>(share.size);
  EvalResult r;
  Batch b;
  for (int64_t w = begin; w < end; w += batch) {
    const int64_t n = std::min(batch, end - w);
    b.B = n;
    b.T = T;
    b.tokens.resize(static_cast<size_t>(n * T));
    b.targets.resize(static_cast<size_t>(n * T));
    for (int64_t i = 0; i < n; ++i) windows.fill(w + i, b, i);
    ForwardStats st = forward ? (*forward)(b) : model.forward(b);
    r.loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
    r.correct += st.correct;
    r.count += st.count;
  }
  return r;
}

EvalResult combine(const EvalResult& mine, comm::ProcessGroup& pg) {
  if (pg.size() == 1) return mine;
  // Three 8-byte values per rank, moved as bytes by an all-gather.
  struct Sums {
    double loss_sum;
    int64_t correct, count;
  };
  static_assert(sizeof(Sums) == 24);
  std::vector<Sums> all(static_cast<size_t>(pg.size()));
  all[static_cast<size_t>(pg.rank())] = {mine.loss_sum, mine.correct, mine.count};
  pg.all_gather(all.data(), all.size() * 6, DType::F32);
  EvalResult r;
  for (const Sums& s : all) {
    r.loss_sum += s.loss_sum;
    r.correct += s.correct;
    r.count += s.count;
  }
  return r;
}

}  // namespace dpt
