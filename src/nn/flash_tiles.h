// The tile kernels of nn/flash_attention.cpp, included there twice (so no
// #pragma once): for the build's targets (the fp32 products, and the bf16
// ones through fp32 FMAs) and under AVX-512 BF16 (vdpbf16ps), which GCC
// only inlines into code compiled for that target. Not a header to include
// elsewhere: it uses the types and helpers flash_attention.cpp defines
// before including it.

// C[m][0 .. NV vectors) (+)= sum over word k in [k0, k1) of the pair
// products of A(m, k) = A[m sam + k sak] and B[k][...] (block's, on pairs
// through vdpbf16ps: see the note on Mode::Dp in flash_attention.cpp).
template <typename V, int NV, Mode M>
__attribute__((always_inline)) inline void block_bf16(float* C, int64_t ldc, const word* A, int64_t sam, int64_t sak,
                                                      const word* B, int64_t ldb, int64_t k0, int64_t k1, bool acc) {
  using VU = typename Unaligned<V>::type;
  using W = typename Words<V>::type;
  using WU = typename Words<V>::unaligned;
  constexpr int64_t kL = sizeof(V) / sizeof(float);
  V c[kMR][NV];
#pragma GCC unroll 4
  for (int m = 0; m < kMR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[m][v] = acc ? *reinterpret_cast<const VU*>(C + m * ldc + v * kL) : V{};
  for (int64_t k = k0; k < k1; ++k) {
    W b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const WU*>(B + k * ldb + v * kL);
#if defined(DPT_FLASH_DPBF16)
    static_assert(M == Mode::Dp && sizeof(V) == 64, "vdpbf16ps runs on 16-float vectors");
#pragma GCC unroll 4
    for (int m = 0; m < kMR; ++m) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(A[m * sam + k * sak]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        c[m][v] = reinterpret_cast<V>(_mm512_dpbf16_ps(reinterpret_cast<__m512>(c[m][v]),
                                                       reinterpret_cast<__m512bh>(a),
                                                       reinterpret_cast<__m512bh>(b[v])));
    }
#endif
  }
#pragma GCC unroll 4
  for (int m = 0; m < kMR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<VU*>(C + m * ldc + v * kL) = c[m][v];
}

// block_cols's bf16 twin (A, B and the k range in 32-bit words of pairs),
// in 16-float vectors (vdpbf16ps is AVX-512's).
template <Mode M>
__attribute__((always_inline)) inline void block_cols_bf16(bool, int64_t nv, float* C, int64_t ldc,
                                                           const word* A, int64_t sam, int64_t sak, const word* B,
                                                           int64_t ldb, int64_t k0, int64_t k1, bool acc) {
  for (int64_t v0 = 0; v0 < nv; v0 += 4, C += 4 * kV, B += 4 * kV) switch (std::min<int64_t>(4, nv - v0)) {
      case 1: block_bf16<v16, 1, M>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      case 2: block_bf16<v16, 2, M>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      case 3: block_bf16<v16, 3, M>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      default: block_bf16<v16, 4, M>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
    }
}

// A head's packed copies for its backward (Q scaled; bf16: also in pairs
// of rows), D = rowsum(dO O) (bf16: with the dO the products read, so that
// it matches their rowsum(P dP)), its rows' lse, and dQ and E zeroed.
template <Mode M>
__attribute__((always_inline)) inline void backward_head(const FlashBlock& s, const float* q, const float* dout,
                                                         const float* out, const float* lse, int64_t h, float scale,
                                                         BackScratch& w) {
  const int64_t Tq = s.Tq, hd = s.hd, hdp = hd_padded(s), Tp = round_up(Tq, kTile), ldo = s.out_ld;
  if constexpr (M != Mode::Dp) {
    pack_rows<M == Mode::Widen>(w.q.data(), q + h * hd, s.q_ld, Tq, Tp, hd, hdp, scale);
    pack_rows<M == Mode::Widen>(w.dout.data(), dout + h * hd, ldo, Tq, Tp, hd, hdp, 1.0f);
    if constexpr (M == Mode::Widen) std::fill(w.E.begin(), w.E.end(), 0.0f);
  } else {
#if defined(DPT_FLASH_DPBF16)
    pack_rows_dp(w.qb.data(), q + h * hd, s.q_ld, Tq, Tp, hd, hdp, scale);
    pack_row_pairs_dp(w.q2.data(), q + h * hd, s.q_ld, Tq, Tp, hd, hdp, scale);
    pack_rows_dp(w.dob.data(), dout + h * hd, ldo, Tq, Tp, hd, hdp, 1.0f);
    pack_row_pairs_dp(w.do2.data(), dout + h * hd, ldo, Tq, Tp, hd, hdp, 1.0f);
#endif
    std::fill(w.E.begin(), w.E.end(), 0.0f);
  }
  std::fill(w.dq.begin(), w.dq.end(), 0.0f);
  for (int64_t t = 0; t < Tq; ++t) {  // D = rowsum(dO * O)
    const float* o = out + t * ldo + h * hd;
    prefetch_ahead(out + h * hd, ldo, t, Tq, hd);
    float d = 0.0f;
    if constexpr (M == Mode::F32) {
      for (int64_t c = 0; c < hd; ++c) d += w.dout[static_cast<size_t>(t * hdp + c)] * o[c];
    } else {  // in lanes (see max_in_lanes; the fp32 path's serial sum keeps its bits)
      float part[kV] = {};
      int64_t c = 0;
      for (; c + kV <= hd; c += kV)
#pragma omp simd
        for (int64_t j = 0; j < kV; ++j) part[j] += dout_read<M>(w, t * hdp + c + j) * o[c + j];
      for (; c < hd; ++c) part[0] += dout_read<M>(w, t * hdp + c) * o[c];
      d = fold_sum(part);
    }
    w.D[static_cast<size_t>(t)] = d;
    w.L[static_cast<size_t>(t)] = lse[h * s.lse_T + t];
  }
}

// Key tile [j0, j0 + nj) of key/value head k, v (already offset to it).
template <Mode M>
__attribute__((always_inline)) inline void backward_key_tile(const FlashBlock& s, const float* k, const float* v,
                                                             int64_t j0, int64_t nj, BackScratch& w) {
  const int64_t hd = s.hd, hdp = hd_padded(s);
  if constexpr (M != Mode::Dp) {
    pack_transposed<M == Mode::Widen>(w.kt.data(), k + j0 * s.kv_ld, s.kv_ld, nj, hd);
    pack_transposed<M == Mode::Widen>(w.vt.data(), v + j0 * s.kv_ld, s.kv_ld, nj, hd);
    pack_rows<M == Mode::Widen>(w.k.data(), k + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp, 1.0f);
  } else {
#if defined(DPT_FLASH_DPBF16)
    pack_channel_pairs_dp(w.kt2.data(), k + j0 * s.kv_ld, s.kv_ld, nj, hd, hdp);
    pack_channel_pairs_dp(w.vt2.data(), v + j0 * s.kv_ld, s.kv_ld, nj, hd, hdp);
    pack_row_pairs_dp(w.k2.data(), k + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp, 1.0f);
#endif
  }
  std::fill(w.dk.begin(), w.dk.end(), 0.0f);
  std::fill(w.dv.begin(), w.dv.end(), 0.0f);
}

// The tile pair's P = e^(S - lse) and dS = P (dP - D) from S and dP (in
// w.p, w.ds), rows [0, nip) of query tile i0 (rows ni.. zero); bf16: their
// copies in pairs of rows (P^T and dS^T of dV += P^T dO and dK += dS^T Q
// read them so) and dS row-major (dQ += dS K), and each row's rounding of
// dS added to E.
template <Mode M>
__attribute__((always_inline)) inline void backward_probabilities(const FlashBlock& s, int64_t i0, int64_t ni,
                                                                  int64_t j0, int64_t nj, BackScratch& w) {
  const int64_t nip = round_up(ni, kMR);
  for (int64_t r = 0; r < nip; ++r) {
    float *p = w.p.data() + r * kTile, *ds = w.ds.data() + r * kTile;
    const int64_t live = r < ni ? live_row(i0 + r, s.delta, j0, nj) : 0;
    const float lr = w.L[static_cast<size_t>(i0 + r)], Dr = w.D[static_cast<size_t>(i0 + r)];
    if constexpr (M == Mode::F32) {
#pragma omp simd
      for (int64_t c = 0; c < live; ++c) {
        p[c] = fast_exp(p[c] - lr);
        ds[c] = p[c] * (ds[c] - Dr);
      }
      std::fill(p + live, p + kTile, 0.0f);
      std::fill(ds + live, ds + kTile, 0.0f);
    } else {  // whole vectors, the columns past live masked (see max_in_lanes)
      for (int64_t c = 0; c < live; c += kV)
#pragma omp simd
        for (int64_t j = 0; j < kV; ++j) {
          const float e = fast_exp(p[c + j] - lr);
          const bool seen = c + j < live;
          ds[c + j] = seen ? e * (ds[c + j] - Dr) : 0.0f;
          p[c + j] = seen ? e : 0.0f;
        }
      std::fill(p + round_up(live, kV), p + kTile, 0.0f);
      std::fill(ds + round_up(live, kV), ds + kTile, 0.0f);
      // dS's rounding, kept in lanes per row (E: [Tp][kV]); Widen: P and
      // dS rounded in place (Dp: their bf16 copies, below).
      float* part = w.E.data() + (i0 + r) * kV;
      if constexpr (M == Mode::Widen) {
        for (int64_t c = 0; c < kTile; c += kV)
#pragma omp simd
          for (int64_t j = 0; j < kV; ++j) {
            const float rounded = as_products_read<true>(ds[c + j]);
            part[j] += rounded - ds[c + j];
            ds[c + j] = rounded;
            p[c + j] = as_products_read<true>(p[c + j]);
          }
      } else {
#if defined(DPT_FLASH_DPBF16)
        __m512 e = _mm512_loadu_ps(part);
        for (int64_t c = 0; c < kTile; c += kV) {
          const __m512 x = _mm512_loadu_ps(ds + c);
          const __m256i b = bf16x16(x);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.dsb.data() + r * kTile + c), b);
          e = _mm512_add_ps(e, _mm512_sub_ps(widened16(b), x));
        }
        _mm512_storeu_ps(part, e);
#endif
      }
    }
  }
#if defined(DPT_FLASH_DPBF16)
  if constexpr (M == Mode::Dp) {  // P and dS in pairs of rows
    for (int64_t r = 0; r < nip; r += 2) {
      const float *p = w.p.data() + r * kTile, *ds = w.ds.data() + r * kTile;
      for (int64_t c = 0; c < kTile; c += kV) {
        const int64_t at = r / 2 * kTile + c;
        _mm512_storeu_si512(w.pt2.data() + at, pair_words16(_mm512_loadu_ps(p + c), _mm512_loadu_ps(p + kTile + c)));
        _mm512_storeu_si512(w.dst2.data() + at,
                            pair_words16(_mm512_loadu_ps(ds + c), _mm512_loadu_ps(ds + kTile + c)));
      }
    }
  }
#endif
}

