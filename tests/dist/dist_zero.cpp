// Multi-rank tests of ZeRO stages 1, 2 and 3 (parallel/zero.cpp): run_training
// on N ranks under every stage against DDP and against one process with the
// global batch; the bytes each rank accounts (WORKLOADS.md, W-GPT-L's table);
// the bytes each rank sends per step (WORKLOADS.md, "Communication volume per
// step"); save and load across strategies; the memory estimate's refusal.
//
//   mpirun -n 3 dist_zero
//
// As in dist_ddp: every rank runs every test in the same order and issues the
// same collectives whatever its checks find (EXPECT, never ASSERT, between
// collectives); reference runs happen on rank 0 alone on a world of one while
// the other ranks wait at a barrier; rank 0 reads the saved weights and
// compares them; at the end the ranks agree on a failure flag.
//
// Exactness. With N = 2 every reduced gradient element is one fp32 addition
// of two partial sums, a + b, whichever rank performs it and whether it is a
// bucket's all-reduce or a unit's reduce-scatter; the optimizers are
// elementwise, so a shard steps exactly as the same elements of a full
// buffer. Hence at N = 2, without clipping, zero1/2/3 must be BITWISE equal
// to DDP. Clipping breaks that on purpose: DDP sums the squared gradients
// over one buffer in one order, ZeRO per shard and then across ranks, so the
// clip factor may differ in its last bit. Gradient accumulation that
// reduce-scatters every micro-step computes (a1 + b1) + (a2 + b2) where DDP
// computes (a1 + a2) + (b1 + b2): bitwise only where the stage accumulates
// locally (zero1 always; zero2/3 with accumulate_locally). At N >= 3 the
// ring adds three or more terms, in an order that depends on the chunk
// boundaries (buckets under DDP, units under ZeRO): a tolerance, justified
// at kMlpTol and kGptTol.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/fashion_mnist.h"
#include "dist_main.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "parallel/rank_bytes.h"
#include "parallel/reducer.h"
#include "parallel/strategy.h"
#include "train/train.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"

namespace dpt {
namespace {

using comm::chunk_range;
using comm::ProcessGroup;

ProcessGroup* g_pg = nullptr;
ProcessGroup* g_self = nullptr;  // rank 0 only: a world of one for references
uint64_t g_job = 0;              // rank 0's pid on every rank: shared file names
ProcessGroup& pg() { return *g_pg; }
int world() { return g_pg->size(); }
int me() { return g_pg->rank(); }

template <class... Args>
void measure(fmt::format_string<Args...> f, Args&&... args) {
  if (me() != 0) return;
  std::printf("[ measure  ] N=%d %s\n", world(), fmt::format(f, std::forward<Args>(args)...).c_str());
  std::fflush(stdout);
}

// ---------------------------------------------------------------- files

std::vector<std::string> g_files;  // removed at exit by rank 0

std::string temp_path(const std::string& tag) {
  const char* dir = std::getenv("TMPDIR");
  std::string p = fmt::format("{}/dist_zero_{}_{}", dir && *dir ? dir : "/tmp", g_job, tag);
  g_files.push_back(p);
  return p;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The first 6000 training and 1000 test images of Fashion-MNIST, unpacked
// (plain IDX files) into a directory of their own by rank 0: the MLP runs
// read them in milliseconds instead of inflating 30 MB each, and evaluate
// on 1000 images instead of 10000. The same real images, only fewer.
std::string g_mnist_dir;

void write_be32(std::ofstream& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
  out.write(b, 4);
}

void write_mnist_subset(const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& [split, prefix, count] : {std::tuple{"train", "train", 6000}, {"test", "t10k", 1000}}) {
    const ImageSet set = load_fashion_mnist(kFashionMnistDir, split);
    const size_t n = static_cast<size_t>(std::min<int64_t>(count, set.count));
    const size_t px = static_cast<size_t>(set.rows) * static_cast<size_t>(set.cols);
    std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
    for (uint32_t v : {0x803u, static_cast<uint32_t>(n), static_cast<uint32_t>(set.rows),
                       static_cast<uint32_t>(set.cols)})
      write_be32(images, v);
    images.write(reinterpret_cast<const char*>(set.pixels.data()), static_cast<std::streamsize>(n * px));
    std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
    for (uint32_t v : {0x801u, static_cast<uint32_t>(n)}) write_be32(labels, v);
    labels.write(reinterpret_cast<const char*>(set.labels.data()), static_cast<std::streamsize>(n));
  }
}

using Weights = std::map<std::string, std::vector<float>>;  // tensor name -> values

Weights read_weights(const std::string& path) {
  Weights w;
  SafetensorsFile f = load_safetensors(path);
  for (NamedTensor& t : f.tensors) w[t.name] = std::move(t.data);
  return w;
}

// ---------------------------------------------------------------- comparing

struct Diff {
  double max_rel = 0;     // max over tensors of max|a - b| / max(1, max|a|), finite elements
  std::string worst;      // the tensor with max_rel
  size_t differing = 0;   // elements not bitwise equal, non-finite ones included
  size_t nonfinite = 0;   // elements that are NaN or infinite on either side
  size_t total = 0;
};

// nullopt: not the same tensors and shapes. A NaN or an infinity on either
// side is counted in nonfinite (and differing) and never scores a
// difference of 0: a comparison only passes with nonfinite == 0.
std::optional<Diff> compare(const Weights& a, const Weights& b) {
  if (a.size() != b.size() || a.empty()) return std::nullopt;
  Diff d;
  for (const auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != va.size()) return std::nullopt;
    const std::vector<float>& vb = it->second;
    double peak = 1.0, worst = 0.0;
    for (size_t i = 0; i < va.size(); ++i) {
      const float x = va[i], y = vb[i];
      if (!std::isfinite(x) || !std::isfinite(y)) {
        ++d.nonfinite;
        ++d.differing;
        continue;
      }
      peak = std::max(peak, static_cast<double>(std::fabs(x)));
      worst = std::max(worst, std::fabs(static_cast<double>(x) - static_cast<double>(y)));
      if (std::memcmp(&x, &y, sizeof(float)) != 0) ++d.differing;
    }
    d.total += va.size();
    if (worst / peak >= d.max_rel) {
      d.max_rel = worst / peak;
      d.worst = name;
    }
  }
  return d;
}

// The parameters of two runs, on rank 0: finite everywhere, within tol
// (relative to max(1, max|a|) per tensor), and bitwise equal if asked.
void expect_close(const Weights& got, const Weights& want, double tol, bool bitwise, const std::string& what) {
  if (me() != 0) return;
  std::optional<Diff> d = compare(got, want);
  if (!d) {
    ADD_FAILURE() << what << ": the two runs saved different tensors (or none)";
    return;
  }
  measure("{}: max relative {:.3e} ({}), {} of {} differ{}", what, d->max_rel, d->worst, d->differing, d->total,
          d->differing == 0 ? " (bitwise equal)" : "");
  EXPECT_EQ(d->nonfinite, 0u) << what << ": NaN or infinity in the parameters";
  EXPECT_LE(d->max_rel, tol) << what << ": worst tensor " << d->worst;
  if (bitwise) {
    EXPECT_EQ(d->differing, 0u) << what << ": expected bitwise equality (worst " << d->worst << ")";
  }
}

TEST(Compare, NonFiniteValuesNeverCompareEqual) {
  const float nan = std::nanf(""), inf = INFINITY;
  const Weights a = {{"w", {1.0f, nan}}}, b = {{"w", {1.0f, nan}}}, c = {{"w", {1.0f, 2.0f}}},
                d = {{"w", {inf, 2.0f}}};
  const std::vector<std::pair<const Weights*, const Weights*>> cases = {{&a, &b}, {&a, &c}, {&c, &a}, {&d, &c}, {&d, &d}};
  for (const auto& [x, y] : cases) {
    const auto diff = compare(*x, *y);
    ASSERT_TRUE(diff.has_value());
    EXPECT_GT(diff->nonfinite, 0u);
    EXPECT_GT(diff->differing, 0u);
  }
  const auto same = compare(c, c);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->nonfinite, 0u);
  EXPECT_EQ(same->differing, 0u);
  EXPECT_EQ(same->max_rel, 0.0);
  EXPECT_FALSE(compare(c, Weights{{"v", {1.0f, 2.0f}}}).has_value());
  EXPECT_FALSE(compare(c, Weights{{"w", {1.0f}}}).has_value());
}

