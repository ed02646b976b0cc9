// The per-chunk machinery of the chunked gated delta rule, shared by its forward
// (delta_rule_chunk.cpp) and backward (delta_rule_chunk_backward.cpp): chunk inputs and work
// arrays, the decay factors, prepare_chunk (G, E, Akk, P, Tm, W, U), the state steps, and the
// backward's gradient arrays. See delta_rule_chunk.cpp for the scheme. Internal to src/ops/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/delta_rule_segments.h"
#include "ops/delta_rule.h"
#include "ops/gemm.h"
#include "ops/vector_exp.h"

namespace trillion::delta_rule_detail {


constexpr int64_t C = kDeltaRuleChunk;
// Sub-chunk of the per-key-channel decay: pairs inside one sub-chunk use pairwise differences, pairs
// across sub-chunks factor Γ through the later sub-chunk's first token r (both factors ≤ 1).
constexpr int64_t kSub = 16;
static_assert(C % kSub == 0, "the chunk must be a whole number of sub-chunks");
constexpr int64_t kSubs = C / kSub;
// Strictly-lower pairs (t, j) of one sub-chunk, and rows j < r of all sub-chunks' column blocks.
constexpr int64_t kSubPairs = kSub * (kSub - 1) / 2;
constexpr int64_t kColRows = kSub * kSubs * (kSubs - 1) / 2;
// First pair of sub-chunk s, first pair of local row tt in it; first column row of sub-chunk s.
constexpr int64_t pair_index(int64_t s, int64_t tt) { return s * kSubPairs + tt * (tt - 1) / 2; }
constexpr int64_t col_row(int64_t s) { return kSub * s * (s - 1) / 2; }

// x[0, n) ← exp(x) with the vectorized exp (ops/vector_exp.h; the sum is discarded).
template <class T>
inline void exp_all(T* x, int64_t n) {
  if (n > 0) exp_shifted_sum(x, n, T(0));
}

// Lane-blocked dot products Σ_i a_i c_i g_i and Σ_i b_i c_i g_i (g = nullptr: all ones), summed in a
// fixed order (lanes, then the lanes in sequence), so the inner loop vectorizes without -ffast-math.
template <class T>
inline void dot2(const T* __restrict a, const T* __restrict b, const T* __restrict c, const T* __restrict g,
                 int64_t K, T& out_a, T& out_b) {
  constexpr int64_t W = 128 / sizeof(T);
  T acc_a[W] = {}, acc_b[W] = {};
  int64_t i0 = 0;
  if (g != nullptr) {
    for (; i0 + W <= K; i0 += W) {
      for (int64_t l = 0; l < W; ++l) {
        const T cg = c[i0 + l] * g[i0 + l];
        acc_a[l] += a[i0 + l] * cg;
        acc_b[l] += b[i0 + l] * cg;
      }
    }
  } else {
    for (; i0 + W <= K; i0 += W) {
      for (int64_t l = 0; l < W; ++l) {
        acc_a[l] += a[i0 + l] * c[i0 + l];
        acc_b[l] += b[i0 + l] * c[i0 + l];
      }
    }
  }
  for (int64_t i = i0; i < K; ++i) {
    const T cg = g != nullptr ? c[i] * g[i] : c[i];
    acc_a[i - i0] += a[i] * cg;
    acc_b[i - i0] += b[i] * cg;
  }
  T sa = 0, sb = 0;
  for (int64_t l = 0; l < W; ++l) {
    sa += acc_a[l];
    sb += acc_b[l];
  }
  out_a = sa;
  out_b = sb;
}


// One chunk of L tokens of one head: pointers to its first token's rows in the caller's arrays.
template <class T>
struct ChunkInputs {
  int64_t L = 0;
  const T *q = nullptr, *k = nullptr;  // [L, K], row stride ldk = H·K
  const T* v = nullptr;                // [L, V], row stride ldv = H·V
  const T* g = nullptr;                // [L] or [L, K], row stride ldg = H or H·K
  const T* beta = nullptr;             // [L], stride H
  int64_t ldk = 0, ldv = 0, ldg = 0, ldb = 0;
};

template <class T>
ChunkInputs<T> chunk_inputs(const T* q, const T* k, const T* v, const T* g, const T* beta, const DeltaRuleSizes& s,
                            int64_t row, int64_t begin, int64_t L, int64_t h) {
  const int64_t H = s.heads, K = s.key_dim, V = s.value_dim, tok = (row * s.seq_len + begin) * H + h;
  const int64_t gw = s.decay == DeltaDecay::per_key_channel ? K : 1;
  return {L, q + tok * K, k + tok * K, v + tok * V, g + tok * gw, beta + tok, H * K, H * V, H * gw, H};
}

// The chunk quantities that do not depend on the incoming state, plus V_new.
template <class T>
struct ChunkWork {
  T* G;    // [C, K] cumulative log-decay inside the chunk (per head: broadcast over K)
  T* E;    // [C, K] exp(G)
  T* D;    // [C, K] exp(G_last − G)
  T* Kd;   // [C, K] K ⊙ D
  T* QE;   // [C, K] Q ⊙ E
  T* Kb;   // [C, K] diag(β)(K ⊙ E)
  T* W;    // [C, K] Tm Kb
  T* U;    // [C, V] Tm diag(β) V
  T* Vn;   // [C, V] U − W S
  T* Akk;  // [C, C] K Kᵀ ⊙ Γ, strictly lower (zeros elsewhere)
  T* P;    // [C, C] Q Kᵀ ⊙ Γ, lower with the diagonal (zeros above)
  T* Tm;   // [C, C] (I + diag(β) Akk)⁻¹, lower
  // Per key channel only (see kSub): row t against its sub-chunk's first token r, and the columns
  // j < r of one sub-chunk against its r.
  T* Er;    // [C, K] exp(G_t − G_r)
  T* Rq;    // [C, K] Q ⊙ Er
  T* Rk;    // [C, K] K ⊙ Er
  T* Ecol;  // [kColRows, K] exp(G_r − G_j), rows j < r of sub-chunk s from col_row(s)
  T* Ccol;  // [kColRows, K] K ⊙ Ecol
  // Pairwise decay, kept for the backward. Per key channel: [kSubs · kSubPairs, K] exp(G_t − G_j) of
  // the strictly-lower pairs inside each sub-chunk (pair_index). Per head: [C, C] Γ_tj (j ≤ t).
  T* Gam;
  static int64_t gam_numel(int64_t K) { return std::max(kSubs * kSubPairs * K, C * C); }
  static int64_t numel(int64_t K, int64_t V) {
    return 10 * C * K + 2 * kColRows * K + gam_numel(K) + 2 * C * V + 3 * C * C;
  }
  explicit ChunkWork(T* p, int64_t K, int64_t V)
      : G(p), E(G + C * K), D(E + C * K), Kd(D + C * K), QE(Kd + C * K), Kb(QE + C * K), W(Kb + C * K),
        U(W + C * K), Vn(U + C * V), Akk(Vn + C * V), P(Akk + C * C), Tm(P + C * C), Er(Tm + C * C),
        Rq(Er + C * K), Rk(Rq + C * K), Ecol(Rk + C * K), Ccol(Ecol + kColRows * K), Gam(Ccol + kColRows * K) {}
};

// Er, Rq, Rk of every row of the chunk, each against its own sub-chunk's first token.
template <class T>
void row_factors(const ChunkWork<T>& w, const ChunkInputs<T>& in, int64_t K) {
  for (int64_t t = 0; t < in.L; ++t) {
    const T* __restrict Gt = w.G + t * K;
    const T* __restrict Gr = w.G + (t - t % kSub) * K;  // [K]
    T* __restrict er = w.Er + t * K;
    for (int64_t i = 0; i < K; ++i) er[i] = Gt[i] - Gr[i];
  }
  exp_all(w.Er, in.L * K);
  for (int64_t t = 0; t < in.L; ++t) {
    const T* __restrict qt = in.q + t * in.ldk;
    const T* __restrict kt = in.k + t * in.ldk;
    const T* __restrict er = w.Er + t * K;
    T* __restrict rq = w.Rq + t * K;
    T* __restrict rk = w.Rk + t * K;
    for (int64_t i = 0; i < K; ++i) {
      rq[i] = qt[i] * er[i];
      rk[i] = kt[i] * er[i];
    }
  }
}

// Ecol, Ccol of the columns j < r against r = s · kSub, the first token of sub-chunk s ≥ 1.
template <class T>
void column_factors(const ChunkWork<T>& w, const ChunkInputs<T>& in, int64_t s, int64_t K) {
  const int64_t r = s * kSub;
  const T* __restrict Gr = w.G + r * K;  // [K]
  T* ecol = w.Ecol + col_row(s) * K;     // [r, K]
  T* ccol = w.Ccol + col_row(s) * K;     // [r, K]
  for (int64_t j = 0; j < r; ++j) {
    const T* __restrict Gj = w.G + j * K;
    T* __restrict e = ecol + j * K;
    for (int64_t i = 0; i < K; ++i) e[i] = Gr[i] - Gj[i];
  }
  exp_all(ecol, r * K);
  for (int64_t j = 0; j < r; ++j) {
    const T* __restrict kj = in.k + j * in.ldk;
    const T* __restrict e = ecol + j * K;
    T* __restrict c = ccol + j * K;
    for (int64_t i = 0; i < K; ++i) c[i] = kj[i] * e[i];
  }
}

// Fills G, E, D, Kd, QE, Kb, Akk, P, Tm, W, U of one chunk.
template <class T>
void prepare_chunk(const ChunkWork<T>& w, const ChunkInputs<T>& in, const DeltaRuleSizes& s) {
  const int64_t L = in.L, K = s.key_dim, V = s.value_dim;
  const bool per_channel = s.decay == DeltaDecay::per_key_channel;
  for (int64_t t = 0; t < L; ++t) {
    T* Gt = w.G + t * K;  // [K]
    const T* gt = in.g + t * in.ldg;
    const T* G_prev = t > 0 ? Gt - K : nullptr;  // [K]
    for (int64_t i = 0; i < K; ++i) Gt[i] = (G_prev != nullptr ? G_prev[i] : T(0)) + (per_channel ? gt[i] : gt[0]);
  }
  const T* G_last = w.G + (L - 1) * K;  // [K]
  // E = exp(G), D = exp(G_last − G), each as one batch of vectorized exps.
  std::memcpy(w.E, w.G, L * K * sizeof(T));
  exp_all(w.E, L * K);
  for (int64_t t = 0; t < L; ++t) {
    const T* __restrict Gt = w.G + t * K;
    T* __restrict Dt = w.D + t * K;
    for (int64_t i = 0; i < K; ++i) Dt[i] = G_last[i] - Gt[i];
  }
  exp_all(w.D, L * K);
  for (int64_t t = 0; t < L; ++t) {
    const T* __restrict qt = in.q + t * in.ldk;
    const T* __restrict kt = in.k + t * in.ldk;
    const T* __restrict Et = w.E + t * K;
    const T* __restrict Dt = w.D + t * K;
    T* __restrict kd = w.Kd + t * K;
    T* __restrict qe = w.QE + t * K;
    T* __restrict kb = w.Kb + t * K;
    const T bt = in.beta[t * in.ldb];
    for (int64_t i = 0; i < K; ++i) {
      kd[i] = kt[i] * Dt[i];
      qe[i] = qt[i] * Et[i];
      kb[i] = bt * kt[i] * Et[i];
    }
  }
  if (per_channel) {
    row_factors(w, in, K);
    for (int64_t b0 = 0; b0 < L; b0 += kSub) {
      const int64_t nb = std::min(kSub, L - b0), s = b0 / kSub;
      // Inside the sub-chunk: pairwise differences exp(G_t − G_j) (j < t), one batch of exps.
      T* gam = w.Gam + pair_index(s, 0) * K;
      for (int64_t tt = 1; tt < nb; ++tt) {
        const T* __restrict Gt = w.G + (b0 + tt) * K;
        for (int64_t jj = 0; jj < tt; ++jj) {
          const T* __restrict Gj = w.G + (b0 + jj) * K;
          T* __restrict e = w.Gam + (pair_index(s, tt) + jj) * K;
          for (int64_t i = 0; i < K; ++i) e[i] = Gt[i] - Gj[i];
        }
      }
      exp_all(gam, nb * (nb - 1) / 2 * K);
      for (int64_t tt = 0; tt < nb; ++tt) {
        const int64_t t = b0 + tt;
        const T* qt = in.q + t * in.ldk;
        const T* kt = in.k + t * in.ldk;
        for (int64_t jj = 0; jj < tt; ++jj) {
          const int64_t j = b0 + jj;
          T sp, sa;
          dot2(qt, kt, in.k + j * in.ldk, w.Gam + (pair_index(s, tt) + jj) * K, K, sp, sa);
          w.P[t * C + j] = sp;
          w.Akk[t * C + j] = sa;
        }
        T sp, sa;
        dot2<T>(qt, kt, kt, nullptr, K, sp, sa);  // the diagonal: Γ = 1
        w.P[t * C + t] = sp;
        w.Akk[t * C + t] = T(0);
      }
      // Earlier columns: Γ_tj = Er_t · Ecol_j through r = b0, so the blocks are GEMMs.
      if (b0 > 0) {
        column_factors(w, in, s, K);
        const T* ccol = w.Ccol + col_row(s) * K;
        gemm<T>(false, true, nb, b0, K, T(1), w.Rq + b0 * K, K, ccol, K, T(0), w.P + b0 * C, C);
        gemm<T>(false, true, nb, b0, K, T(1), w.Rk + b0 * K, K, ccol, K, T(0), w.Akk + b0 * C, C);
      }
    }
  } else {
    gemm<T>(false, true, L, L, K, T(1), in.k, in.ldk, in.k, in.ldk, T(0), w.Akk, C);
    gemm<T>(false, true, L, L, K, T(1), in.q, in.ldk, in.k, in.ldk, T(0), w.P, C);
    // Γ_tj = exp(G_t − G_j) for j ≤ t (above the diagonal: exp(0), unused), one batch of exps.
    for (int64_t t = 0; t < L; ++t) {
      const T Gt = w.G[t * K];
      for (int64_t j = 0; j < C; ++j) w.Gam[t * C + j] = j <= t ? Gt - w.G[j * K] : T(0);
    }
    exp_all(w.Gam, L * C);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t j = 0; j <= t; ++j) {
        const T gamma = w.Gam[t * C + j];
        w.P[t * C + j] *= gamma;
        w.Akk[t * C + j] = j < t ? w.Akk[t * C + j] * gamma : T(0);
      }
    }
  }
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t j = t + 1; j < L; ++j) w.P[t * C + j] = w.Akk[t * C + j] = T(0);
  }
  // Forward substitution: row t of Tm is e_t − Σ_{m<t} β_t Akk_tm · (row m of Tm).
  for (int64_t t = 0; t < L; ++t) {
    T* row = w.Tm + t * C;  // [C]
    std::fill(row, row + L, T(0));
    const T bt = in.beta[t * in.ldb];
    for (int64_t m = 0; m < t; ++m) {
      const T l = bt * w.Akk[t * C + m];
      const T* row_m = w.Tm + m * C;
      for (int64_t j = 0; j <= m; ++j) row[j] -= l * row_m[j];
    }
    row[t] = T(1);
  }
  gemm<T>(false, false, L, K, L, T(1), w.Tm, C, w.Kb, K, T(0), w.W, K);
  // U = Tm (diag(β) V), with diag(β) V staged in Vn (chunk_values overwrites it).
  for (int64_t t = 0; t < L; ++t) {
    const T bt = in.beta[t * in.ldb];
    const T* vt = in.v + t * in.ldv;
    for (int64_t j = 0; j < V; ++j) w.Vn[t * V + j] = bt * vt[j];
  }
  gemm<T>(false, false, L, V, L, T(1), w.Tm, C, w.Vn, V, T(0), w.U, V);
}

