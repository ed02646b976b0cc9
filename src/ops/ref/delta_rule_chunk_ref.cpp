// The unfused chunked gated delta rule (see delta_rule_chunk_ref.h): whole-sequence stages, every
// intermediate its own Buffer, gemm<T>() for the products, parallel over (batch row, head) items.
#include "ops/ref/delta_rule_chunk_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

constexpr int64_t C = kDeltaRuleChunk;

struct ChunkShape {
  int64_t B, T, H, K, V, items, chunks;
  bool pc;     // per_key_channel decay
  int64_t Kg;  // decay channels: K per key channel, 1 per head
};

ChunkShape shape_of(const int32_t* cu_seqlens, const DeltaRuleSizes& s) {
  TRILLION_CHECK(cu_seqlens == nullptr, "delta_rule_chunk_ref: cu_seqlens must be null");
  TRILLION_CHECK(s.batch >= 1 && s.seq_len >= 0 && s.heads >= 1 && s.key_dim >= 1 && s.value_dim >= 1,
                 "delta_rule_chunk_ref: bad sizes");
  const bool pc = s.decay == DeltaDecay::per_key_channel;
  return {s.batch, s.seq_len, s.heads, s.key_dim, s.value_dim, s.batch * s.heads, (s.seq_len + C - 1) / C,
          pc, pc ? s.key_dim : 1};
}

// Stages (1) and (2) of the forward, kept for the output stage and for the backward.
template <class T>
struct ForwardStages {
  // Padded inputs [items, chunks, C, ·].
  Buffer<T> qp, kp, vp, bp, gp;
  // Stage (1): G [.., C, Kg]; Γ [.., C, C] (per key channel [.., C, C, K], Γ_tj,i = exp(G_t,i − G_j,i));
  // KK = K Kᵀ (per key channel Σ_i k_t,i k_j,i Γ_tj,i, j ≤ t); A, Tm [.., C, C]; Kbe = diag β (K ⊙ exp G), Vb = diag β V, W, U.
  Buffer<T> G, Gam, KK, A, Tm, Kbe, Vb, W, U;
  // Stage (2): incoming states [items, chunks, K, V], V_new [.., C, V], final states [items, K, V].
  Buffer<T> S, Vn, Sfin;