// ---------------------------------------------------------------- workloads

// MLP 784 -> 29 -> 13 -> 10 (SGD with momentum 0.9): units of 22765, 390 and
// 140 elements. 22765 is odd and leaves 1 over 3 and 4, 390 leaves 2 over 4,
// 140 leaves 2 over 3: every N has uneven shards (UnevenShards checks).
constexpr const char* kMlpSizes = "784,29,13,10";
constexpr int64_t kMlpSteps = 4, kMlpPerRank = 16;
// GPT of width 25 (5 heads of 5), 2 blocks, context 15, vocabulary 256
// (AdamW): units embed (256 + 15) * 25 = 6775, two blocks of
// 12 * 25^2 + 13 * 25 = 7825, ln_f 50. The embedding and the blocks leave
// 1 over 2 and 3 and 3 or 1 over 4; ln_f 2 over 3 and 4.
const std::map<std::string, std::string> kGptHparams = {
    {"n_layer", "2"}, {"n_embd", "25"}, {"n_head", "5"}, {"block_size", "15"}};
constexpr int64_t kGptSteps = 3, kGptPerRank = 2;

enum class Net { Mlp, Decoder };
struct Workload {
  Net net = Net::Mlp;
  float clip = 0.0f;
  int64_t accum = 1;
  DType precision = DType::F32;
  DType reduce = DType::F32;  // --reduce-dtype
  bool bf16() const { return precision == DType::BF16; }
  std::string key() const {
    return fmt::format("{}_clip{}_accum{}{}{}", net == Net::Mlp ? "mlp" : "gpt", clip, accum, bf16() ? "_bf16" : "",
                       reduce == DType::BF16 ? "_reducebf16" : "");
  }
};

// The clips are well below the gradient norms of these runs (0.38 to 0.63
// for the MLP, 1.6 to 2.0 for the GPT, measured at N = 2, 3, 4; every
// reference run checks that each step's norm is above twice the clip), so
// every step clips.
constexpr float kMlpClip = 0.05f, kGptClip = 0.1f;

TrainOptions options(const Workload& s, int ranks) {
  TrainOptions o;
  if (s.net == Net::Mlp) {
    o.model = "mlp";
    o.hparams = {{"sizes", kMlpSizes}};
    o.data = g_mnist_dir;
    o.steps = kMlpSteps;
    o.batch = kMlpPerRank * ranks;
    o.seed = 11;
  } else {
    o.model = "gpt";
    o.hparams = kGptHparams;
    o.steps = kGptSteps;
    o.batch = kGptPerRank * ranks;
    o.seed = 5;
    o.val_fraction = 0.0;  // no evaluation: not what is tested here
  }
  o.clip = s.clip;
  o.grad_accum = s.accum;
  o.precision = s.precision;
  o.ddp.reduce_dtype = s.reduce;
  // Only the last step logs: its loss all-reduce and (ZeRO) its gradient
  // norm all-gather are the only collectives besides the strategy's.
  o.log_every = 1000;
  o.quiet = true;
  return o;
}

struct Variant {
  const char* name;
  const char* strategy;
  bool scatter = false;      // zero1: reduce-scatter instead of DDP's buckets
  bool local_accum = false;  // zero2/3: accumulate micro-steps locally
  bool reshard = true;       // zero3
  const char* prefetch = "both";
  int shard_group = 0;       // hsdp
  int stage() const { return strategy[0] == 'z' ? strategy[4] - '0' : (strategy[0] == 'h' ? 3 : 0); }
  // Gradients of micro-steps summed locally before one reduction, as DDP.
  bool accumulates_locally() const { return stage() <= 1 || local_accum; }
};
const Variant kDdp{.name = "ddp", .strategy = "ddp"};
const Variant kZero1{.name = "zero1", .strategy = "zero1"};
const Variant kZero1Scatter{.name = "zero1-scatter", .strategy = "zero1", .scatter = true};
const Variant kZero2{.name = "zero2", .strategy = "zero2"};
const Variant kZero2Local{.name = "zero2-local", .strategy = "zero2", .local_accum = true};
const Variant kZero3{.name = "zero3", .strategy = "zero3"};
const Variant kZero3Keep{.name = "zero3-keep", .strategy = "zero3", .reshard = false};
const Variant kZero3NoPrefetch{.name = "zero3-noprefetch", .strategy = "zero3", .prefetch = "none"};
const Variant kZero3Local{.name = "zero3-local", .strategy = "zero3", .local_accum = true};

const std::vector<Variant> kAllStages = {kZero1, kZero1Scatter, kZero2, kZero3, kZero3Keep, kZero3NoPrefetch};

void apply(const Variant& v, TrainOptions& o) {
  o.strategy = v.strategy;
  o.zero_scatter = v.scatter;
  o.zero_accumulate_locally = v.local_accum;
  o.reshard_after_forward = v.reshard;
  o.prefetch = parse_prefetch(v.prefetch);
  o.shard_group = v.shard_group;
}

// ---------------------------------------------------------------- runs

struct TrainRun {
  bool ok = false;
  Weights weights;     // rank 0
  std::string saved;   // the file (kept until exit)
  TrainResult result;  // this rank
  std::map<std::string, comm::OpStats> ledger;  // this rank's collectives during the run
  std::vector<double> grad_norms;               // references: every step's (pre-clip) norm
  double seconds = 0;
};

