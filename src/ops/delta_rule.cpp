// The gated delta rule in recurrent form, forward and backward (see delta_rule.h for the math,
// layouts and segments).
// A work item is one (segment, head) pair, run token by token on a state S[K, V] held in a per-thread
// scratch allocated before the parallel region. Every sum runs in a fixed index order inside one item.
// Backward: a first pass runs the recurrence and keeps the state at the start of every
// kDeltaRuleCheckpoint-token chunk; then, chunk by chunk from the last, it recomputes the chunk's
// states from its checkpoint and runs the reverse recursion for dS through the chunk.
#include "ops/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/delta_rule_segments.h"

namespace trillion {
namespace {

using delta_rule_detail::check_and_longest_segment;
using delta_rule_detail::load_state;
using delta_rule_detail::Segment;
using delta_rule_detail::segment_count;
using delta_rule_detail::segment_of;


// Index of (row, t, h) in a [B, T, H] array.
inline int64_t token_index(const DeltaRuleSizes& s, int64_t row, int64_t t, int64_t h) {
  return (row * s.seq_len + t) * s.heads + h;
}

// dec[K] = exp(g) of one token and head: g[tok] broadcast (per head) or g[tok, K] (per key channel).
template <class T>
void load_decay(T* dec, const T* g, int64_t tok, const DeltaRuleSizes& s) {
  const int64_t K = s.key_dim;
  if (s.decay == DeltaDecay::per_key_channel) {
    for (int64_t i = 0; i < K; ++i) dec[i] = std::exp(g[tok * K + i]);
  } else {
    std::fill(dec, dec + K, std::exp(g[tok]));
  }
}

// out[V] = Sᵀ x for S[K, V], x[K].
template <class T>
void transpose_times(T* out, const T* S, const T* x, int64_t K, int64_t V) {
  std::fill(out, out + V, T(0));
  for (int64_t i = 0; i < K; ++i) {
    const T* row = S + i * V;  // [V]
    const T xi = x[i];
    for (int64_t j = 0; j < V; ++j) out[j] += xi * row[j];
  }
}

// One token, in place on S[K, V]: S ← Diag(dec) S; u = β (v − Sᵀ k); S ← S + k uᵀ. u[V] is scratch.
template <class T>
void advance(T* S, T* u, const T* dec, const T* k, const T* v, T beta, int64_t K, int64_t V) {
  std::fill(u, u + V, T(0));
  for (int64_t i = 0; i < K; ++i) {
    T* row = S + i * V;  // [V]
    const T d = dec[i], ki = k[i];
    for (int64_t j = 0; j < V; ++j) {
      row[j] *= d;
      u[j] += ki * row[j];
    }
  }
  for (int64_t j = 0; j < V; ++j) u[j] = beta * (v[j] - u[j]);
  for (int64_t i = 0; i < K; ++i) {
    T* row = S + i * V;  // [V]
    const T ki = k[i];
    for (int64_t j = 0; j < V; ++j) row[j] += ki * u[j];
  }
}

}  // namespace

template <class T>
void delta_rule_recurrent_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                  const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  check_and_longest_segment(cu_seqlens, sizes);
  const int64_t K = sizes.key_dim, V = sizes.value_dim, KV = K * V, H = sizes.heads;
  const int64_t segments = segment_count(cu_seqlens, sizes);
  // Per thread: state [K, V], dec [K], u [V].
  const int64_t per_thread = KV + K + V;
  Buffer<T> scratch(num_threads() * per_thread);
  parallel_for(segments * H, [&](int64_t item) {
    const int64_t n = item / H, h = item % H;
    const Segment seg = segment_of(n, cu_seqlens, sizes);
    T* S = scratch.data() + omp_get_thread_num() * per_thread;  // [K, V]
    T* dec = S + KV;                                            // [K]
    T* u = dec + K;                                             // [V]
    load_state(S, s0, n, h, sizes);
    for (int64_t t = seg.begin; t < seg.end; ++t) {
      const int64_t tok = token_index(sizes, seg.row, t, h);
      load_decay(dec, g, tok, sizes);
      advance(S, u, dec, k + tok * K, v + tok * V, beta[tok], K, V);
      transpose_times(o + tok * V, S, q + tok * K, K, V);
    }
    if (s_final != nullptr) std::memcpy(s_final + (n * H + h) * KV, S, KV * sizeof(T));
  });
}

