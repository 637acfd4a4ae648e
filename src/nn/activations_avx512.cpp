#include "nn/activations_avx512.h"

#include <atomic>
#include <cstdlib>

// Compiled for AVX-512 with BF16 alone (no x86-64 level includes it) and
// run only where the CPU has it (enabled()), as nn/flash_attention.cpp's
// vdpbf16ps tiles.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DPT_AVX512_ACTIVATIONS 1
#include <immintrin.h>
#endif

namespace dpt::avx512_activations {

namespace {
std::atomic<bool> turned_off{false};
}  // namespace

void set_off(bool off) { turned_off.store(off); }

#if defined(DPT_AVX512_ACTIVATIONS)

bool enabled() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bf16");
  return has && !turned_off.load(std::memory_order_relaxed);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
// GCC 12's headers build vrcp14ps, vscalefps and vreduceps from an
// "undefined" source vector and then warn that it may be used
// uninitialized; the instructions write every lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
// GELU: sigmoid(z) with z = x (a + b x^2), a = 2 sqrt(2/pi), b = a 0.044715;
// 1 + e^-z = 1 + 2^y with y = x (kA + kB x^2).
constexpr float kGeluA = 2.0f * 0.7978845608028654f;
constexpr float kGeluB = kGeluA * 0.044715f;
constexpr float kGeluYA = -kGeluA * kLog2e;
constexpr float kGeluYB = -kGeluB * kLog2e;
// The forwards need no clamp: past the exponent's range vscalefps gives 0
// or infinity (an infinite y too: vreduceps gives it f = 0), so the sigmoid
// is 1 or 0 and the output x or -0. The backwards multiply 1 - s by x z'
// (GELU) or g (SiLU), which would be infinity x 0 far out: they read x
// clamped where the sigmoid is already 0 or 1 in fp32 (GELU past |x| = 20,
// where 2^y is 2^+-869; SiLU past |g| = 100, 2^+-144).
constexpr float kGeluClamp = 20.0f;
constexpr float kSiluClamp = 100.0f;

inline __m512 splat(float v) { return _mm512_set1_ps(v); }

inline __m512 clamp(__m512 x, float c) {
  // vmaxps returns its second operand where either is NaN: a NaN stays.
  return _mm512_min_ps(splat(c), _mm512_max_ps(splat(-c), x));
}

// 2^y = 2^f 2^floor(y): f = y - floor(y) from vreduceps (imm 0x09: round
// down, no precision exception), 2^f from a degree-4 polynomial on [0, 1)
// (Chebyshev nodes: within 3.5e-6, relative), and vscalefps multiplying by
// 2^floor(y), which goes to 0 or infinity past the exponent's range.
inline __m512 exp2_of(__m512 y) {
  const __m512 f = _mm512_reduce_ps(y, 0x09);
  __m512 p = splat(1.367030945e-02f);
  p = _mm512_fmadd_ps(p, f, splat(5.174499750e-02f));
  p = _mm512_fmadd_ps(p, f, splat(2.416043580e-01f));
  p = _mm512_fmadd_ps(p, f, splat(6.929728985e-01f));
  p = _mm512_fmadd_ps(p, f, splat(1.000003457e+00f));
  return _mm512_scalef_ps(p, y);
}

// The sigmoid 1 / (1 + e) (0 where e is infinite).
inline __m512 sigmoid(__m512 e) { return _mm512_rcp14_ps(_mm512_add_ps(splat(1.0f), e)); }

// The sigmoid and its complement 1 - s = e / (1 + e), taken as e s: well
// conditioned where s is near 1, where 1 - s would cancel. Where e is
// infinite e s is NaN, which vminps (returning its second operand on a NaN)
// makes 1.
struct Sigmoid {
  __m512 s, one_minus_s;
};
inline Sigmoid sigmoid_and_complement(__m512 e) {
  const __m512 s = sigmoid(e);
  return {s, _mm512_min_ps(_mm512_mul_ps(e, s), splat(1.0f))};
}

// GELU's 2^y (e^-z) at x and x^2.
inline __m512 gelu_exp2(__m512 x, __m512 x2) {
  return exp2_of(_mm512_mul_ps(x, _mm512_fmadd_ps(splat(kGeluYB), x2, splat(kGeluYA))));
}
// SiLU's 2^y (e^-g).
inline __m512 silu_exp2(__m512 g) { return exp2_of(_mm512_mul_ps(g, splat(-kLog2e))); }

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline void store(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
inline void store(bf16* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// body(i, mask) over [0, n) in 16-lane vectors, the last one masked.
template <typename Body>
inline void for_vectors(int64_t n, Body body) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) body(i, static_cast<__mmask16>(0xffff));
  if (i < n) body(i, static_cast<__mmask16>((1u << (n - i)) - 1u));
}

}  // namespace