// Runs are computed on first use and kept: the first use is the same test
// on every rank, so the collectives stay in step.
std::map<std::string, TrainRun> g_runs;

const TrainRun& run(const Workload& s, const Variant& v) {
  const std::string key = s.key() + "_" + v.name;
  if (auto it = g_runs.find(key); it != g_runs.end()) return it->second;
  TrainOptions o = options(s, world());
  apply(v, o);
  o.save = temp_path(key + ".safetensors");
  TrainRun r;
  r.saved = o.save;
  const auto before = pg().ledger().snapshot();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r.result = run_training(o, pg());
    r.ok = true;
    if (me() == 0) r.weights = read_weights(o.save);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << me() << ": " << key << " threw: " << e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.ledger = comm::difference(pg().ledger().snapshot(), before);
  return g_runs[key] = std::move(r);
}

// One process with the global batch, on rank 0 (the others wait). It logs
// every step, so its metrics give each step's gradient norm before clipping.
const TrainRun& reference(const Workload& s) {
  const std::string key = s.key() + "_local";
  if (auto it = g_runs.find(key); it != g_runs.end()) return it->second;
  TrainOptions o = options(s, world());
  o.strategy = "local";
  o.log_every = 1;
  o.save = temp_path(key + ".safetensors");
  o.metrics_out = temp_path(key + ".jsonl");
  TrainRun r;
  r.saved = o.save;
  const auto t0 = std::chrono::steady_clock::now();
  if (me() == 0) {
    try {
      r.result = run_training(o, *g_self);
      r.ok = true;
      r.weights = read_weights(o.save);
      std::ifstream in(o.metrics_out);
      for (std::string line; std::getline(in, line);)
        r.grad_norms.push_back(nlohmann::json::parse(line)["grad_norm"].get<double>());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "reference " << key << " threw: " << e.what();
    }
  }
  pg().barrier();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g_runs[key] = std::move(r);
}

// ---------------------------------------------------------------- equivalence

// Tolerances on max|a - b| / max(1, max|a|) per tensor (parameters here are
// below 1, so in effect absolute), as in dist_ddp: the runs differ only in
// the order of fp32 additions (see the top of this file), each reordering
// moving a gradient element by a few ulps (~1e-7 relative). Measured on the
// 2-core test machine (OpenBLAS, one thread per rank) at N = 2, 3, 4, with
// clipping and accumulation, and set at about ten times the measurement:
//   MLP (SGD with momentum, 4 steps of lr 0.05): at most 1.5e-8 against DDP
//   and against one process alike (3.0e-8 on the full training set): one
//   or two ulps of the largest parameters (about 0.3; an ulp in
//   [0.125, 0.25) is 1.5e-8). SGD's updates are linear in the gradients,
//   so nothing amplifies them. kMlpTol = 1e-7 (dist_ddp's), while one step
//   moves a parameter by lr * |g| ~ 1e-4: a wrong shard, a missing
//   reduction or a wrong scale shows at once.
//   GPT (AdamW, 3 steps of lr 3e-4): AdamW divides each update by
//   sqrt(v) + eps, so an element whose gradient is a near-cancelling sum
//   (tiny beside its terms) carries the summation error of those terms into
//   a fraction of its update, up to lr. Against DDP, ZeRO's own error: at
//   most 5.9e-7 (N = 4, accumulation); kGptTol = 5e-6, 60 times below one
//   step's lr. Against one process with the global batch the error is
//   DDP's own as well (dist_ddp's subject): at most 5.3e-6 (N = 4, DDP and
//   zero1 alike, transformer.h.0.mlp.c_proj.weight); kGptLocalTol = 5e-5,
//   still 6 times below one step's lr on any single element, and a wrong
//   gradient moves thousands of elements by about lr.
constexpr double kMlpTol = 1e-7;
constexpr double kGptTol = 5e-6;
constexpr double kGptLocalTol = 5e-5;

// bf16 mixed precision: the masters, the gradients and their reductions are
// fp32, but each step computes on bf16 copies of the masters, so an fp32
// difference of an ulp between two runs (the order of additions, as above)
// becomes a whole bf16 ulp of a weight (2^-8 relative) wherever it moves a
// master across a rounding boundary, and the next step's gradients carry
// it everywhere. Measured: at N = 2 and 3 no worse than fp32 (at most
// 9.2e-7), at N = 4 with accumulation 2.9e-5 against DDP and one process
// alike (21,874 of 22,475 elements differ, none by more). kBf16Tol = 1e-4:
// three times that, a third of one step's lr; a wrong or missing
// reduction moves elements by about lr.
constexpr double kBf16Tol = 1e-4;

double tol(const Workload& s) { return s.bf16() ? kBf16Tol : s.net == Net::Mlp ? kMlpTol : kGptTol; }
double local_tol(const Workload& s) { return s.bf16() ? kBf16Tol : s.net == Net::Mlp ? kMlpTol : kGptLocalTol; }

void check_equivalence(const Workload& s, const std::vector<Variant>& variants) {
  const TrainRun& local = reference(s);
  const TrainRun& ddp = run(s, kDdp);
  EXPECT_TRUE(ddp.ok);
  if (me() == 0 && local.ok) {
    EXPECT_EQ(local.grad_norms.size(), static_cast<size_t>(local.result.steps));
    if (s.clip > 0) {  // every step clipped: the clip is part of what is compared
      measure("{} gradient norms before clipping: {:.3f}", s.key(), fmt::join(local.grad_norms, ", "));
      for (double g : local.grad_norms) EXPECT_GT(g, 2.0 * s.clip) << s.key();
    }
    expect_close(ddp.weights, local.weights, local_tol(s), false, s.key() + " ddp vs local");
  }
  for (const Variant& v : variants) {
    const TrainRun& z = run(s, v);
    EXPECT_TRUE(z.ok) << v.name;
    if (me() != 0 || !z.ok) continue;
    const bool bitwise = world() == 2 && s.clip == 0.0f && (s.accum == 1 || v.accumulates_locally());
    if (ddp.ok) expect_close(z.weights, ddp.weights, tol(s), bitwise, s.key() + " " + v.name + " vs ddp");
    if (local.ok) expect_close(z.weights, local.weights, local_tol(s), false, s.key() + " " + v.name + " vs local");
    // The same samples: the losses agree to fp32 noise.
    EXPECT_NEAR(z.result.final_loss, ddp.result.final_loss, 1e-5 * std::fabs(ddp.result.final_loss)) << v.name;
  }
}

TEST(Equivalence, UnevenShards) {
  // The models above have units whose chunks differ in size at this N.
  for (const Net net : {Net::Mlp, Net::Decoder}) {
    auto model = make_model(model_hparams(options({.net = net}, world())));
    size_t uneven = 0;
    for (const Unit& u : model->layout().units())
      if (chunk_range(u.numel, world(), 0).size != chunk_range(u.numel, world(), world() - 1).size) ++uneven;
    EXPECT_GE(uneven, 1u) << (net == Net::Mlp ? "mlp" : "gpt");
    measure("{}: {} of {} units have uneven shards", net == Net::Mlp ? "mlp" : "gpt", uneven,
            model->layout().units().size());
  }
}