template <class T>
void delta_rule_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                                   const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                                   const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  const int64_t longest = check_and_longest_segment(cu_seqlens, sizes);
  const int64_t K = sizes.key_dim, V = sizes.value_dim, KV = K * V, H = sizes.heads;
  const int64_t segments = segment_count(cu_seqlens, sizes);
  constexpr int64_t C = kDeltaRuleCheckpoint;
  const int64_t max_chunks = std::max<int64_t>(1, (longest + C - 1) / C);
  const bool per_channel = sizes.decay == DeltaDecay::per_key_channel;
  // Per thread: checkpoints [max_chunks, K, V], chunk states [C + 1, K, V], A [K, V], dS [K, V],
  // dec [K], dg_row [K], u [V], r [V], du [V], dp [V].
  const int64_t per_thread = (max_chunks + C + 3) * KV + 2 * K + 4 * V;
  Buffer<T> scratch(num_threads() * per_thread);
  parallel_for(segments * H, [&](int64_t item) {
    const int64_t n = item / H, h = item % H;
    const Segment seg = segment_of(n, cu_seqlens, sizes);
    T* checkpoints = scratch.data() + omp_get_thread_num() * per_thread;  // [max_chunks, K, V]
    T* states = checkpoints + max_chunks * KV;                            // [C + 1, K, V]
    T* A = states + (C + 1) * KV;                                         // [K, V]
    T* dS = A + KV;                                                       // [K, V]
    T* dec = dS + KV;                                                     // [K]
    T* dg_row = dec + K;                                                  // [K]
    T* u = dg_row + K;                                                    // [V]
    T* r = u + V;                                                         // [V]
    T* du = r + V;                                                        // [V]
    T* dp = du + V;                                                       // [V]
    const int64_t chunks = (seg.end - seg.begin + C - 1) / C;

    // Pass 1: the state at the start of every chunk.
    load_state(checkpoints, s0, n, h, sizes);
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      T* S = checkpoints + (c + 1) * KV;  // [K, V]
      std::memcpy(S, checkpoints + c * KV, KV * sizeof(T));
      for (int64_t t = seg.begin + c * C; t < seg.begin + (c + 1) * C; ++t) {
        const int64_t tok = token_index(sizes, seg.row, t, h);
        load_decay(dec, g, tok, sizes);
        advance(S, u, dec, k + tok * K, v + tok * V, beta[tok], K, V);
      }
    }

    // Pass 2: chunks from the last; dS is the gradient of the state after the current token.
    if (ds_final != nullptr) {
      std::memcpy(dS, ds_final + (n * H + h) * KV, KV * sizeof(T));
    } else {
      std::fill(dS, dS + KV, T(0));
    }
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t c_begin = seg.begin + c * C, c_end = std::min(seg.end, c_begin + C);
      // states[t − c_begin] is the state before token t, states[t − c_begin + 1] after it.
      std::memcpy(states, checkpoints + c * KV, KV * sizeof(T));
      for (int64_t t = c_begin; t < c_end; ++t) {
        const int64_t tok = token_index(sizes, seg.row, t, h);
        T* S = states + (t - c_begin + 1) * KV;  // [K, V]
        std::memcpy(S, S - KV, KV * sizeof(T));
        load_decay(dec, g, tok, sizes);
        advance(S, u, dec, k + tok * K, v + tok * V, beta[tok], K, V);
      }
      for (int64_t t = c_end - 1; t >= c_begin; --t) {
        const int64_t tok = token_index(sizes, seg.row, t, h);
        const T* S_prev = states + (t - c_begin) * KV;  // [K, V]
        const T* S_t = S_prev + KV;                     // [K, V]
        const T* qt = q + tok * K;                      // [K]
        const T* kt = k + tok * K;                      // [K]
        const T* vt = v + tok * V;                      // [V]
        const T* dot = d_o + tok * V;                   // [V]
        T* dqt = dq + tok * K;                          // [K]
        T* dkt = dk + tok * K;                          // [K]
        T* dvt = dv + tok * V;                          // [V]
        const T bt = beta[tok];
        // A = Diag(dec) S_prev, r = v − Aᵀ k, u = β r.
        load_decay(dec, g, tok, sizes);
        std::fill(r, r + V, T(0));
        for (int64_t i = 0; i < K; ++i) {
          for (int64_t j = 0; j < V; ++j) {
            A[i * V + j] = dec[i] * S_prev[i * V + j];
            r[j] += kt[i] * A[i * V + j];
          }
        }
        for (int64_t j = 0; j < V; ++j) {
          r[j] = vt[j] - r[j];
          u[j] = bt * r[j];
        }
        // o = S_tᵀ q: dq = S_t do, dS += q doᵀ. Then S_t = A + k uᵀ: dk = dS u, du = dSᵀ k.
        std::fill(du, du + V, T(0));
        for (int64_t i = 0; i < K; ++i) {
          const T* s_row = S_t + i * V;  // [V]
          T* ds_row = dS + i * V;        // [V]
          T dq_i = 0, dk_i = 0;
          for (int64_t j = 0; j < V; ++j) {
            dq_i += s_row[j] * dot[j];
            ds_row[j] += qt[i] * dot[j];
            dk_i += ds_row[j] * u[j];
            du[j] += kt[i] * ds_row[j];
          }
          dqt[i] = dq_i;
          dkt[i] = dk_i;
        }
        // u = β (v − Aᵀ k): dv = β du, dβ = r · du, dp = −β du for p = Aᵀ k.
        T dbeta_t = 0;
        for (int64_t j = 0; j < V; ++j) {
          dvt[j] = bt * du[j];
          dbeta_t += r[j] * du[j];
          dp[j] = -bt * du[j];
        }
        dbeta[tok] = dbeta_t;
        // p = Aᵀ k: dk += A dp, dA = dS + k dpᵀ (into dS). A = Diag(exp(g)) S_prev: dg_i = Σ_j dA_ij A_ij,
        // dS_prev = Diag(dec) dA.
        for (int64_t i = 0; i < K; ++i) {
          const T* a_row = A + i * V;  // [V]
          T* ds_row = dS + i * V;      // [V]
          T dk_i = 0, dg_i = 0;
          for (int64_t j = 0; j < V; ++j) {
            dk_i += a_row[j] * dp[j];
            ds_row[j] += kt[i] * dp[j];
            dg_i += ds_row[j] * a_row[j];
            ds_row[j] *= dec[i];
          }
          dkt[i] += dk_i;
          dg_row[i] = dg_i;
        }
        if (per_channel) {
          std::memcpy(dg + tok * K, dg_row, K * sizeof(T));
        } else {
          T dg_t = 0;
          for (int64_t i = 0; i < K; ++i) dg_t += dg_row[i];
          dg[tok] = dg_t;
        }
      }
    }
    if (ds0 != nullptr) std::memcpy(ds0 + (n * H + h) * KV, dS, KV * sizeof(T));
  });
}

#define TRILLION_INSTANTIATE_DELTA_RULE(T)                                                                          \
  template void delta_rule_recurrent_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                                const int32_t*, const DeltaRuleSizes&);                             \
  template void delta_rule_recurrent_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                                 const T*, const T*, const T*, const T*, const int32_t*,            \
                                                 const DeltaRuleSizes&);
TRILLION_INSTANTIATE_DELTA_RULE(float)
TRILLION_INSTANTIATE_DELTA_RULE(double)
#undef TRILLION_INSTANTIATE_DELTA_RULE

}  // namespace trillion
