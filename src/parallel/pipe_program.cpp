#include "parallel/pipe_program.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

namespace {

using Kind = PipeAction::Kind;
constexpr double kNever = -1.0;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::F: return "F";
    case Kind::B: return "B";
    case Kind::W: return "W";
    case Kind::BW: return "BW";
  }
  return "?";
}

// When each chunk's operations of each micro-batch ended (kNever: not yet).
struct Ends {
  int M = 1;
  std::vector<double> f, b, w;  // [chunk x M]; b: B or BW
  Ends(int chunks, int micro) : M(micro), f(size(chunks), kNever), b(f), w(f) {}
  size_t size(int chunks) const { return static_cast<size_t>(chunks) * static_cast<size_t>(M); }
  size_t at(int c, int m) const { return static_cast<size_t>(c) * static_cast<size_t>(M) + static_cast<size_t>(m); }
};

// When a's inputs are on its rank, or kNever while one is missing.
double ready_at(const PipeProgram& p, const Ends& e, const PipeAction& a, double transfer) {
  const int S = p.chunks(), c = a.chunk;
  auto arrival = [&](double end, int from) {
    if (end == kNever) return kNever;
    return end + (p.rank_of_chunk[static_cast<size_t>(from)] == p.rank_of_chunk[static_cast<size_t>(c)] ? 0.0 : transfer);
  };
  if (a.kind == Kind::F) return c == 0 ? 0.0 : arrival(e.f[e.at(c - 1, a.micro)], c - 1);
  if (a.kind == Kind::W) return e.b[e.at(c, a.micro)];
  const double own = e.f[e.at(c, a.micro)];
  if (own == kNever || c == S - 1) return own;
  const double grad = arrival(e.b[e.at(c + 1, a.micro)], c + 1);
  return grad == kNever ? kNever : std::max(own, grad);
}

double cost_of(const PipeAction& a, const PipeCosts& k) {
  switch (a.kind) {
    case Kind::F: return k.f;
    case Kind::B: return k.b;
    case Kind::W: return k.w;
    case Kind::BW: return k.b + k.w;
  }
  return 0.0;
}

void record(Ends& e, const PipeAction& a, double end) {
  const size_t i = e.at(a.chunk, a.micro);
  if (a.kind == Kind::F) e.f[i] = end;
  if (a.kind == Kind::B || a.kind == Kind::BW) e.b[i] = end;
  if (a.kind == Kind::W || a.kind == Kind::BW) e.w[i] = end;
}

// Runs the lists in order on every rank; "" when they complete, else the
// sentence naming the first rank's stuck operation.
std::string run(const PipeProgram& p, const PipeCosts& k, PipeSimulation* sim) {
  const size_t R = p.ranks.size();
  Ends e(p.chunks(), p.micro_batches);
  std::vector<size_t> next(R, 0);
  std::vector<double> free(R, 0.0), busy(R, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < R; ++r)
      for (; next[r] < p.ranks[r].size(); ++next[r]) {
        const PipeAction& a = p.ranks[r][next[r]];
        const double ready = ready_at(p, e, a, k.transfer);
        if (ready == kNever) break;
        const double start = std::max(free[r], ready), c = cost_of(a, k);
        free[r] = start + c;
        busy[r] += c;
        record(e, a, free[r]);
        progress = true;
      }
  }
  for (size_t r = 0; r < R; ++r)
    if (next[r] < p.ranks[r].size())
      return fmt::format("rank {} waits forever at {}: its inputs come from operations that wait on it (a cycle of "
                         "waits)",
                         r, pipe_action_name(p.ranks[r][next[r]]));
  if (sim) {
    sim->step = *std::max_element(free.begin(), free.end());
    sim->idle.clear();
    for (size_t r = 0; r < R; ++r) sim->idle.push_back(sim->step > 0 ? 1.0 - busy[r] / sim->step : 0.0);
  }
  return "";
}

