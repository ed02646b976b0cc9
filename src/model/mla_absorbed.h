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
#include "model/step.h"
#include "ops/attention.h"

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

// Context parallelism (model/step.h's ContextExchange): attention of this rank's `seq` tokens of
// `batch` sequences in the absorbed form over the whole sequences' rows (whole_len tokens each): one
// key head of L + rope dims, values over L (doc_start [batch, seq] in global positions, or null).
inline AttentionSizes absorbed_sizes(const MlaDims& dims, int64_t batch, int64_t seq, int64_t whole_len,
                                     const int32_t* doc_start) {
  return {batch, seq, whole_len, dims.heads, 1, dims.absorbed_row(), dims.scale, dims.absorbed_latent(), doc_start};
}

// The whole sequences' rows [e | k_rot], gathered from every rank's (never expanded keys), and their
// latents e, contiguous (the values); m = batch · the whole length.
template <class T>
struct WholeRows {
  T* rows;    // [m, L + rope]
  T* latent;  // [m, L]
};

// The forward's operands, in scratch in this order: W_e (absorbed_weight), the whole rows (this
// rank's [n, L + rope] from its latent c [n, r_kv] and kv_a [n, r_kv + rope], its k_rot rotated;
// then the gathered ones), and the absorbed queries q_abs [n, H, L + rope] from q [n, H, nope +
// rope]. Attention then runs through the exchange (gathered_attention_forward: q_abs over rows and
// latents, sizes = absorbed_sizes) into the output over the latents [n, H, L], which expand_outputs
// maps to [n, H, v].
template <class T>
struct AbsorbedOperands {
  const T* w_e;  // [H·(nope + v), L]
  WholeRows<T> whole;
  T* q_abs;  // [n, H, L + rope]
};
template <class T>
AbsorbedOperands<T> absorbed_operands(const T* q, const T* latent, const T* kv_a, const LinearWeights<T>& kv_b,
                                      const MlaDims& dims, const AttentionSizes& sizes, ContextExchange& context,
                                      Arena& scratch);

// Its backward, from d_out [n, H, v] (o_proj's input gradient), the forward's q, latent, kv_a, output
// over the latents out_latent [n, H, L], lse and selection (sparse layers), and W_e: the rows are
// gathered again, each rank's terms of their gradients summed onto the tokens' owners; g is written
// (model/mla.h LatentGrads), kv_b_proj's gradients (null: frozen) accumulate.
template <class T>
void absorbed_attention_backward(const LatentGrads<T>& g, const T* d_out, const T* q, const T* latent, const T* kv_a,
                                 const T* out_latent, const T* lse, const int32_t* selection, const T* w_e,
                                 const LinearWeights<T>& kv_b, const LinearWeights<T>& kv_b_grads, const MlaDims& dims,
                                 const AttentionSizes& sizes, ContextExchange& context, Arena& scratch);

}  // namespace trillion
