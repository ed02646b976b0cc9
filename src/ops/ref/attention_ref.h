// Plain causal GQA attention: the full [q_len, kv_len] score matrix of one head at a time, a
// row softmax, and the textbook backward. It is the test oracle for the tiled kernel
// (ops/attention.h) and the baseline of `trillion bench attention`; it is not meant to be fast
// or frugal (its workspace is two [q_len, kv_len] matrices).
//
// Layouts, causality and scale are those of ops/attention.h:
//   q, dq: [batch, q_len, q_heads, head_dim];  k, dk: [batch, kv_len, kv_heads, head_dim]
//   out, dout: [batch, q_len, q_heads, v_dim];  v, dv: [batch, kv_len, kv_heads, v_dim]
//   lse: [batch, q_heads, q_len]
// Forward writes lse like the tiled kernel; the reference backward does not read it (it recomputes
// the probabilities from q and k), so nothing else is saved.
// Gradient rule: dq, dk, dv are written (=).
#pragma once

#include "ops/attention.h"

namespace trillion {

// Writes out and lse (log-sum-exp of the scaled, masked scores of each query row).
template <class T>
void attention_ref_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& sizes);

// Recomputes the probabilities from q and k, then dv = Pᵀ dout, dP = dout vᵀ,
// dS = P ⊙ (dP − rowsum(P ⊙ dP)), dq = dS k · scale, dk = dSᵀ q · scale (summed over the query
// heads that share a key/value head).
template <class T>
void attention_ref_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                            const AttentionSizes& sizes);

}  // namespace trillion
