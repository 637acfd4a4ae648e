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

}  // namespace

double pipe_cost_of(const PipeAction& a, const PipeCosts& k) {
  const bool own = static_cast<size_t>(a.chunk) < k.chunk.size();
  const double f = own ? k.chunk[static_cast<size_t>(a.chunk)][0] : k.f;
  const double b = own ? k.chunk[static_cast<size_t>(a.chunk)][1] : k.b;
  const double w = own ? k.chunk[static_cast<size_t>(a.chunk)][2] : k.w;
  switch (a.kind) {
    case Kind::F: return f;
    case Kind::B: return b;
    case Kind::W: return w;
    case Kind::BW: return b + w;
  }
  return 0.0;
}

namespace {

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
        const double start = std::max(free[r], ready), c = pipe_cost_of(a, k);
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

// Messages of one kind from one rank to another arrive in the order sent.
std::string check_link_order(const PipeProgram& p) {
  const auto P = static_cast<size_t>(p.pp);
  auto at = [&](int kind, int from, int to) {
    return (static_cast<size_t>(kind) * P + static_cast<size_t>(from)) * P + static_cast<size_t>(to);
  };
  // For each (kind, from, to): the messages in the sender's order, as the
  // (chunk, micro-batch) that receives each; then the receivers' order.
  std::vector<std::vector<std::pair<int, int>>> sent(2 * P * P);
  for (size_t r = 0; r < p.ranks.size(); ++r)
    for (const PipeAction& a : p.ranks[r])
      if (const PipeMessage m = pipe_send(p, a))
        sent[at(m.kind, static_cast<int>(r), m.peer)].push_back({a.chunk + (m.kind == 0 ? 1 : -1), a.micro});
  std::vector<size_t> next(sent.size(), 0);
  for (size_t r = 0; r < p.ranks.size(); ++r)
    for (const PipeAction& a : p.ranks[r]) {
      const PipeMessage m = pipe_receive(p, a);
      if (!m) continue;
      const size_t i = at(m.kind, m.peer, static_cast<int>(r));
      if (next[i] >= sent[i].size() || sent[i][next[i]] != std::pair{a.chunk, a.micro})
        return fmt::format("rank {} receives for {} out of the order rank {} sends in ({} are received in the order "
                           "they are sent)",
                           r, pipe_action_name(a), m.peer, m.kind == 0 ? "activations" : "gradients");
      ++next[i];
    }
  return "";
}

}  // namespace

int PipeSlots::local(int chunk) const {
  const auto it = std::find(chunks.begin(), chunks.end(), chunk);
  DPT_CHECK(it != chunks.end(), "chunk {} is not on this rank", chunk);
  return static_cast<int>(it - chunks.begin());
}

PipeSlots pipe_slot_table(const PipeProgram& p, int rank) {
  PipeSlots t;
  for (int c = 0; c < p.chunks(); ++c)
    if (p.rank_of_chunk[static_cast<size_t>(c)] == rank) t.chunks.push_back(c);
  const size_t n = t.chunks.size(), M = static_cast<size_t>(p.micro_batches);
  t.of.assign(n, std::vector<int>(M, -1));
  t.free_at.assign(n, std::vector<int>(M, -1));
  t.count.assign(n, 0);
  std::vector<std::vector<int>> freed_by(n);  // per local chunk: for each slot, the op that last freed it
  std::vector<std::vector<char>> busy(n);
  const auto& ops = p.ranks[static_cast<size_t>(rank)];
  const bool split = std::any_of(ops.begin(), ops.end(), [](const PipeAction& a) { return a.kind == Kind::W; });
  for (size_t k = 0; k < ops.size(); ++k) {
    const PipeAction& a = ops[k];
    const auto i = static_cast<size_t>(t.local(a.chunk));
    const auto m = static_cast<size_t>(a.micro);
    if (a.kind == Kind::F) {
      size_t s = 0;
      while (s < busy[i].size() && busy[i][s]) ++s;
      if (s == busy[i].size()) busy[i].push_back(0), freed_by[i].push_back(-1);
      busy[i][s] = 1;
      t.of[i][m] = static_cast<int>(s);
      t.free_at[i][m] = freed_by[i][s];
      t.count[i] = std::max(t.count[i], static_cast<int>(s) + 1);
    } else if (a.kind == Kind::W || a.kind == Kind::BW || (a.kind == Kind::B && !split)) {
      const auto s = static_cast<size_t>(t.of[i][m]);
      busy[i][s] = 0;
      freed_by[i][s] = static_cast<int>(k);
    }
  }
  return t;
}

double pipe_bubble_of(const PipeProgram& p) {
  const double pp = p.pp, M = p.micro_batches;
  if (p.schedule == "gpipe" || p.schedule == "1f1b") return (pp - 1) / (M + pp - 1);
  if (p.schedule == "interleaved") return (pp - 1) / (p.v * M + pp - 1);
  return simulate_pipe_program(p, PipeCosts{}).idle[0];  // F = B = W = 1, transfers free
}

PipeMessage pipe_send(const PipeProgram& p, const PipeAction& a) {
  const int own = p.rank_of_chunk[static_cast<size_t>(a.chunk)];
  const int to = a.kind == Kind::F && a.chunk + 1 < p.chunks() ? a.chunk + 1
                 : (a.kind == Kind::B || a.kind == Kind::BW) && a.chunk > 0 ? a.chunk - 1
                                                                           : -1;
  if (to < 0 || p.rank_of_chunk[static_cast<size_t>(to)] == own) return {};
  return {a.kind == Kind::F ? 0 : 1, p.rank_of_chunk[static_cast<size_t>(to)]};
}

PipeMessage pipe_receive(const PipeProgram& p, const PipeAction& a) {
  const int own = p.rank_of_chunk[static_cast<size_t>(a.chunk)];
  const int from = a.kind == Kind::F && a.chunk > 0 ? a.chunk - 1
                   : (a.kind == Kind::B || a.kind == Kind::BW) && a.chunk + 1 < p.chunks() ? a.chunk + 1
                                                                                          : -1;
  if (from < 0 || p.rank_of_chunk[static_cast<size_t>(from)] == own) return {};
  return {a.kind == Kind::F ? 0 : 1, p.rank_of_chunk[static_cast<size_t>(from)]};
}

bool pipe_splits_backward(const PipeProgram& p) {
  for (const auto& ops : p.ranks)
    for (const PipeAction& a : ops)
      if (a.kind == Kind::W) return true;
  return false;
}

int pipe_arenas(const PipeProgram& p, int rank) {
  const PipeSlots t = pipe_slot_table(p, rank);
  int n = 0;
  for (int c : t.count) n += c;
  return n;
}

std::string pipe_action_name(const PipeAction& a) {
  return fmt::format("{}(chunk {}, micro {})", kind_name(a.kind), a.chunk, a.micro);
}

PipeCheck check_pipe_program(const PipeProgram& p) {
  PipeCheck out;
  out.error = check_structure(p);
  if (out.error.empty()) out.error = check_link_order(p);
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
