// Attention sublayer: forward (training and decoding) and backward. See attention_block.h.
#include "model/attention_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/family.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sparse_attention.h"

namespace trillion {

AttentionBlockDims AttentionBlockDims::from_config(const ModelConfig& config, bool sparse) {
  AttentionBlockDims dims;
  dims.hidden = config.hidden_size;
  dims.q_heads = config.num_attention_heads;
  dims.kv_heads = config.num_key_value_heads;
  dims.head_dim = config.head_dim;
  dims.rope = config.rope_spec(config.rotary_dim(), false);
  const Family family = family_of(config.model_type);
  dims.input_norm = {config.rms_norm_eps, family.zero_centred_norms};
  dims.qk_norm = {config.rms_norm_eps, family.zero_centred_norms};
  dims.has_qk_norm = config.use_qk_norm;
  dims.bias = config.attention_bias;
  dims.gated = family.gated_attention;
  dims.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  if (sparse) dims.indexer = IndexerDims::from_config(config, /*from_latent=*/false);
  return dims;
}

namespace {

// Buffers of the projections of n tokens (all [n, heads, d] unless noted).
template <class T>
struct Projections {
  T* q_raw;   // [n, Hq, d]
  T* q_rstd;  // [n · Hq]
  T* q;       // [n, Hq, d]
  T* gate;    // [n, Hq, d] (gated only)
  T* k_raw;   // [n, Hkv, d]
  T* k_rstd;  // [n · Hkv]
  T* k;       // [n, Hkv, d]
  T* v;       // [n, Hkv, d]
};

// From the normed input h[n, D]: q, gate, k, v with q_norm / k_norm and RoPE applied.
template <class T>
void project_qkv(const Projections<T>& p, const T* h, const int32_t* positions, int64_t n,
                 const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, Arena& scratch) {
  const int64_t d = dims.head_dim, D = dims.hidden;
  if (dims.gated) {
    T* q_and_gate = scratch.alloc<T>(n * dims.q_proj_out());  // [n, Hq, 2d]: query then gate per head
    linear(q_and_gate, h, w.q_proj, n, D, dims.q_proj_out(), /*accumulate=*/false);
    for (int64_t row = 0; row < n * dims.q_heads; ++row) {
      std::memcpy(p.q_raw + row * d, q_and_gate + row * 2 * d, d * sizeof(T));
      std::memcpy(p.gate + row * d, q_and_gate + row * 2 * d + d, d * sizeof(T));
    }
  } else {
    linear(p.q_raw, h, w.q_proj, n, D, dims.q_width(), /*accumulate=*/false);
  }
  linear(p.k_raw, h, w.k_proj, n, D, dims.kv_width(), /*accumulate=*/false);
  linear(p.v, h, w.v_proj, n, D, dims.kv_width(), /*accumulate=*/false);
  if (dims.has_qk_norm) {
    rmsnorm_forward(p.q, p.q_rstd, p.q_raw, w.q_norm, n * dims.q_heads, d, dims.qk_norm.eps, dims.qk_norm.zero_centred);
    rmsnorm_forward(p.k, p.k_rstd, p.k_raw, w.k_norm, n * dims.kv_heads, d, dims.qk_norm.eps, dims.qk_norm.zero_centred);
  } else {
    std::memcpy(p.q, p.q_raw, n * dims.q_width() * sizeof(T));
    std::memcpy(p.k, p.k_raw, n * dims.kv_width() * sizeof(T));
  }
  rope_forward(p.q, positions, n, dims.q_heads, d, 0, dims.rope);
  rope_forward(p.k, positions, n, dims.kv_heads, d, 0, dims.rope);
}

}  // namespace

template <class T>
void mixer_forward(T* x, const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, const LayerPass& pass,
                   int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int32_t* positions = pass.positions;
  const int64_t batch = pass.batch, seq = pass.seq;
  ActivationStore* store = pass.store;
  const int64_t n = batch * seq, D = dims.hidden, d = dims.head_dim, qw = dims.q_width();
  // Saved for the backward, or (store == nullptr: forward only) temporaries of this sublayer.
  const auto buffer = [&](Tag tag, const Shape& shape) { return save_or_scratch<T>(store, tag, layer, shape, scratch); };
  T* input = buffer(Tag::attn_input, {n, D});  // [n, D]
  std::memcpy(input, x, n * D * sizeof(T));
  T* rstd = buffer(Tag::attn_norm_rstd, {n});  // [n]
  T* h = buffer(Tag::attn_norm_out, {n, D});   // [n, D]
  rmsnorm_forward(h, rstd, input, w.input_norm, n, D, dims.input_norm.eps, dims.input_norm.zero_centred);

  Projections<T> p;
  p.q_raw = buffer(Tag::q_raw, {n, dims.q_heads, d});          // [n, Hq, d]
  p.q_rstd = buffer(Tag::q_rstd, {n * dims.q_heads});          // [n · Hq]
  p.q = buffer(Tag::q, {n, dims.q_heads, d});                  // [n, Hq, d]
  p.gate = dims.gated ? buffer(Tag::gate, {n, qw}) : nullptr;  // [n, Hq·d]
  p.k_raw = buffer(Tag::k_raw, {n, dims.kv_heads, d});         // [n, Hkv, d]
  p.k_rstd = buffer(Tag::k_rstd, {n * dims.kv_heads});         // [n · Hkv]
  p.k = buffer(Tag::k, {n, dims.kv_heads, d});                 // [n, Hkv, d]
  p.v = buffer(Tag::v, {n, dims.kv_heads, d});                 // [n, Hkv, d]
  project_qkv(p, h, positions, n, w, dims, scratch);

  AttentionSizes sizes{batch, seq, seq, dims.q_heads, dims.kv_heads, dims.head_dim, 1.0 / std::sqrt(double(dims.head_dim))};
  sizes.doc_start = pass.doc_start;
  T* out = buffer(Tag::attn_out, {n, qw});                     // [n, Hq·d]
  T* lse = buffer(Tag::attn_lse, {batch, dims.q_heads, seq});  // [batch, Hq, seq]
  IndexerOutputs<T> selected;
  if (dims.indexer.enabled()) selected = indexer_forward(h, h, w.indexer, dims.indexer, pass, layer, scratch);
  if (attends_sparsely(dims.indexer, pass))
    sparse_attention_forward(out, lse, p.q, p.k, p.v, selected.selection, sparse_sizes(sizes, dims.indexer.topk));
  else
    attention_forward(out, lse, p.q, p.k, p.v, sizes);
  if (dims.indexer.enabled())
    indexer_train(selected, p.q, p.k, lse, dims.q_heads, dims.kv_heads, dims.head_dim, sizes.scale, dims.indexer, pass,
                  layer, scratch);
  const T* o_in = out;  // [n, Hq·d]
  if (dims.gated) {
    T* gated = buffer(Tag::o_proj_in, {n, qw});  // [n, Hq·d] out · sigmoid(gate)
    sigmoid_gate_forward(gated, out, p.gate, n * qw);
    o_in = gated;
  }
  linear(x, o_in, w.o_proj, n, qw, D, /*accumulate=*/true);  // residual: x[n, D] += o_in · o_projᵀ
}

template <class T>
void mixer_backward(T* dx, const AttentionBlockWeights<T>& w, const AttentionBlockWeights<T>& grads,
                    const AttentionBlockDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                    Arena& scratch) {
  using Tag = ActivationTag;
  const int32_t* positions = pass.positions;
  const int64_t batch = pass.batch, seq = pass.seq;
  const int64_t n = batch * seq, D = dims.hidden, d = dims.head_dim, qw = dims.q_width(), kvw = dims.kv_width();
  const T* input = store.get<T>(Tag::attn_input, layer, n * D);
  const T* rstd = store.get<T>(Tag::attn_norm_rstd, layer, n);
  const T* h = store.get<T>(Tag::attn_norm_out, layer, n * D);
  const T* q_raw = store.get<T>(Tag::q_raw, layer, n * qw);
  const T* q_rstd = store.get<T>(Tag::q_rstd, layer, n * dims.q_heads);
  const T* q = store.get<T>(Tag::q, layer, n * qw);
  const T* k_raw = store.get<T>(Tag::k_raw, layer, n * kvw);
  const T* k_rstd = store.get<T>(Tag::k_rstd, layer, n * dims.kv_heads);
  const T* k = store.get<T>(Tag::k, layer, n * kvw);
  const T* v = store.get<T>(Tag::v, layer, n * kvw);
  const T* out = store.get<T>(Tag::attn_out, layer, n * qw);
  const T* lse = store.get<T>(Tag::attn_lse, layer, batch * dims.q_heads * seq);

  // o_proj: dx is the gradient wrt the sublayer output y.
  T* d_o_in = scratch.alloc<T>(n * qw);  // [n, Hq·d]
  T* d_out = d_o_in;                     // [n, Hq, d] gradient wrt the attention output
  T* d_gate = nullptr;                   // [n, Hq, d]
  if (dims.gated) {
    const T* o_in = store.get<T>(Tag::o_proj_in, layer, n * qw);
    linear_grad(d_o_in, grads.o_proj, dx, o_in, w.o_proj, n, qw, D, /*accumulate_dx=*/false);
    const T* gate = store.get<T>(Tag::gate, layer, n * qw);
    d_out = scratch.alloc<T>(n * qw);
    d_gate = scratch.alloc<T>(n * qw);
    sigmoid_gate_backward(d_out, d_gate, d_o_in, out, gate, n * qw);
  } else {
    linear_grad(d_o_in, grads.o_proj, dx, out, w.o_proj, n, qw, D, /*accumulate_dx=*/false);
  }

  AttentionSizes sizes{batch, seq, seq, dims.q_heads, dims.kv_heads, d, 1.0 / std::sqrt(double(d))};
  sizes.doc_start = pass.doc_start;
  T* dq = scratch.alloc<T>(n * qw);   // [n, Hq, d]
  T* dk = scratch.alloc<T>(n * kvw);  // [n, Hkv, d] summed over the query heads sharing each KV head
  T* dv = scratch.alloc<T>(n * kvw);  // [n, Hkv, d]
  if (attends_sparsely(dims.indexer, pass)) {
    const int32_t* selection = store.get<int32_t>(Tag::attn_indices, layer, n * dims.indexer.topk);
    sparse_attention_backward(dq, dk, dv, d_out, q, k, v, out, lse, selection, sparse_sizes(sizes, dims.indexer.topk));
  } else {
    attention_backward(dq, dk, dv, d_out, q, k, v, out, lse, sizes);
  }
  rope_backward(dq, positions, n, dims.q_heads, d, 0, dims.rope);
  rope_backward(dk, positions, n, dims.kv_heads, d, 0, dims.rope);
  T* dq_raw = dq;  // [n, Hq, d] gradient wrt the query before q_norm
  T* dk_raw = dk;  // [n, Hkv, d] gradient wrt the key before k_norm
  if (dims.has_qk_norm) {
    dq_raw = scratch.alloc<T>(n * qw);
    dk_raw = scratch.alloc<T>(n * kvw);
    rmsnorm_backward(dq_raw, grads.q_norm, dq, q_raw, w.q_norm, q_rstd, n * dims.q_heads, d,
                     dims.qk_norm.zero_centred, false);
    rmsnorm_backward(dk_raw, grads.k_norm, dk, k_raw, w.k_norm, k_rstd, n * dims.kv_heads, d,
                     dims.qk_norm.zero_centred, false);
  }

  // dh = Σ over q (and gate), k, v projections of their input gradients.
  T* dh = scratch.alloc<T>(n * D);  // [n, D]
  if (dims.gated) {
    T* d_q_and_gate = scratch.alloc<T>(n * dims.q_proj_out());  // [n, Hq, 2d]
    for (int64_t row = 0; row < n * dims.q_heads; ++row) {
      std::memcpy(d_q_and_gate + row * 2 * d, dq_raw + row * d, d * sizeof(T));
      std::memcpy(d_q_and_gate + row * 2 * d + d, d_gate + row * d, d * sizeof(T));
    }
    linear_grad(dh, grads.q_proj, d_q_and_gate, h, w.q_proj, n, D, dims.q_proj_out(), /*accumulate_dx=*/false);
  } else {
    linear_grad(dh, grads.q_proj, dq_raw, h, w.q_proj, n, D, qw, /*accumulate_dx=*/false);
  }
  linear_grad(dh, grads.k_proj, dk_raw, h, w.k_proj, n, D, kvw, /*accumulate_dx=*/true);
  linear_grad(dh, grads.v_proj, dv, h, w.v_proj, n, D, kvw, /*accumulate_dx=*/true);
  if (dims.indexer.enabled()) indexer_backward(h, h, w.indexer, grads.indexer, dims.indexer, pass, store, layer, scratch);
  // Residual: dx (gradient wrt the output) += gradient through the input norm.
  rmsnorm_backward(dx, grads.input_norm, dh, input, w.input_norm, rstd, n, D, dims.input_norm.zero_centred,
                   /*accumulate_dx=*/true);
}

template <class T>
void mixer_decode(T* x, int64_t n, int64_t past, int64_t max_len, T* cache, const AttentionBlockWeights<T>& w,
                  const AttentionBlockDims& dims, Arena& scratch) {
  const int64_t D = dims.hidden, qw = dims.q_width(), kvw = dims.kv_width();
  T* k_cache = cache;                    // [max_len, Hkv, d]
  T* v_cache = cache + max_len * kvw;    // [max_len, Hkv, d]
  int32_t* positions = scratch.alloc<int32_t>(n);  // [n]
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(past + i);
  T* rstd = scratch.alloc<T>(n);     // [n]
  T* h = scratch.alloc<T>(n * D);    // [n, D]
  rmsnorm_forward(h, rstd, x, w.input_norm, n, D, dims.input_norm.eps, dims.input_norm.zero_centred);
  Projections<T> p;
  p.q_raw = scratch.alloc<T>(n * qw);
  p.q_rstd = scratch.alloc<T>(n * dims.q_heads);
  p.q = scratch.alloc<T>(n * qw);
  p.gate = dims.gated ? scratch.alloc<T>(n * qw) : nullptr;
  p.k_raw = scratch.alloc<T>(n * kvw);
  p.k_rstd = scratch.alloc<T>(n * dims.kv_heads);
  p.k = k_cache + past * kvw;  // new rows of the cache
  p.v = v_cache + past * kvw;
  project_qkv(p, h, positions, n, w, dims, scratch);

  AttentionSizes sizes{1, n, past + n, dims.q_heads, dims.kv_heads, dims.head_dim, 1.0 / std::sqrt(double(dims.head_dim))};
  T* out = scratch.alloc<T>(n * qw);               // [n, Hq, d]
  T* lse = scratch.alloc<T>(dims.q_heads * n);     // [1, Hq, n]
  if (dims.indexer.enabled()) {
    T* index_keys = cache + 2 * max_len * kvw;  // [max_len, d_I]
    const int32_t* selection = indexer_decode(h, h, n, past, index_keys, w.indexer, dims.indexer, scratch);
    sparse_attention_forward(out, lse, p.q, k_cache, v_cache, selection, sparse_sizes(sizes, dims.indexer.topk));
  } else {
    attention_forward(out, lse, p.q, k_cache, v_cache, sizes);
  }
  const T* o_in = out;  // [n, Hq·d]
  if (dims.gated) {
    T* gated = scratch.alloc<T>(n * qw);  // [n, Hq·d] out · sigmoid(gate)
    sigmoid_gate_forward(gated, out, p.gate, n * qw);
    o_in = gated;
  }
  linear(x, o_in, w.o_proj, n, qw, D, /*accumulate=*/true);  // residual: x[n, D] += o_in · o_projᵀ
}

// mixer_forward's saves, in its order, then the indexer's (sparse layers).
std::vector<SavedSize> saved_sizes(const AttentionBlockDims& dims, const StepShape& shape) {
  using Tag = ActivationTag;
  const int64_t n = shape.tokens(), e = shape.element_bytes, D = dims.hidden;
  const int64_t qw = dims.q_width(), kvw = dims.kv_width();
  std::vector<SavedSize> sizes{{Tag::attn_input, n * D * e}, {Tag::attn_norm_rstd, n * e},
                               {Tag::attn_norm_out, n * D * e}, {Tag::q_raw, n * qw * e},
                               {Tag::q_rstd, n * dims.q_heads * e}, {Tag::q, n * qw * e}};
  if (dims.gated) sizes.push_back({Tag::gate, n * qw * e});
  sizes.insert(sizes.end(), {{Tag::k_raw, n * kvw * e}, {Tag::k_rstd, n * dims.kv_heads * e},
                             {Tag::k, n * kvw * e}, {Tag::v, n * kvw * e}, {Tag::attn_out, n * qw * e},
                             {Tag::attn_lse, n * dims.q_heads * e}});
  if (dims.gated) sizes.push_back({Tag::o_proj_in, n * qw * e});
  for (const SavedSize& s : saved_sizes(dims.indexer, shape)) sizes.push_back(s);
  return sizes;
}

// Nothing is freed within either pass; each holds at one of its kernel calls the scratch allocated
// so far and that kernel's temporaries. Forward: (gated) the q_proj output, with RoPE's tables, then
// the indexer's forward, or its scratch with the attention's temporaries. Backward: d_o_in, (gated)
// d_out and d_gate, dq, dk, dv with the attention's temporaries or RoPE's tables; (q/k norms) dq_raw
// and dk_raw with their norms' partials; dh and (gated) d_q_and_gate with the indexer's backward,
// then with its scratch and the input norm's partials.
int64_t workspace_bytes(const AttentionBlockDims& dims, const StepShape& shape) {
  const int64_t n = shape.tokens(), e = shape.element_bytes, d = dims.head_dim;
  const int64_t q = Arena::rounded(n * dims.q_width() * e), kv = Arena::rounded(n * dims.kv_width() * e);
  const int64_t q_and_gate = dims.gated ? Arena::rounded(n * dims.q_proj_out() * e) : 0;
  const int64_t rope = rope_workspace_bytes(n, dims.rope.rotary_dim, e);
  const AttentionSizes sizes{shape.batch, shape.seq, shape.seq, dims.q_heads, dims.kv_heads, d, 0.0};
  const int64_t forward =
      q_and_gate + std::max({rope, forward_workspace_bytes(dims.indexer, shape, dims.q_heads, dims.kv_heads, d),
                             forward_scratch_bytes(dims.indexer, shape) +
                                 main_attention_workspace_bytes(dims.indexer, sizes, shape, /*backward=*/false)});
  const int64_t attention = q + (dims.gated ? 2 * q : 0) + q + 2 * kv;  // d_o_in … dv
  const int64_t norms = dims.has_qk_norm ? q + kv : 0;                  // dq_raw, dk_raw
  const int64_t norm_partials =
      dims.has_qk_norm ? std::max(rmsnorm_backward_workspace_bytes(n * dims.q_heads, d, true),
                                  rmsnorm_backward_workspace_bytes(n * dims.kv_heads, d, true))
                       : 0;
  const int64_t inputs = attention + norms + Arena::rounded(n * dims.hidden * e) + q_and_gate;  // … dh, d_q_and_gate
  const int64_t backward = std::max(
      {attention + std::max(main_attention_workspace_bytes(dims.indexer, sizes, shape, /*backward=*/true), rope),
       attention + norms + norm_partials,
       inputs + std::max(backward_workspace_bytes(dims.indexer, shape),
                         backward_scratch_bytes(dims.indexer, shape) +
                             rmsnorm_backward_workspace_bytes(n, dims.hidden, true))});
  return std::max(forward, backward);
}

#define TRILLION_INSTANTIATE(T)                                                                                \
  template void mixer_forward<T>(T*, const AttentionBlockWeights<T>&, const AttentionBlockDims&, const LayerPass&, \
                                 int, Arena&);                                                                   \
  template void mixer_backward<T>(T*, const AttentionBlockWeights<T>&, const AttentionBlockWeights<T>&,          \
                                  const AttentionBlockDims&, const LayerPass&, const ActivationStore&, int,      \
                                  Arena&);                                                                       \
  template void mixer_decode<T>(T*, int64_t, int64_t, int64_t, T*, const AttentionBlockWeights<T>&,              \
                                const AttentionBlockDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
