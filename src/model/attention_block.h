// The full-attention mixer of a decoder layer, Qwen3 style (Qwen3-Next style when gated, GLM-4 style
// with q/k/v biases and optional q_norm/k_norm):
//   h = RMSNorm(x);  q = RoPE(q_norm(h·Wqᵀ + bq)), k = RoPE(k_norm(h·Wkᵀ + bk)), v = h·Wvᵀ + bv
//   (q_norm/k_norm per head, when the family has them; biases when attention_bias)
//   o = causal GQA attention(q, k, v) with scale head_dim^−½
//   qwen3_next: q_proj gives 2·d outputs per head (query, then gate) and o ← o · sigmoid(gate)
//   x ← x + o·Woᵀ
// Sparse layers (`sparse_attention` in layer_types of a family without MLA) add a lightning indexer
// whose query is projected from h (model/lightning_indexer.h: tensors self_attn.indexer.wq [H_I·d_I, D],
// .wk [d_I, D], .k_norm (weight, bias) [d_I], .weights_proj [H_I, D]; RoPE on the first rotary_dim
// dims of its query and key): attention then runs over its top-k keys, the query heads of a KV head
// sharing one selection, or stays dense in the indexer's warm-up.
// Training forward saves through the ActivationStore (saved_tensors: q_raw … o_proj_in), a
// forward-only pass keeps them in scratch; decoding runs n new tokens against a KV cache.
// Gradient rule: the backward returns the gradient wrt its input h; parameter gradients
// accumulate (+=).
#pragma once

#include <vector>

#include "model/memory_sizes.h"
#include <algorithm>
#include <cstdint>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "model/lightning_indexer.h"
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
  NormSpec qk_norm;         // q_norm / k_norm (per head)
  bool has_qk_norm = true;  // q_norm / k_norm present
  bool bias = false;        // q/k/v projections have a bias (attention_bias)
  bool gated = false;       // q_proj carries the sigmoid output gate
  InitStds init;
  IndexerDims indexer;  // enabled on sparse layers
  static AttentionBlockDims from_config(const ModelConfig& config, bool sparse);
  int64_t q_width() const { return q_heads * head_dim; }                 // Hq·d
  int64_t kv_width() const { return kv_heads * head_dim; }               // Hkv·d
  int64_t q_proj_out() const { return (gated ? 2 : 1) * q_width(); }     // rows of q_proj.weight
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct AttentionBlockWeights {
  LinearWeights<T> q_proj;   // [q_proj_out, D], bias [q_proj_out]
  LinearWeights<T> k_proj;   // [Hkv·d, D], bias [Hkv·d]
  LinearWeights<T> v_proj;   // [Hkv·d, D], bias [Hkv·d]
  LinearWeights<T> o_proj;   // [D, Hq·d], no bias
  T* q_norm = nullptr;       // [d] (has_qk_norm)
  T* k_norm = nullptr;       // [d] (has_qk_norm)
  IndexerWeights<T> indexer;  // sparse layers
};

// The mixer's tensors, declared once (model/param_rows.h): names below "model.layers.{l}.".
// Decode cache: keys and values, 2 · max_len · Hkv · d elements (cache_elements).
template <class T, class Visit>
void visit_params(AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, Visit&& visit) {
  const int64_t D = dims.hidden;
  visit(w.q_proj, linear_row("self_attn.q_proj.weight", {dims.q_proj_out(), D}, dims.init.std_in));
  if (dims.bias) visit(w.q_proj.bias, bias_row("self_attn.q_proj.bias", dims.q_proj_out()));
  visit(w.k_proj, linear_row("self_attn.k_proj.weight", {dims.kv_width(), D}, dims.init.std_in));
  if (dims.bias) visit(w.k_proj.bias, bias_row("self_attn.k_proj.bias", dims.kv_width()));
  visit(w.v_proj, linear_row("self_attn.v_proj.weight", {dims.kv_width(), D}, dims.init.std_in));
  if (dims.bias) visit(w.v_proj.bias, bias_row("self_attn.v_proj.bias", dims.kv_width()));
  visit(w.o_proj, linear_row("self_attn.o_proj.weight", {D, dims.q_width()}, dims.init.std_out));
  if (dims.has_qk_norm) {
    visit(w.q_norm, norm_row("self_attn.q_norm.weight", dims.head_dim, dims.qk_norm));
    visit(w.k_norm, norm_row("self_attn.k_norm.weight", dims.head_dim, dims.qk_norm));
  }
  visit_params(w.indexer, dims.indexer, visit);
}

