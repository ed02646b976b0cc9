// Kimi Delta Attention, the linear-attention mixer of Kimi-Linear (transformers'
// KimiLinearDeltaAttention), a mixer kind (model/decoder_layer.h). h heads of dim D (dk = dv = D):
//
//   x̂ = RMSNorm(x) (input_layernorm, plain)
//   [q | k | v] = silu(causal conv1d([q_proj x̂ | k_proj x̂ | v_proj x̂]))   (ops/conv1d.h)
//   q = l2norm(q) · D^−½, k = l2norm(k)   per head
//   g = −exp(A_log[head]) · softplus(f_b_proj(f_a_proj(x̂)) + dt_bias)   per key channel
//   β = sigmoid(b_proj x̂)                                               per head
//   o = gated delta rule(q, k, v, g, β)   training: chunked; decoding: recurrent (ops/delta_rule.h)
//   x += o_proj(o_norm.weight · rmsnorm(o) · sigmoid(g_b_proj(g_a_proj(x̂))))   per head
//
// Tensors carry transformers' in-memory names (self_attn.conv1d [3·h·D, 1, W],
// self_attn.forget_gate.{f_a_proj, f_b_proj, dt_bias, A_log [1, 1, h, 1]}); the checkpoint keys
// are Moonshot's, which save_pretrained writes: q_conv1d / k_conv1d / v_conv1d, and the forget
// gate's tensors directly under self_attn (the family's renames, model/family.h).
// Saves: the la_* tags (saved_tensors; no per-token states).
// Decode cache: the conv window [W − 1, 3·h·D], then the recurrent state [h, D, D].
// Gradient rule: the backward returns the gradient wrt its input x̂; parameter gradients (+=).
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
struct KimiDeltaAttentionWeights;

struct KimiDeltaAttentionDims {
  template <class T>
  using Weights = KimiDeltaAttentionWeights<T>;
  int64_t hidden = 0;     // hidden size
  int64_t heads = 0;      // h (linear_num_heads)
  int64_t head_dim = 0;   // D (linear_head_dim)
  int64_t conv_width = 4; // W
  double norm_eps = 1e-5;  // o_norm
  InitStds init;
  static KimiDeltaAttentionDims from_config(const ModelConfig& config);
  int64_t width() const { return heads * head_dim; }  // h·D
};

template <class T>
struct KimiDeltaAttentionWeights {
  LinearWeights<T> q_proj, k_proj, v_proj;  // [h·D, hidden] each
  T* conv = nullptr;           // [3·h·D, 1, W]
  LinearWeights<T> f_a_proj;   // [D, hidden]
  LinearWeights<T> f_b_proj;   // [h·D, D]
  T* dt_bias = nullptr;        // [h·D]
  T* A_log = nullptr;          // [1, 1, h, 1]
  LinearWeights<T> b_proj;     // [h, hidden]
  LinearWeights<T> g_a_proj;   // [D, hidden]
  LinearWeights<T> g_b_proj;   // [h·D, D]
  T* o_norm = nullptr;         // [D]
  LinearWeights<T> o_proj;     // [hidden, h·D]
};