// The forward's online softmax over key tile j0 (nj keys): S's rows [0, ni)
// become P = e^(S - m), and O's rows and l are rescaled to the new maxima m.
// The bf16 paths take the row's max and sum in lanes (Dp: in registers).
template <Mode M>
__attribute__((always_inline)) inline void online_softmax(float* S, float* O, int64_t i0, int64_t ni, int64_t delta,
                                                          int64_t j0, int64_t nj, int64_t hdp, ForwardScratch& w) {
  for (int64_t r = 0; r < ni; ++r) {
    float* row = S + r * kTile;
    const int64_t live = live_row(i0 + r, delta, j0, nj);
    if (live == 0) {  // a row before this tile's first key (its block's P V reads the row: zeros)
      std::fill(row, row + kTile, 0.0f);
      continue;
    }
    float mx = w.m[r], sum = 0.0f;
    if constexpr (M == Mode::Dp) {
#if defined(DPT_FLASH_DPBF16)
      mx = max_in_lanes_dp(row, live, mx);
      sum = exp_sum_in_lanes_dp(row, live, mx);
#endif
    } else if constexpr (M == Mode::Widen) {
      mx = max_in_lanes(row, live, mx);
      sum = exp_sum_in_lanes(row, live, mx);
    } else {
#pragma omp simd reduction(max : mx)
      for (int64_t c = 0; c < live; ++c) mx = std::max(mx, row[c]);
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < live; ++c) {
        row[c] = fast_exp(row[c] - mx);
        sum += row[c];
      }
    }
    std::fill(row + live, row + kTile, 0.0f);
    const float keep = fast_exp(w.m[r] - mx);  // 0 (e^-80) on a row's first live tile, where O and l are 0
    float* orow = O + r * hdp;
#pragma omp simd
    for (int64_t d = 0; d < hdp; ++d) orow[d] *= keep;
    w.l[r] = w.l[r] * keep + sum;
    w.m[r] = mx;
  }
}