// Elements of one layer's decode cache for max_len positions (keys, then values, then on sparse
// layers the indexer keys [max_len, d_I]).
inline int64_t cache_elements(const AttentionBlockDims& dims, int64_t max_len) {
  return max_len * (2 * dims.kv_width() + (dims.indexer.enabled() ? dims.indexer.head_dim : 0));
}

// Training FLOPs per token (forward + backward): 6 · projection parameters, plus causal QKᵀ and PV
// over seq / 2 keys on average (2 FLOPs per multiply-add each; backward twice the forward).
// Sparse layers attend to at most top-k keys and add the indexer's FLOPs.
inline double flops_per_token(const AttentionBlockDims& dims, int64_t seq) {
  const double D = double(dims.hidden);
  const double projections = D * double(dims.q_proj_out() + 2 * dims.kv_width()) + double(dims.q_width()) * D;
  return 6.0 * projections +
         3.0 * 4.0 * attended_keys(dims.indexer, seq) * double(dims.q_heads) * double(dims.head_dim) +
         flops_per_token(dims.indexer, seq);
}

// The mixer interface every mixer kind implements (model/decoder_layer.h dispatches on it; the
// decoder layer owns the input norm, h = input_layernorm(x), and the residual around it).
// x[batch·seq, D] += sublayer(h) for h[batch·seq, D]; pass.positions[batch·seq] are 0..seq−1 per
// sequence. A pass that saves (train, recompute) keeps what the backward needs (saved_tensors) in
// pass.store under `layer`; eval and decode passes keep everything in `scratch` instead. Temporaries come
// from `scratch` (the caller resets it between sublayers).
template <class T>
void mixer_forward(T* x, const T* h, const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims,
                   const LayerPass& pass, int layer, Arena& scratch);

// dy[batch·seq, D]: the gradient wrt the sublayer's output. Returns dh[batch·seq, D] in `scratch`,
// the gradient wrt h (the decoder layer carries it through the input norm while that scratch is
// still held). grads += parameter gradients.
template <class T>
T* mixer_backward(const T* dy, const T* h, const AttentionBlockWeights<T>& w, const AttentionBlockWeights<T>& grads,
                  const AttentionBlockDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                  Arena& scratch);

// Decoding (batch 1): x[n, D] += sublayer(h) for n new tokens at positions past..past+n−1; their
// keys and values are written to rows past.. of k_cache / v_cache [max_len, Hkv, d] and attention
// runs with q_len = n, kv_len = past + n (bottom-right causal). The cache is keys [max_len, Hkv, d]
// then values [max_len, Hkv, d].
template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h), and the memory plan's most
// scratch its forward or backward holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const AttentionBlockDims& dims, const SavedExtent& extent);
Workspace workspace_bytes(const AttentionBlockDims& dims, const StepShape& shape);
// Under context parallelism (shape.context): what its exchange receives in a training step.
ContextTraffic context_traffic(const AttentionBlockDims& dims, const StepShape& shape);
// Under context parallelism it attends to the gathered keys and values (and the indexer scores the
// gathered keys) as one rank does: no FLOPs beyond flops_per_token.
constexpr double context_flops_per_token(const AttentionBlockDims&, int64_t /*seq*/) { return 0.0; }
// Its backward reads h only as its q/k/v (gate) projections' and the indexer's operand.
constexpr InputUse input_use(const AttentionBlockDims&) { return InputUse::operand; }

}  // namespace trillion