TEST(Equivalence, MlpSgd) { check_equivalence({.net = Net::Mlp}, kAllStages); }

TEST(Equivalence, MlpSgdClipped) {
  check_equivalence({.net = Net::Mlp, .clip = kMlpClip}, {kZero1, kZero1Scatter, kZero2, kZero3});
}

TEST(Equivalence, MlpSgdGradAccum2) {
  const Workload s{.net = Net::Mlp, .accum = 2};
  check_equivalence(s, {kZero1, kZero1Scatter, kZero2, kZero2Local, kZero3, kZero3Local});
  // And against DDP without accumulation: the same samples, summed in
  // another grouping.
  if (me() == 0)
    for (const Variant& v : {kZero2, kZero2Local, kZero3, kZero3Local})
      expect_close(run(s, v).weights, run({.net = Net::Mlp}, kDdp).weights, kMlpTol, false,
                   fmt::format("mlp {} grad_accum 2 vs ddp grad_accum 1", v.name));
}

TEST(Equivalence, GptAdamW) { check_equivalence({.net = Net::Decoder}, kAllStages); }

// hsdp: ZeRO-3 inside shard groups, gradient shards all-reduced across the
// groups. Every shard group size that divides the world: 1 (no sharding,
// all replicas), the world (zero3 itself) and any between.
std::vector<Variant> hsdp_variants() {
  static std::vector<std::string> names;
  std::vector<Variant> v;
  names.reserve(8);
  for (int sg = 1; sg <= world(); ++sg)
    if (world() % sg == 0) {
      names.push_back(fmt::format("hsdp-sg{}", sg));
      v.push_back({.name = names.back().c_str(), .strategy = "hsdp", .shard_group = sg});
    }
  return v;
}

TEST(Equivalence, GptAdamWHsdp) { check_equivalence({.net = Net::Decoder}, hsdp_variants()); }

TEST(Equivalence, MlpSgdGradAccum2Hsdp) { check_equivalence({.net = Net::Mlp, .accum = 2}, hsdp_variants()); }


TEST(Equivalence, GptAdamWClipped) {
  check_equivalence({.net = Net::Decoder, .clip = kGptClip}, {kZero1, kZero1Scatter, kZero2, kZero3});
}

// bf16 mixed precision under every strategy, against DDP and one process
// in bf16 (and, in Precision.*, against fp32).
TEST(Equivalence, MlpSgdBf16) { check_equivalence({.net = Net::Mlp, .precision = DType::BF16}, kAllStages); }

TEST(Equivalence, GptAdamWBf16) { check_equivalence({.net = Net::Decoder, .precision = DType::BF16}, kAllStages); }

TEST(Equivalence, GptAdamWBf16GradAccum2) {
  check_equivalence({.net = Net::Decoder, .accum = 2, .precision = DType::BF16}, {kZero1, kZero2, kZero3, kZero3Local});
}

// --reduce-dtype bf16: every strategy's reductions sum the same bf16
// values, each addition rounded; at N = 2 that is one addition per element,
// so the strategies agree bit for bit. From N = 3 the ring adds in an order
// set by the chunking (DDP's buckets, ZeRO's units), each order rounds its
// own way, and AdamW's first steps (updates of about lr x sign(g)) turn a
// gradient that is rounding noise into a step of lr either way: measured at
// most 3.06e-4 (one lr) at N = 3 and 4, on 9,894 to 16,544 of 22,475
// elements. kReduceBf16Tol = 1e-3 only bounds that; the loss, against one
// process in fp32 reductions, is what shows the sums are right.
constexpr double kReduceBf16Tol = 1e-3;

TEST(Equivalence, GptAdamWReduceBf16) {
  for (const DType precision : {DType::F32, DType::BF16}) {
    const Workload s{.net = Net::Decoder, .precision = precision, .reduce = DType::BF16};
    const TrainRun& ddp = run(s, kDdp);
    const TrainRun& local = reference({.net = Net::Decoder, .precision = precision});
    ASSERT_TRUE(ddp.ok);
    // DDP holds the gradients' bf16 copy for its buckets.
    auto model = make_model(model_hparams(options(s, world())));
    EXPECT_EQ(ddp.result.memory.scratch, model->param_count() * sizeof(bf16));
    for (const Variant& v : {kZero1, kZero1Scatter, kZero2, kZero3}) {
      const TrainRun& z = run(s, v);
      EXPECT_TRUE(z.ok) << v.name;
      if (me() != 0 || !z.ok) continue;
      expect_close(z.weights, ddp.weights, world() == 2 ? 0.0 : kReduceBf16Tol, world() == 2,
                   s.key() + " " + v.name + " vs ddp");
      if (local.ok) {
        EXPECT_NEAR(z.result.final_loss, local.result.final_loss, 2e-3 * local.result.final_loss) << v.name;
      }
    }
  }
}

TEST(Equivalence, GptAdamWGradAccum2) {
  check_equivalence({.net = Net::Decoder, .accum = 2}, {kZero1, kZero1Scatter, kZero2, kZero2Local, kZero3, kZero3Local});
}

// ---------------------------------------------------------------- memory

size_t max_unit(const Layout& layout) {
  size_t m = 0;
  for (const Unit& u : layout.units()) m = std::max(m, u.numel);
  return m;
}

size_t shard_of(const Layout& layout, int rank) {
  size_t n = 0;
  for (const Unit& u : layout.units()) n += chunk_range(u.numel, world(), rank).size;
  return n;
}

