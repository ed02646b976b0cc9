// The chunked gated delta rule's backward (the scheme: delta_rule_chunk.cpp's header comment).
#include <cstring>

#include "ops/delta_rule_chunk_work.h"

namespace trillion {

using namespace delta_rule_detail;  // this file's own machinery (delta_rule_chunk_work.h)

int64_t delta_rule_chunk_backward_workspace_bytes(int64_t key_dim, int64_t value_dim, int64_t longest_segment,
                                                  int64_t element_bytes, int threads) {
  return threads * backward_per_thread(key_dim, value_dim, longest_segment) * element_bytes;
}

template <class T>
void delta_rule_chunk_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                               const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                               const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  const int64_t longest = check_and_longest_segment(cu_seqlens, sizes);
  const int64_t K = sizes.key_dim, V = sizes.value_dim, KV = K * V, H = sizes.heads;
  const int64_t segments = segment_count(cu_seqlens, sizes);
  const int64_t max_chunks = backward_chunks(longest);
  const bool per_channel = sizes.decay == DeltaDecay::per_key_channel;
  const int64_t per_thread = backward_per_thread(K, V, longest);  // states, dS, dS_prev, work, grads
  Buffer<T> scratch(num_threads() * per_thread);
  parallel_for(segments * H, [&](int64_t item) {
    const int64_t n = item / H, h = item % H;
    const Segment seg = segment_of(n, cu_seqlens, sizes);
    T* states = scratch.data() + omp_get_thread_num() * per_thread;  // [max_chunks, K, V]
    T* dS = states + max_chunks * KV;                                // [K, V]
    T* dS_prev = dS + KV;                                            // [K, V]
    const ChunkWork<T> w(dS_prev + KV, K, V);
    const ChunkGrads<T> d(dS_prev + KV + ChunkWork<T>::numel(K, V), K, V);
    const int64_t chunks = (seg.end - seg.begin + C - 1) / C;

    // Pass 1: the state at the start of every chunk.
    load_state(states, s0, n, h, sizes);
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      const ChunkInputs<T> in = chunk_inputs(q, k, v, g, beta, sizes, seg.row, seg.begin + c * C, C, h);
      T* S = states + (c + 1) * KV;  // [K, V]
      std::memcpy(S, S - KV, KV * sizeof(T));
      prepare_chunk(w, in, sizes);
      chunk_values(w, S, C, K, V);
      advance_state(w, S, C, K, V);
    }

    // Pass 2: chunks from the last; dS is the gradient of the state after the current chunk.
    load_state(dS, ds_final, n, h, sizes);
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t begin = seg.begin + c * C, L = std::min(C, seg.end - begin);
      const int64_t tok0 = (seg.row * sizes.seq_len + begin) * H + h;
      const ChunkInputs<T> in = chunk_inputs(q, k, v, g, beta, sizes, seg.row, begin, L, h);
      const T* S = states + c * KV;         // [K, V] state entering the chunk
      const T* doc = d_o + tok0 * V;        // [L, V], row stride H·V
      const T* E_last = w.E + (L - 1) * K;  // [K]
      prepare_chunk(w, in, sizes);
      chunk_values(w, S, L, K, V);
      // S' = diag(E_last) S + Kdᵀ Vn and O = QE S + P Vn: dVn = Pᵀ dO + Kd dS.
      gemm<T>(true, false, L, V, L, T(1), w.P, C, doc, H * V, T(0), d.dVn, V);
      gemm<T>(false, false, L, V, K, T(1), w.Kd, K, dS, V, T(1), d.dVn, V);
      // QE = Q ⊙ E: tmp = dO Sᵀ; dQ = tmp ⊙ E, dG = tmp ⊙ QE.
      gemm<T>(false, true, L, K, V, T(1), doc, H * V, S, V, T(0), d.tmp, K);
      for (int64_t x = 0; x < L * K; ++x) {
        d.dQ[x] = d.tmp[x] * w.E[x];
        d.dGc[x] = d.tmp[x] * w.QE[x];
      }
      // Kd = K ⊙ exp(G_last − G): tmp = Vn dSᵀ; dK = tmp ⊙ D; dG_t −= tmp ⊙ Kd, dG_last += Σ_t tmp ⊙ Kd
      // (the last row's two terms cancel exactly and are skipped).
      gemm<T>(false, true, L, K, V, T(1), w.Vn, V, dS, V, T(0), d.tmp, K);
      T* dG_last = d.dGc + (L - 1) * K;  // [K]
      for (int64_t t = 0; t < L; ++t) {
        for (int64_t i = 0; i < K; ++i) {
          const int64_t x = t * K + i;
          d.dK[x] = d.tmp[x] * w.D[x];
          if (t + 1 < L) {
            const T e = d.tmp[x] * w.Kd[x];
            d.dGc[x] -= e;
            dG_last[i] += e;
          }
        }
      }
      // diag(E_last) S: dG_last,i += E_last,i Σ_j dS_ij S_ij.
      for (int64_t i = 0; i < K; ++i) {
        T sum = 0;
        for (int64_t j = 0; j < V; ++j) sum += dS[i * V + j] * S[i * V + j];
        dG_last[i] += E_last[i] * sum;
      }
      // dP = dO Vnᵀ (lower with the diagonal).
      gemm<T>(false, true, L, L, V, T(1), doc, H * V, w.Vn, V, T(0), d.dP, C);
      // Vn = U − W S: dW = −dVn Sᵀ, dU = dVn; W = Tm Kb, U = Tm Vb: dKb = Tmᵀ dW, dVb = Tmᵀ dU.
      gemm<T>(false, true, L, K, V, T(-1), d.dVn, V, S, V, T(0), d.dW, K);
      gemm<T>(true, false, L, K, L, T(1), w.Tm, C, d.dW, K, T(0), d.dKb, K);
      gemm<T>(true, false, L, V, L, T(1), w.Tm, C, d.dVn, V, T(0), d.dVb, V);
      // Vb = diag(β) V, Kb = diag(β)(K ⊙ E).
      for (int64_t t = 0; t < L; ++t) {
        const T bt = in.beta[t * in.ldb];
        const T* vt = in.v + t * in.ldv;
        const T* kt = in.k + t * in.ldk;
        T* dvt = dv + (tok0 + t * H) * V;  // [V]
        T db = 0;
        for (int64_t j = 0; j < V; ++j) {
          dvt[j] = bt * d.dVb[t * V + j];
          db += d.dVb[t * V + j] * vt[j];
        }
        for (int64_t i = 0; i < K; ++i) {
          const int64_t x = t * K + i;
          db += d.dKb[x] * kt[i] * w.E[x];
          d.dK[x] += bt * d.dKb[x] * w.E[x];
          d.dGc[x] += d.dKb[x] * w.Kb[x];
        }
        d.db[t] = db;
        d.dGh[t] = 0;
      }
      // Tm = (I + diag(β) Akk)⁻¹: dL = −Tmᵀ dTm Tmᵀ = −(dVb Uᵀ + dKb Wᵀ), strictly lower; N = diag(β) dL.
      gemm<T>(false, true, L, L, V, T(-1), d.dVb, V, w.U, V, T(0), d.N, C);
      gemm<T>(false, true, L, L, K, T(-1), d.dKb, K, w.W, K, T(1), d.N, C);
      for (int64_t t = 0; t < L; ++t) {
        const T bt = in.beta[t * in.ldb];
        for (int64_t j = 0; j < L; ++j) {
          const int64_t x = t * C + j;
          if (j < t) {
            d.db[t] += d.N[x] * w.Akk[x];
            d.N[x] *= bt;
          } else {
            d.N[x] = T(0);
          }
          if (j > t) d.dP[x] = T(0);
        }
      }
      if (per_channel) {
        // P_tj = Σ_i q_ti k_ji Γ_tji (j ≤ t), Akk_tj = Σ_i k_ti k_ji Γ_tji (j < t), Γ as in forward. The
        // diagonal (Γ = 1) goes straight to dQ, dK; the pairs j < t go to pQ, pKr, pKc, and their
        // G-gradient is dG_t += q_t ⊙ pQ_t + k_t ⊙ pKr_t, dG_j −= k_j ⊙ pKc_j.
        std::fill(d.pQ, d.pQ + L * K, T(0));
        std::fill(d.pKr, d.pKr + L * K, T(0));
        std::fill(d.pKc, d.pKc + L * K, T(0));
        for (int64_t b0 = 0; b0 < L; b0 += kSub) {
          const int64_t nb = std::min(kSub, L - b0);
          for (int64_t t = b0; t < b0 + nb; ++t) {
            const T* qt = in.q + t * in.ldk;
            const T* kt = in.k + t * in.ldk;
            const T a_tt = d.dP[t * C + t];
            for (int64_t i = 0; i < K; ++i) {
              d.dQ[t * K + i] += a_tt * kt[i];
              d.dK[t * K + i] += a_tt * qt[i];
            }
            for (int64_t j = b0; j < t; ++j) {
              const T a = d.dP[t * C + j], nn = d.N[t * C + j];
              pair_grads(a, nn, qt, kt, in.k + j * in.ldk, w.Gam + (pair_index(b0 / kSub, t - b0) + j - b0) * K,
                         d.pQ + t * K, d.pKr + t * K, d.pKc + j * K, K);
            }
          }
          if (b0 > 0) {
            // Γ_tj = Er_t · Ecol_j for j < b0: pQ_t += Er ⊙ (dP Ccol), pKr_t += Er ⊙ (N Ccol),
            // pKc_j += Ecol ⊙ (dPᵀ Rq + Nᵀ Rk).
            // Ecol, Ccol of this sub-chunk are still there from prepare_chunk.
            const T* ecol = w.Ecol + col_row(b0 / kSub) * K;
            const T* ccol = w.Ccol + col_row(b0 / kSub) * K;
            gemm<T>(false, false, nb, K, b0, T(1), d.dP + b0 * C, C, ccol, K, T(0), d.tmp, K);
            gemm<T>(false, false, nb, K, b0, T(1), d.N + b0 * C, C, ccol, K, T(0), d.tmp2, K);
            for (int64_t x = 0; x < nb * K; ++x) {
              d.pQ[b0 * K + x] += d.tmp[x] * w.Er[b0 * K + x];
              d.pKr[b0 * K + x] += d.tmp2[x] * w.Er[b0 * K + x];
            }
            gemm<T>(true, false, b0, K, nb, T(1), d.dP + b0 * C, C, w.Rq + b0 * K, K, T(0), d.tmp2, K);
            gemm<T>(true, false, b0, K, nb, T(1), d.N + b0 * C, C, w.Rk + b0 * K, K, T(1), d.tmp2, K);
            for (int64_t x = 0; x < b0 * K; ++x) d.pKc[x] += d.tmp2[x] * ecol[x];
          }
        }
        for (int64_t t = 0; t < L; ++t) {
          const T* qt = in.q + t * in.ldk;
          const T* kt = in.k + t * in.ldk;
          for (int64_t i = 0; i < K; ++i) {
            const int64_t x = t * K + i;
            d.dQ[x] += d.pQ[x];
            d.dK[x] += d.pKr[x] + d.pKc[x];
            d.dGc[x] += qt[i] * d.pQ[x] + kt[i] * (d.pKr[x] - d.pKc[x]);
          }
        }
      } else {
        // Scalar Γ: the G-gradient of P_tj is P_tj (at t) and −P_tj (at j), likewise Akk; then the
        // products with dP ⊙ Γ and N ⊙ Γ are GEMMs.
        for (int64_t t = 0; t < L; ++t) {
          for (int64_t j = 0; j < t; ++j) {  // the diagonal (Γ = 1) has no G-gradient
            const int64_t x = t * C + j;
            const T e = d.dP[x] * w.P[x] + d.N[x] * w.Akk[x];
            d.dGh[t] += e;
            d.dGh[j] -= e;
            const T gamma = w.Gam[x];  // from prepare_chunk
            d.dP[x] *= gamma;
            d.N[x] *= gamma;
          }
        }
        gemm<T>(false, false, L, K, L, T(1), d.dP, C, in.k, in.ldk, T(1), d.dQ, K);
        gemm<T>(true, false, L, K, L, T(1), d.dP, C, in.q, in.ldk, T(1), d.dK, K);
        gemm<T>(false, false, L, K, L, T(1), d.N, C, in.k, in.ldk, T(1), d.dK, K);
        gemm<T>(true, false, L, K, L, T(1), d.N, C, in.k, in.ldk, T(1), d.dK, K);
      }
      // Outputs of the chunk: dq, dk, dbeta, and dg as the reverse cumulative sum of dG.
      const int64_t gw = per_channel ? K : 1;
      for (int64_t t = L - 1; t >= 0; --t) {
        const int64_t tok = tok0 + t * H;
        std::memcpy(dq + tok * K, d.dQ + t * K, K * sizeof(T));
        std::memcpy(dk + tok * K, d.dK + t * K, K * sizeof(T));
        dbeta[tok] = d.db[t];
        T* dgt = dg + tok * gw;
        if (per_channel) {
          for (int64_t i = 0; i < K; ++i) dgt[i] = d.dGc[t * K + i] + (t + 1 < L ? dgt[i + H * K] : T(0));
        } else {
          T sum = d.dGh[t];
          for (int64_t i = 0; i < K; ++i) sum += d.dGc[t * K + i];
          dgt[0] = sum + (t + 1 < L ? dgt[H] : T(0));
        }
      }
      // dS_prev = QEᵀ dO + diag(E_last) dS − Wᵀ dVn.
      gemm<T>(true, false, K, V, L, T(1), w.QE, K, doc, H * V, T(0), dS_prev, V);
      for (int64_t i = 0; i < K; ++i) {
        for (int64_t j = 0; j < V; ++j) dS_prev[i * V + j] += E_last[i] * dS[i * V + j];
      }
      gemm<T>(true, false, K, V, L, T(-1), w.W, K, d.dVn, V, T(1), dS_prev, V);
      std::memcpy(dS, dS_prev, KV * sizeof(T));
    }
    if (ds0 != nullptr) std::memcpy(ds0 + (n * H + h) * KV, dS, KV * sizeof(T));
  });
}

#define TRILLION_INSTANTIATE(T)                                                                                 \
  template void delta_rule_chunk_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                             const T*, const T*, const T*, const T*, const int32_t*,            \
                                             const DeltaRuleSizes&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
