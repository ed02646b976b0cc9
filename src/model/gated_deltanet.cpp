// Gated DeltaNet mixer: forward, backward and decoding. See gated_deltanet.h.
#include "model/gated_deltanet.h"

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

GatedDeltaNetDims GatedDeltaNetDims::from_config(const ModelConfig& config) {
  GatedDeltaNetDims d;
  d.hidden = config.hidden_size;
  d.key_heads = config.linear_num_key_heads;
  d.value_heads = config.linear_num_value_heads;
  d.key_dim = config.linear_key_head_dim;
  d.value_dim = config.linear_value_head_dim;
  d.conv_width = config.linear_conv_kernel_dim;
  d.norm_eps = config.rms_norm_eps;
  d.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  return d;
}

namespace {

// The interleaved projections of n tokens, split: conv_in [n, Ck] = [q (nk·dk) | k (nk·dk) | v (nv·dv)],
// z [n, nv·dv], b and a [n, nv] (value head g·r + j from group g's j-th entries).
template <class T>
void split_projections(T* conv_in, T* z, T* b, T* a, const T* qkvz, const T* ba, int64_t n, const GatedDeltaNetDims& d) {
  const int64_t nk = d.key_heads, dk = d.key_dim, r = d.group(), vr = r * d.value_dim, Ck = d.conv_channels();
  const int64_t group_width = 2 * dk + 2 * vr, rows = d.qkvz_rows(), nv = d.value_heads;
  for (int64_t t = 0; t < n; ++t) {
    const T* row = qkvz + t * rows;  // [nk, 2dk + 2r·dv]
    T* out = conv_in + t * Ck;       // [Ck]
    for (int64_t g = 0; g < nk; ++g) {
      const T* group = row + g * group_width;
      std::memcpy(out + g * dk, group, dk * sizeof(T));                          // q_g
      std::memcpy(out + nk * dk + g * dk, group + dk, dk * sizeof(T));           // k_g
      std::memcpy(out + 2 * nk * dk + g * vr, group + 2 * dk, vr * sizeof(T));   // v_g
      std::memcpy(z + t * nv * d.value_dim + g * vr, group + 2 * dk + vr, vr * sizeof(T));  // z_g
      for (int64_t j = 0; j < r; ++j) {
        b[t * nv + g * r + j] = ba[t * 2 * nv + g * 2 * r + j];
        a[t * nv + g * r + j] = ba[t * 2 * nv + g * 2 * r + r + j];
      }
    }
  }
}

// The reverse of split_projections for the gradients.
template <class T>
void merge_projections(T* qkvz, T* ba, const T* conv_in, const T* z, const T* b, const T* a, int64_t n,
                       const GatedDeltaNetDims& d) {
  const int64_t nk = d.key_heads, dk = d.key_dim, r = d.group(), vr = r * d.value_dim, Ck = d.conv_channels();
  const int64_t group_width = 2 * dk + 2 * vr, rows = d.qkvz_rows(), nv = d.value_heads;
  for (int64_t t = 0; t < n; ++t) {
    T* row = qkvz + t * rows;
    const T* in = conv_in + t * Ck;
    for (int64_t g = 0; g < nk; ++g) {
      T* group = row + g * group_width;
      std::memcpy(group, in + g * dk, dk * sizeof(T));
      std::memcpy(group + dk, in + nk * dk + g * dk, dk * sizeof(T));
      std::memcpy(group + 2 * dk, in + 2 * nk * dk + g * vr, vr * sizeof(T));
      std::memcpy(group + 2 * dk + vr, z + t * nv * d.value_dim + g * vr, vr * sizeof(T));
      for (int64_t j = 0; j < r; ++j) {
        ba[t * 2 * nv + g * 2 * r + j] = b[t * nv + g * r + j];
        ba[t * 2 * nv + g * 2 * r + r + j] = a[t * nv + g * r + j];
      }
    }
  }
}

// q_rep, k_rep [n, nv, dk] from q_hat, k_hat [n, nk, dk]: value head h uses key head h / r; q scaled.
template <class T>
void repeat_heads(T* q_rep, T* k_rep, const T* q_hat, const T* k_hat, int64_t n, const GatedDeltaNetDims& d) {
  const int64_t nv = d.value_heads, nk = d.key_heads, dk = d.key_dim, r = d.group();
  const T scale = static_cast<T>(1.0 / std::sqrt(double(dk)));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < nv; ++h)
      for (int64_t i = 0; i < dk; ++i) {
        q_rep[(t * nv + h) * dk + i] = q_hat[(t * nk + h / r) * dk + i] * scale;
        k_rep[(t * nv + h) * dk + i] = k_hat[(t * nk + h / r) * dk + i];
      }
}