// One query tile [i0, i0 + ni) of one head (q, out: the head's slices of
// one sequence; k, v: its key/value head's) against every key tile it sees,
// into out's rows and lse's (lse: the head's row 0). merge: (out, lse) hold
// an earlier partial result (lse -inf: none) and get the union; else they
// are written. A row that sees no key is left as it was. Under bf16
// products, S = Q K^T reads both in bf16 and P V reads P in fp32 and V in
// bf16 (so that the output, and the backward's D = rowsum(dO O) from it,
// agree with the backward's rowsum(P dP) to fp32 rounding: FlashProducts).
template <Mode M>
__attribute__((always_inline)) inline void forward_tile_as(const FlashBlock& s, const float* q, const float* k,
                                                           const float* v, float* out, float* lse, int64_t i0,
                                                           int64_t ni, float scale, bool wide, bool merge,
                                                           ForwardScratch& w) {
  const int64_t hd = s.hd, hdp = hd_padded(s), nv = hdp / kV, delta = s.delta;
  w.q.resize(static_cast<size_t>(kTile * hdp));
  w.kt.resize(static_cast<size_t>(hd * kTile));
  w.v.resize(static_cast<size_t>(kTile * hdp));
  w.s.resize(static_cast<size_t>(kTile * kTile));
  w.o.assign(static_cast<size_t>(kTile * hdp), 0.0f);
  w.m.assign(static_cast<size_t>(kTile), -std::numeric_limits<float>::infinity());
  w.l.assign(static_cast<size_t>(kTile), 0.0f);
  float *Q = w.q.data(), *Kt = w.kt.data(), *V = w.v.data(), *S = w.s.data(), *O = w.o.data();
  if constexpr (M != Mode::Dp) {
    pack_rows<M == Mode::Widen>(Q, q + i0 * s.q_ld, s.q_ld, ni, kTile, hd, hdp, scale);
  } else {
    w.qb.resize(static_cast<size_t>(kTile * hdp));
    w.kt2.resize(static_cast<size_t>(kTile / 2 * hdp));
#if defined(DPT_FLASH_DPBF16)
    pack_rows_dp(w.qb.data(), q + i0 * s.q_ld, s.q_ld, ni, kTile, hd, hdp, scale);
#endif
  }
  const int64_t nip = round_up(ni, kMR), key_end = std::min(s.Tk, i0 + ni + delta);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    const int64_t nj = std::min(kTile, s.Tk - j0);
    if constexpr (M != Mode::Dp) {
      pack_transposed<M == Mode::Widen>(Kt, k + j0 * s.kv_ld, s.kv_ld, nj, hd);
      pack_rows<M == Mode::Widen>(V, v + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp, 1.0f);
      for (int64_t r0 = 0; r0 < nip; r0 += kMR)  // S = (scale Q) K^T, the live columns of each row block
        block_cols(wide, round_up(live_keys(i0, r0, delta, j0, nj), kV) / kV, S + r0 * kTile, kTile, Q + r0 * hdp,
                   hdp, 1, Kt, kTile, 0, hd, false);
    } else {
#if defined(DPT_FLASH_DPBF16)
      pack_channel_pairs_dp(w.kt2.data(), k + j0 * s.kv_ld, s.kv_ld, nj, hd, hdp);
      pack_rows_rounded_dp(V, v + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp);  // V rounded, read in fp32
#endif
      for (int64_t r0 = 0; r0 < nip; r0 += kMR)
        block_cols_bf16<M>(wide, round_up(live_keys(i0, r0, delta, j0, nj), kV) / kV, S + r0 * kTile, kTile,
                           words(w.qb) + r0 * hdp / 2, hdp / 2, 1, w.kt2.data(), kTile, 0, (hd + 1) / 2, false);
    }
    online_softmax<M>(S, O, i0, ni, delta, j0, nj, hdp, w);
    for (int64_t r0 = 0; r0 < nip; r0 += kMR)  // O += P V
      block_cols(wide, nv, O + r0 * hdp, hdp, S + r0 * kTile, kTile, 1, V, hdp, 0,
                 live_keys(i0, r0, delta, j0, nj), true);
  }
  finish_rows(s, out, lse, i0, ni, merge, w);
}