// Vn = U − W S for the incoming state S[K, V].
template <class T>
void chunk_values(const ChunkWork<T>& w, const T* S, int64_t L, int64_t K, int64_t V) {
  std::memcpy(w.Vn, w.U, L * V * sizeof(T));
  gemm<T>(false, false, L, V, K, T(-1), w.W, K, S, V, T(1), w.Vn, V);
}

// S ← diag(E_last) S + Kdᵀ Vn, in place on S[K, V].
template <class T>
void advance_state(const ChunkWork<T>& w, T* S, int64_t L, int64_t K, int64_t V) {
  const T* E_last = w.E + (L - 1) * K;
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < V; ++j) S[i * V + j] *= E_last[i];
  }
  gemm<T>(true, false, K, V, L, T(1), w.Kd, K, w.Vn, V, T(1), S, V);
}

// One pair j < t inside a sub-chunk, Γ = gam[K]: pQ_t += a (k_j ⊙ Γ), pKr_t += nn (k_j ⊙ Γ),
// pKc_j += (a q_t + nn k_t) ⊙ Γ (three distinct rows, so the loop vectorizes).
template <class T>
inline void pair_grads(T a, T nn, const T* __restrict qt, const T* __restrict kt, const T* __restrict kj,
                       const T* __restrict gam, T* __restrict pq, T* __restrict pkr, T* __restrict pkc, int64_t K) {
  for (int64_t i = 0; i < K; ++i) {
    const T kg = kj[i] * gam[i];
    pq[i] += a * kg;
    pkr[i] += nn * kg;
    pkc[i] += (a * qt[i] + nn * kt[i]) * gam[i];
  }
}

