// Multi-head latent attention (MLA), the attention of DeepSeek-V3 / V3.2 and Kimi Linear, as
// transformers' DeepseekV3Attention / KimiLinearAttention compute it (H heads, nope / rope / v the
// qk_nope / qk_rope / v head dims, r_q / r_kv the q / kv LoRA ranks):
//   h = RMSNorm(x)
//   q = q_proj(h), or q_b_proj(RMSNorm_1e-6(q_a_proj(h)))       [n, H, nope + rope], per head [nope | rope]
//   [c_raw | k_rot] = kv_a_proj_with_mqa(h)                       [n, r_kv + rope]
//   c = RMSNorm_1e-6(c_raw)  (kv_a_layernorm)                     [n, r_kv]  the latent
//   [k_nope | v] = kv_b_proj(c) per head                          [n, H, nope + v]
//   RoPE on q's rope part and on the one shared k_rot (DeepSeek; interleaved or half-split, YaRN);
//   Kimi Linear rotates nothing (NoPE)
//   K = [k_nope | k_rot broadcast to every head],  o = causal attention(q, K, v)  (qk dim ≠ v dim)
//   scale = (nope + rope)^−½ · mscale(factor, mscale_all_dim)² (DeepSeek under YaRN; else 1)
//   x ← x + o_proj(o)
// Biases (attention_bias) on q_a_proj, kv_a_proj_with_mqa and o_proj. num_key_value_heads must equal
// num_attention_heads (transformers' MLA repeats nothing).
// Sparse layers (deepseek_v32's indexed_attention) add a lightning indexer on the query latent
// (model/lightning_indexer.h): attention then runs over its top-k keys per query (ops/sparse_attention.h),
// or, in the indexer's warm-up, stays dense while the indexer learns.
// Decoding caches per token the latent and the rotated key, [c | k_rot] (r_kv + rope elements; sparse
// layers also the indexer key), never expanded keys, and attends in the latent space, the
// weight-absorbed form (model/mla_absorbed.h): per head the query's nope part becomes W_UKᵀ q_nope
// (W_UK: that head's k_nope rows of kv_b_proj), attention runs with one key head [c | k_rot] and
// values c, and W_UV (its v rows) maps the result back; scores and outputs are those of the
// expanded form.
// Context parallelism (model/step.h's ContextExchange) trains in the absorbed form too: each rank
// gathers per token the row [e | k_rot] of the whole sequences (e = c, with an adapter on kv_b_proj
// [c | scaling · u]: model/mla_absorbed.h), never expanded keys, so what a rank holds of the other
// ranks' tokens is r_kv + rope values per token whatever the heads. Its queries attend to the whole
// sequences' rows, its output over the latents [n, H, L] is saved (W_UV's gradient reads it), and
// the backward gathers the rows again and sums every rank's terms of their gradients onto the
// tokens' owners. Sparse layers select over the whole sequences' indexer keys
// (model/lightning_indexer.h), and their sparse attention reads the selected rows.
// Training forward saves through the ActivationStore (saved_tensors: q, k, v, attn_out, attn_lse,
// mla_*; under cp mla_out_latent in place of k, v and attn_out). Gradient rule: the backward
// returns the gradient wrt its input h; parameter gradients accumulate (+=).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "model/lightning_indexer.h"
#include "model/linear.h"
#include "model/memory_sizes.h"
#include "model/param_rows.h"
#include "model/step.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace trillion {

template <class T>
struct MlaWeights;

