// The schedules of parallel/pipe_program.h: each a function from the mesh
// and the micro-batch count to every rank's list of operations.
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "parallel/pipe_program.h"

namespace dpt {

namespace {

using Kind = PipeAction::Kind;

PipeProgram shell(const std::string& name, int pp, int v, int M) {
  PipeProgram p;
  p.schedule = name;
  p.pp = pp;
  p.v = v;
  p.micro_batches = M;
  p.ranks.resize(static_cast<size_t>(pp));
  for (int c = 0; c < pp * v; ++c) p.rank_of_chunk.push_back(c % pp);  // interleaved (and v = 1)
  return p;
}

PipeProgram gpipe(int pp, int M) {
  PipeProgram p = shell("gpipe", pp, 1, M);
  for (int r = 0; r < pp; ++r) {
    for (int m = 0; m < M; ++m) p.ranks[static_cast<size_t>(r)].push_back({Kind::F, r, m});
    for (int m = 0; m < M; ++m) p.ranks[static_cast<size_t>(r)].push_back({Kind::BW, r, m});
  }
  return p;
}

// Megatron-LM's interleaved 1F1B; v = 1 is plain 1F1B. Forward number i of
// a rank runs micro-batch group i / (pp v), its local chunk k (pp
// micro-batches per chunk in turn) and micro-batch group x pp + i mod pp;
// backwards the same with the chunks reversed.
PipeProgram one_f_one_b(const std::string& name, int pp, int v, int M) {
  PipeProgram p = shell(name, pp, v, M);
  const int total = v * M;
  for (int r = 0; r < pp; ++r) {
    auto op = [&](Kind kind, int i) {
      const int group = i / (pp * v), within = i % (pp * v), k = within / pp;
      const int chunk = r + (kind == Kind::F ? k : v - 1 - k) * pp;
      return PipeAction{kind, chunk, v == 1 ? i : group * pp + within % pp};
    };
    const int warm = std::min(total, v == 1 ? pp - r - 1 : (pp - r - 1) * 2 + (v - 1) * pp);
    auto& ops = p.ranks[static_cast<size_t>(r)];
    for (int i = 0; i < warm; ++i) ops.push_back(op(Kind::F, i));
    for (int i = 0; i < total - warm; ++i) {
      ops.push_back(op(Kind::F, warm + i));
      ops.push_back(op(Kind::BW, i));
    }
    for (int i = total - warm; i < total; ++i) ops.push_back(op(Kind::BW, i));
  }
  return p;
}

// A zero-bubble schedule built by running it: unit costs, every rank at each
// free moment takes, of what is ready, a W when `w_cap` of them are owed,
// else a B (the critical path; the later chunk first), else an F while
// fewer than its cap of chunk activations are held (the later chunk
// first), else a W (filling what would be idle). Each chunk's F, B and W
// go in micro-batch order.
struct Greedy {
  PipeProgram& p;
  std::vector<int> held_cap, w_cap;
  std::vector<int> nf, nb, nw;      // per chunk: the next micro-batch of each kind
  std::vector<double> f_end, b_end;  // [chunk x M]
  std::vector<int> held, owed;       // per rank
  std::vector<double> free;          // per rank
  PipeCosts costs;