// What this rank accounts after a run (TrainResult.memory) against
// WORKLOADS.md's table with the exact shard: Ψ parameters, this rank's
// shard S = sum over units of chunk_range(unit, N, rank), k bytes of
// optimizer state per parameter (AdamW m and v: 8; SGD momentum: 4):
//   DDP    4Ψ + 4Ψ + kΨ
//   zero1  4Ψ + 4Ψ + kS
//   zero2  4Ψ + 4S + kS, + scratch: the reused unit-gradient buffers
//   zero3  4S + 4S + kS, + gathered: the buffers of gathered units
//          (+ the same scratch as zero2)
// Accumulating locally (zero2/3) adds the full gradients, 4Ψ, instead of
// the scratch. Scratch and gather buffers are allocated at the sizes of the
// units that first ask for them and reused (zero.cpp's BufferPool): scratch
// holds at least the largest unit and at most 3 of its size (the unit being
// computed, the tied embedding waiting for its second contribution, one
// being reduced: zero.cpp's kGradBuffers); gathered holds at least the
// largest unit and at most the whole model, and exactly the whole model
// without resharding (every unit stays gathered from its forward to its
// backward).
void check_memory(const Workload& s, const Variant& v) {
  const TrainRun& r = run(s, v);
  if (!r.ok) return;  // already failed
  TrainOptions o = options(s, world());
  apply(v, o);
  apply_defaults(o);
  auto model = make_model(model_hparams(o));
  model->set_precision(o.precision);  // the estimate follows the model's precision
  const Layout& layout = model->layout();
  const size_t P = layout.numel() * 4, S = shard_of(layout, me()) * 4, M = max_unit(layout) * 4;
  const size_t k = o.optimizer.name == "adamw" ? 2 : 1;
  const int stage = v.stage();
  // bf16 (WORKLOADS.md's mixed-precision table): parameters are 2-byte
  // copies, the fp32 masters join the optimizer state (k + 1 floats).
  const bool mixed = s.bf16();
  const size_t param_bytes = (stage == 3 ? S : P) / (mixed ? 2 : 1), kk = k + (mixed ? 1 : 0);
  const MemoryBytes& got = r.result.memory;
  const std::string what = fmt::format("rank {} {} {}", me(), s.key(), v.name);
  EXPECT_EQ(got.parameters, param_bytes) << what;
  EXPECT_EQ(got.gradients, (stage <= 1 ? P : S) + (stage >= 2 && v.local_accum ? P : 0)) << what;
  EXPECT_EQ(got.optimizer, kk * (stage == 0 ? P : S)) << what;
  if (stage >= 2 && !v.local_accum) {
    EXPECT_GE(got.scratch, M) << what;
    EXPECT_LE(got.scratch, 3 * M) << what;
  } else {
    EXPECT_EQ(got.scratch, 0u) << what;
  }
  // A gathered bf16 unit of n elements takes (n + 1) / 2 floats.
  size_t all_units = 0;
  for (const Unit& u : layout.units()) all_units += 4 * (mixed ? (u.numel + 1) / 2 : u.numel);
  const size_t largest = 4 * (mixed ? (M / 4 + 1) / 2 : M / 4);
  if (stage == 3 && !v.reshard) {
    EXPECT_EQ(got.gathered, all_units) << what;
  } else if (stage == 3) {
    EXPECT_GE(got.gathered, largest) << what;
    EXPECT_LE(got.gathered, all_units) << what;
  } else {
    EXPECT_EQ(got.gathered, 0u) << what;
  }
  // The estimate (before anything is allocated) uses rank 0's shard, the
  // largest (chunk_range puts the larger chunks first): exact on rank 0, an
  // upper bound on the others.
  const MemoryBytes est = rank_bytes(strategy_options(o), *model, world());
  const size_t S0 = shard_of(layout, 0) * 4;
  EXPECT_EQ(est.parameters, (stage == 3 ? S0 : P) / (mixed ? 2 : 1)) << what;
  EXPECT_EQ(est.gradients, (stage <= 1 ? P : S0) + (stage >= 2 && v.local_accum ? P : 0)) << what;
  EXPECT_EQ(est.optimizer, kk * (stage == 0 ? P : S0)) << what;
  EXPECT_GE(S0, S) << what;
  if (me() == 0) {
    EXPECT_EQ(est.parameters, got.parameters) << what;
    EXPECT_EQ(est.gradients, got.gradients) << what;
    EXPECT_EQ(est.optimizer, got.optimizer) << what;
  }
  // The pools are reserved at the estimate's sizes on every rank and never
  // grow: equal, not merely bounded.
  EXPECT_EQ(est.scratch, got.scratch) << what;
  EXPECT_EQ(est.gathered, got.gathered) << what;
  if (me() == 0)
    measure("memory {} {}: parameters {} gradients {} optimizer {} gathered {} scratch {} (estimate {} {} {} {} {})",
            s.key(), v.name, got.parameters, got.gradients, got.optimizer, got.gathered, got.scratch, est.parameters,
            est.gradients, est.optimizer, est.gathered, est.scratch);
}

TEST(Memory, AccountedBytesMatchTheTable) {
  for (const Workload& s : {Workload{.net = Net::Mlp}, Workload{.net = Net::Decoder}})
    for (const Variant& v : {kDdp, kZero1, kZero1Scatter, kZero2, kZero3, kZero3Keep, kZero3NoPrefetch})
      check_memory(s, v);
  for (const Workload& s : {Workload{.net = Net::Mlp, .accum = 2}, Workload{.net = Net::Decoder, .accum = 2}})
    for (const Variant& v : {kZero2, kZero2Local, kZero3, kZero3Local}) check_memory(s, v);
  for (const Workload& s : {Workload{.net = Net::Mlp, .precision = DType::BF16},
                            Workload{.net = Net::Decoder, .precision = DType::BF16}})
    for (const Variant& v : {kDdp, kZero1, kZero1Scatter, kZero2, kZero3, kZero3Keep, kZero3NoPrefetch})
      check_memory(s, v);
  check_memory({.net = Net::Decoder, .accum = 2, .precision = DType::BF16}, kZero3Local);
}

// ---------------------------------------------------------------- communication

// Bytes this rank sends in the engine's ring collectives on a buffer of m
// floats (comm/ring.cpp; on one host ring position = rank): the
// reduce-scatter sends every chunk but its own, the all-gather every chunk
// but its next neighbour's, the all-reduce both; chunks by chunk_range.
uint64_t rs_bytes(size_t m, size_t elem = 4) { return elem * (m - chunk_range(m, world(), me()).size); }
uint64_t ag_bytes(size_t m, size_t elem = 4) { return elem * (m - chunk_range(m, world(), (me() + 1) % world()).size); }
uint64_t ar_bytes(size_t m, size_t elem = 4) { return rs_bytes(m, elem) + ag_bytes(m, elem); }

struct Volume {
  uint64_t per_step = 0;        // every step once prefetching has its recorded order
  uint64_t first_step = 0;      // extra bytes in the run's first step
  uint64_t last_step = 0;       // extra bytes of the logged last step
  uint64_t reduce_scatter = 0;  // per step, of per_step
  // per_step split by the phase each collective is issued in (the ledger's
  // phases): forward, backward, optimizer (the table's three columns).
  uint64_t forward = 0, backward = 0, optimizer = 0;
};

