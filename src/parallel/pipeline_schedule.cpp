#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

double pipe_bubble(int pp, int M) { return static_cast<double>(pp - 1) / static_cast<double>(M + pp - 1); }

std::vector<int64_t> pipe_split(const std::string& split, int pp, int64_t layers, int64_t embed, int64_t block,
                                int64_t head, int v) {
  if (layers < pp && v == 1)
    throw InputError(fmt::format("--pp {} needs at least one block per stage, and the model has {}", pp, layers));
  if (layers < pp)
    throw InputError(fmt::format("--pp {} x --virtual-stages {} needs at least one block per chunk, and the model has {}",
                                 pp / v, v, layers));
  if (!split.empty()) {
    std::vector<int64_t> counts;
    std::stringstream in(split);
    std::string item;
    int64_t sum = 0;
    while (std::getline(in, item, ',')) {
      size_t used = 0;
      int64_t n = 0;
      try {
        n = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || item.empty() || n < 1)
        throw InputError(fmt::format("--pp-split '{}': '{}' is not a positive number of blocks", split, item));
      counts.push_back(n);
      sum += n;
    }
    // getline yields no item after a final comma: "2,2," would read as 2,2.
    if (split.back() == ',')
      throw InputError(fmt::format("--pp-split '{}': '' is not a positive number of blocks", split));
    if (static_cast<int>(counts.size()) != pp || sum != layers)
      throw InputError(v == 1 ? fmt::format("--pp-split '{}' must give {} stages' blocks summing to the model's {}",
                                            split, pp, layers)
                              : fmt::format("--pp-split '{}' must give {} counts of blocks (one per chunk: --pp x "
                                            "--virtual-stages {}) summing to the model's {}",
                                            split, pp, v, layers));
    return counts;
  }
  // best[s][l]: the smallest largest stage over splits of blocks [0, l)
  // into stages 0 .. s; a few layers and stages, so the full table is cheap.
  const int64_t inf = std::numeric_limits<int64_t>::max();
  const auto P = static_cast<size_t>(pp), L = static_cast<size_t>(layers);
  std::vector<std::vector<int64_t>> best(P, std::vector<int64_t>(L + 1, inf));
  std::vector<std::vector<size_t>> from(P, std::vector<size_t>(L + 1, 0));
  auto weight = [&](size_t s, size_t a, size_t b) {
    return static_cast<int64_t>(b - a) * block + (s == 0 ? embed : 0) + (s + 1 == P ? head : 0);
  };
  for (size_t l = 1; l <= L; ++l) best[0][l] = weight(0, 0, l);
  for (size_t s = 1; s < P; ++s)
    for (size_t l = s + 1; l <= L; ++l)
      for (size_t k = s; k < l; ++k) {
        if (best[s - 1][k] == inf) continue;
        const int64_t w = std::max(best[s - 1][k], weight(s, k, l));
        if (w < best[s][l]) {
          best[s][l] = w;
          from[s][l] = k;
        }
      }
  std::vector<int64_t> counts(P);
  size_t l = L;
  for (size_t s = P; s-- > 0;) {
    const size_t k = s == 0 ? 0 : from[s][l];
    counts[s] = static_cast<int64_t>(l - k);
    l = k;
  }
  return counts;
}

}  // namespace dpt