// One tile pair of backward_group_as: query tile [i0, i0 + ni) of the head
// (packed in w) against key tile [j0, j0 + nj) into w.dk, w.dv (the key
// tile's) and w.dq (the head's).
template <Mode M>
__attribute__((always_inline)) inline void backward_tile_pair(const FlashBlock& s, int64_t i0, int64_t ni, int64_t j0,
                                                              int64_t nj, bool wide, BackScratch& w) {
  const int64_t delta = s.delta, hd = s.hd, hdp = hd_padded(s), nv = hdp / kV, nip = round_up(ni, kMR);
  float *dQ = w.dq.data(), *dK = w.dk.data(), *dV = w.dv.data(), *P = w.p.data(), *dS = w.ds.data();
  const float* Qi = w.q.data() + i0 * hdp;
  const float* dOi = w.dout.data() + i0 * hdp;
  for (int64_t r0 = 0; r0 < nip; r0 += kMR) {  // S = (scale Q) K^T and dP = dO V^T, live columns
    const int64_t cols = round_up(live_keys(i0, r0, delta, j0, nj), kV) / kV;
    if constexpr (M != Mode::Dp) {
      block_cols(wide, cols, P + r0 * kTile, kTile, Qi + r0 * hdp, hdp, 1, w.kt.data(), kTile, 0, hd, false);
      block_cols(wide, cols, dS + r0 * kTile, kTile, dOi + r0 * hdp, hdp, 1, w.vt.data(), kTile, 0, hd, false);
    } else {
      const int64_t row = (i0 + r0) * hdp / 2, pairs = (hd + 1) / 2;
      block_cols_bf16<M>(wide, cols, P + r0 * kTile, kTile, words(w.qb) + row, hdp / 2, 1, w.kt2.data(), kTile, 0,
                         pairs, false);
      block_cols_bf16<M>(wide, cols, dS + r0 * kTile, kTile, words(w.dob) + row, hdp / 2, 1, w.vt2.data(), kTile,
                         0, pairs, false);
    }
  }
  backward_probabilities<M>(s, i0, ni, j0, nj, w);
  // dV += P^T dO and dK += dS^T (scale Q) over the rows that see each block
  // of keys (row r sees key c when i0 + r + delta >= j0 + c); bf16: over
  // pairs of rows from the even row at or before the first (the row before
  // the first sees none of the block's keys: its P and dS are 0).
  for (int64_t c0 = 0; c0 < nj; c0 += kMR) {
    const int64_t r_first = std::clamp<int64_t>(j0 + c0 - delta - i0, 0, ni);
    if constexpr (M != Mode::Dp) {
      block_cols(wide, nv, dV + c0 * hdp, hdp, P + c0, 1, kTile, dOi, hdp, r_first, ni, true);
      block_cols(wide, nv, dK + c0 * hdp, hdp, dS + c0, 1, kTile, Qi, hdp, r_first, ni, true);
    } else {
      const int64_t at = i0 / 2 * hdp;
      block_cols_bf16<M>(wide, nv, dV + c0 * hdp, hdp, w.pt2.data() + c0, 1, kTile, w.do2.data() + at, hdp,
                         r_first / 2, (ni + 1) / 2, true);
      block_cols_bf16<M>(wide, nv, dK + c0 * hdp, hdp, w.dst2.data() + c0, 1, kTile, w.q2.data() + at, hdp,
                         r_first / 2, (ni + 1) / 2, true);
    }
  }
  for (int64_t r0 = 0; r0 < nip; r0 += kMR) {  // dQ += dS K (its scale applied once, at the end)
    const int64_t live = live_keys(i0, r0, delta, j0, nj);
    if constexpr (M != Mode::Dp)
      block_cols(wide, nv, dQ + (i0 + r0) * hdp, hdp, dS + r0 * kTile, kTile, 1, w.k.data(), hdp, 0, live, true);
    else
      block_cols_bf16<M>(wide, nv, dQ + (i0 + r0) * hdp, hdp, words(w.dsb) + r0 * kTile / 2, kTile / 2, 1,
                         w.k2.data(), hdp, 0, (live + 1) / 2, true);
  }
}