// WORKLOADS.md's "Communication volume per step" with the exact ring
// chunking, per rank, for a model of units u (Σ over them):
//   DDP    all-reduce of every bucket                      2Ψ(N-1)/N
//   zero1  the same (or a reduce-scatter per unit), then an all-gather
//          per unit of the updated parameters              3Ψ(N-1)/N (2Ψ(N-1)/N)
//   zero2  reduce-scatter per unit + all-gather per unit   2Ψ(N-1)/N
//   zero3  forward: all-gather per unit; backward: all-gather per unit +
//          reduce-scatter per unit                         3Ψ(N-1)/N
// with grad_accum micro-steps: zero2/3 reduce-scatter every micro-step
// (unless accumulating locally) and zero3 gathers every micro-step.
// The named extras, besides this table:
//   - zero3 keeps the unit forward opens last (the MLP's last layer, the
//     GPT's embedding, opened again for the tied output projection) for the
//     backward that opens it first: it is not gathered again in backward,
//     except in the run's first step, before the order is recorded.
//   - zero3, GPT: the tied embedding is opened twice in forward (embedding,
//     then output projection) and twice in backward (output projection,
//     then embedding): resharded in between, it is gathered twice in
//     forward, and in backward a second time at the end. Without resharding
//     it stays gathered through forward, but backward frees it after the
//     output projection and gathers it again for the embedding's gradient.
//   - the logged last step: the loss all-reduce (one float) and, under
//     ZeRO, the gradient-norm all-gather (one double per rank, as 2 floats).
Volume expected_volume(const Workload& s, const Variant& v) {
  TrainOptions o = options(s, world());
  apply(v, o);
  auto model = make_model(model_hparams(o));
  const Layout& layout = model->layout();
  const auto& units = layout.units();
  const bool gpt = s.net == Net::Decoder;
  // The unit forward opens last: kept for backward (see above).
  const size_t kept = gpt ? units.front().numel : units.back().numel;
  const size_t embed = units.front().numel;
  // Parameter all-gathers move bf16 in a mixed-precision run: half the bytes.
  const size_t pe = s.bf16() ? 2 : 4;
  auto pag = [&](size_t m) { return ag_bytes(m, pe); };
  // Gradient reductions move bf16 with --reduce-dtype bf16.
  const size_t re = s.reduce == DType::BF16 ? 2 : 4;
  uint64_t rs = 0, ag = 0;
  for (const Unit& u : units) {
    rs += rs_bytes(u.numel, re);
    ag += pag(u.numel);
  }
  const uint64_t micro = static_cast<uint64_t>(s.accum);
  Volume vol;
  uint64_t buckets = 0;
  for (const Bucket& b : Reducer::assign(layout, o.ddp)) buckets += ar_bytes(b.numel, re);
  switch (v.stage()) {
    case 0:
      vol.backward = buckets;
      break;
    case 1:
      vol.reduce_scatter = v.scatter ? rs : 0;
      vol.backward = v.scatter ? rs : buckets;
      vol.optimizer = ag;
      break;
    case 2:
      vol.reduce_scatter = v.local_accum ? rs : micro * rs;
      vol.backward = vol.reduce_scatter;
      vol.optimizer = ag;
      break;
    case 3: {
      vol.reduce_scatter = v.local_accum ? rs : micro * rs;
      if (v.reshard) {
        vol.forward = micro * (ag + (gpt ? pag(embed) : 0));
        vol.backward = micro * (ag - pag(kept) + (gpt ? pag(embed) : 0));
        vol.first_step = pag(kept);
      } else {
        vol.forward = micro * ag;
        vol.backward = micro * (gpt ? pag(embed) : 0);
      }
      vol.backward += vol.reduce_scatter;
      break;
    }
  }
  vol.per_step = vol.forward + vol.backward + vol.optimizer;
  vol.last_step = ar_bytes(1) + (v.stage() > 0 ? ag_bytes(2 * static_cast<size_t>(world())) : 0);
  return vol;
}

void check_volume(const Workload& s, const Variant& v) {
  const TrainRun& r = run(s, v);
  if (!r.ok) return;
  const Volume vol = expected_volume(s, v);
  const uint64_t steps = static_cast<uint64_t>(r.result.steps);
  const std::string what = fmt::format("rank {} {} {}", me(), s.key(), v.name);
  // TrainResult.comm_bytes_per_step: the ledger's bytes over the steps,
  // divided by the steps (integer division, as the engine does). Every
  // term is a multiple of 4 bytes, so with 3 or 4 steps any float too many
  // or too few in a step changes it.
  EXPECT_EQ(r.result.comm_bytes_per_step, (steps * vol.per_step + vol.first_step + vol.last_step) / steps) << what;
  // Reduce-scatters happen nowhere but in the steps: exact per op.
  const auto it = r.ledger.find("reduce_scatter");
  const uint64_t rs = it == r.ledger.end() ? 0 : it->second.bytes_sent;
  EXPECT_EQ(rs, steps * vol.reduce_scatter) << what;
  // By phase: the first step's extra gather is backward's, the logged last
  // step's gradient-norm all-gather the optimizer's, its loss average
  // "other" (the evaluation and logging phase).
  auto phase = [&](const char* name) {
    const auto p = r.result.comm_bytes_per_phase.find(name);
    return p == r.result.comm_bytes_per_phase.end() ? uint64_t{0} : p->second;
  };
  const uint64_t norm = v.stage() > 0 ? ag_bytes(2 * static_cast<size_t>(world())) : 0;
  EXPECT_EQ(phase("forward"), vol.forward) << what;
  EXPECT_EQ(phase("backward"), (steps * vol.backward + vol.first_step) / steps) << what;
  EXPECT_EQ(phase("optimizer"), (steps * vol.optimizer + norm) / steps) << what;
  EXPECT_EQ(phase("other"), ar_bytes(1) / steps) << what;
  if (me() == 0) {
    // The table's ideal (for Ψ bytes of gradients, Ψ(N-1)/N per pass)
    // beside it, for the record.
    TrainOptions o = options(s, world());
    auto model = make_model(model_hparams(o));
    const double psi = 4.0 * static_cast<double>(model->param_count()) * (world() - 1) / world();
    measure("bytes/step {} {}: {} ({:.3f} x Psi(N-1)/N), reduce-scatter {}", s.key(), v.name,
            r.result.comm_bytes_per_step, static_cast<double>(r.result.comm_bytes_per_step) / psi, rs / steps);
  }
}

bool exact_ring() {
  if (pg().config().algo != comm::Algo::Ring) return false;
  const auto& h = pg().hosts();
  return std::all_of(h.begin(), h.end(), [&](const std::string& x) { return x == h.front(); });
}

TEST(CommVolume, LedgerBytesPerStepMatchTheTable) {
  if (!exact_ring()) GTEST_SKIP() << "the exact figures are those of the ring algorithms on one host";
  for (const Workload& s : {Workload{.net = Net::Mlp}, Workload{.net = Net::Decoder}})
    for (const Variant& v : {kDdp, kZero1, kZero1Scatter, kZero2, kZero3, kZero3Keep, kZero3NoPrefetch})
      check_volume(s, v);
  for (const Workload& s : {Workload{.net = Net::Mlp, .accum = 2}, Workload{.net = Net::Decoder, .accum = 2}})
    for (const Variant& v : {kDdp, kZero1, kZero2, kZero2Local, kZero3, kZero3Local}) check_volume(s, v);
  for (const Workload& s : {Workload{.net = Net::Mlp, .precision = DType::BF16},
                            Workload{.net = Net::Decoder, .precision = DType::BF16},
                            Workload{.net = Net::Decoder, .reduce = DType::BF16},
                            Workload{.net = Net::Decoder, .precision = DType::BF16, .reduce = DType::BF16}})
    for (const Variant& v : {kDdp, kZero1, kZero1Scatter, kZero2, kZero3, kZero3Keep, kZero3NoPrefetch})
      check_volume(s, v);
}