  Greedy(PipeProgram& prog, std::vector<int> hcap, std::vector<int> wcap, PipeCosts k)
      : p(prog), held_cap(std::move(hcap)), w_cap(std::move(wcap)), costs(std::move(k)) {
    const auto S = static_cast<size_t>(p.chunks()), M = static_cast<size_t>(p.micro_batches);
    nf.assign(S, 0), nb.assign(S, 0), nw.assign(S, 0);
    f_end.assign(S * M, -1.0), b_end.assign(S * M, -1.0);
    held.assign(p.ranks.size(), 0), owed.assign(p.ranks.size(), 0), free.assign(p.ranks.size(), 0.0);
  }
  double& fe(int c, int m) { return f_end[static_cast<size_t>(c * p.micro_batches + m)]; }
  double& be(int c, int m) { return b_end[static_cast<size_t>(c * p.micro_batches + m)]; }
  // When an input ended on chunk `from` is on chunk `to`'s rank (< 0: not yet known).
  double arrival(double end, int from, int to) const {
    const bool local = p.rank_of_chunk[static_cast<size_t>(from)] == p.rank_of_chunk[static_cast<size_t>(to)];
    return end < 0 || local ? end : end + costs.transfer;
  }
  // When a's inputs are there (< 0: not yet known).
  double ready(const PipeAction& a) {
    if (a.kind == Kind::F) return a.chunk == 0 ? 0.0 : arrival(fe(a.chunk - 1, a.micro), a.chunk - 1, a.chunk);
    if (a.kind == Kind::W) return be(a.chunk, a.micro);
    const double own = fe(a.chunk, a.micro);
    if (a.chunk == p.chunks() - 1 || own < 0) return own;
    const double grad = arrival(be(a.chunk + 1, a.micro), a.chunk + 1, a.chunk);
    return grad < 0 ? -1.0 : std::max(own, grad);
  }
  // Rank r's candidates of one kind, later chunks first.
  std::vector<PipeAction> candidates(int r, Kind kind) {
    std::vector<PipeAction> out;
    int later = 0;  // the rank's chunks after c: an F on c leaves each of them a slot (else a V can fill
                    // every slot with its first chunk and wait forever for its own second one)
    for (int c = p.chunks() - 1; c >= 0; --c) {
      if (p.rank_of_chunk[static_cast<size_t>(c)] != r) continue;
      const auto i = static_cast<size_t>(c);
      const int m = kind == Kind::F ? nf[i] : kind == Kind::B ? nb[i] : nw[i];
      const bool left = m < p.micro_batches && (kind != Kind::W || m < nb[i]);
      if (left && (kind != Kind::F || held[static_cast<size_t>(r)] < held_cap[static_cast<size_t>(r)] - later))
        out.push_back({kind, c, m});
      ++later;
    }
    return out;
  }
  bool forwards_left(int r) const {
    for (int c = 0; c < p.chunks(); ++c)
      if (p.rank_of_chunk[static_cast<size_t>(c)] == r && nf[static_cast<size_t>(c)] < p.micro_batches) return true;
    return false;
  }
  // Rank r's choice at time t, if any is ready by then.
  bool choose(int r, double t, PipeAction* out) {
    const auto ri = static_cast<size_t>(r);
    std::vector<std::vector<PipeAction>> order = {candidates(r, Kind::B), candidates(r, Kind::F),
                                                  candidates(r, Kind::W)};
    // W's are owed memory; once the rank's last F has run, no new activation comes and a B converts
    // one held into one owed, so W's wait behind B's without raising the peak.
    if (owed[ri] >= w_cap[ri] && forwards_left(r)) order.insert(order.begin(), candidates(r, Kind::W));
    for (const auto& kind : order)
      for (const PipeAction& a : kind)
        if (const double at = ready(a); at >= 0 && at <= t) return *out = a, true;
    return false;
  }
  // The earliest time rank r could start something (infinity: nothing yet).
  double next_time(int r) {
    double best = std::numeric_limits<double>::infinity();
    for (Kind k : {Kind::B, Kind::F, Kind::W})
      for (const PipeAction& a : candidates(r, k))
        if (const double at = ready(a); at >= 0) best = std::min(best, std::max(at, free[static_cast<size_t>(r)]));
    return best;
  }
  void take(int r, const PipeAction& a, double t) {
    const auto ri = static_cast<size_t>(r), ci = static_cast<size_t>(a.chunk);
    p.ranks[ri].push_back(a);
    free[ri] = t + pipe_cost_of(a, costs);
    if (a.kind == Kind::F) ++nf[ci], ++held[ri], fe(a.chunk, a.micro) = free[ri];
    if (a.kind == Kind::B) ++nb[ci], --held[ri], ++owed[ri], be(a.chunk, a.micro) = free[ri];
    if (a.kind == Kind::W) ++nw[ci], --owed[ri];
  }
  void run() {
    const size_t total = static_cast<size_t>(3 * p.chunks() * p.micro_batches);
    for (size_t done = 0; done < total; ++done) {
      int best = -1;
      double t = std::numeric_limits<double>::infinity();
      for (int r = 0; r < p.pp; ++r)
        if (const double at = next_time(r); at < t) best = r, t = at;
      PipeAction a;
      DPT_CHECK(best >= 0 && choose(best, t, &a), "the {} schedule's builder found nothing to run", p.schedule);
      take(best, a, t);
    }
  }
};

PipeProgram zero_bubble(const std::string& name, int pp, int v, int M, const PipeCosts& costs) {
  PipeProgram p = shell(name, pp, v, M);
  std::vector<int> held_cap, w_cap;
  if (v == 2) {
    for (int c = 0; c < 2 * pp; ++c) p.rank_of_chunk[static_cast<size_t>(c)] = c < pp ? c : 2 * pp - 1 - c;
    held_cap.assign(static_cast<size_t>(pp), 2 * pp);  // 1f1b's peak in blocks: pp stages of 2 chunks
    w_cap.assign(static_cast<size_t>(pp), pp);
  } else {
    for (int r = 0; r < pp; ++r) {
      held_cap.push_back(pp - r);                // 1f1b's
      w_cap.push_back(std::max(1, pp - r - 1));  // the last stage runs F B W in turn
    }
  }
  // Built with the chunks' own costs and with unit costs, the one whose
  // simulated step (with the chunks' costs) is shorter: the greedy choice
  // is a heuristic, and either build can win (ties keep the unit one).
  PipeProgram unit = p;
  Greedy(unit, held_cap, w_cap, PipeCosts{}).run();
  Greedy(p, held_cap, w_cap, costs).run();
  return simulate_pipe_program(p, costs).step < simulate_pipe_program(unit, costs).step ? p : unit;
}

}  // namespace

int pipe_virtual_stages(const std::string& schedule, int v) {
  if (v > 0) return v;
  return schedule == "interleaved" || schedule == "zb-v" ? 2 : 1;
}

std::vector<std::string> pipe_program_names() { return {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}; }

PipeProgram pipe_program(const std::string& schedule, int pp, int v, int M, const PipeCosts& costs) {
  if (pp < 1 || M < 1) throw InputError(fmt::format("a pipeline needs pp >= 1 and micro-batches >= 1, not {} and {}", pp, M));
  const bool one_chunk = schedule == "gpipe" || schedule == "1f1b" || schedule == "zb-h1";
  if (one_chunk && v != 1)
    throw InputError(fmt::format("--pp-schedule {} holds one chunk per rank, not --virtual-stages {}", schedule, v));
  if (schedule == "gpipe") return gpipe(pp, M);
  if (schedule == "1f1b") return one_f_one_b("1f1b", pp, 1, M);
  if (schedule == "zb-h1") return zero_bubble("zb-h1", pp, 1, M, costs);
  if (schedule == "interleaved") {
    if (v < 2) throw InputError(fmt::format("--pp-schedule interleaved needs --virtual-stages 2 or more, not {}", v));
    if (M % pp != 0)
      throw InputError(fmt::format("--pp-schedule interleaved runs micro-batches in groups of pp: {} micro-batches "
                                   "are not a multiple of --pp {}",
                                   M, pp));
    return one_f_one_b("interleaved", pp, v, M);
  }
  if (schedule == "zb-v") {
    if (v != 2) throw InputError(fmt::format("--pp-schedule zb-v holds two chunks per rank (a V), not {}", v));
    return zero_bubble("zb-v", pp, 2, M, costs);
  }
  throw InputError(fmt::format("unknown pipeline schedule '{}' (expected gpipe, 1f1b, interleaved, zb-h1 or zb-v)",
                               schedule));
}

}  // namespace dpt