  ForwardStages(const ChunkShape& d, const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0) {
    const int64_t rows = d.items * d.chunks * C, K = d.K, V = d.V, H = d.H, Kg = d.Kg;
    qp = Buffer<T>(rows * K);
    kp = Buffer<T>(rows * K);
    vp = Buffer<T>(rows * V);
    bp = Buffer<T>(rows);
    gp = Buffer<T>(rows * Kg);
    // Pad and reshape [B, T, H, ·] → [B·H, chunks, C, ·].
    parallel_for(d.items, [&](int64_t i) {
      const int64_t b = i / H, h = i % H;
      for (int64_t t = 0; t < d.chunks * C; ++t) {
        const int64_t r = i * d.chunks * C + t;
        if (t < d.T) {
          const int64_t src = (b * d.T + t) * H + h;
          std::memcpy(&qp[r * K], q + src * K, K * sizeof(T));
          std::memcpy(&kp[r * K], k + src * K, K * sizeof(T));
          std::memcpy(&vp[r * V], v + src * V, V * sizeof(T));
          bp[r] = beta[src];
          std::memcpy(&gp[r * Kg], g + src * Kg, Kg * sizeof(T));
        } else {
          std::fill_n(&qp[r * K], K, T(0));
          std::fill_n(&kp[r * K], K, T(0));
          std::fill_n(&vp[r * V], V, T(0));
          bp[r] = T(0);
          std::fill_n(&gp[r * Kg], Kg, T(0));
        }
      }
    });

    // Stage (1), every chunk of every item.
    const int64_t nc = d.items * d.chunks;
    G = Buffer<T>(rows * Kg);
    Gam = Buffer<T>(nc * C * C * Kg);
    KK = Buffer<T>(nc * C * C);
    A = Buffer<T>(nc * C * C);
    Tm = Buffer<T>(nc * C * C);
    Kbe = Buffer<T>(rows * K);
    Vb = Buffer<T>(rows * V);
    W = Buffer<T>(rows * K);
    U = Buffer<T>(rows * V);
    parallel_for(d.items, [&](int64_t i) {
      for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
        const int64_t r0 = c * C;
        for (int64_t x = 0; x < Kg; ++x) {
          T acc = 0;
          for (int64_t t = 0; t < C; ++t) G[(r0 + t) * Kg + x] = acc += gp[(r0 + t) * Kg + x];
        }
        T* gam = &Gam[c * C * C * Kg];
        for (int64_t t = 0; t < C; ++t)
          for (int64_t j = 0; j < C; ++j)
            for (int64_t x = 0; x < Kg; ++x)
              gam[(t * C + j) * Kg + x] = j <= t ? std::exp(G[(r0 + t) * Kg + x] - G[(r0 + j) * Kg + x]) : T(0);
        T* kk = &KK[c * C * C];
        if (!d.pc) {
          gemm<T>(false, true, C, C, K, T(1), &kp[r0 * K], K, &kp[r0 * K], K, T(0), kk, C);
        } else {
          for (int64_t t = 0; t < C; ++t)
            for (int64_t j = 0; j < C; ++j) {
              T x = 0;
              if (j <= t)
                for (int64_t i = 0; i < K; ++i)
                  x += kp[(r0 + t) * K + i] * kp[(r0 + j) * K + i] * gam[(t * C + j) * K + i];
              kk[t * C + j] = x;
            }
        }
        T* a = &A[c * C * C];
        for (int64_t t = 0; t < C; ++t)
          for (int64_t j = 0; j < C; ++j)
            a[t * C + j] = j < t ? bp[r0 + t] * kk[t * C + j] * (d.pc ? T(1) : gam[t * C + j]) : T(0);
        // Tm = (I + A)⁻¹ by forward substitution: Tm_tj = δ_tj − Σ_{j ≤ m < t} A_tm Tm_mj.
        T* tm = &Tm[c * C * C];
        for (int64_t t = 0; t < C; ++t)
          for (int64_t j = 0; j < C; ++j) {
            if (j > t) {
              tm[t * C + j] = T(0);
              continue;
            }
            T x = j == t ? T(1) : T(0);
            for (int64_t m = j; m < t; ++m) x -= a[t * C + m] * tm[m * C + j];
            tm[t * C + j] = x;
          }
        for (int64_t t = 0; t < C; ++t) {
          for (int64_t x = 0; x < K; ++x)
            Kbe[(r0 + t) * K + x] = bp[r0 + t] * std::exp(G[(r0 + t) * Kg + (d.pc ? x : 0)]) * kp[(r0 + t) * K + x];
          for (int64_t x = 0; x < V; ++x) Vb[(r0 + t) * V + x] = bp[r0 + t] * vp[(r0 + t) * V + x];
        }
        gemm<T>(false, false, C, K, C, T(1), tm, C, &Kbe[r0 * K], K, T(0), &W[r0 * K], K);
        gemm<T>(false, false, C, V, C, T(1), tm, C, &Vb[r0 * V], V, T(0), &U[r0 * V], V);
      }
    });

    // Stage (2): S_0 = s0; V_new = U − W S; S ← Diag(exp(G_last)) S + (K ⊙ exp(G_last − G))ᵀ V_new.
    const int64_t KV = K * V;
    S = Buffer<T>(nc * KV);
    Vn = Buffer<T>(rows * V);
    Sfin = Buffer<T>(d.items * KV);
    Buffer<T> Kd(rows * K);  // K ⊙ exp(G_last − G), its own intermediate
    parallel_for(d.items, [&](int64_t i) {
      T* state = &Sfin[i * KV];
      if (s0 != nullptr) std::memcpy(state, s0 + i * KV, KV * sizeof(T));
      else std::fill_n(state, KV, T(0));
      for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
        const int64_t r0 = c * C;
        std::memcpy(&S[c * KV], state, KV * sizeof(T));
        T* vn = &Vn[r0 * V];
        std::memcpy(vn, &U[r0 * V], C * V * sizeof(T));
        gemm<T>(false, false, C, V, K, T(-1), &W[r0 * K], K, state, V, T(1), vn, V);
        const T* glast = &G[(r0 + C - 1) * Kg];
        for (int64_t t = 0; t < C; ++t)
          for (int64_t x = 0; x < K; ++x) {
            const int64_t xg = d.pc ? x : 0;
            Kd[(r0 + t) * K + x] = std::exp(glast[xg] - G[(r0 + t) * Kg + xg]) * kp[(r0 + t) * K + x];
          }
        for (int64_t x = 0; x < K; ++x) {
          const T decay = std::exp(glast[d.pc ? x : 0]);
          for (int64_t y = 0; y < V; ++y) state[x * V + y] *= decay;
        }
        gemm<T>(true, false, K, V, C, T(1), &Kd[r0 * K], K, vn, V, T(1), state, V);
      }
    });
  }
};