// The decode path and the training forward share this: from the normed input h, everything up to
// the delta rule's inputs. conv runs through `conv` (training or decoding).
template <class T>
struct Core {
  T *conv_in, *z, *b, *a, *q_hat, *q_inv, *k_hat, *k_inv, *v, *g, *beta, *q_rep, *k_rep;
};

template <class T, class Conv>
void prepare_core(const Core<T>& c, const T* h, int64_t n, const GatedDeltaNetWeights<T>& w,
                  const GatedDeltaNetDims& d, Arena& scratch, const Conv& conv) {
  const int64_t D = d.hidden, nk = d.key_heads, dk = d.key_dim, nv = d.value_heads, Ck = d.conv_channels();
  T* qkvz = scratch.alloc<T>(n * d.qkvz_rows());  // [n, 2·nk·dk + 2·nv·dv]
  T* ba = scratch.alloc<T>(n * 2 * nv);           // [n, 2·nv]
  linear(qkvz, h, w.in_proj_qkvz, n, D, d.qkvz_rows(), /*accumulate=*/false);
  linear(ba, h, w.in_proj_ba, n, D, 2 * nv, /*accumulate=*/false);
  split_projections(c.conv_in, c.z, c.b, c.a, qkvz, ba, n, d);
  T* conv_out = scratch.alloc<T>(n * Ck);  // [n, Ck]
  conv(conv_out, c.conv_in);
  T* q_raw = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  T* k_raw = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  copy_column_block(q_raw, conv_out, n, Ck, nk * dk, nk * dk);
  copy_column_block(k_raw, conv_out + nk * dk, n, Ck, nk * dk, nk * dk);
  copy_column_block(c.v, conv_out + 2 * nk * dk, n, Ck, nv * d.value_dim, nv * d.value_dim);
  l2norm_forward(c.q_hat, c.q_inv, q_raw, n * nk, dk, kLinearAttentionL2Eps);
  l2norm_forward(c.k_hat, c.k_inv, k_raw, n * nk, dk, kLinearAttentionL2Eps);
  repeat_heads(c.q_rep, c.k_rep, c.q_hat, c.k_hat, n, d);
  decay_gate_forward(c.g, c.a, w.A_log, w.dt_bias, n, nv, 1);
  for (int64_t i = 0; i < n * nv; ++i) c.beta[i] = T(1) / (T(1) + std::exp(-c.b[i]));
}

// Core buffers of n tokens: where `saves` puts them (the store, or scratch), with the temporaries.
template <class T>
Core<T> core_buffers(int64_t n, const GatedDeltaNetDims& d, const SavedWriter& saves, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t dk = d.key_dim, nv = d.value_heads;
  Core<T> c;
  c.conv_in = saves.out<T>(Tag::la_conv_in);  // [n, Cc]
  c.z = saves.out<T>(Tag::la_z);              // [n, nv, dv]
  c.b = scratch.alloc<T>(n * nv);             // [n, nv]
  c.a = saves.out<T>(Tag::la_a);              // [n, nv]
  c.q_hat = saves.out<T>(Tag::la_q_hat);      // [n, nk, dk]
  c.q_inv = saves.out<T>(Tag::la_q_inv);      // [n · nk]
  c.k_hat = saves.out<T>(Tag::la_k_hat);      // [n, nk, dk]
  c.k_inv = saves.out<T>(Tag::la_k_inv);      // [n · nk]
  c.v = saves.out<T>(Tag::la_v);              // [n, nv, dv]
  c.g = saves.out<T>(Tag::la_g);              // [n, nv]
  c.beta = saves.out<T>(Tag::la_beta);        // [n, nv]
  c.q_rep = scratch.alloc<T>(n * nv * dk);    // [n, nv, dk]
  c.k_rep = scratch.alloc<T>(n * nv * dk);    // [n, nv, dk]
  return c;
}

}  // namespace

