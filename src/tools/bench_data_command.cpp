// `dpt bench data`: how fast the training path reads windows from token
// shards (open and check, then the sampler's batches), so it can be set
// against what a training run consumes (bench/data_bench.py, docs/data.md).
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "data/shard_sampler.h"
#include "data/token_shards.h"
#include "io/atomic_file.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace dpt {

using Clock = std::chrono::steady_clock;

BenchDataCommand::BenchDataCommand(CLI::App& app) {
  CLI::App* bench = bench_subcommand(app);
  cmd_ = bench->add_subcommand("data", "read training windows from token shards as fast as the sampler can");
  cmd_->add_option("--data", data_, "token shards: file, directory or glob")->required();
  cmd_->add_option("--data-format", format_, "llmc or u16 (default: llmc)")->check(CLI::IsMember({"llmc", "u16"}));
  // Checked here: a context of 0 divided by zero in the windows' count
  // (SIGFPE), and a NaN or negative --seconds read nothing.
  cmd_->add_option("--vocab", vocab_, "tokens must be below this")->capture_default_str()->check(positive());
  cmd_->add_option("--context", context_, "window length T (windows hold T + 1 tokens)")
      ->capture_default_str()
      ->check(positive());
  cmd_->add_option("--batch", batch_, "windows per step (the global batch)")->capture_default_str()->check(positive());
  cmd_->add_option("--seconds", seconds_, "how long to read")->capture_default_str()->check(positive());
  cmd_->add_option("--json", json_, "write the results as JSON");
}

int BenchDataCommand::run() {
  const auto t0 = Clock::now();
  const TokenShards shards(data_, parse_token_format(format_.empty() ? "llmc" : format_), vocab_);
  const double open_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const ShardWindows windows(shards, context_);
  ShardSampler sampler(windows, batch_, 0);
  Batch b;
  int64_t steps = 0;
  const auto t1 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds_) {
    for (int i = 0; i < 64; ++i, ++steps) sampler.next(b, batch_);
    elapsed = std::chrono::duration<double>(Clock::now() - t1).count();
  }
  const double tokens_per_s = static_cast<double>(steps * batch_ * context_) / elapsed;
  const double bytes = static_cast<double>(shards.total_tokens()) * 2.0;
  std::printf("%s: %lld tokens in %zu shards, opened and checked in %.2f s (%.2f GB/s)\n", data_.c_str(),
              static_cast<long long>(shards.total_tokens()), shards.count(), open_s, bytes / open_s / 1e9);
  std::printf("sampler: %lld steps of %lld windows of %lld tokens in %.2f s: %.3g tokens/s; peak RSS %.1f MiB\n",
              static_cast<long long>(steps), static_cast<long long>(batch_), static_cast<long long>(context_ + 1),
              elapsed, tokens_per_s, static_cast<double>(peak_rss_bytes()) / (1 << 20));
  if (!json_.empty()) {
    nlohmann::json j = {{"data", data_},           {"shards", shards.count()},  {"tokens", shards.total_tokens()},
                        {"open_check_s", open_s},  {"context", context_},       {"batch", batch_},
                        {"steps", steps},          {"seconds", elapsed},        {"tokens_per_s", tokens_per_s},
                        {"peak_rss", peak_rss_bytes()}};
    AtomicFile f(json_);
    f.write(j.dump(2) + "\n");
    f.commit();
  }
  return 0;
}

}  // namespace dpt