// P = Q Kᵀ ⊙ Γ (causal incl. the diagonal; per key channel P_tj = Σ_i q_t,i k_j,i Γ_tj,i, and QK is
// not formed) and QE = Q ⊙ exp(G) of every chunk.
template <class T>
void output_factors(const ChunkShape& d, const ForwardStages<T>& f, Buffer<T>& QK, Buffer<T>& P, Buffer<T>& QE) {
  const int64_t nc = d.items * d.chunks, K = d.K, Kg = d.Kg;
  QK = Buffer<T>(d.pc ? 1 : nc * C * C);
  P = Buffer<T>(nc * C * C);
  QE = Buffer<T>(nc * C * K);
  parallel_for(d.items, [&](int64_t i) {
    for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
      const int64_t r0 = c * C;
      if (!d.pc) {
        gemm<T>(false, true, C, C, K, T(1), &f.qp[r0 * K], K, &f.kp[r0 * K], K, T(0), &QK[c * C * C], C);
        for (int64_t x = 0; x < C * C; ++x) P[c * C * C + x] = QK[c * C * C + x] * f.Gam[c * C * C + x];
      } else {
        const T* gam = &f.Gam[c * C * C * K];
        for (int64_t t = 0; t < C; ++t)
          for (int64_t j = 0; j < C; ++j) {
            T x = 0;
            if (j <= t)
              for (int64_t i = 0; i < K; ++i)
                x += f.qp[(r0 + t) * K + i] * f.kp[(r0 + j) * K + i] * gam[(t * C + j) * K + i];
            P[c * C * C + t * C + j] = x;
          }
      }
      for (int64_t t = 0; t < C; ++t)
        for (int64_t x = 0; x < K; ++x)
          QE[(r0 + t) * K + x] = std::exp(f.G[(r0 + t) * Kg + (d.pc ? x : 0)]) * f.qp[(r0 + t) * K + x];
    }
  });
}

// Padded [items, chunks, C, width] → [B, T, H, width] (padding dropped).
template <class T>
void unpad(T* out, const Buffer<T>& padded, const ChunkShape& d, int64_t width) {
  parallel_for(d.items, [&](int64_t i) {
    const int64_t b = i / d.H, h = i % d.H;
    for (int64_t t = 0; t < d.T; ++t)
      std::memcpy(out + ((b * d.T + t) * d.H + h) * width, &padded[(i * d.chunks * C + t) * width],
                  width * sizeof(T));
  });
}

