// The full-attention mixer of a decoder layer, Qwen3 style (Qwen3-Next style when gated, GLM-4 style
// with q/k/v biases and optional q_norm/k_norm):
//   h = RMSNorm(x);  q = RoPE(q_norm(h·Wqᵀ + bq)), k = RoPE(k_norm(h·Wkᵀ + bk)), v = h·Wvᵀ + bv
//   (q_norm/k_norm per head, when the family has them; biases when attention_bias)
//   o = causal GQA attention(q, k, v) with scale head_dim^−½
//   qwen3_next: q_proj gives 2·d outputs per head (query, then gate) and o ← o · sigmoid(gate)
//   x ← x + o·Woᵀ
// Training forward saves through the ActivationStore (tags attn_input … o_proj_in), a forward-only
// pass keeps them in scratch; decoding
// runs n new tokens against a KV cache. Gradient rule: the residual gradient dx is accumulated
// (+=) with the sublayer's input gradient; parameter gradients accumulate (+=).
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "ops/rope.h"
#include "model/linear.h"
#include "model/param_rows.h"
#include "model/step.h"

namespace trillion {

template <class T>
struct AttentionBlockWeights;

struct AttentionBlockDims {
  template <class T>
  using Weights = AttentionBlockWeights<T>;
  int64_t hidden = 0;      // D
  int64_t q_heads = 0;     // Hq
  int64_t kv_heads = 0;    // Hkv
  int64_t head_dim = 0;    // d
  RopeSpec rope;  // on the first rope.rotary_dim dims of each head
  NormSpec input_norm;      // input_layernorm
  NormSpec qk_norm;         // q_norm / k_norm (per head)
  bool has_qk_norm = true;  // q_norm / k_norm present
  bool bias = false;        // q/k/v projections have a bias (attention_bias)
  bool gated = false;       // q_proj carries the sigmoid output gate
  InitStds init;
  static AttentionBlockDims from_config(const ModelConfig& config);
  int64_t q_width() const { return q_heads * head_dim; }                 // Hq·d
  int64_t kv_width() const { return kv_heads * head_dim; }               // Hkv·d
  int64_t q_proj_out() const { return (gated ? 2 : 1) * q_width(); }     // rows of q_proj.weight
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct AttentionBlockWeights {
  T* input_norm = nullptr;   // [D]
  LinearWeights<T> q_proj;   // [q_proj_out, D], bias [q_proj_out]
  LinearWeights<T> k_proj;   // [Hkv·d, D], bias [Hkv·d]
  LinearWeights<T> v_proj;   // [Hkv·d, D], bias [Hkv·d]
  LinearWeights<T> o_proj;   // [D, Hq·d], no bias
  T* q_norm = nullptr;       // [d] (has_qk_norm)
  T* k_norm = nullptr;       // [d] (has_qk_norm)
};

// The mixer's tensors, declared once (model/param_rows.h): names below "model.layers.{l}.".
// Decode cache: keys and values, 2 · max_len · Hkv · d elements (cache_elements).
template <class T, class Visit>
void visit_params(AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, Visit&& visit) {
  const int64_t D = dims.hidden;
  visit(w.input_norm, norm_row("input_layernorm.weight", D, dims.input_norm));
  visit(w.q_proj.weight, weight_row("self_attn.q_proj.weight", {dims.q_proj_out(), D}, dims.init.std_in));
  if (dims.bias) visit(w.q_proj.bias, bias_row("self_attn.q_proj.bias", dims.q_proj_out()));
  visit(w.k_proj.weight, weight_row("self_attn.k_proj.weight", {dims.kv_width(), D}, dims.init.std_in));
  if (dims.bias) visit(w.k_proj.bias, bias_row("self_attn.k_proj.bias", dims.kv_width()));
  visit(w.v_proj.weight, weight_row("self_attn.v_proj.weight", {dims.kv_width(), D}, dims.init.std_in));
  if (dims.bias) visit(w.v_proj.bias, bias_row("self_attn.v_proj.bias", dims.kv_width()));
  visit(w.o_proj.weight, weight_row("self_attn.o_proj.weight", {D, dims.q_width()}, dims.init.std_out));
  if (dims.has_qk_norm) {
    visit(w.q_norm, norm_row("self_attn.q_norm.weight", dims.head_dim, dims.qk_norm));
    visit(w.k_norm, norm_row("self_attn.k_norm.weight", dims.head_dim, dims.qk_norm));
  }
}

// Elements of one layer's decode cache for max_len positions (keys, then values).
inline int64_t cache_elements(const AttentionBlockDims& dims, int64_t max_len) {
  return 2 * max_len * dims.kv_width();
}

// Training FLOPs per token (forward + backward): 6 · projection parameters, plus causal QKᵀ and PV
// over seq / 2 keys on average (2 FLOPs per multiply-add each; backward twice the forward).
inline double flops_per_token(const AttentionBlockDims& dims, int64_t seq) {
  const double D = double(dims.hidden);
  const double projections = D * double(dims.q_proj_out() + 2 * dims.kv_width()) + double(dims.q_width()) * D;
  return 6.0 * projections + 3.0 * 4.0 * (double(seq) / 2.0) * double(dims.q_heads) * double(dims.head_dim);
}

// The mixer interface every mixer kind implements (model/decoder_layer.h dispatches on it).
// x[batch·seq, D] += attention sublayer(x); pass.positions[batch·seq] are 0..seq−1 per sequence.
// Saves what the backward needs in pass.store under `layer`; a null store (forward only, e.g.
// evaluation) keeps everything in `scratch` instead. Temporaries come from `scratch` (the caller
// resets it between sublayers).
template <class T>
void mixer_forward(T* x, const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, const LayerPass& pass,
                   int layer, Arena& scratch);

// dx[batch·seq, D]: gradient wrt the sublayer's output on entry; the sublayer's input gradient is
// added (+=), so on return it is the gradient wrt x. grads += parameter gradients.
template <class T>
void mixer_backward(T* dx, const AttentionBlockWeights<T>& w, const AttentionBlockWeights<T>& grads,
                    const AttentionBlockDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                    Arena& scratch);

// Decoding (batch 1): x[n, D] += sublayer(x) for n new tokens at positions past..past+n−1; their
// keys and values are written to rows past.. of k_cache / v_cache [max_len, Hkv, d] and attention
// runs with q_len = n, kv_len = past + n (bottom-right causal). The cache is keys [max_len, Hkv, d]
// then values [max_len, Hkv, d].
template <class T>
void mixer_decode(T* x, int64_t n, int64_t past, int64_t max_len, T* cache, const AttentionBlockWeights<T>& w,
                  const AttentionBlockDims& dims, Arena& scratch);

}  // namespace trillion