// Every query head of key/value head g of one sequence (every pointer: that
// sequence's row 0, head 0): each key tile's dK and dV summed over the
// query tiles that see it (FlashAttention-2's order), dQ over the head's key
// tiles. accumulate: every gradient added to what dq, dk and dv hold; else
// dq written, and the group's first head writes dk and dv, the others add.
// Under bf16 products every product reads bf16 (FlashProducts), and dS's
// rounding is taken back out of dK (key_bias_correction).
template <Mode M>
__attribute__((always_inline)) inline void backward_group_as(const FlashBlock& s, const float* q, const float* k,
                                                             const float* v, const float* dout, const float* out,
                                                             const float* lse, float* dq, float* dk, float* dv,
                                                             int64_t g, float scale, bool wide, bool accumulate,
                                                             BackScratch& w) {
  const int64_t Tq = s.Tq, Tk = s.Tk, delta = s.delta, hd = s.hd, hdp = hd_padded(s);
  const int64_t Tp = round_up(Tq, kTile);
  w.size(Tp, hd, hdp);
  if constexpr (M != Mode::F32) w.size_bf16(Tp, hdp);
  k += g * hd, v += g * hd, dk += g * hd, dv += g * hd;
  // Key tiles past the last query row's sight get nothing.
  const int64_t key_end = std::min(Tk, Tq + delta);
  for (int64_t h = g * group_of(s); h < (g + 1) * group_of(s); ++h) {
    const bool add = accumulate || h != g * group_of(s);
    backward_head<M>(s, q, dout, out, lse, h, scale, w);
    for (int64_t j0 = 0; j0 < (accumulate ? key_end : Tk); j0 += kTile) {
      const int64_t nj = std::min(kTile, Tk - j0);
      backward_key_tile<M>(s, k, v, j0, nj, w);
      // The first query tile with a row that sees key j0 (row j0 - delta).
      for (int64_t i0 = std::max<int64_t>(0, j0 - delta) / kTile * kTile; i0 < Tq; i0 += kTile)
        backward_tile_pair<M>(s, i0, std::min(kTile, Tq - i0), j0, nj, wide, w);
      write_key_tile(s, dk, dv, j0, nj, add, w);
    }
    if constexpr (M != Mode::F32) key_bias_correction<M>(s, w, dk);
    for (int64_t t = 0; t < Tq; ++t) {
      prefetch_ahead<1>(dq + h * hd, s.q_ld, t, Tq, hd);
      add_row(dq + t * s.q_ld + h * hd, w.dq.data() + t * hdp, hd, accumulate, scale);
    }
  }
}
