// The gated delta rule (linear attention of Gated DeltaNet / Qwen3-Next and of Kimi Delta
// Attention), forward and backward: the recurrent form, one token at a time (delta_rule.cpp), and the
// chunked form below (delta_rule_chunk.cpp; same results to rounding, for training).
//
// Per sequence segment and value head, with a state S[K, V] and tokens t in order:
//   S ← Diag(exp(g_t)) S            (per-head decay: g_t scalar, S ← exp(g_t) S)
//   u_t = β_t (v_t − Sᵀ k_t)
//   S ← S + k_t u_tᵀ
//   o_t = Sᵀ q_t
// q and k arrive L2-normalized and q scaled (by K^−½) by the caller; key heads are already repeated
// to the value heads, so q, k, v, g, β share one head count H.
//
// Layouts (row-major, token-major with heads inside, as the projections produce them):
//   q, k, dq, dk: [B, T, H, K]        v, o, dv, d_o: [B, T, H, V]
//   g, dg:        [B, T, H] (per_head) or [B, T, H, K] (per_key_channel)
//   beta, dbeta:  [B, T, H]
//   s0, s_final, ds0, ds_final: [N, H, K, V], one state per segment.
//
// Segments. With cu_seqlens == null every batch row is one segment (N = B). With cu_seqlens
// (as fla's cu_seqlens) the tokens are packed: batch must be 1, cu_seqlens[N + 1] (N =
// sizes.num_segments) holds the segment starts, cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T;
// segment n covers tokens [cu_seqlens[n], cu_seqlens[n + 1]) (it may be empty). At every segment
// start the state is that segment's s0[n] (zeros when s0 is null), and s_final[n] is its state after
// its last token.
//
// Backward, per token from the last, with dS the gradient of the state after the token (starting
// from ds_final), A = Diag(exp(g_t)) S_{t−1}, r = v_t − Aᵀ k_t, u = β_t r:
//   dS += q_t d_o_tᵀ;  dq_t = S_t d_o_t;  du = dSᵀ k_t;  dv_t = β_t du;  dβ_t = r · du;  dp = −β_t du;
//   dk_t = dS u + A dp;  dA = dS + k_t dpᵀ;  dg_t,i = Σ_j dA_ij A_ij (per head: summed over i);
//   dS ← Diag(exp(g_t)) dA;  ds0 is dS before the segment's first token.
// Forward saves nothing: backward takes the forward's inputs and recomputes the states, keeping a
// checkpoint every kDeltaRuleCheckpoint tokens, so its scratch is per thread
// about (max(1, ⌈L/64⌉) + 67) · K · V values for the longest segment L, never [T, K, V] per head.
// Gradient rule: dq, dk, dv, dg, dbeta and ds0 are written (=).
// Work items are (segment, head) pairs, each sequential, so results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace trillion {

enum class DeltaDecay {
  per_head,         // Gated DeltaNet: g [B, T, H]
  per_key_channel,  // Kimi Delta Attention: g [B, T, H, K]
};

struct DeltaRuleSizes {
  int64_t batch = 1;         // B (1 when cu_seqlens is given)
  int64_t seq_len = 0;       // T, tokens per batch row (packed: all tokens)
  int64_t heads = 0;         // H
  int64_t key_dim = 0;       // K
  int64_t value_dim = 0;     // V
  int64_t num_segments = 0;  // N when cu_seqlens is given; ignored otherwise (N = B)
  DeltaDecay decay = DeltaDecay::per_head;
};

// Tokens between two saved states in the backward's recomputation.
inline constexpr int64_t kDeltaRuleCheckpoint = 64;

// o[B, T, H, V] and s_final[N, H, K, V] (null: not wanted) from q, k [B, T, H, K], v [B, T, H, V],
// g [B, T, H] or [B, T, H, K], beta [B, T, H], s0 [N, H, K, V] (null: zeros), cu_seqlens [N + 1]
// (null: one segment per batch row).
template <class T>
void delta_rule_recurrent_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                  const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

// dq, dk [B, T, H, K], dv [B, T, H, V], dg (shape of g), dbeta [B, T, H], ds0 [N, H, K, V] (null: not
// wanted; defined also when s0 is null), all written (=), from d_o [B, T, H, V], ds_final
// [N, H, K, V] (null: zeros) and the forward's inputs.
template <class T>
void delta_rule_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                                   const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                                   const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

// Chunked form (delta_rule_chunk.cpp): same API, layouts, segments and gradient rule as the
// recurrent form, and the same results to rounding. Segments are cut into chunks of
// kDeltaRuleChunk tokens (the last one partial); inside a chunk G is the cumulative log-decay and
// Γ_tj = exp(G_t − G_j) (per key channel for per_key_channel decay), and with the incoming state S:
//   Tm = (I + strict_tril(diag(β)(K Kᵀ ⊙ Γ)))⁻¹,  W = Tm diag(β)(K ⊙ exp(G)),  U = Tm diag(β) V,
//   V_new = U − W S,  O = (Q ⊙ exp(G)) S + (Q Kᵀ ⊙ Γ, causal incl. diagonal) V_new,
//   S' = exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ V_new.
// Forward saves nothing; backward recomputes the chunk-start states into per-thread scratch of about
// (⌈L/64⌉ + 2) · K · V values for the longest segment L, plus O(64 · (K + V + 64)) per thread.
inline constexpr int64_t kDeltaRuleChunk = 64;

// Forward FLOPs per token and head of the chunked form (the linear-attention issue's count):
// 2 · kDeltaRuleChunk · (3 K + 2 V) + 6 K V; training, forward and backward, takes 3 times it.
inline double delta_rule_chunk_flops_per_token(int64_t key_dim, int64_t value_dim) {
  const double k = double(key_dim), v = double(value_dim);
  return 2.0 * double(kDeltaRuleChunk) * (3.0 * k + 2.0 * v) + 6.0 * k * v;
}

// Chunked form of delta_rule_recurrent_forward (same arguments).
template <class T>
void delta_rule_chunk_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                              const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

// Chunked form of delta_rule_recurrent_backward (same arguments).
template <class T>
void delta_rule_chunk_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                               const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                               const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

// The bytes of delta_rule_chunk_forward's and delta_rule_chunk_backward's temporaries (their
// per-thread scratch of T at `threads` threads; the backward's grows with the longest segment, T
// without cu_seqlens), for the memory plan.
int64_t delta_rule_chunk_forward_workspace_bytes(int64_t key_dim, int64_t value_dim, int64_t element_bytes,
                                                 int threads);
int64_t delta_rule_chunk_backward_workspace_bytes(int64_t key_dim, int64_t value_dim, int64_t longest_segment,
                                                  int64_t element_bytes, int threads);

}  // namespace trillion
