// Kimi Delta Attention mixer: forward, backward and decoding. See kimi_delta_attention.h.
#include "model/kimi_delta_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/family.h"
#include "ops/conv1d.h"
#include "ops/delta_rule.h"
#include "ops/linear_attention_gates.h"
#include "ops/norm.h"
#include "parallel/context_delta_rule.h"

namespace trillion {

KimiDeltaAttentionDims KimiDeltaAttentionDims::from_config(const ModelConfig& config) {
  KimiDeltaAttentionDims d;
  d.hidden = config.hidden_size;
  d.heads = config.linear_num_value_heads;
  d.head_dim = config.linear_value_head_dim;
  d.conv_width = config.linear_conv_kernel_dim;
  d.norm_eps = config.rms_norm_eps;
  d.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  return d;
}

namespace {

// Everything the delta rule takes, computed from the normed input h (training forward and decode).
template <class T>
struct KdaInputs {
  T *conv_in, *q_hat, *q_inv, *k_hat, *k_inv, *v, *f_low, *a, *g, *beta, *g_low, *z, *q_scaled;
};

// Where `saves` puts them (the store, or scratch), with the scaled query a temporary.
template <class T>
KdaInputs<T> kda_buffers(int64_t n, const KimiDeltaAttentionDims& d, const SavedWriter& saves, Arena& scratch) {
  using Tag = ActivationTag;
  KdaInputs<T> c;
  c.conv_in = saves.out<T>(Tag::la_conv_in);    // [n, 3·h·D]
  c.q_hat = saves.out<T>(Tag::la_q_hat);        // [n, h, D]
  c.q_inv = saves.out<T>(Tag::la_q_inv);        // [n · h]
  c.k_hat = saves.out<T>(Tag::la_k_hat);        // [n, h, D]
  c.k_inv = saves.out<T>(Tag::la_k_inv);        // [n · h]
  c.v = saves.out<T>(Tag::la_v);                // [n, h, D]
  c.f_low = saves.out<T>(Tag::la_f_low);        // [n, D]
  c.a = saves.out<T>(Tag::la_a);                // [n, h·D]
  c.g = saves.out<T>(Tag::la_g);                // [n, h·D]
  c.beta = saves.out<T>(Tag::la_beta);          // [n, h]
  c.g_low = saves.out<T>(Tag::la_g_low);        // [n, D]
  c.z = saves.out<T>(Tag::la_z);                // [n, h, D]
  c.q_scaled = scratch.alloc<T>(n * d.width());  // [n, h, D]
  return c;
}

template <class T, class Conv>
void prepare_inputs(const KdaInputs<T>& c, const T* x_hat, int64_t n, const KimiDeltaAttentionWeights<T>& w,
                    const KimiDeltaAttentionDims& d, Arena& scratch, const Conv& conv) {
  const int64_t H = d.hidden, W = d.width(), D = d.head_dim, h = d.heads;
  T* proj = scratch.alloc<T>(n * W);  // [n, h·D] one projection at a time
  const LinearWeights<T>* projections[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  for (int p = 0; p < 3; ++p) {
    linear(proj, x_hat, *projections[p], n, H, W, /*accumulate=*/false);
    copy_column_block(c.conv_in + p * W, proj, n, W, 3 * W, W);
  }
  T* conv_out = scratch.alloc<T>(n * 3 * W);  // [n, 3·h·D]
  conv(conv_out, c.conv_in);
  T* q_raw = scratch.alloc<T>(n * W);  // [n, h, D]
  T* k_raw = scratch.alloc<T>(n * W);  // [n, h, D]
  copy_column_block(q_raw, conv_out, n, 3 * W, W, W);
  copy_column_block(k_raw, conv_out + W, n, 3 * W, W, W);
  copy_column_block(c.v, conv_out + 2 * W, n, 3 * W, W, W);
  l2norm_forward(c.q_hat, c.q_inv, q_raw, n * h, D, kLinearAttentionL2Eps);
  l2norm_forward(c.k_hat, c.k_inv, k_raw, n * h, D, kLinearAttentionL2Eps);
  const T scale = static_cast<T>(1.0 / std::sqrt(double(D)));
  for (int64_t i = 0; i < n * W; ++i) c.q_scaled[i] = c.q_hat[i] * scale;
  linear(c.f_low, x_hat, w.f_a_proj, n, H, D, /*accumulate=*/false);
  linear(c.a, c.f_low, w.f_b_proj, n, D, W, /*accumulate=*/false);
  decay_gate_forward(c.g, c.a, w.A_log, w.dt_bias, n, W, D);
  linear(c.beta, x_hat, w.b_proj, n, H, h, /*accumulate=*/false);
  for (int64_t i = 0; i < n * h; ++i) c.beta[i] = T(1) / (T(1) + std::exp(-c.beta[i]));
  linear(c.g_low, x_hat, w.g_a_proj, n, H, D, /*accumulate=*/false);
  linear(c.z, c.g_low, w.g_b_proj, n, D, W, /*accumulate=*/false);
}

}  // namespace

// Saved in mixer_forward's order: the conv's input and the delta rule's inputs (kda_buffers), its
// output, the gated norm's statistics and output.
std::vector<SavedTensor> saved_tensors(const KimiDeltaAttentionDims& d, const SavedExtent& extent) {
  using Tag = ActivationTag;
  const int64_t n = extent.tokens(), W = d.width(), D = d.head_dim, h = d.heads;
  return {{Tag::la_conv_in, {n, 3 * W}},  // [n, 3·h·D] [q | k | v] before the conv
          {Tag::la_q_hat, {n, h, D}},     // [n, h, D]
          {Tag::la_q_inv, {n * h}},       // [n · h]
          {Tag::la_k_hat, {n, h, D}},     // [n, h, D]
          {Tag::la_k_inv, {n * h}},       // [n · h]
          {Tag::la_v, {n, h, D}},         // [n, h, D]
          {Tag::la_f_low, {n, D}, true, /*operand=*/true},  // [n, D] f_b_proj's input
          {Tag::la_a, {n, W}},            // [n, h·D]
          {Tag::la_g, {n, W}},            // [n, h·D]
          {Tag::la_beta, {n, h}},         // [n, h]
          {Tag::la_g_low, {n, D}, true, /*operand=*/true},  // [n, D] g_b_proj's input
          {Tag::la_z, {n, h, D}},         // [n, h, D]
          {Tag::la_core, {n, h, D}},      // [n, h, D]
          {Tag::la_norm_rstd, {n * h}},   // [n · h]
          {Tag::la_normed, {n, W}, true, /*operand=*/true}};  // [n, h·D] o_proj's input
}

template <class T>
void mixer_forward(T* x, const T* x_hat, const KimiDeltaAttentionWeights<T>& w, const KimiDeltaAttentionDims& d,
                   const LayerPass& pass, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t n = pass.batch * pass.seq, H = d.hidden, W = d.width(), D = d.head_dim, h = d.heads;
  const SavedWriter saves(saved_tensors(d, SavedExtent::of(pass)), pass.store, layer, scratch);
  const KdaInputs<T> c = kda_buffers<T>(n, d, saves, scratch);
  const Conv1dSizes conv_sizes{pass.segment_batch(), pass.segment_seq(), 3 * W, d.conv_width, pass.segments};
  prepare_inputs(c, x_hat, n, w, d, scratch, [&](T* out, const T* in) {
    if (pass.context != nullptr)
      pass.context->conv1d_silu_forward(out, in, w.conv, pass.doc_start, conv_sizes);  // halos across ranks
    else
      conv1d_silu_forward(out, in, w.conv, pass.cu_seqlens, conv_sizes);
  });
  T* core = saves.out<T>(Tag::la_core);  // [n, h, D]
  const DeltaRuleSizes sizes{pass.segment_batch(), pass.segment_seq(), h, D, D, pass.segments,
                             DeltaDecay::per_key_channel};
  if (pass.context != nullptr)  // from the state the earlier ranks' tokens leave
    pass.context->delta_rule_forward(core, c.q_scaled, c.k_hat, c.v, c.g, c.beta, pass.doc_start, sizes);
  else
    delta_rule_chunk_forward(core, static_cast<T*>(nullptr), c.q_scaled, c.k_hat, c.v, c.g, c.beta,
                             static_cast<const T*>(nullptr), pass.cu_seqlens, sizes);
  T* norm_rstd = saves.out<T>(Tag::la_norm_rstd);  // [n · h]
  T* normed = saves.out<T>(Tag::la_normed);        // [n, h·D]
  gated_rmsnorm_forward(normed, norm_rstd, core, c.z, w.o_norm, n * h, D, d.norm_eps, GateActivation::sigmoid);
  linear(x, normed, w.o_proj, n, W, H, /*accumulate=*/true);  // residual
}

template <class T>
T* mixer_backward(const T* dy, const T* x_hat, const KimiDeltaAttentionWeights<T>& w,
                  const KimiDeltaAttentionWeights<T>& grads, const KimiDeltaAttentionDims& d, const LayerPass& pass,
                  const ActivationStore& store, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t n = pass.batch * pass.seq, H = d.hidden, W = d.width(), D = d.head_dim, h = d.heads;
  const SavedReader saved(saved_tensors(d, SavedExtent::of(pass)), store, layer);
  const T* conv_in = saved.in<T>(Tag::la_conv_in);      // [n, 3·h·D]
  const T* q_hat = saved.in<T>(Tag::la_q_hat);          // [n, h, D]
  const T* q_inv = saved.in<T>(Tag::la_q_inv);          // [n · h]
  const T* k_hat = saved.in<T>(Tag::la_k_hat);          // [n, h, D]
  const T* k_inv = saved.in<T>(Tag::la_k_inv);          // [n · h]
  const T* v = saved.in<T>(Tag::la_v);                  // [n, h, D]
  const T* f_low = saved.in<T>(Tag::la_f_low);          // [n, D]
  const T* a = saved.in<T>(Tag::la_a);                  // [n, h·D]
  const T* g = saved.in<T>(Tag::la_g);                  // [n, h·D]
  const T* beta = saved.in<T>(Tag::la_beta);            // [n, h]
  const T* g_low = saved.in<T>(Tag::la_g_low);          // [n, D]
  const T* z = saved.in<T>(Tag::la_z);                  // [n, h, D]
  const T* core = saved.in<T>(Tag::la_core);            // [n, h, D]
  const T* norm_rstd = saved.in<T>(Tag::la_norm_rstd);  // [n · h]
  const T* normed = saved.in<T>(Tag::la_normed);        // [n, h·D]

  T* d_normed = scratch.alloc<T>(n * W);  // [n, h·D]
  linear_grad(d_normed, grads.o_proj, dy, normed, w.o_proj, n, W, H, /*accumulate_dx=*/false);
  T* d_core = scratch.alloc<T>(n * W);  // [n, h, D]
  T* dz = scratch.alloc<T>(n * W);      // [n, h, D]
  gated_rmsnorm_backward(d_core, dz, grads.o_norm, d_normed, core, z, w.o_norm, norm_rstd, n * h, D,
                         GateActivation::sigmoid);
  T* dx_hat = scratch.alloc<T>(n * H);  // [n, hidden] Σ of every projection's input gradient
  T* d_low = scratch.alloc<T>(n * D);   // [n, D]
  linear_grad(d_low, grads.g_b_proj, dz, g_low, w.g_b_proj, n, D, W, /*accumulate_dx=*/false);
  linear_grad(dx_hat, grads.g_a_proj, d_low, x_hat, w.g_a_proj, n, H, D, /*accumulate_dx=*/false);

  const T scale = static_cast<T>(1.0 / std::sqrt(double(D)));
  T* q_scaled = scratch.alloc<T>(n * W);  // [n, h, D]
  for (int64_t i = 0; i < n * W; ++i) q_scaled[i] = q_hat[i] * scale;
  T* dq = scratch.alloc<T>(n * W);     // [n, h, D] gradient wrt the scaled query
  T* dk = scratch.alloc<T>(n * W);     // [n, h, D]
  T* dv = scratch.alloc<T>(n * W);     // [n, h, D]
  T* dg = scratch.alloc<T>(n * W);     // [n, h, D]
  T* dbeta = scratch.alloc<T>(n * h);  // [n, h]
  const DeltaRuleSizes sizes{pass.segment_batch(), pass.segment_seq(), h, D, D, pass.segments,
                             DeltaDecay::per_key_channel};
  if (pass.context != nullptr)
    pass.context->delta_rule_backward(dq, dk, dv, dg, dbeta, d_core, q_scaled, k_hat, v, g, beta, pass.doc_start,
                                      sizes);
  else
    delta_rule_chunk_backward(dq, dk, dv, dg, dbeta, static_cast<T*>(nullptr), d_core, static_cast<const T*>(nullptr),
                              q_scaled, k_hat, v, g, beta, static_cast<const T*>(nullptr), pass.cu_seqlens, sizes);
  for (int64_t i = 0; i < n * h; ++i) dbeta[i] *= beta[i] * (T(1) - beta[i]);  // through the sigmoid
  linear_grad(dx_hat, grads.b_proj, dbeta, x_hat, w.b_proj, n, H, h, /*accumulate_dx=*/true);
  T* da = scratch.alloc<T>(n * W);  // [n, h·D]
  decay_gate_backward(da, grads.A_log, grads.dt_bias, dg, a, w.A_log, w.dt_bias, n, W, D);
  linear_grad(d_low, grads.f_b_proj, da, f_low, w.f_b_proj, n, D, W, /*accumulate_dx=*/false);
  linear_grad(dx_hat, grads.f_a_proj, d_low, x_hat, w.f_a_proj, n, H, D, /*accumulate_dx=*/true);

  for (int64_t i = 0; i < n * W; ++i) dq[i] *= scale;
  T* d_conv_out = scratch.alloc<T>(n * 3 * W);  // [n, 3·h·D] = [dq | dk | dv] before the L2 norms
  T* d_raw = scratch.alloc<T>(n * W);           // [n, h, D]
  l2norm_backward(d_raw, dq, q_hat, q_inv, n * h, D);
  copy_column_block(d_conv_out, d_raw, n, W, 3 * W, W);
  l2norm_backward(d_raw, dk, k_hat, k_inv, n * h, D);
  copy_column_block(d_conv_out + W, d_raw, n, W, 3 * W, W);
  copy_column_block(d_conv_out + 2 * W, dv, n, W, 3 * W, W);
  T* d_conv_in = scratch.alloc<T>(n * 3 * W);  // [n, 3·h·D]
  const Conv1dSizes conv_sizes{pass.segment_batch(), pass.segment_seq(), 3 * W, d.conv_width, pass.segments};
  if (pass.context != nullptr)
    pass.context->conv1d_silu_backward(d_conv_in, grads.conv, d_conv_out, conv_in, w.conv, pass.doc_start, conv_sizes);
  else
    conv1d_silu_backward(d_conv_in, grads.conv, d_conv_out, conv_in, w.conv, pass.cu_seqlens, conv_sizes);
  const LinearWeights<T>* projections[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  const LinearWeights<T>* projection_grads[] = {&grads.q_proj, &grads.k_proj, &grads.v_proj};
  T* d_proj = scratch.alloc<T>(n * W);  // [n, h·D] one projection's output gradient at a time
  for (int p = 0; p < 3; ++p) {
    copy_column_block(d_proj, d_conv_in + p * W, n, 3 * W, W, W);
    linear_grad(dx_hat, *projection_grads[p], d_proj, x_hat, *projections[p], n, H, W, /*accumulate_dx=*/true);
  }
  return dx_hat;
}

template <class T>
void mixer_decode(T* x, const T* x_hat, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const KimiDeltaAttentionWeights<T>& w, const KimiDeltaAttentionDims& d, Arena& scratch) {
  const int64_t H = d.hidden, W = d.width(), D = d.head_dim, h = d.heads;
  T* history = cache;                              // [W_conv − 1, 3·h·D]
  T* state = cache + (d.conv_width - 1) * 3 * W;   // [h, D, D]
  const SavedWriter temporaries(saved_tensors(d, SavedExtent{1, n}), nullptr, 0, scratch);
  const KdaInputs<T> c = kda_buffers<T>(n, d, temporaries, scratch);
  const Conv1dSizes conv_sizes{1, n, 3 * W, d.conv_width, 0};
  prepare_inputs(c, x_hat, n, w, d, scratch,
                 [&](T* out, const T* in) { conv1d_silu_decode(out, history, in, w.conv, n, conv_sizes); });
  T* core = scratch.alloc<T>(n * W);     // [n, h, D]
  T* s0 = scratch.alloc<T>(h * D * D);   // [1, h, D, D] the carried state
  std::memcpy(s0, state, h * D * D * sizeof(T));
  const DeltaRuleSizes sizes{1, n, h, D, D, 0, DeltaDecay::per_key_channel};
  delta_rule_recurrent_forward(core, state, c.q_scaled, c.k_hat, c.v, c.g, c.beta, s0, nullptr, sizes);
  T* norm_rstd = scratch.alloc<T>(n * h);  // [n · h]
  T* normed = scratch.alloc<T>(n * W);     // [n, h·D]
  gated_rmsnorm_forward(normed, norm_rstd, core, c.z, w.o_norm, n * h, D, d.norm_eps, GateActivation::sigmoid);
  linear(x, normed, w.o_proj, n, W, H, /*accumulate=*/true);
}

// Forward: q_scaled, proj, q_raw, k_raw [n, h·D] and conv_out [n, 3·h·D], then the delta rule's
// scratch. Backward, at each kernel with temporaries: the delta rule after d_normed, d_core, dz,
// q_scaled, dq, dk, dv, dg [n, h·D], dx_hat [n, hidden], d_low [n, D], dbeta [n, h]; the conv after
// da, d_raw [n, h·D], d_conv_out, d_conv_in [n, 3·h·D]; the decoder layer's input norm after d_proj
// [n, h·D]. Under context parallelism the convolution and the delta rule hold the exchange's scratch
// instead (the kernels' temporaries inside), the forward's either beside all of its own.
namespace {

// The convolution's and the delta rule's sizes in a training step (no packed segments under cp).
Conv1dSizes step_conv_sizes(const KimiDeltaAttentionDims& d, const StepShape& shape) {
  return {shape.batch, shape.seq, 3 * d.width(), d.conv_width, 0};
}
DeltaRuleSizes step_delta_sizes(const KimiDeltaAttentionDims& d, const StepShape& shape) {
  return {shape.batch, shape.seq, d.heads, d.head_dim, d.head_dim, 0, DeltaDecay::per_key_channel};
}

}  // namespace

Workspace workspace_bytes(const KimiDeltaAttentionDims& d, const StepShape& shape) {
  const int64_t n = shape.tokens(), e = shape.element_bytes, W = d.width(), D = d.head_dim;
  const auto rounded = [&](int64_t count) { return Arena::rounded(count * e); };
  const ContextPlan* context = shape.context;
  const Workspace conv = context ? context->conv1d_silu(step_conv_sizes(d, shape), e).workspace : Workspace{};
  const Workspace delta =
      context ? context->delta_rule(step_delta_sizes(d, shape), shape.threads, e).workspace : Workspace{};
  const int64_t forward = 4 * rounded(n * W) + rounded(n * 3 * W) +
                          (context ? std::max(conv.forward, delta.forward)
                                   : delta_rule_chunk_forward_workspace_bytes(D, D, e, shape.threads));
  const int64_t at_delta = 8 * rounded(n * W) + rounded(n * d.hidden) + rounded(n * D) + rounded(n * d.heads);
  const int64_t at_conv = at_delta + 2 * rounded(n * W) + 2 * rounded(n * 3 * W);
  const int64_t at_norm = at_conv + rounded(n * W);
  const int64_t backward =
      std::max({at_delta + (context ? delta.backward
                                    : delta_rule_chunk_backward_workspace_bytes(D, D, shape.seq, e, shape.threads)),
                at_conv + (context ? conv.backward : conv1d_silu_backward_workspace_bytes(n, 3 * W, d.conv_width, e)),
                at_norm + rmsnorm_backward_workspace_bytes(n, d.hidden, /*has_dw=*/true)});
  return {forward, backward};
}

ContextTraffic context_traffic(const KimiDeltaAttentionDims& d, const StepShape& shape) {
  ContextTraffic received = shape.context->conv1d_silu(step_conv_sizes(d, shape), shape.element_bytes).received;
  received += shape.context->delta_rule(step_delta_sizes(d, shape), shape.threads, shape.element_bytes).received;
  return received;
}

double context_flops_per_token(const KimiDeltaAttentionDims& d, int64_t /*seq*/) {
  return double(d.heads) * context_delta_rule_flops_per_token(d.head_dim, d.head_dim);
}

#define TRILLION_INSTANTIATE(T)                                                                                   \
  template void mixer_forward<T>(T*, const T*, const KimiDeltaAttentionWeights<T>&, const KimiDeltaAttentionDims&, \
                                 const LayerPass&, int, Arena&);                                                  \
  template T* mixer_backward<T>(const T*, const T*, const KimiDeltaAttentionWeights<T>&,                          \
                                const KimiDeltaAttentionWeights<T>&, const KimiDeltaAttentionDims&,               \
                                const LayerPass&, const ActivationStore&, int, Arena&);                           \
  template void mixer_decode<T>(T*, const T*, int64_t, int64_t, int64_t, T*, const KimiDeltaAttentionWeights<T>&, \
                                const KimiDeltaAttentionDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