TEST(CommVolume, Bf16HalvesZero3Gathers) {
  // The check in one line: ZeRO-3's parameter all-gathers in bf16
  // are half of fp32's (the reduce-scatters stay fp32).
  if (!exact_ring()) GTEST_SKIP() << "the exact figures are those of the ring algorithms on one host";
  const Workload f{.net = Net::Decoder}, h{.net = Net::Decoder, .precision = DType::BF16};
  const TrainRun &a = run(f, kZero3), &b = run(h, kZero3);
  if (!a.ok || !b.ok) return;
  // Forward moves nothing but parameter all-gathers.
  EXPECT_EQ(2 * b.result.comm_bytes_per_phase.at("forward"), a.result.comm_bytes_per_phase.at("forward"));
  EXPECT_EQ(b.ledger.at("reduce_scatter").bytes_sent, a.ledger.at("reduce_scatter").bytes_sent);
}

TEST(CommVolume, HsdpAddsTheReplicaAllReduce) {
  // The report sums the shard and replica groups' ledgers. hsdp over one
  // shard group of every rank is zero3, byte for byte; over shard groups of
  // one rank at N = 2 it all-reduces every gradient once, as DDP does.
  if (!exact_ring()) GTEST_SKIP() << "the exact figures are those of the ring algorithms on one host";
  for (const Workload& s : {Workload{.net = Net::Mlp}, Workload{.net = Net::Decoder}}) {
    const auto all = hsdp_variants();
    const TrainRun &whole = run(s, all.back()), &z3 = run(s, kZero3);
    if (whole.ok && z3.ok) {
      EXPECT_EQ(whole.result.comm_bytes_per_step, z3.result.comm_bytes_per_step) << s.key() << " hsdp over all ranks";
    }
    if (world() != 2) continue;
    const TrainRun &ones = run(s, all.front()), &ddp = run(s, kDdp);
    if (ones.ok && ddp.ok) {
      EXPECT_EQ(ones.result.comm_bytes_per_step, ddp.result.comm_bytes_per_step) << s.key() << " hsdp over 1-rank groups";
    }
  }
}

TEST(CommVolume, TheTableItself) {
  // The ratios of WORKLOADS.md, from the exact figures, for the MLP (no tied
  // unit): DDP 2, zero1 3 (2 with reduce-scatter), zero2 2, zero3 3 less
  // the one unit kept from forward to backward, each times Ψ(N-1)/N up to
  // the uneven chunks (< 1 element per unit and bucket).
  const Workload s{.net = Net::Mlp};
  auto model = make_model(model_hparams(options(s, world())));
  const double psi = 4.0 * static_cast<double>(model->param_count()) * (world() - 1) / world();
  const double last = 4.0 * static_cast<double>(model->layout().units().back().numel) * (world() - 1) / world();
  const double slack = 4.0 * 16;  // a few floats: uneven chunks
  EXPECT_NEAR(expected_volume(s, kDdp).per_step, 2 * psi, slack);
  EXPECT_NEAR(expected_volume(s, kZero1).per_step, 3 * psi, slack);
  EXPECT_NEAR(expected_volume(s, kZero1Scatter).per_step, 2 * psi, slack);
  EXPECT_NEAR(expected_volume(s, kZero2).per_step, 2 * psi, slack);
  EXPECT_NEAR(expected_volume(s, kZero3).per_step, 3 * psi - last, slack);
  EXPECT_NEAR(expected_volume(s, kZero3Keep).per_step, 2 * psi, slack);
}

// ---------------------------------------------------------------- save and load

// Writes the model's weights as run_training's --save does: every rank
// takes part in each unit's gather, rank 0 writes the file.
void save_through(Strategy& strategy, const Model& model, const std::string& path) {
  const Layout& layout = model.layout();
  std::optional<SafetensorsWriter> file;
  if (me() == 0) {
    std::vector<TensorSpec> specs;
    for (const Slot& s : layout.slots()) specs.push_back({s.name, DType::F32, s.shape});
    file.emplace(path, std::move(specs), model.metadata());
  }
  FlatBuffer unit(max_unit(layout));
  for (size_t u = 0; u < layout.units().size(); ++u) {
    strategy.gather_unit(static_cast<int>(u), unit.f32());
    if (file) file->write(unit.f32(), layout.units()[u].numel);
  }
  if (file) file->commit();
}

// Builds the model and `v`'s strategy on `group` from seed or file, and
// saves what it holds to a new file; returns its path.
std::string resave(const TrainOptions& base, const Variant& v, ProcessGroup& group, const std::string& load,
                   const std::string& tag) {
  TrainOptions o = base;
  apply(v, o);
  apply_defaults(o);
  StrategyOptions so = strategy_options(o);
  auto model = make_model(model_hparams(o));
  auto strategy = make_strategy(so, *model, group, {o.seed, load});
  const std::string path = temp_path(tag);
  save_through(*strategy, *model, path);  // on a world of one: rank 0 alone
  return path;
}

void check_save_load(const Workload& s) {
  const TrainOptions o = options(s, world());
  const std::string net = s.net == Net::Mlp ? "mlp" : "gpt";
  // 1. The initial weights: every strategy writes the very same file (zero3
  //    each rank from its own shards, DDP rank 0's full copy, broadcast),
  //    and it holds Model::init_params(seed).
  std::map<std::string, std::string> init;
  for (const Variant& v : {kDdp, kZero1, kZero2, kZero3}) init[v.name] = resave(o, v, pg(), "", net + "_init_" + v.name);
  if (me() == 0) {
    const std::string want = file_bytes(init["ddp"]);
    EXPECT_GT(want.size(), 0u);
    for (const auto& [name, path] : init) EXPECT_EQ(file_bytes(path), want) << net << " initial weights saved by " << name;
    auto model = make_model(model_hparams(o));
    model->init_params(o.seed);
    const Weights w = read_weights(init["zero3"]);
    EXPECT_EQ(w.size(), model->layout().slots().size());
    for (const Slot& sl : model->layout().slots()) {
      const auto it = w.find(sl.name);
      const bool same = it != w.end() && it->second.size() == sl.numel &&
                        std::memcmp(it->second.data(), model->params() + sl.offset, sl.numel * 4) == 0;
      EXPECT_TRUE(same) << net << ": " << sl.name << " is not init_params(seed)'s";
    }
  }
  // 2. Trained weights saved under zero3 (the equivalence run), loaded
  //    under every strategy on N ranks and, on rank 0, under local and
  //    zero3 on one rank: saved again, the same bytes.
  const TrainRun& trained = run(s, kZero3);
  EXPECT_TRUE(trained.ok);
  if (!trained.ok) return;
  std::map<std::string, std::string> again;
  for (const Variant& v : {kDdp, kZero1, kZero2, kZero3})
    again[v.name] = resave(o, v, pg(), trained.saved, net + "_again_" + v.name);
  if (me() == 0) {
    const Variant kLocal{.name = "local", .strategy = "local"};
    again["local (1 rank)"] = resave(o, kLocal, *g_self, trained.saved, net + "_again_local");
    again["zero3 (1 rank)"] = resave(o, kZero3, *g_self, trained.saved, net + "_again_zero3_1");
  }
  pg().barrier();
  if (me() == 0) {
    const std::string want = file_bytes(trained.saved);
    EXPECT_GT(want.size(), 0u);
    for (const auto& [name, path] : again)
      EXPECT_EQ(file_bytes(path), want) << net << ": zero3's file loaded under " << name << " and saved again";
    // ... and DDP's file loaded under zero3 on N ranks: the trained DDP run.
  }
  const TrainRun& ddp = run(s, kDdp);
  if (!ddp.ok) return;
  const std::string z3 = resave(o, kZero3, pg(), ddp.saved, net + "_ddp_under_zero3");
  if (me() == 0) {
    EXPECT_EQ(file_bytes(z3), file_bytes(ddp.saved)) << net << ": ddp's file loaded under zero3";
  }
}