// Input gradients of chunk c for per_key_channel decay (padded buffers; see the backward).
template <class T>
void per_channel_input_grads(const ChunkShape& d, const ForwardStages<T>& f, int64_t c, const Buffer<T>& dA,
                             const Buffer<T>& dP, const Buffer<T>& dGam, const Buffer<T>& dSout,
                             const Buffer<T>& dKbe, const Buffer<T>& dQE, const Buffer<T>& dKd,
                             const Buffer<T>& dVb, Buffer<T>& dqp, Buffer<T>& dkp, Buffer<T>& dvp, Buffer<T>& dbp,
                             Buffer<T>& dG, Buffer<T>& dgp) {
  const int64_t K = d.K, V = d.V, KV = K * V, r0 = c * C, m0 = c * C * C;
  const T* kc = &f.kp[r0 * K];
  const T* qc = &f.qp[r0 * K];
  const T* gam = &f.Gam[m0 * K];
  T* dq = &dqp[r0 * K];
  T* dk = &dkp[r0 * K];
  T* dg = &dG[r0 * K];
  std::fill_n(dq, C * K, T(0));
  std::fill_n(dk, C * K, T(0));
  std::fill_n(dg, C * K, T(0));
  // Through A and P (Γ included).
  for (int64_t t = 0; t < C; ++t) {
    const T b = f.bp[r0 + t];
    for (int64_t j = 0; j <= t; ++j) {
      const T a = b * dA[m0 + t * C + j], p = dP[m0 + t * C + j];
      const T* gm = &gam[(t * C + j) * K];
      const T* dgm = &dGam[(m0 + t * C + j) * K];
      for (int64_t i = 0; i < K; ++i) {
        dq[t * K + i] += p * kc[j * K + i] * gm[i];
        dk[t * K + i] += a * kc[j * K + i] * gm[i];
        dk[j * K + i] += (a * kc[t * K + i] + p * qc[t * K + i]) * gm[i];
        // Γ_tj,i = exp(G_t,i − G_j,i): row t gets +, column j gets −.
        const T dl = dgm[i] * gm[i];
        dg[t * K + i] += dl;
        dg[j * K + i] -= dl;
      }
    }
  }
  const T* glast = &f.G[(r0 + C - 1) * K];
  std::vector<T> dglast(K, T(0));
  // State decay: S' = Diag(exp(G_last)) S + …  ⇒  dG_last,i += exp(G_last,i) Σ_v dSout_iv S_iv.
  for (int64_t i = 0; i < K; ++i) {
    T acc = 0;
    for (int64_t y = 0; y < V; ++y) acc += dSout[c * KV + i * V + y] * f.S[c * KV + i * V + y];
    dglast[i] += std::exp(glast[i]) * acc;
  }
  for (int64_t t = 0; t < C; ++t) {
    const int64_t r = r0 + t;
    const T b = f.bp[r];
    T dkbe_e_k = 0, dvb_v = 0;
    for (int64_t i = 0; i < K; ++i) {
      const T e = std::exp(f.G[r * K + i]), ed = std::exp(glast[i] - f.G[r * K + i]);
      const T dkbe_k = dKbe[r * K + i] * kc[t * K + i], dkd_k = dKd[r * K + i] * kc[t * K + i];
      dkbe_e_k += e * dkbe_k;
      dq[t * K + i] += e * dQE[r * K + i];
      dk[t * K + i] += b * e * dKbe[r * K + i] + ed * dKd[r * K + i];
      // exp(G_t,i) in Kbe and QE; exp(G_last,i − G_t,i) in Kd.
      dg[t * K + i] += e * (b * dkbe_k + dQE[r * K + i] * qc[t * K + i]) - ed * dkd_k;
      dglast[i] += ed * dkd_k;
    }
    for (int64_t x = 0; x < V; ++x) {
      dvb_v += dVb[r * V + x] * f.vp[r * V + x];
      dvp[r * V + x] = b * dVb[r * V + x];
    }
    dbp[r] += dkbe_e_k + dvb_v;
  }
  for (int64_t i = 0; i < K; ++i) {
    dg[(C - 1) * K + i] += dglast[i];
    T acc = 0;
    for (int64_t t = C - 1; t >= 0; --t) dgp[(r0 + t) * K + i] = acc += dg[t * K + i];
  }
}

}  // namespace

template <class T>
void delta_rule_chunk_ref_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                  const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  const ChunkShape d = shape_of(cu_seqlens, sizes);
  const ForwardStages<T> f(d, q, k, v, g, beta, s0);
  // Stage (3): O = (Q ⊙ exp(G)) S + P V_new for all chunks.
  Buffer<T> QK, P, QE;
  output_factors(d, f, QK, P, QE);
  const int64_t K = d.K, V = d.V;
  Buffer<T> Op(d.items * d.chunks * C * V);
  parallel_for(d.items, [&](int64_t i) {
    for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
      const int64_t r0 = c * C;
      gemm<T>(false, false, C, V, K, T(1), &QE[r0 * K], K, &f.S[c * K * V], V, T(0), &Op[r0 * V], V);
      gemm<T>(false, false, C, V, C, T(1), &P[c * C * C], C, &f.Vn[r0 * V], V, T(1), &Op[r0 * V], V);
    }
  });
  unpad(o, Op, d, V);
  if (s_final != nullptr) std::memcpy(s_final, f.Sfin.data(), d.items * K * V * sizeof(T));
}