// Initialization as transformers': A_log log U(1, 16), dt_bias softplus⁻¹(exp U(log 1e-3, log 1e-1)),
// o_norm 1; none of these three decays.
template <class T, class Visit>
void visit_params(KimiDeltaAttentionWeights<T>& w, const KimiDeltaAttentionDims& d, Visit&& visit) {
  const int64_t H = d.hidden, D = d.head_dim, W = d.width(), K = d.conv_width;
  const double in = d.init.std_in;
  visit(w.q_proj, linear_row("self_attn.q_proj.weight", {W, H}, in));
  visit(w.k_proj, linear_row("self_attn.k_proj.weight", {W, H}, in));
  visit(w.v_proj, linear_row("self_attn.v_proj.weight", {W, H}, in));
  ParamRow conv = weight_row("self_attn.conv1d.weight", {3 * W, 1, K}, in);
  conv.hf_keys = {{"self_attn.q_conv1d.weight", {W, 1, K}, 0},
                  {"self_attn.k_conv1d.weight", {W, 1, K}, W * K},
                  {"self_attn.v_conv1d.weight", {W, 1, K}, 2 * W * K}};
  visit(w.conv, conv);
  visit(w.f_a_proj, linear_row("self_attn.forget_gate.f_a_proj.weight", {D, H}, in));
  visit(w.f_b_proj, linear_row("self_attn.forget_gate.f_b_proj.weight", {W, D}, in));
  ParamRow dt_bias = make_row("self_attn.forget_gate.dt_bias", {W}, InitKind::inverse_softplus_log_uniform, 0.0, false);
  dt_bias.init_low = 1e-3;
  dt_bias.init_high = 1e-1;
  visit(w.dt_bias, dt_bias);
  ParamRow a_log = make_row("self_attn.forget_gate.A_log", {1, 1, d.heads, 1}, InitKind::log_uniform, 0.0, false);
  a_log.init_low = 1.0;
  a_log.init_high = 16.0;
  visit(w.A_log, a_log);
  visit(w.b_proj, linear_row("self_attn.b_proj.weight", {d.heads, H}, in));
  visit(w.g_a_proj, linear_row("self_attn.g_a_proj.weight", {D, H}, in));
  visit(w.g_b_proj, linear_row("self_attn.g_b_proj.weight", {W, D}, in));
  visit(w.o_norm, make_row("self_attn.o_norm.weight", {D}, InitKind::ones, 0.0, false));
  visit(w.o_proj, linear_row("self_attn.o_proj.weight", {H, W}, d.init.std_out));
}

// Training FLOPs per token: 6 · projection parameters + the chunked delta rule's products.
inline double flops_per_token(const KimiDeltaAttentionDims& d, int64_t /*seq*/) {
  const double H = double(d.hidden), D = double(d.head_dim), W = double(d.width());
  const double projections = 4.0 * H * W + 2.0 * (H * D + D * W) + H * double(d.heads);
  return 6.0 * projections + 3.0 * double(d.heads) * delta_rule_chunk_flops_per_token(d.head_dim, d.head_dim);
}

inline int64_t cache_elements(const KimiDeltaAttentionDims& d, int64_t /*max_len*/) {
  return (d.conv_width - 1) * 3 * d.width() + d.heads * d.head_dim * d.head_dim;
}

template <class T>
void mixer_forward(T* x, const T* x_hat, const KimiDeltaAttentionWeights<T>& w, const KimiDeltaAttentionDims& dims,
                   const LayerPass& pass, int layer, Arena& scratch);
template <class T>
T* mixer_backward(const T* dy, const T* x_hat, const KimiDeltaAttentionWeights<T>& w,
                  const KimiDeltaAttentionWeights<T>& grads, const KimiDeltaAttentionDims& dims, const LayerPass& pass,
                  const ActivationStore& store, int layer, Arena& scratch);
template <class T>
void mixer_decode(T* x, const T* x_hat, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const KimiDeltaAttentionWeights<T>& w, const KimiDeltaAttentionDims& dims, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h), and the memory plan's most
// scratch its forward or backward holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const KimiDeltaAttentionDims& dims, const SavedExtent& extent);
Workspace workspace_bytes(const KimiDeltaAttentionDims& dims, const StepShape& shape);
// Under context parallelism (shape.context): what its exchange receives in a training step.
ContextTraffic context_traffic(const KimiDeltaAttentionDims& dims, const StepShape& shape);
// Training FLOPs per token it adds to flops_per_token under context parallelism: the state
// passing's second run of the kernel, both runs formed again in the backward, and the correction
// (parallel/context_delta_rule.h's context_delta_rule_flops_per_token per head).
double context_flops_per_token(const KimiDeltaAttentionDims& dims, int64_t seq);
// Its backward reads h only as its projections' operand.
constexpr InputUse input_use(const KimiDeltaAttentionDims&) { return InputUse::operand; }

}  // namespace trillion
