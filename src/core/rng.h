// Seeded, reproducible randomness. mt19937_64 gives the same stream on every
// platform; the distributions are written here (not std::) because the
// standard leaves their algorithms to the library.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace dpt {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  uint64_t next() { return gen_(); }
  // Uniform in [0, 1) with 24 bits of precision.
  float uniform() { return static_cast<float>(gen_() >> 40) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return gen_() % n; }
  // Standard normal by Box-Muller.
  float normal() {
    double u1 = (static_cast<double>(gen_() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  std::mt19937_64 gen_;
};

}  // namespace dpt
