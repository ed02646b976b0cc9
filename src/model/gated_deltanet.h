// The Gated DeltaNet mixer of Qwen3-Next's linear-attention layers (transformers'
// Qwen3NextGatedDeltaNet), a mixer kind (model/decoder_layer.h):
//
//   h = RMSNorm(x) (input_layernorm, zero-centred in qwen3_next)
//   [q | k | v | z] per key-head group = h · in_proj_qkvzᵀ,  [b | a] per group = h · in_proj_baᵀ
//   [q | k | v] = silu(causal depthwise conv1d([q | k | v]))        (ops/conv1d.h)
//   q = l2norm(q) · dk^−½, k = l2norm(k), both repeated from nk key heads to nv value heads
//   β = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias)          (ops/linear_attention_gates.h)
//   o = gated delta rule(q, k, v, g, β)   training: chunked; decoding: recurrent (ops/delta_rule.h)
//   x += out_proj(norm.weight · rmsnorm(o) · silu(z))  per value head (not zero-centred)
//
// Notation: nk / nv key / value heads (r = nv / nk), dk / dv head dims, W the conv width,
// Ck = 2 · nk · dk + nv · dv conv channels. in_proj_qkvz's rows are interleaved per key-head group
// g: [q_g (dk) | k_g (dk) | v_g (r · dv) | z_g (r · dv)], in_proj_ba's [b_g (r) | a_g (r)]; value
// head g · r + j belongs to group g (transformers' fix_query_key_value_ordering).
// Saves (training) through the ActivationStore the la_* tags (saved_tensors; no per-token states:
// the delta rule's backward recomputes them). Decode cache: the
// conv window [W − 1, Ck], then the recurrent state [nv, dk, dv].
// Gradient rule: the backward returns the gradient wrt its input h; parameter gradients (+=).
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/memory_sizes.h"
#include "model/param_rows.h"
#include "model/step.h"
#include "ops/delta_rule.h"

namespace trillion {

template <class T>
struct GatedDeltaNetWeights;

struct GatedDeltaNetDims {
  template <class T>
  using Weights = GatedDeltaNetWeights<T>;
  int64_t hidden = 0;                         // D
  int64_t key_heads = 0, value_heads = 0;     // nk, nv
  int64_t key_dim = 0, value_dim = 0;         // dk, dv
  int64_t conv_width = 4;                     // W
  double norm_eps = 1e-6;                     // the gated output norm (plain weight)
  InitStds init;
  static GatedDeltaNetDims from_config(const ModelConfig& config);
  int64_t group() const { return value_heads / key_heads; }                  // r
  int64_t qkvz_rows() const { return 2 * key_heads * key_dim + 2 * value_heads * value_dim; }
  int64_t conv_channels() const { return 2 * key_heads * key_dim + value_heads * value_dim; }  // Ck
};

template <class T>
struct GatedDeltaNetWeights {
  LinearWeights<T> in_proj_qkvz; // [2·nk·dk + 2·nv·dv, D]
  LinearWeights<T> in_proj_ba;   // [2·nv, D]
  T* conv = nullptr;             // [Ck, 1, W]
  T* dt_bias = nullptr;          // [nv]
  T* A_log = nullptr;            // [nv]
  T* norm = nullptr;             // [dv]
  LinearWeights<T> out_proj;     // [D, nv·dv]
};

// The mixer's tensors (transformers' names and initialization: dt_bias 1, A_log log U(0.01, 16),
// norm 1; none of these three decays).
template <class T, class Visit>
void visit_params(GatedDeltaNetWeights<T>& w, const GatedDeltaNetDims& d, Visit&& visit) {
  const int64_t D = d.hidden, nv = d.value_heads;
  visit(w.in_proj_qkvz, linear_row("linear_attn.in_proj_qkvz.weight", {d.qkvz_rows(), D}, d.init.std_in));
  visit(w.in_proj_ba, linear_row("linear_attn.in_proj_ba.weight", {2 * nv, D}, d.init.std_in));
  visit(w.conv, weight_row("linear_attn.conv1d.weight", {d.conv_channels(), 1, d.conv_width}, d.init.std_in));
  visit(w.dt_bias, make_row("linear_attn.dt_bias", {nv}, InitKind::ones, 0.0, false));
  ParamRow a_log = make_row("linear_attn.A_log", {nv}, InitKind::log_uniform, 0.0, false);
  a_log.init_low = 0.01;
  a_log.init_high = 16.0;
  visit(w.A_log, a_log);
  visit(w.norm, make_row("linear_attn.norm.weight", {d.value_dim}, InitKind::ones, 0.0, false));
  visit(w.out_proj, linear_row("linear_attn.out_proj.weight", {D, nv * d.value_dim}, d.init.std_out));
}

// Training FLOPs per token: 6 · projection parameters + the delta rule's chunked products per value
// head (3 · ops/delta_rule.h's delta_rule_chunk_flops_per_token).
inline double flops_per_token(const GatedDeltaNetDims& d, int64_t /*seq*/) {
  const double D = double(d.hidden), projections = D * double(d.qkvz_rows() + 2 * d.value_heads) +
                                                   double(d.value_heads * d.value_dim) * D;
  return 6.0 * projections + 3.0 * double(d.value_heads) * delta_rule_chunk_flops_per_token(d.key_dim, d.value_dim);
}

inline int64_t cache_elements(const GatedDeltaNetDims& d, int64_t /*max_len*/) {
  return (d.conv_width - 1) * d.conv_channels() + d.value_heads * d.key_dim * d.value_dim;
}

// The mixer interface (model/attention_block.h).
template <class T>
void mixer_forward(T* x, const T* h, const GatedDeltaNetWeights<T>& w, const GatedDeltaNetDims& dims,
                   const LayerPass& pass, int layer, Arena& scratch);
template <class T>
T* mixer_backward(const T* dy, const T* h, const GatedDeltaNetWeights<T>& w, const GatedDeltaNetWeights<T>& grads,
                  const GatedDeltaNetDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                  Arena& scratch);
template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const GatedDeltaNetWeights<T>& w, const GatedDeltaNetDims& dims, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h), and the memory plan's most
// scratch its forward or backward holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const GatedDeltaNetDims& dims, const SavedExtent& extent);
Workspace workspace_bytes(const GatedDeltaNetDims& dims, const StepShape& shape);
// Under context parallelism (shape.context): what its exchange receives in a training step.
ContextTraffic context_traffic(const GatedDeltaNetDims& dims, const StepShape& shape);
// Training FLOPs per token it adds to flops_per_token under context parallelism: the state
// passing's second run of the kernel, both runs formed again in the backward, and the correction
// (parallel/context_delta_rule.h's context_delta_rule_flops_per_token per head).
double context_flops_per_token(const GatedDeltaNetDims& dims, int64_t seq);
// Its backward reads h only as its in_proj_qkvz's and in_proj_ba's operand.
constexpr InputUse input_use(const GatedDeltaNetDims&) { return InputUse::operand; }

}  // namespace trillion
