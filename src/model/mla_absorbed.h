// MLA's weight-absorbed form (DeepSeek-V2 §2.1.2), which decoding and context-parallel training use
// (model/mla.h): per head the query's nope part is mapped into the latent space by that head's key
// rows of kv_b_proj, attention runs over per-token rows [e | k_rot] shared by every head (one key
// head) with values e, and the head's value rows of kv_b_proj map its output back. Scores and
// outputs are those of the expanded form, and the keys [tokens, H, nope + rope] are never built:
// a token's row is r_kv + rope values however many heads read it.
//
// The latent e and the weight W_e that maps it ([H·(nope + v), L], per head nope key rows W_UK
// [nope, L], then v value rows W_UV [v, L]):
// - without an adapter on kv_b_proj, e = c and W_e = kv_b_proj (L = r_kv); decoding, which has no
//   dropout, merges an adapter into the weight (model/linear.h merged_weight);
// - training with an adapter (rank r_a) uses e = [c | scaling · u] with u = dropout(c) · Aᵀ, its
//   down projection (model/linear.h lora_down), and W_e = [kv_b_proj | B] (L = r_kv + r_a):
//   W_e · e = kv_b_proj(c) with its adapter, dropout included, which no merged weight could give.
// Gradient rule: the products' input gradients are written (=), dW_e accumulates (+=; null: a
// frozen kv_b_proj, skipped).
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "model/linear.h"
#include "model/mla.h"

namespace trillion {

// q_abs[n, H, L + rope] = per head [q_nope · W_UK | q_rot], from q[n, H, nope + rope]; and its
// backward: dq[n, H, nope + rope] (=) and dW_e's key rows += q_nopeᵀ · dq_abs's latent part.
template <class T>
void absorb_queries(T* q_abs, const T* q, const T* w_e, int64_t latent, int64_t n, const MlaDims& dims);
template <class T>
void absorb_queries_backward(T* dq, T* dw_e, const T* dq_abs, const T* q, const T* w_e, int64_t latent, int64_t n,
                             const MlaDims& dims);

// out[n, H, v] = per head out_latent · W_UVᵀ, from out_latent[n, H, L]; and its backward:
// d_out_latent[n, H, L] (=) = per head d_out · W_UV, and dW_e's value rows += d_outᵀ · out_latent.
template <class T>
void expand_outputs(T* out, const T* out_latent, const T* w_e, int64_t latent, int64_t n, const MlaDims& dims);
template <class T>
void expand_outputs_backward(T* d_out_latent, T* dw_e, const T* d_out, const T* out_latent, const T* w_e,
                             int64_t latent, int64_t n, const MlaDims& dims);

// Training's W_e [H·(nope + v), L] (L = dims.absorbed_latent()): kv_b_proj itself, or with an adapter
// [kv_b_proj | B] formed in scratch.
template <class T>
const T* absorbed_weight(const LinearWeights<T>& kv_b, const MlaDims& dims, Arena& scratch);
// grads of kv_b_proj (its weight, its adapter's B; a null one is frozen) += dW_e [H·(nope + v), L].
template <class T>
void absorbed_weight_grad(const LinearWeights<T>& grads, const T* dw_e, const MlaDims& dims);

// Training's rows of n tokens, rows[n, L + rope] = [c | scaling · u | k_rot], from the latent
// c[n, r_kv] and kv_a[n, r_kv + rope] (its k_rot rotated), u drawn with this pass's dropout masks;
// and their backward from d_rows[n, L + rope]: d_latent[n, r_kv] (=) = dc and the adapter's input
// gradient, d_kv_a's rope columns (=) d k_rot, and the adapter's A gradient (+=).
template <class T>
void latent_rows(T* rows, const T* latent, const T* kv_a, const LinearWeights<T>& kv_b, int64_t n, const MlaDims& dims);
template <class T>
void latent_rows_backward(T* d_latent, T* d_kv_a, const LinearWeights<T>& grads, const T* d_rows, const T* latent,
                          const LinearWeights<T>& kv_b, int64_t n, const MlaDims& dims);

}  // namespace trillion