// Saved in mixer_forward's order: the conv's input, the projections' and the core's inputs, the delta
// rule's output, the gated norm's statistics and output.
std::vector<SavedTensor> saved_tensors(const GatedDeltaNetDims& d, const SavedExtent& extent) {
  using Tag = ActivationTag;
  const int64_t n = extent.tokens(), nk = d.key_heads, dk = d.key_dim, nv = d.value_heads, dv = d.value_dim;
  return {{Tag::la_conv_in, {n, d.conv_channels()}},  // [n, Cc] [q | k | v] before the conv
          {Tag::la_z, {n, nv, dv}},                   // [n, nv, dv]
          {Tag::la_a, {n, nv}},                       // [n, nv]
          {Tag::la_q_hat, {n, nk, dk}},               // [n, nk, dk]
          {Tag::la_q_inv, {n * nk}},                  // [n · nk]
          {Tag::la_k_hat, {n, nk, dk}},               // [n, nk, dk]
          {Tag::la_k_inv, {n * nk}},                  // [n · nk]
          {Tag::la_v, {n, nv, dv}},                   // [n, nv, dv]
          {Tag::la_g, {n, nv}},                       // [n, nv]
          {Tag::la_beta, {n, nv}},                    // [n, nv]
          {Tag::la_core, {n, nv, dv}},                // [n, nv, dv]
          {Tag::la_norm_rstd, {n * nv}},              // [n · nv]
          {Tag::la_normed, {n, nv * dv}, true, /*operand=*/true}};  // [n, nv · dv] out_proj's input
}

template <class T>
void mixer_forward(T* x, const T* h, const GatedDeltaNetWeights<T>& w, const GatedDeltaNetDims& d,
                   const LayerPass& pass, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t n = pass.batch * pass.seq, D = d.hidden, nv = d.value_heads, dv = d.value_dim;
  const SavedWriter saves(saved_tensors(d, SavedExtent::of(pass)), pass.store, layer, scratch);
  const Core<T> c = core_buffers<T>(n, d, saves, scratch);
  const Conv1dSizes conv_sizes{pass.segment_batch(), pass.segment_seq(), d.conv_channels(), d.conv_width, pass.segments};
  prepare_core(c, h, n, w, d, scratch, [&](T* out, const T* in) {
    if (pass.context != nullptr)
      pass.context->conv1d_silu_forward(out, in, w.conv, pass.doc_start, conv_sizes);  // halos across ranks
    else
      conv1d_silu_forward(out, in, w.conv, pass.cu_seqlens, conv_sizes);
  });
  T* core = saves.out<T>(Tag::la_core);  // [n, nv, dv]
  const DeltaRuleSizes sizes{pass.segment_batch(), pass.segment_seq(), nv, d.key_dim, dv, pass.segments,
                             DeltaDecay::per_head};
  if (pass.context != nullptr)  // from the state the earlier ranks' tokens leave
    pass.context->delta_rule_forward(core, c.q_rep, c.k_rep, c.v, c.g, c.beta, pass.doc_start, sizes);
  else
    delta_rule_chunk_forward(core, static_cast<T*>(nullptr), c.q_rep, c.k_rep, c.v, c.g, c.beta,
                             static_cast<const T*>(nullptr), pass.cu_seqlens, sizes);
  T* norm_rstd = saves.out<T>(Tag::la_norm_rstd);  // [n · nv]
  T* normed = saves.out<T>(Tag::la_normed);        // [n, nv · dv]
  gated_rmsnorm_forward(normed, norm_rstd, core, c.z, w.norm, n * nv, dv, d.norm_eps, GateActivation::silu);
  linear(x, normed, w.out_proj, n, nv * dv, D, /*accumulate=*/true);  // residual
}

