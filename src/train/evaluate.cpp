#include "train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "data/batches.h"

namespace dpt {

namespace {

void add(EvalResult& r, const ForwardStats& st) {
  r.loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
  r.correct += st.correct;
  r.count += st.count;
}

// This rank's share of `count` items, in batches: run(first, n) evaluates
// items [first, first + n). Every rank runs the same number of forward
// passes, the most any rank needs: a strategy that gathers parameters in
// forward (ZeRO-3) needs every rank in each gather, so a rank whose share
// has run out evaluates item 0 once more per missing pass and drops the
// result (without this, the rank with more windows waited forever).
template <typename Run>
EvalResult over_share(int64_t count, int64_t batch, int rank, int world, Run&& run) {
  const comm::Range share = comm::chunk_range(static_cast<size_t>(count), world, rank);
  const int64_t begin = static_cast<int64_t>(share.begin), end = begin + static_cast<int64_t>(share.size);
  size_t most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, comm::chunk_range(static_cast<size_t>(count), world, r).size);
  const int64_t passes = (static_cast<int64_t>(most) + batch - 1) / batch;
  EvalResult result;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t first = begin + p * batch;
    if (first < end)
      add(result, run(first, std::min(batch, end - first)));
    else
      run(int64_t{0}, int64_t{1});  // a pass in step with the other ranks; its result is not counted
  }
  return result;
}

}  // namespace

EvalResult evaluate_images(Model& model, const ImageSet& set, int64_t batch, int rank, int world) {
  Batch b;
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  return over_share(set.count, batch, rank, world, [&](int64_t first, int64_t n) {
    std::iota(idx.begin(), idx.begin() + n, first);
    fill_image_batch(set, idx.data(), n, b);
    return model.forward(b);
  });
}

EvalResult evaluate_text(Model& model, const uint8_t* data, size_t n, int64_t batch, int64_t max_windows,
                         int rank, int world, const ForwardFn* forward) {
  const int64_t T = model.positions();
  int64_t windows = static_cast<int64_t>(n) / (T + 1);
  if (windows == 0)
    throw InputError(fmt::format("text of {} bytes is shorter than one window of {} bytes", n, T + 1));
  if (max_windows > 0) windows = std::min(windows, max_windows);
  Batch b;
  return over_share(windows, batch, rank, world, [&](int64_t first, int64_t count) {
    fill_sequential_windows(data, n, T, first, count, b);
    return forward ? (*forward)(b) : model.forward(b);
  });
}

EvalResult evaluate_windows(Model& model, const ShardWindows& windows, int64_t batch, int64_t max_windows,
                            int rank, int world, const ForwardFn* forward) {
  const int64_t T = windows.T();
  const int64_t count = max_windows > 0 ? std::min(windows.size(), max_windows) : windows.size();
  Batch b;
  return over_share(count, batch, rank, world, [&](int64_t first, int64_t n) {
    b.B = n;
    b.T = T;
    b.tokens.resize(static_cast<size_t>(n * T));
    b.targets.resize(static_cast<size_t>(n * T));
    for (int64_t i = 0; i < n; ++i) windows.fill(first + i, b, i);
    return forward ? (*forward)(b) : model.forward(b);
  });
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