void gelu_forward(bf16* out, const float* inp, int64_t n) {
  for_vectors(n, [&](int64_t i, __mmask16 m) {
    const __m512 x = load(inp + i, m);
    store(out + i, m, _mm512_mul_ps(x, sigmoid(gelu_exp2(x, _mm512_mul_ps(x, x)))));
  });
}

// gelu'(x) = s (1 + x z' (1 - s)), s = sigmoid(z), z' = a + 3 b x^2.
void gelu_backward(float* dx, bf16* dx16, float* acc, const float* dy, const float* x, int64_t n) {
  for_vectors(n, [&](int64_t i, __mmask16 m) {
    const __m512 xc = clamp(load(x + i, m), kGeluClamp);
    const __m512 g = load(dy + i, m);
    const __m512 x2 = _mm512_mul_ps(xc, xc);
    const Sigmoid sg = sigmoid_and_complement(gelu_exp2(xc, x2));
    const __m512 xdz = _mm512_mul_ps(xc, _mm512_fmadd_ps(splat(3.0f * kGeluB), x2, splat(kGeluA)));
    const __m512 d = _mm512_mul_ps(g, _mm512_mul_ps(sg.s, _mm512_fmadd_ps(xdz, sg.one_minus_s, splat(1.0f))));
    if (dx) store(dx + i, m, d);
    store(dx16 + i, m, d);
    store(acc + i, m, _mm512_add_ps(load(acc + i, m), d));
  });
}

void swiglu_forward(bf16* y, const float* g, const float* u, int64_t I) {
  for_vectors(I, [&](int64_t i, __mmask16 m) {
    const __m512 gv = load(g + i, m);
    store(y + i, m, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid(silu_exp2(gv))), load(u + i, m)));
  });
}

// silu'(g) = s (1 + g (1 - s)) at the clamped g (1 past it, or 0).
void swiglu_backward(float* dg, float* du, bf16* dg16, bf16* du16, const float* dy, const float* g, const float* u,
                     int64_t I) {
  for_vectors(I, [&](int64_t i, __mmask16 m) {
    const __m512 gv = load(g + i, m), uv = load(u + i, m), dyv = load(dy + i, m);
    const __m512 gc = clamp(gv, kSiluClamp);
    const Sigmoid sg = sigmoid_and_complement(silu_exp2(gc));
    const __m512 ds = _mm512_mul_ps(sg.s, _mm512_fmadd_ps(gc, sg.one_minus_s, splat(1.0f)));
    const __m512 a = _mm512_mul_ps(_mm512_mul_ps(dyv, uv), ds);
    const __m512 b = _mm512_mul_ps(dyv, _mm512_mul_ps(gv, sg.s));
    if (dg) {
      store(dg + i, m, a);
      store(du + i, m, b);
    }
    store(dg16 + i, m, a);
    store(du16 + i, m, b);
  });
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#else  // no AVX-512 build: the portable paths alone (enabled() is false).

bool enabled() { return false; }
void gelu_forward(bf16*, const float*, int64_t) { std::abort(); }
void gelu_backward(float*, bf16*, float*, const float*, const float*, int64_t) { std::abort(); }
void swiglu_forward(bf16*, const float*, const float*, int64_t) { std::abort(); }
void swiglu_backward(float*, float*, bf16*, bf16*, const float*, const float*, const float*, int64_t) { std::abort(); }

#endif

}  // namespace dpt::avx512_activations