TEST(SaveLoad, SameBytesUnderEveryStrategy) {
  check_save_load({.net = Net::Mlp});
  check_save_load({.net = Net::Decoder});
}

// ---------------------------------------------------------------- the estimate refuses

// A GPT of 8 blocks of width 448 (19.4 M parameters): DDP needs about
// 0.3 GiB a rank (the sentence gives MiB below 1 GiB, to one decimal);
// zero3 a third of that or less. One step of one
// synthetic sequence of 16 tokens per rank.
TrainOptions big_gpt() {
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "8"}, {"n_embd", "448"}, {"n_head", "8"}, {"block_size", "16"}};
  o.synthetic = true;
  o.steps = 1;
  o.batch = world();
  o.quiet = true;
  o.seed = 3;
  return o;
}

TEST(MemoryEstimate, RefusesDdpThatCannotFitAndRunsZero3) {
  TrainOptions o = big_gpt();
  apply_defaults(o);
  auto model = make_model(model_hparams(o));
  set_attention(o, *model);  // the run's attention (its default), whose arena it counts
  // As check_memory counts: the estimate plus the activations of one
  // micro-batch, per rank, times the ranks on this host.
  const size_t acts = model->activation_bytes_for(o.batch / world());
  auto need = [&](const char* name) {
    TrainOptions t = o;
    t.strategy = name;
    const MemoryBytes b = rank_bytes(strategy_options(t), *model, world());
    return b.parameters + b.gradients + b.optimizer + b.gathered + b.scratch + acts;
  };
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const size_t here = local_size ? static_cast<size_t>(std::max(1, std::atoi(local_size))) : world();
  const size_t zero3 = need("zero3");
  for (const char* other : {"ddp", "zero1", "zero2"}) EXPECT_GT(need(other), zero3) << other;
  // The budget: exactly what zero3 needs on this host.
  o.memory_budget = here * zero3;
  // The sentence's figures: GiB from 1 GiB up, else MiB, one decimal.
  auto human = [](size_t b) {
    return b >= (size_t{1} << 30) ? fmt::format("{:.1f} GiB", static_cast<double>(b) / (1u << 30))
                                  : fmt::format("{:.1f} MiB", static_cast<double>(b) / (1u << 20));
  };
  o.strategy = "ddp";
  std::string refused;
  try {
    run_training(o, pg());
    ADD_FAILURE() << "rank " << me() << ": ddp ran within a budget of " << o.memory_budget << " bytes";
  } catch (const InputError& e) {
    refused = e.what();
  }
  const std::string want_need = fmt::format("--strategy ddp needs about {} per rank", human(need("ddp")));
  const std::string want_have = fmt::format("but {} is available", human(o.memory_budget));
  const std::string want_fit = fmt::format("--strategy zero3 would fit (about {} per rank)", human(zero3));
  EXPECT_NE(refused.find(want_need), std::string::npos) << refused;
  EXPECT_NE(refused.find(want_have), std::string::npos) << refused;
  EXPECT_NE(refused.find(want_fit), std::string::npos) << refused;
  // One sentence: no line break, no full stop inside (figures have
  // decimal points, never followed by a space).
  EXPECT_EQ(refused.find('\n'), std::string::npos) << refused;
  EXPECT_EQ(refused.find(". "), std::string::npos) << refused;
  EXPECT_NE(human(need("ddp")), human(zero3)) << "figures too close";
  measure("refused: {}", refused);

  // zero3 under the same budget runs.
  o.strategy = "zero3";
  try {
    const TrainResult r = run_training(o, pg());
    EXPECT_EQ(r.steps, 1);
    EXPECT_LE(r.memory.parameters + r.memory.gradients + r.memory.optimizer + r.memory.gathered + r.memory.scratch,
              zero3 - acts);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << me() << ": zero3 was refused within its own estimate: " << e.what();
  }
  // One byte less and nothing fits: zero3 is refused too.
  o.memory_budget = here * zero3 - 1;
  try {
    run_training(o, pg());
    ADD_FAILURE() << "rank " << me() << ": zero3 ran within a budget one byte short of its estimate";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no strategy fits"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpt

int main(int argc, char** argv) {
  using dpt::comm::ProcessGroup;
  std::unique_ptr<ProcessGroup> group, self;
  try {
    group = ProcessGroup::create();
    if (group->rank() == 0) self = ProcessGroup::create_self();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_zero: cannot create the process group: %s\n", e.what());
    return 1;
  }
  dpt::g_pg = group.get();
  dpt::g_self = self.get();
  dpt::set_threads(1);
  // Rank 0's pid names the temporary files, the same on every rank.
  uint64_t job = static_cast<uint64_t>(::getpid());
  group->broadcast(&job, 2, dpt::DType::F32, 0);
  dpt::g_job = job;
  const char* tmp = std::getenv("TMPDIR");
  dpt::g_mnist_dir = fmt::format("{}/dist_zero_{}_fashion_mnist", tmp && *tmp ? tmp : "/tmp", job);
  if (group->rank() == 0) {
    try {
      dpt::write_mnist_subset(dpt::g_mnist_dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dist_zero: cannot write the Fashion-MNIST subset: %s\n", e.what());
    }
  }
  group->barrier();
  const int rc = dpt::test::run_all_ranks(argc, argv, *group, "dist_zero");
  if (group->rank() == 0) {
    for (const std::string& f : dpt::g_files) std::remove(f.c_str());
    std::filesystem::remove_all(dpt::g_mnist_dir);
  }
  dpt::g_pg = nullptr;
  dpt::g_self = nullptr;
  self.reset();
  group.reset();
  return rc;
}