// The backward's per-chunk gradient arrays.
template <class T>
struct ChunkGrads {
  T* dVn;  // [C, V]
  T* dVb;  // [C, V] gradient of diag(β) V
  T* dQ;   // [C, K]
  T* dK;   // [C, K]
  T* dGc;  // [C, K] gradient of G (per head: summed over K at the end)
  T* dW;   // [C, K]
  T* dKb;  // [C, K]
  T* tmp;  // [C, K]
  T* dP;   // [C, C]
  T* N;    // [C, C] β_t · dL_tj, strictly lower
  T* dGh;  // [C] per head: gradient of G from the pairwise terms
  T* db;   // [C]
  // Per key channel: the off-diagonal pairwise parts of dQ, of dK through row t and through column j.
  T* pQ;    // [C, K]
  T* pKr;   // [C, K]
  T* pKc;   // [C, K]
  T* tmp2;  // [C, K]
  static int64_t numel(int64_t K, int64_t V) { return 2 * C * V + 10 * C * K + 2 * C * C + 2 * C; }
  explicit ChunkGrads(T* p, int64_t K, int64_t V)
      : dVn(p), dVb(dVn + C * V), dQ(dVb + C * V), dK(dQ + C * K), dGc(dK + C * K), dW(dGc + C * K),
        dKb(dW + C * K), tmp(dKb + C * K), dP(tmp + C * K), N(dP + C * C), dGh(N + C * C), db(dGh + C),
        pQ(db + C), pKr(pQ + C * K), pKc(pKr + C * K), tmp2(pKc + C * K) {}
};

// Per-thread scratch elements of the chunked forward (state [K, V], then ChunkWork) and of the
// backward (chunk-start states [backward_chunks, K, V], dS, dS_prev [K, V], ChunkWork, ChunkGrads);
// the counts do not depend on T.
inline int64_t backward_chunks(int64_t longest_segment) {
  return std::max<int64_t>(1, (longest_segment + C - 1) / C);
}
inline int64_t forward_per_thread(int64_t K, int64_t V) { return K * V + ChunkWork<float>::numel(K, V); }
inline int64_t backward_per_thread(int64_t K, int64_t V, int64_t longest_segment) {
  return (backward_chunks(longest_segment) + 2) * K * V + ChunkWork<float>::numel(K, V) +
         ChunkGrads<float>::numel(K, V);
}


}  // namespace trillion::delta_rule_detail