template <class T>
T* mixer_backward(const T* dy, const T* h, const GatedDeltaNetWeights<T>& w, const GatedDeltaNetWeights<T>& grads,
                  const GatedDeltaNetDims& d, const LayerPass& pass, const ActivationStore& store, int layer,
                  Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t n = pass.batch * pass.seq, D = d.hidden, nk = d.key_heads, dk = d.key_dim, nv = d.value_heads;
  const int64_t dv = d.value_dim, Ck = d.conv_channels(), r = d.group();
  const SavedReader saved(saved_tensors(d, SavedExtent::of(pass)), store, layer);
  const T* conv_in = saved.in<T>(Tag::la_conv_in);      // [n, Ck]
  const T* z = saved.in<T>(Tag::la_z);                  // [n, nv, dv]
  const T* a = saved.in<T>(Tag::la_a);                  // [n, nv]
  const T* q_hat = saved.in<T>(Tag::la_q_hat);          // [n, nk, dk]
  const T* q_inv = saved.in<T>(Tag::la_q_inv);          // [n · nk]
  const T* k_hat = saved.in<T>(Tag::la_k_hat);          // [n, nk, dk]
  const T* k_inv = saved.in<T>(Tag::la_k_inv);          // [n · nk]
  const T* v = saved.in<T>(Tag::la_v);                  // [n, nv, dv]
  const T* g = saved.in<T>(Tag::la_g);                  // [n, nv]
  const T* beta = saved.in<T>(Tag::la_beta);            // [n, nv]
  const T* core = saved.in<T>(Tag::la_core);            // [n, nv, dv]
  const T* norm_rstd = saved.in<T>(Tag::la_norm_rstd);  // [n · nv]
  const T* normed = saved.in<T>(Tag::la_normed);        // [n, nv · dv]

  T* d_normed = scratch.alloc<T>(n * nv * dv);  // [n, nv · dv]
  linear_grad(d_normed, grads.out_proj, dy, normed, w.out_proj, n, nv * dv, D, /*accumulate_dx=*/false);
  T* d_core = scratch.alloc<T>(n * nv * dv);  // [n, nv, dv]
  T* dz = scratch.alloc<T>(n * nv * dv);      // [n, nv, dv]
  gated_rmsnorm_backward(d_core, dz, grads.norm, d_normed, core, z, w.norm, norm_rstd, n * nv, dv,
                         GateActivation::silu);

  T* q_rep = scratch.alloc<T>(n * nv * dk);  // [n, nv, dk]
  T* k_rep = scratch.alloc<T>(n * nv * dk);  // [n, nv, dk]
  repeat_heads(q_rep, k_rep, q_hat, k_hat, n, d);
  T* dq_rep = scratch.alloc<T>(n * nv * dk);  // [n, nv, dk]
  T* dk_rep = scratch.alloc<T>(n * nv * dk);  // [n, nv, dk]
  T* d_conv_out = scratch.alloc<T>(n * Ck);   // [n, Ck] = [dq | dk | dv]
  T* dv_heads = scratch.alloc<T>(n * nv * dv);  // [n, nv, dv]
  T* dg = scratch.alloc<T>(n * nv);           // [n, nv]
  T* dbeta = scratch.alloc<T>(n * nv);        // [n, nv]
  const DeltaRuleSizes sizes{pass.segment_batch(), pass.segment_seq(), nv, dk, dv, pass.segments, DeltaDecay::per_head};
  if (pass.context != nullptr)
    pass.context->delta_rule_backward(dq_rep, dk_rep, dv_heads, dg, dbeta, d_core, q_rep, k_rep, v, g, beta,
                                      pass.doc_start, sizes);
  else
    delta_rule_chunk_backward(dq_rep, dk_rep, dv_heads, dg, dbeta, static_cast<T*>(nullptr), d_core,
                              static_cast<const T*>(nullptr), q_rep, k_rep, v, g, beta,
                              static_cast<const T*>(nullptr), pass.cu_seqlens, sizes);
  T* da = scratch.alloc<T>(n * nv);  // [n, nv]
  T* db = scratch.alloc<T>(n * nv);  // [n, nv]
  decay_gate_backward(da, grads.A_log, grads.dt_bias, dg, a, w.A_log, w.dt_bias, n, nv, 1);
  for (int64_t i = 0; i < n * nv; ++i) db[i] = dbeta[i] * beta[i] * (T(1) - beta[i]);

  // Sum the repeats back onto the key heads (q also through its scale), then through the L2 norms.
  T* dq_hat = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  T* dk_hat = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  const T scale = static_cast<T>(1.0 / std::sqrt(double(dk)));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t kh = 0; kh < nk; ++kh)
      for (int64_t i = 0; i < dk; ++i) {
        T sq = T(0), sk = T(0);
        for (int64_t j = 0; j < r; ++j) {
          sq += dq_rep[(t * nv + kh * r + j) * dk + i];
          sk += dk_rep[(t * nv + kh * r + j) * dk + i];
        }
        dq_hat[(t * nk + kh) * dk + i] = sq * scale;
        dk_hat[(t * nk + kh) * dk + i] = sk;
      }
  T* dq_raw = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  T* dk_raw = scratch.alloc<T>(n * nk * dk);  // [n, nk, dk]
  l2norm_backward(dq_raw, dq_hat, q_hat, q_inv, n * nk, dk);
  l2norm_backward(dk_raw, dk_hat, k_hat, k_inv, n * nk, dk);
  copy_column_block(d_conv_out, dq_raw, n, nk * dk, Ck, nk * dk);
  copy_column_block(d_conv_out + nk * dk, dk_raw, n, nk * dk, Ck, nk * dk);
  copy_column_block(d_conv_out + 2 * nk * dk, dv_heads, n, nv * dv, Ck, nv * dv);
  T* d_conv_in = scratch.alloc<T>(n * Ck);  // [n, Ck]
  const Conv1dSizes conv_sizes{pass.segment_batch(), pass.segment_seq(), Ck, d.conv_width, pass.segments};
  if (pass.context != nullptr)
    pass.context->conv1d_silu_backward(d_conv_in, grads.conv, d_conv_out, conv_in, w.conv, pass.doc_start, conv_sizes);
  else
    conv1d_silu_backward(d_conv_in, grads.conv, d_conv_out, conv_in, w.conv, pass.cu_seqlens, conv_sizes);

  T* d_qkvz = scratch.alloc<T>(n * d.qkvz_rows());  // [n, 2·nk·dk + 2·nv·dv]
  T* d_ba = scratch.alloc<T>(n * 2 * nv);           // [n, 2·nv]
  merge_projections(d_qkvz, d_ba, d_conv_in, dz, db, da, n, d);
  T* dh = scratch.alloc<T>(n * D);  // [n, D]
  linear_grad(dh, grads.in_proj_qkvz, d_qkvz, h, w.in_proj_qkvz, n, D, d.qkvz_rows(), /*accumulate_dx=*/false);
  linear_grad(dh, grads.in_proj_ba, d_ba, h, w.in_proj_ba, n, D, 2 * nv, /*accumulate_dx=*/true);
  return dh;
}

