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

// Counter-based randomness: the value for element `index` of stream `seed`
// is a pure function of the two (SplitMix64's finaliser over a Weyl
// sequence), so any range of a large tensor can be filled on its own, by any
// rank, in any order, and equals the same range filled as part of the whole.
inline uint64_t counter_bits(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0xD1B54A32D192ED03ULL + (index + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) with 24 bits, for element `index`.
inline float counter_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(counter_bits(seed, index) >> 40) * (1.0f / 16777216.0f);
}
// Standard normal for element `index` (Box-Muller on two 53-bit uniforms
// drawn from the two halves of the element's own pair of counters).
inline float counter_normal(uint64_t seed, uint64_t index) {
  const double u1 = (static_cast<double>(counter_bits(seed, 2 * index) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = static_cast<double>(counter_bits(seed, 2 * index + 1) >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace dpt
