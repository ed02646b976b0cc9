// A plain, unfused chunked gated delta rule: the chunked form (ops/delta_rule.h) as a framework
// composes it from whole-tensor ops (transformers' torch_chunk_gated_delta_rule style). It is the
// "unfused" baseline of `trillion bench linear-attention`, not a production kernel.
//
// Same signatures, layouts, math and gradient rule as delta_rule_chunk_forward / _backward, but:
//  * both decay kinds, but only cu_seqlens == null (one segment per batch row) is supported
//    (TRILLION_CHECK otherwise). Per key channel, G is [C, K] per chunk and Γ_tj,i =
//    exp(G_t,i − G_j,i) (j ≤ t) an explicit [C, C, K] buffer (never exp(G_t) · exp(−G_j), so no
//    overflow); K Kᵀ ⊙ Γ and Q Kᵀ ⊙ Γ become Σ_i k_t,i k_j,i Γ_tj,i and Σ_i q_t,i k_j,i Γ_tj,i (plain
//    loops), exp(G) / exp(G_last − G) / the state decay act per channel, and dg is the per-channel
//    reverse cumulative sum of dG [C, K];
//  * every batch row is zero-padded to a whole number of chunks of kDeltaRuleChunk tokens (k, q, v,
//    β and g zero in the padding, which then changes nothing);
//  * the work runs stage by stage over the WHOLE sequence, every intermediate materialized in its
//    own Buffer (shapes per (batch row, head) item, `chunks` = ⌈T / C⌉):
//      (1) padded inputs, cumulative G, Γ, K Kᵀ (⊙ Γ per key channel), A = strict_tril(diag β (K Kᵀ ⊙ Γ)), Tm = (I + A)⁻¹
//          by forward substitution, W, U                         [chunks, C, ·];
//      (2) the inter-chunk state recursion: every chunk's incoming state [chunks, K, V] and V_new;
//      (3) the outputs of all chunks (Q Kᵀ, P, Q ⊙ exp(G), O).
//    Backward recomputes stages (1)–(2), runs the reverse state recursion storing every chunk's dS
//    (gradient of its outgoing state) and dV_new, then the per-chunk gradients through W, U and Tm
//    (dL = −Tmᵀ dTm Tmᵀ, strictly lower; reverse cumulative sum of dG for dg), each its own Buffer.
// Matrix products are gemm<T>() calls, loops are plain; parallel over (batch row, head) items only.
#pragma once

#include <cstdint>

#include "ops/delta_rule.h"

namespace trillion {

// Unfused chunked form of delta_rule_chunk_forward (same arguments; cu_seqlens null).
template <class T>
void delta_rule_chunk_ref_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                  const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

// Unfused chunked form of delta_rule_chunk_backward (same arguments; cu_seqlens null).
template <class T>
void delta_rule_chunk_ref_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* ds0, const T* d_o, const T* ds_final,
                                   const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0,
                                   const int32_t* cu_seqlens, const DeltaRuleSizes& sizes);

}  // namespace trillion