template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const GatedDeltaNetWeights<T>& w, const GatedDeltaNetDims& d, Arena& scratch) {
  const int64_t D = d.hidden, nv = d.value_heads, dv = d.value_dim, Ck = d.conv_channels();
  T* history = cache;                                 // [W − 1, Ck]
  T* state = cache + (d.conv_width - 1) * Ck;         // [nv, dk, dv]
  const SavedWriter temporaries(saved_tensors(d, SavedExtent{1, n}), nullptr, 0, scratch);
  const Core<T> c = core_buffers<T>(n, d, temporaries, scratch);
  const Conv1dSizes conv_sizes{1, n, Ck, d.conv_width, 0};
  prepare_core(c, h, n, w, d, scratch,
               [&](T* out, const T* in) { conv1d_silu_decode(out, history, in, w.conv, n, conv_sizes); });
  T* core = scratch.alloc<T>(n * nv * dv);                   // [n, nv, dv]
  T* s0 = scratch.alloc<T>(nv * d.key_dim * dv);             // [1, nv, dk, dv] the carried state
  std::memcpy(s0, state, nv * d.key_dim * dv * sizeof(T));
  const DeltaRuleSizes sizes{1, n, nv, d.key_dim, dv, 0, DeltaDecay::per_head};
  delta_rule_recurrent_forward(core, state, c.q_rep, c.k_rep, c.v, c.g, c.beta, s0, nullptr, sizes);
  T* norm_rstd = scratch.alloc<T>(n * nv);  // [n · nv]
  T* normed = scratch.alloc<T>(n * nv * dv);  // [n, nv · dv]
  gated_rmsnorm_forward(normed, norm_rstd, core, c.z, w.norm, n * nv, dv, d.norm_eps, GateActivation::silu);
  linear(x, normed, w.out_proj, n, nv * dv, D, /*accumulate=*/true);
}