struct MlaDims {
  template <class T>
  using Weights = MlaWeights<T>;
  int64_t hidden = 0;       // D
  int64_t heads = 0;        // H
  int64_t q_lora_rank = 0;  // r_q; 0: one q_proj
  int64_t kv_lora_rank = 0; // r_kv
  int64_t nope = 0;         // qk_nope_head_dim
  int64_t rope_dim = 0;     // qk_rope_head_dim
  int64_t v = 0;            // v_head_dim
  bool rotary = true;       // RoPE on the rope parts (false: Kimi Linear's NoPE)
  RopeSpec rope;            // rope.rotary_dim = rope_dim
  double scale = 0.0;       // softmax scale
  bool bias = false;        // attention_bias
  NormSpec latent_norm;     // q_a_layernorm, kv_a_layernorm (eps 1e-6)
  InitStds init;
  IndexerDims indexer;      // enabled on sparse layers
  int64_t kv_b_adapter_rank = 0;  // r_a of a LoRA adapter on kv_b_proj (config.lora), 0: none
  bool base_frozen = false;       // config.lora: kv_b_proj frozen with the rest of the base
  static MlaDims from_config(const ModelConfig& config, int layer, bool sparse);
  int64_t qk() const { return nope + rope_dim; }                    // query/key head dim
  int64_t q_width() const { return heads * qk(); }                  // H·qk
  int64_t kv_a_out() const { return kv_lora_rank + rope_dim; }      // rows of kv_a_proj_with_mqa
  int64_t kv_b_out() const { return heads * (nope + v); }           // rows of kv_b_proj
  int64_t o_width() const { return heads * v; }                     // H·v
  // The absorbed form's latent width L and key row [e | k_rot] (model/mla_absorbed.h, in training).
  int64_t absorbed_latent() const { return kv_lora_rank + kv_b_adapter_rank; }
  int64_t absorbed_row() const { return absorbed_latent() + rope_dim; }
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct MlaWeights {
  LinearWeights<T> q_proj;      // [H·qk, D] (q_lora_rank 0)
  LinearWeights<T> q_a_proj;    // [r_q, D], bias [r_q]
  T* q_a_norm = nullptr;        // [r_q]
  LinearWeights<T> q_b_proj;    // [H·qk, r_q]
  LinearWeights<T> kv_a_proj;   // [r_kv + rope, D], bias [r_kv + rope]
  T* kv_a_norm = nullptr;       // [r_kv]
  LinearWeights<T> kv_b_proj;   // [H·(nope + v), r_kv]
  LinearWeights<T> o_proj;      // [D, H·v], bias [D]
  IndexerWeights<T> indexer;    // sparse layers
};

// The mixer's tensors, declared once (model/param_rows.h): names below "model.layers.{l}.".
template <class T, class Visit>
void visit_params(MlaWeights<T>& w, const MlaDims& dims, Visit&& visit) {
  const int64_t D = dims.hidden;
  if (dims.q_lora_rank == 0) {
    visit(w.q_proj, linear_row("self_attn.q_proj.weight", {dims.q_width(), D}, dims.init.std_in));
  } else {
    visit(w.q_a_proj, linear_row("self_attn.q_a_proj.weight", {dims.q_lora_rank, D}, dims.init.std_in));
    if (dims.bias) visit(w.q_a_proj.bias, bias_row("self_attn.q_a_proj.bias", dims.q_lora_rank));
    visit(w.q_a_norm, norm_row("self_attn.q_a_layernorm.weight", dims.q_lora_rank, dims.latent_norm));
    visit(w.q_b_proj,
          linear_row("self_attn.q_b_proj.weight", {dims.q_width(), dims.q_lora_rank}, dims.init.std_in));
  }
  visit(w.kv_a_proj,
        linear_row("self_attn.kv_a_proj_with_mqa.weight", {dims.kv_a_out(), D}, dims.init.std_in));
  if (dims.bias) visit(w.kv_a_proj.bias, bias_row("self_attn.kv_a_proj_with_mqa.bias", dims.kv_a_out()));
  visit(w.kv_a_norm, norm_row("self_attn.kv_a_layernorm.weight", dims.kv_lora_rank, dims.latent_norm));
  visit(w.kv_b_proj,
        linear_row("self_attn.kv_b_proj.weight", {dims.kv_b_out(), dims.kv_lora_rank}, dims.init.std_in));
  visit(w.o_proj, linear_row("self_attn.o_proj.weight", {D, dims.o_width()}, dims.init.std_out));
  if (dims.bias) visit(w.o_proj.bias, bias_row("self_attn.o_proj.bias", D));
  visit_params(w.indexer, dims.indexer, visit);
}

// Elements of one layer's decode cache for max_len positions: [c | k_rot] per position, then (sparse
// layers) the indexer keys [max_len, d_I].
inline int64_t cache_elements(const MlaDims& dims, int64_t max_len) {
  return max_len * (dims.kv_a_out() + (dims.indexer.enabled() ? dims.indexer.head_dim : 0));
}

// Training FLOPs per token (forward + backward): 6 · projection parameters, plus causal QKᵀ (qk dims)
// and PV (v dims) over seq / 2 keys on average (at most top-k on sparse layers), backward twice the
// forward, plus the indexer's.
inline double flops_per_token(const MlaDims& dims, int64_t seq) {
  const double D = double(dims.hidden);
  const double q = dims.q_lora_rank == 0 ? D * double(dims.q_width())
                                         : double(dims.q_lora_rank) * (D + double(dims.q_width()));
  const double projections = q + D * double(dims.kv_a_out()) + double(dims.kv_lora_rank * dims.kv_b_out()) +
                             double(dims.o_width()) * D;
  return 6.0 * projections +
         3.0 * 2.0 * attended_keys(dims.indexer, seq) * double(dims.heads) * double(dims.qk() + dims.v) +
         flops_per_token(dims.indexer, seq);
}
// What it adds under context parallelism, where it attends in its absorbed form (model/mla_absorbed.h):
//   - per key, the scores over the row [e | k_rot] and the output over e: heads · (2 · absorbed_latent
//     + rope) multiply-adds in place of heads · (qk + v);
//   - per token, the queries' absorption and the output's expansion through W_e [kv_b_out, L]: formed
//     in the forward and again in the backward, with both gradients (dW_e over all of L, frozen columns
//     too, unless kv_b_proj is frozen with no adapter): 8 (6) · kv_b_out · L FLOPs, in place of what
//     flops_per_token counts for kv_b_proj's expansion, 6 (frozen: 4) · kv_b_out · r_kv, and its
//     adapter's B, 6 · kv_b_out · r_a.
// The indexer loss's target scores (over the selected rows at width L + rope under cp) are counted in
// neither.
inline double context_flops_per_token(const MlaDims& dims, int64_t seq) {
  const double absorbed = double(2 * dims.absorbed_latent() + dims.rope_dim), expanded = double(dims.qk() + dims.v);
  const double per_key = 3.0 * 2.0 * attended_keys(dims.indexer, seq) * double(dims.heads) * (absorbed - expanded);
  const double rows = double(dims.kv_b_out());
  const bool forms_dw_e = !dims.base_frozen || dims.kv_b_adapter_rank > 0;
  const double absorption = (forms_dw_e ? 8.0 : 6.0) * rows * double(dims.absorbed_latent());
  const double expansion =
      (dims.base_frozen ? 4.0 : 6.0) * rows * double(dims.kv_lora_rank) + 6.0 * rows * double(dims.kv_b_adapter_rank);
  return per_key + absorption - expansion;
}

// The attention's backward as far as the latents, what the rest of mixer_backward reads: dq
// [n, H, qk] and dc [n, r_kv] (=), and the rope columns of d_kv_a [n, r_kv + rope] (=, d k_rot).
template <class T>
struct LatentGrads {
  T* dq;        // [n, H, qk]
  T* d_latent;  // [n, r_kv]
  T* d_kv_a;    // [n, r_kv + rope]
};

// Attention of `seq` tokens of `batch` sequences in one rank's expanded form: H key heads of qk
// dims, values of v (doc_start [batch, seq], or null).
inline AttentionSizes expanded_sizes(const MlaDims& dims, int64_t batch, int64_t seq, const int32_t* doc_start) {
  return {batch, seq, seq, dims.heads, dims.heads, dims.qk(), dims.scale, dims.v, doc_start};
}

// One rank's expanded form: keys k = [k_nope | k_rot] [n, H, qk] and values v [n, H, v] from
// kv [n, H, nope + v] = kv_b_proj(c) and kv_a's (rotated) k_rot; and back from d_out [n, H, v] through
// the attention (sizes: its own, H key heads; selection [n, topk] on sparse layers, or null) and
// kv_b_proj to g (=), kv_b_proj's gradients (null: frozen) accumulating. Under context parallelism
// the absorbed form (model/mla_absorbed.h) takes its place.
template <class T>
void expand_keys(T* k, T* v, const T* kv, const T* kv_a, int64_t n, const MlaDims& dims);
template <class T>
void expanded_attention_backward(const LatentGrads<T>& g, const T* d_out, const T* q, const T* latent, const T* k,
                                 const T* v, const T* out, const T* lse, const int32_t* selection,
                                 const LinearWeights<T>& kv_b, const LinearWeights<T>& kv_b_grads, const MlaDims& dims,
                                 const AttentionSizes& sizes, Arena& scratch);

// The mixer interface (model/attention_block.h documents it).
template <class T>
void mixer_forward(T* x, const T* h, const MlaWeights<T>& w, const MlaDims& dims, const LayerPass& pass, int layer,
                   Arena& scratch);
template <class T>
T* mixer_backward(const T* dy, const T* h, const MlaWeights<T>& w, const MlaWeights<T>& grads, const MlaDims& dims,
                  const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch);
template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache, const MlaWeights<T>& w,
                  const MlaDims& dims, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h), and the memory plan's most
// scratch its forward or backward holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const MlaDims& dims, const SavedExtent& extent);
Workspace workspace_bytes(const MlaDims& dims, const StepShape& shape);
// Under context parallelism (shape.context): what its exchange receives in a training step (sparse
// layers: the indexer's too).
ContextTraffic context_traffic(const MlaDims& dims, const StepShape& shape);
// Its backward reads h only as its projections' and the indexer's operand.
constexpr InputUse input_use(const MlaDims&) { return InputUse::operand; }

}  // namespace trillion