template <class T>
void delta_rule_chunk_ref_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                                   const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                                   const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  const ChunkShape d = shape_of(cu_seqlens, sizes);
  const int64_t K = d.K, V = d.V, H = d.H, KV = K * V, nc = d.items * d.chunks, rows = nc * C, Kg = d.Kg;
  // Recompute stages (1)–(3)'s factors.
  const ForwardStages<T> f(d, q, k, v, g, beta, s0);
  Buffer<T> QK, P, QE;
  output_factors(d, f, QK, P, QE);
  Buffer<T> dOp(rows * V);  // padded d_o
  parallel_for(d.items, [&](int64_t i) {
    const int64_t b = i / H, h = i % H;
    for (int64_t t = 0; t < d.chunks * C; ++t) {
      T* dst = &dOp[(i * d.chunks * C + t) * V];
      if (t < d.T) std::memcpy(dst, d_o + ((b * d.T + t) * H + h) * V, V * sizeof(T));
      else std::fill_n(dst, V, T(0));
    }
  });

  // Reverse state recursion: dSout[c] is the gradient of chunk c's outgoing state;
  //   dV_new = Pᵀ dO + Kd dSout,  dS_in = exp(G_last) dSout + QEᵀ dO − Wᵀ dV_new.
  Buffer<T> dSout(nc * KV), dVn(rows * V), dS0(d.items * KV), Kd(rows * K);
  parallel_for(d.items, [&](int64_t i) {
    T* ds = &dS0[i * KV];
    if (ds_final != nullptr) std::memcpy(ds, ds_final + i * KV, KV * sizeof(T));
    else std::fill_n(ds, KV, T(0));
    for (int64_t c = (i + 1) * d.chunks - 1; c >= i * d.chunks; --c) {
      const int64_t r0 = c * C;
      std::memcpy(&dSout[c * KV], ds, KV * sizeof(T));
      const T* glast = &f.G[(r0 + C - 1) * Kg];
      for (int64_t t = 0; t < C; ++t)
        for (int64_t x = 0; x < K; ++x) {
          const int64_t xg = d.pc ? x : 0;
          Kd[(r0 + t) * K + x] = std::exp(glast[xg] - f.G[(r0 + t) * Kg + xg]) * f.kp[(r0 + t) * K + x];
        }
      T* dvn = &dVn[r0 * V];
      gemm<T>(true, false, C, V, C, T(1), &P[c * C * C], C, &dOp[r0 * V], V, T(0), dvn, V);
      gemm<T>(false, false, C, V, K, T(1), &Kd[r0 * K], K, ds, V, T(1), dvn, V);
      for (int64_t x = 0; x < K; ++x) {
        const T decay = std::exp(glast[d.pc ? x : 0]);
        for (int64_t y = 0; y < V; ++y) ds[x * V + y] *= decay;
      }
      gemm<T>(true, false, K, V, C, T(1), &QE[r0 * K], K, &dOp[r0 * V], V, T(1), ds, V);
      gemm<T>(true, false, K, V, C, T(-1), &f.W[r0 * K], K, dvn, V, T(1), ds, V);
    }
  });
  if (ds0 != nullptr) std::memcpy(ds0, dS0.data(), d.items * KV * sizeof(T));

  // Per-chunk gradients, each product its own whole-sequence buffer:
  //   dP = dO V_newᵀ (causal), dKd = V_new dSoutᵀ, dQE = dO Sᵀ, dW = −dV_new Sᵀ,
  //   dTm = dW Kbeᵀ + dV_new Vbᵀ, dKbe = Tmᵀ dW, dVb = Tmᵀ dV_new, dA = −Tmᵀ dTm Tmᵀ (strictly lower).
  Buffer<T> dP(nc * C * C), dKd(rows * K), dQE(rows * K), dW(rows * K), dTm(nc * C * C), dKbe(rows * K),
      dVb(rows * V), TdTm(nc * C * C), dA(nc * C * C);
  parallel_for(d.items, [&](int64_t i) {
    for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
      const int64_t r0 = c * C, m0 = c * C * C;
      gemm<T>(false, true, C, C, V, T(1), &dOp[r0 * V], V, &f.Vn[r0 * V], V, T(0), &dP[m0], C);
      for (int64_t t = 0; t < C; ++t)
        for (int64_t j = t + 1; j < C; ++j) dP[m0 + t * C + j] = T(0);
      gemm<T>(false, true, C, K, V, T(1), &f.Vn[r0 * V], V, &dSout[c * KV], V, T(0), &dKd[r0 * K], K);
      gemm<T>(false, true, C, K, V, T(1), &dOp[r0 * V], V, &f.S[c * KV], V, T(0), &dQE[r0 * K], K);
      gemm<T>(false, true, C, K, V, T(-1), &dVn[r0 * V], V, &f.S[c * KV], V, T(0), &dW[r0 * K], K);
      gemm<T>(false, true, C, C, K, T(1), &dW[r0 * K], K, &f.Kbe[r0 * K], K, T(0), &dTm[m0], C);
      gemm<T>(false, true, C, C, V, T(1), &dVn[r0 * V], V, &f.Vb[r0 * V], V, T(1), &dTm[m0], C);
      gemm<T>(true, false, C, K, C, T(1), &f.Tm[m0], C, &dW[r0 * K], K, T(0), &dKbe[r0 * K], K);
      gemm<T>(true, false, C, V, C, T(1), &f.Tm[m0], C, &dVn[r0 * V], V, T(0), &dVb[r0 * V], V);
      gemm<T>(true, false, C, C, C, T(1), &f.Tm[m0], C, &dTm[m0], C, T(0), &TdTm[m0], C);
      gemm<T>(false, true, C, C, C, T(-1), &TdTm[m0], C, &f.Tm[m0], C, T(0), &dA[m0], C);
      for (int64_t t = 0; t < C; ++t)
        for (int64_t j = t; j < C; ++j) dA[m0 + t * C + j] = T(0);
    }
  });

  // Through A = diag β (K Kᵀ ⊙ Γ) and P = Q Kᵀ ⊙ Γ: dKK = diag β dA ⊙ Γ, dQK = dP ⊙ Γ,
  // dΓ = diag β dA ⊙ K Kᵀ + dP ⊙ Q Kᵀ; dβ_t = Σ_j dA_tj (K Kᵀ ⊙ Γ)_tj.
  // Per key channel (KK already holds Σ_i k k Γ): dβ_t = Σ_j dA_tj KK_tj, and with a_tj = β_t dA_tj,
  // p_tj = dP_tj: dΓ_tj,i = (a_tj k_t,i + p_tj q_t,i) k_j,i [.., C, C, K]; dKK and dQK are not formed.
  const int64_t nmat = d.pc ? 1 : nc * C * C;
  Buffer<T> dKK(nmat), dQK(nmat), dGam(nc * C * C * Kg), dbp(rows);
  parallel_for(d.items, [&](int64_t i) {
    for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
      const int64_t r0 = c * C, m0 = c * C * C;
      if (d.pc) {
        const T* kc = &f.kp[r0 * K];
        const T* qc = &f.qp[r0 * K];
        for (int64_t t = 0; t < C; ++t) {
          const T b = f.bp[r0 + t];
          T db = 0;
          for (int64_t j = 0; j < C; ++j) {
            const int64_t x = m0 + t * C + j;
            db += dA[x] * f.KK[x];
            const T a = b * dA[x], p = dP[x];
            T* dgam = &dGam[x * K];
            for (int64_t i = 0; i < K; ++i) dgam[i] = (a * kc[t * K + i] + p * qc[t * K + i]) * kc[j * K + i];
          }
          dbp[r0 + t] = db;
        }
        continue;
      }
      for (int64_t t = 0; t < C; ++t) {
        const T b = f.bp[r0 + t];
        T db = 0;
        for (int64_t j = 0; j < C; ++j) {
          const int64_t x = m0 + t * C + j;
          dKK[x] = b * dA[x] * f.Gam[x];
          dQK[x] = dP[x] * f.Gam[x];
          dGam[x] = b * dA[x] * f.KK[x] + dP[x] * QK[x];
          db += dA[x] * f.KK[x] * f.Gam[x];
        }
        dbp[r0 + t] = db;
      }
    }
  });

  // Input gradients (padded): dQ = dQK K + exp(G) ⊙ dQE; dK = (dKK + dKKᵀ) K + dQKᵀ Q + β exp(G) dKbe
  // + exp(G_last − G) dKd; dV = β dVb; dβ += exp(G) (dKbe · k) + dVb · v; dG from Γ, exp(G), the
  // state decay and Kd; dg = reverse cumulative sum of dG inside the chunk.
  // Per key channel: dQ_t = Σ_j p_tj k_j ⊙ Γ_tj, dK_t = Σ_j a_tj k_j ⊙ Γ_tj + Σ_s (a_st k_s + p_st q_s) ⊙ Γ_st,
  // and every exp(G) / decay factor per channel; dG [.., C, K], reverse cumulative sum per channel.
  Buffer<T> dqp(rows * K), dkp(rows * K), dvp(rows * V), dG(rows * Kg), dgp(rows * Kg);
  parallel_for(d.items, [&](int64_t i) {
    for (int64_t c = i * d.chunks; c < (i + 1) * d.chunks; ++c) {
      const int64_t r0 = c * C, m0 = c * C * C;
      const T* kc = &f.kp[r0 * K];
      const T* qc = &f.qp[r0 * K];
      if (d.pc) {
        per_channel_input_grads(d, f, c, dA, dP, dGam, dSout, dKbe, dQE, dKd, dVb, dqp, dkp, dvp, dbp, dG, dgp);
        continue;
      }
      gemm<T>(false, false, C, K, C, T(1), &dQK[m0], C, kc, K, T(0), &dqp[r0 * K], K);
      gemm<T>(false, false, C, K, C, T(1), &dKK[m0], C, kc, K, T(0), &dkp[r0 * K], K);
      gemm<T>(true, false, C, K, C, T(1), &dKK[m0], C, kc, K, T(1), &dkp[r0 * K], K);
      gemm<T>(true, false, C, K, C, T(1), &dQK[m0], C, qc, K, T(1), &dkp[r0 * K], K);
      const T glast = f.G[r0 + C - 1];
      T dglast = 0;
      // State decay: S' = exp(G_last) S + …  ⇒  dG_last += exp(G_last) Σ dSout ⊙ S.
      T dgam = 0;
      for (int64_t x = 0; x < KV; ++x) dgam += dSout[c * KV + x] * f.S[c * KV + x];
      dglast += std::exp(glast) * dgam;
      for (int64_t t = 0; t < C; ++t) {
        const int64_t r = r0 + t;
        const T e = std::exp(f.G[r]), ed = std::exp(glast - f.G[r]), b = f.bp[r];
        T dkbe_k = 0, dqe_q = 0, dkd_k = 0, dvb_v = 0;
        for (int64_t x = 0; x < K; ++x) {
          dkbe_k += dKbe[r * K + x] * kc[t * K + x];
          dqe_q += dQE[r * K + x] * qc[t * K + x];
          dkd_k += dKd[r * K + x] * kc[t * K + x];
          dqp[r * K + x] += e * dQE[r * K + x];
          dkp[r * K + x] += b * e * dKbe[r * K + x] + ed * dKd[r * K + x];
        }
        for (int64_t x = 0; x < V; ++x) {
          dvb_v += dVb[r * V + x] * f.vp[r * V + x];
          dvp[r * V + x] = b * dVb[r * V + x];
        }
        dbp[r] += e * dkbe_k + dvb_v;
        // exp(G_t) in Kbe and QE; exp(G_last − G_t) in Kd.
        T dgt = e * (b * dkbe_k + dqe_q) - ed * dkd_k;
        dglast += ed * dkd_k;
        // Γ_tj = exp(G_t − G_j): row t gets +, column t gets −.
        for (int64_t j = 0; j < C; ++j) {
          dgt += dGam[m0 + t * C + j] * f.Gam[m0 + t * C + j];
          dgt -= dGam[m0 + j * C + t] * f.Gam[m0 + j * C + t];
        }
        dG[r] = dgt;
      }
      dG[r0 + C - 1] += dglast;
      T acc = 0;
      for (int64_t t = C - 1; t >= 0; --t) dgp[r0 + t] = acc += dG[r0 + t];
    }
  });
  unpad(dq, dqp, d, K);
  unpad(dk, dkp, d, K);
  unpad(dv, dvp, d, V);
  unpad(dg, dgp, d, Kg);
  unpad(dbeta, dbp, d, 1);
}

#define TRILLION_INSTANTIATE(T)                                                                                    \
  template void delta_rule_chunk_ref_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,         \
                                                const T*, const int32_t*, const DeltaRuleSizes&);                 \
  template void delta_rule_chunk_ref_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*,  \
                                                 const T*, const T*, const T*, const T*, const int32_t*,          \
                                                 const DeltaRuleSizes&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