// Forward: b, q_rep, k_rep (core_buffers), qkvz, ba, conv_out, q_raw, k_raw (prepare_core), then the
// delta rule's scratch. Backward, at each kernel with temporaries: the delta rule after d_normed,
// d_core, dz, dv_heads [n, nv·dv], q_rep, k_rep, dq_rep, dk_rep [n, nv·dk], d_conv_out [n, Ck], dg,
// dbeta [n, nv]; the conv after da, db [n, nv], dq_hat, dk_hat, dq_raw, dk_raw [n, nk·dk],
// d_conv_in [n, Ck]; the decoder layer's input norm after d_qkvz, d_ba, dh. Under context
// parallelism the convolution and the delta rule hold the exchange's scratch instead (the kernels'
// temporaries inside), the forward's either beside all of its own.
namespace {

// The convolution's and the delta rule's sizes in a training step (no packed segments under cp).
Conv1dSizes step_conv_sizes(const GatedDeltaNetDims& d, const StepShape& shape) {
  return {shape.batch, shape.seq, d.conv_channels(), d.conv_width, 0};
}
DeltaRuleSizes step_delta_sizes(const GatedDeltaNetDims& d, const StepShape& shape) {
  return {shape.batch, shape.seq, d.value_heads, d.key_dim, d.value_dim, 0, DeltaDecay::per_head};
}

}  // namespace

Workspace workspace_bytes(const GatedDeltaNetDims& d, const StepShape& shape) {
  const int64_t n = shape.tokens(), e = shape.element_bytes;
  const ContextPlan* context = shape.context;
  const Workspace conv = context ? context->conv1d_silu(step_conv_sizes(d, shape), e).workspace : Workspace{};
  const Workspace delta =
      context ? context->delta_rule(step_delta_sizes(d, shape), shape.threads, e).workspace : Workspace{};
  const auto rounded = [&](int64_t count) { return Arena::rounded(count * e); };
  const int64_t nk = d.key_heads, dk = d.key_dim, nv = d.value_heads, dv = d.value_dim, Ck = d.conv_channels();
  const int64_t forward = rounded(n * nv) + 2 * rounded(n * nv * dk) + rounded(n * d.qkvz_rows()) +
                          rounded(n * 2 * nv) + rounded(n * Ck) + 2 * rounded(n * nk * dk) +
                          (context ? std::max(conv.forward, delta.forward)
                                   : delta_rule_chunk_forward_workspace_bytes(dk, dv, e, shape.threads));
  const int64_t at_delta = 4 * rounded(n * nv * dv) + 4 * rounded(n * nv * dk) + rounded(n * Ck) + 2 * rounded(n * nv);
  const int64_t at_conv = at_delta + 2 * rounded(n * nv) + 4 * rounded(n * nk * dk) + rounded(n * Ck);
  const int64_t at_norm = at_conv + rounded(n * d.qkvz_rows()) + rounded(n * 2 * nv) + rounded(n * d.hidden);
  const int64_t backward =
      std::max({at_delta + (context ? delta.backward
                                    : delta_rule_chunk_backward_workspace_bytes(dk, dv, shape.seq, e, shape.threads)),
                at_conv + (context ? conv.backward : conv1d_silu_backward_workspace_bytes(n, Ck, d.conv_width, e)),
                at_norm + rmsnorm_backward_workspace_bytes(n, d.hidden, /*has_dw=*/true)});
  return {forward, backward};
}

ContextTraffic context_traffic(const GatedDeltaNetDims& d, const StepShape& shape) {
  ContextTraffic received = shape.context->conv1d_silu(step_conv_sizes(d, shape), shape.element_bytes).received;
  received += shape.context->delta_rule(step_delta_sizes(d, shape), shape.threads, shape.element_bytes).received;
  return received;
}

double context_flops_per_token(const GatedDeltaNetDims& d, int64_t /*seq*/) {
  return double(d.value_heads) * context_delta_rule_flops_per_token(d.key_dim, d.value_dim);
}

#define TRILLION_INSTANTIATE(T)                                                                                  \
  template void mixer_forward<T>(T*, const T*, const GatedDeltaNetWeights<T>&, const GatedDeltaNetDims&,         \
                                 const LayerPass&, int, Arena&);                                                 \
  template T* mixer_backward<T>(const T*, const T*, const GatedDeltaNetWeights<T>&, const GatedDeltaNetWeights<T>&, \
                                const GatedDeltaNetDims&, const LayerPass&, const ActivationStore&, int, Arena&); \
  template void mixer_decode<T>(T*, const T*, int64_t, int64_t, int64_t, T*, const GatedDeltaNetWeights<T>&,     \
                                const GatedDeltaNetDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