// Each operation on its chunk's rank, once each, F before B before W.
std::string check_structure(const PipeProgram& p) {
  const int S = p.chunks(), M = p.micro_batches;
  std::vector<int> count(static_cast<size_t>(4 * S * M), 0);
  auto slot = [&](Kind k, int c, int m) -> int& { return count[static_cast<size_t>((k * S + c) * M + m)]; };
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    Ends seen(S, M);
    for (size_t i = 0; i < p.ranks[r].size(); ++i) {
      const PipeAction& a = p.ranks[r][i];
      if (a.chunk < 0 || a.chunk >= S || a.micro < 0 || a.micro >= M)
        return fmt::format("rank {} lists {}, outside {} chunks and {} micro-batches", r, pipe_action_name(a), S, M);
      if (p.rank_of_chunk[static_cast<size_t>(a.chunk)] != static_cast<int>(r))
        return fmt::format("rank {} lists {}, but chunk {} is on rank {}", r, pipe_action_name(a), a.chunk,
                           p.rank_of_chunk[static_cast<size_t>(a.chunk)]);
      if (++slot(a.kind, a.chunk, a.micro) > 1) return fmt::format("rank {} lists {} twice", r, pipe_action_name(a));
      const size_t at = seen.at(a.chunk, a.micro);
      if (a.kind != Kind::F && seen.f[at] == kNever)
        return fmt::format("rank {} runs {} before its forward", r, pipe_action_name(a));
      if (a.kind == Kind::W && seen.b[at] == kNever)
        return fmt::format("rank {} runs {} before its input gradient (B)", r, pipe_action_name(a));
      record(seen, a, 1.0);
    }
  }
  for (int c = 0; c < S; ++c)
    for (int m = 0; m < M; ++m) {
      const PipeAction f{Kind::F, c, m};
      if (slot(Kind::F, c, m) == 0)
        return c == 0 ? fmt::format("no rank runs {}", pipe_action_name(f))
                      : fmt::format("{} sends its output to rank {}, which has no {} to receive it",
                                    pipe_action_name({Kind::F, c - 1, m}), p.rank_of_chunk[static_cast<size_t>(c)],
                                    pipe_action_name(f));
      const bool fused = slot(Kind::BW, c, m) == 1, split = slot(Kind::B, c, m) == 1 && slot(Kind::W, c, m) == 1;
      if (fused == split || slot(Kind::B, c, m) != slot(Kind::W, c, m))
        return fmt::format("chunk {} micro-batch {} needs one BW, or one B and one W, on rank {}", c, m,
                           p.rank_of_chunk[static_cast<size_t>(c)]);
    }
  return "";
}

}  // namespace

std::string pipe_action_name(const PipeAction& a) {
  return fmt::format("{}(chunk {}, micro {})", kind_name(a.kind), a.chunk, a.micro);
}

PipeCheck check_pipe_program(const PipeProgram& p) {
  PipeCheck out;
  out.error = check_structure(p);
  if (out.error.empty()) out.error = run(p, PipeCosts{}, nullptr);
  for (const auto& ops : p.ranks) {
    int held = 0, waiting = 0, peak_held = 0, peak_w = 0;
    for (const PipeAction& a : ops) {
      held += a.kind == Kind::F ? 1 : (a.kind == Kind::B || a.kind == Kind::BW) ? -1 : 0;
      waiting += a.kind == Kind::B ? 1 : a.kind == Kind::W ? -1 : 0;
      peak_held = std::max(peak_held, held);
      peak_w = std::max(peak_w, waiting);
    }
    out.peak_held.push_back(peak_held);
    out.peak_w.push_back(peak_w);
  }
  return out;
}

PipeSimulation simulate_pipe_program(const PipeProgram& p, const PipeCosts& costs) {
  PipeSimulation sim;
  const std::string error = run(p, costs, &sim);
  DPT_CHECK(error.empty(), "simulating an invalid pipeline program: {}", error);
  return sim;
}

}  // namespace dpt
