// Running a shell command from a test: stdout, stderr, exit status and wall
// time. Shared by the tests that drive the `dpt` binary.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "device/device.h"
#include "io/safetensors.h"

namespace dpt::test {

// The binary under test (every target that includes this file defines
// DPT_BINARY_DIR, the build folder).
inline std::string dpt_bin() { return std::string(DPT_BINARY_DIR) + "/dpt"; }

// What a --device cuda run that the other flags rule out says: `built`
// where this dpt has CUDA; a build without it (a machine without the CUDA
// toolkit, as a fresh Debian machine is) refuses the device first.
inline std::string cuda_refusal(const std::string& built) { return cuda_built() ? built : "built without CUDA"; }

struct RunResult {
  int code = -1;  // exit status; 128 + signal if killed
  std::string out, err;
  double seconds = 0;
  std::string all() const { return out + err; }
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Quotes a path for /bin/sh.
inline std::string q(const std::filesystem::path& p) { return fmt::format("'{}'", p.string()); }

// Runs `cmd` with /bin/sh; stderr goes through a file in `scratch`. With
// limit_s > 0 the command runs under timeout(1) and is killed after it.
inline RunResult run_shell(const std::string& cmd, const std::filesystem::path& scratch, int limit_s = 0) {
  static int counter = 0;
  const std::filesystem::path err_path = scratch / fmt::format("stderr_{}.txt", counter++);
  const std::string line = limit_s > 0 ? fmt::format("timeout -k 5 {} {} 2> {}", limit_s, cmd, q(err_path))
                                       : fmt::format("{} 2> {}", cmd, q(err_path));
  RunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(line.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(status))
    r.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    r.code = 128 + WTERMSIG(status);
  r.err = read_file(err_path);
  std::filesystem::remove(err_path);
  return r;
}

// A refusal as a multi-rank run prints it: exit 1, nothing on stdout, and
// every rank that reports an error reports the same sentence, `says` in it.
inline void expect_one_refusal(const RunResult& r, const std::string& says) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  std::istringstream in(r.err);
  std::string first, line;
  int lines = 0;
  while (std::getline(in, line)) {
    const size_t at = line.find("error: ");  // after "dpt[rank r]: "
    if (at == std::string::npos) continue;
    line = line.substr(at);
    if (first.empty()) first = line;
    EXPECT_EQ(line, first);
    ++lines;
  }
  EXPECT_GE(lines, 1) << r.err;
  EXPECT_EQ(r.out, "");
}

// A text of `count` words drawn from `words` by a fixed generator, so every
// run of a test reads the same corpus.
inline void write_word_corpus(const std::filesystem::path& path, const std::vector<std::string>& words,
                              int count = 20000) {
  std::ofstream text(path);
  uint64_t x = 1;
  for (int i = 0; i < count; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text << words[(x >> 33) % words.size()] << ' ';
  }
}

// `dpt train --data DATA <args>` on n ranks (`dpt launch` for n > 1), one
// thread each, the engine's settings from the environment removed.
inline RunResult train_ranks(const std::filesystem::path& dpt, int n, const std::filesystem::path& data,
                             const std::string& args, const std::filesystem::path& scratch, int limit_s) {
  const std::string env = "env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_CHECK OMP_NUM_THREADS=1 "
                          "DPT_COMM_TIMEOUT=60";
  const std::string launcher = n == 1 ? "" : fmt::format("{} launch -n {} -- ", q(dpt), n);
  return run_shell(fmt::format("{} {}{} train --data {} {}", env, launcher, q(dpt), q(data), args), scratch,
                   limit_s);
}

// Logged losses by step from a run's metrics file, STEM.jsonl (a resumed
// run logs from its checkpoint's step on).
inline std::map<int64_t, double> logged_losses(const std::filesystem::path& stem) {
  std::map<int64_t, double> out;
  std::istringstream in(read_file(stem.string() + ".jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// Every loss run a logs within r x |b's| of run b's at the same step, and
// both logs ending at the same step.
inline void expect_losses_within(const std::filesystem::path& a, const std::filesystem::path& b, double r) {
  const std::map<int64_t, double> la = logged_losses(a), lb = logged_losses(b);
  ASSERT_FALSE(la.empty()) << a;
  EXPECT_EQ(la.rbegin()->first, lb.rbegin()->first);
  for (const auto& [step, loss] : la) {
    ASSERT_TRUE(lb.count(step)) << "step " << step;
    EXPECT_LE(std::fabs(loss - lb.at(step)), r * std::fabs(lb.at(step))) << "step " << step;
  }
}

// Every element of every tensor of the weights file a within r of b's
// (per tensor, max|a - b| <= r x max|b|; r = 0: the same values), every
// value finite; returns the worst tensor's max|a - b| / max|b|.
inline double expect_tensors_within(const std::filesystem::path& a, const std::filesystem::path& b, double r) {
  const SafetensorsFile fa = load_safetensors(a.string()), fb = load_safetensors(b.string());
  EXPECT_EQ(fa.tensors.size(), fb.tensors.size());
  double worst = 0.0;
  for (const NamedTensor& tb : fb.tensors) {
    const NamedTensor* ta = fa.find(tb.name);
    if (ta == nullptr || ta->shape != tb.shape) {
      ADD_FAILURE() << tb.name << " missing or of another shape in " << a;
      continue;
    }
    double diff = 0.0, peak = 0.0;
    for (size_t i = 0; i < tb.data.size(); ++i) {
      EXPECT_TRUE(std::isfinite(ta->data[i])) << tb.name;
      peak = std::max(peak, std::fabs(static_cast<double>(tb.data[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(ta->data[i]) - tb.data[i]));
    }
    EXPECT_LE(diff, r * peak) << tb.name << " of " << a << " against " << b;
    worst = std::max(worst, peak > 0 ? diff / peak : diff);
  }
  return worst;
}

}  // namespace dpt::test
