// Plain sparse attention over a per-query selected key set: the selection turned into a dense
// [q_len, kv_len] mask, the full score matrix of one head at a time with −inf outside the selected
// set, a row softmax, and the textbook backward. It is the test oracle for the tiled kernel
// (ops/sparse_attention.h) and the "gather + dense attention" baseline of a benchmark; it is not
// meant to be fast or frugal (its workspace is three [q_len, kv_len] matrices).
//
// Layouts, selection rules, GQA and scale are those of ops/sparse_attention.h:
//   q, dq: [batch, q_len, q_heads, qk_dim];  k, dk: [batch, kv_len, kv_heads, qk_dim]
//   v, dv: [batch, kv_len, kv_heads, v_dim];  out, dout: [batch, q_len, q_heads, v_dim]
//   lse: [batch, q_heads, q_len];  indices: [batch, q_len, topk] int32, −1 padded
// Forward writes lse like the tiled kernel; the reference backward does not read it (it recomputes
// the probabilities from q and k), so nothing else is saved.
// Gradient rule: dq, dk, dv are written (=).
#pragma once

#include <cstdint>

#include "ops/sparse_attention.h"

namespace trillion {

// Writes out and lse (log-sum-exp of the scaled scores of each query row's selected keys).
template <class T>
void sparse_attention_ref_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                                  const SparseAttentionSizes& sizes);

// Recomputes the masked probabilities P from q and k, then dv = Pᵀ dout, dP = dout vᵀ,
// dS = P ⊙ (dP − rowsum(P ⊙ dP)), dq = dS k · scale, dk = dSᵀ q · scale (summed over the query
// heads that share a key/value head).
template <class T>
void sparse_attention_ref_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                   const int32_t* indices, const SparseAttentionSizes& sizes);

// indices[batch, q_len, topk] ← the full causal selection: row t holds keys 0 .. t + kv_len − q_len
// in increasing order, then −1. Requires topk ≥ kv_len (the last row sees every key).
void causal_all_indices(int32_t* indices, int64_t batch, int64_t q_len, int64_t kv_len, int64_t topk);

}  // namespace trillion
