#include "train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "data/batches.h"

namespace dpt {

EvalResult evaluate_images(Model& model, const ImageSet& set, int64_t batch) {
  EvalResult r;
  Batch b;
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < set.count; start += batch) {
    int64_t n = std::min(batch, set.count - start);
    std::iota(idx.begin(), idx.begin() + n, start);
    fill_image_batch(set, idx.data(), n, b);
    ForwardStats st = model.forward(b);
    loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
    correct += st.correct;
    r.count += st.count;
  }
  if (r.count > 0) {
    r.loss = loss_sum / static_cast<double>(r.count);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.count);
  }
  return r;
}

EvalResult evaluate_text(Model& model, const uint8_t* data, size_t n, int64_t batch,
                         int64_t max_windows) {
  const int64_t T = model.positions();
  int64_t windows = static_cast<int64_t>(n) / (T + 1);
  if (windows == 0)
    throw InputError(fmt::format("text of {} bytes is shorter than one window of {} bytes", n, T + 1));
  if (max_windows > 0) windows = std::min(windows, max_windows);
  EvalResult r;
  Batch b;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t w = 0; w < windows; w += batch) {
    fill_sequential_windows(data, n, T, w, std::min(batch, windows - w), b);
    ForwardStats st = model.forward(b);
    loss_sum += static_cast<double>(st.loss) * static_cast<double>(st.count);
    correct += st.correct;
    r.count += st.count;
  }
  r.loss = loss_sum / static_cast<double>(r.count);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(r.count);
  return r;
}

}  // namespace dpt
