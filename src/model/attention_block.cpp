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

// Context parallelism: the keys and values of the whole sequences (m = batch · their length rows of
// `row` = Hkv · d), gathered from the group's k and v [batch, its tokens, row] into the scratch.
template <class T>
struct WholeKeys {
  T* k;  // [m, Hkv, d]
  T* v;  // [m, Hkv, d]
};

template <class T>
WholeKeys<T> gather_whole_keys(const T* k, const T* v, int64_t batch, int64_t row, ContextExchange& context,
                               Arena& scratch) {
  const int64_t m = batch * context.sequence_length();
  const WholeKeys<T> whole{scratch.alloc<T>(m * row), scratch.alloc<T>(m * row)};
  context.gather_sequences(whole.k, k, batch, row);
  context.gather_sequences(whole.v, v, batch, row);
  return whole;
}

}  // namespace

// Saved in mixer_forward's order: the projections, the attention's output and log-sum-exp, then the
// indexer's (sparse layers) and the gated output.
std::vector<SavedTensor> saved_tensors(const AttentionBlockDims& dims, const SavedExtent& extent) {
  using Tag = ActivationTag;
  const int64_t n = extent.tokens(), d = dims.head_dim, qw = dims.q_width();
  // Attention reads q, k and v only as operands of products: the dense tiles' GEMMs, and sparse
  // attention's row products, which under the bf16 precision read their bf16 rounding too.
  std::vector<SavedTensor> list{{Tag::q_raw, {n, dims.q_heads, d}},         // [n, Hq, d] before q_norm
                                {Tag::q_rstd, {n * dims.q_heads}},          // [n · Hq]
                                {Tag::q, {n, dims.q_heads, d}, true, /*operand=*/true}};  // [n, Hq, d] after q_norm and RoPE
  if (dims.gated) list.push_back({Tag::gate, {n, qw}});                     // [n, Hq·d]
  list.insert(list.end(), {{Tag::k_raw, {n, dims.kv_heads, d}},             // [n, Hkv, d] before k_norm
                           {Tag::k_rstd, {n * dims.kv_heads}},              // [n · Hkv]
                           {Tag::k, {n, dims.kv_heads, d}, true, /*operand=*/true},  // [n, Hkv, d] after k_norm and RoPE
                           {Tag::v, {n, dims.kv_heads, d}, true, /*operand=*/true},  // [n, Hkv, d]
                           {Tag::attn_out, {n, qw}},                 // [n, Hq·d]
                           {Tag::attn_lse, {extent.batch, dims.q_heads, extent.seq}}});  // [batch, Hq, seq]
  const std::vector<SavedTensor> indexer = saved_tensors(dims.indexer, extent);
  list.insert(list.end(), indexer.begin(), indexer.end());
  if (dims.gated) list.push_back({Tag::o_proj_in, {n, qw}, /*kept=*/true, /*operand=*/true});  // [n, Hq·d] o_proj's input
  return list;
}

template <class T>
void mixer_forward(T* x, const T* h, const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims,
                   const LayerPass& pass, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t batch = pass.batch, seq = pass.seq;
  const int64_t n = batch * seq, D = dims.hidden, qw = dims.q_width();
  const SavedWriter saves(saved_tensors(dims, SavedExtent::of(pass)), pass.store, layer, scratch);
  Projections<T> p;
  p.q_raw = saves.out<T>(Tag::q_raw);                        // [n, Hq, d]
  p.q_rstd = saves.out<T>(Tag::q_rstd);                      // [n · Hq]
  p.q = saves.out<T>(Tag::q);                                // [n, Hq, d]
  p.gate = dims.gated ? saves.out<T>(Tag::gate) : nullptr;   // [n, Hq·d]
  p.k_raw = saves.out<T>(Tag::k_raw);                        // [n, Hkv, d]
  p.k_rstd = saves.out<T>(Tag::k_rstd);                      // [n · Hkv]
  p.k = saves.out<T>(Tag::k);                                // [n, Hkv, d]
  p.v = saves.out<T>(Tag::v);                                // [n, Hkv, d]
  project_qkv(p, h, pass.positions, n, w, dims, scratch);

  // Under context parallelism the keys and values of the whole sequences, gathered from the group.
  const T* k = p.k;  // [batch, kv_len, Hkv, d]
  const T* v = p.v;  // [batch, kv_len, Hkv, d]
  int64_t kv_len = seq;
  if (pass.context != nullptr) {
    const WholeKeys<T> whole = gather_whole_keys(p.k, p.v, batch, dims.kv_width(), *pass.context, scratch);
    k = whole.k, v = whole.v, kv_len = pass.context->sequence_length();
  }
  AttentionSizes sizes{
      batch, seq, kv_len, dims.q_heads, dims.kv_heads, dims.head_dim, 1.0 / std::sqrt(double(dims.head_dim))};
  sizes.doc_start = pass.doc_start;
  T* out = saves.out<T>(Tag::attn_out);  // [n, Hq·d]
  T* lse = saves.out<T>(Tag::attn_lse);  // [batch, Hq, seq]
  IndexerOutputs<T> selected;
  if (dims.indexer.enabled()) selected = indexer_forward(h, h, w.indexer, dims.indexer, pass, layer, scratch);
  const int32_t* selection = attends_sparsely(dims.indexer, pass) ? selected.selection : nullptr;  // [n, topk]
  if (pass.context != nullptr)  // chunk by chunk over the whole keys (the selection: global positions)
    pass.context->gathered_attention_forward(out, lse, p.q, k, v, selection, dims.indexer.topk, sizes);
  else if (selection != nullptr)
    sparse_attention_forward(out, lse, p.q, k, v, selection, sparse_sizes(sizes, dims.indexer.topk));
  else
    attention_forward(out, lse, p.q, k, v, sizes);
  if (dims.indexer.enabled())
    indexer_train(selected, p.q, k, lse, dims.q_heads, dims.kv_heads, dims.head_dim, sizes.scale, dims.indexer, pass,
                  layer, scratch);
  const T* o_in = out;  // [n, Hq·d]
  if (dims.gated) {
    T* gated = saves.out<T>(Tag::o_proj_in);  // [n, Hq·d] out · sigmoid(gate)
    sigmoid_gate_forward(gated, out, p.gate, n * qw);
    o_in = gated;
  }
  linear(x, o_in, w.o_proj, n, qw, D, /*accumulate=*/true);  // residual: x[n, D] += o_in · o_projᵀ
}

template <class T>
T* mixer_backward(const T* dy, const T* h, const AttentionBlockWeights<T>& w, const AttentionBlockWeights<T>& grads,
                  const AttentionBlockDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                  Arena& scratch) {
  using Tag = ActivationTag;
  const int32_t* positions = pass.positions;
  const int64_t batch = pass.batch, seq = pass.seq;
  const int64_t n = batch * seq, D = dims.hidden, d = dims.head_dim, qw = dims.q_width(), kvw = dims.kv_width();
  const SavedReader saved(saved_tensors(dims, SavedExtent::of(pass)), store, layer);
  const T* q_raw = saved.in<T>(Tag::q_raw);    // [n, Hq, d]
  const T* q_rstd = saved.in<T>(Tag::q_rstd);  // [n · Hq]
  const T* q = saved.in<T>(Tag::q);            // [n, Hq, d]
  const T* k_raw = saved.in<T>(Tag::k_raw);    // [n, Hkv, d]
  const T* k_rstd = saved.in<T>(Tag::k_rstd);  // [n · Hkv]
  const T* k = saved.in<T>(Tag::k);            // [n, Hkv, d]
  const T* v = saved.in<T>(Tag::v);            // [n, Hkv, d]
  const T* out = saved.in<T>(Tag::attn_out);   // [n, Hq·d]
  const T* lse = saved.in<T>(Tag::attn_lse);   // [batch, Hq, seq]

  // o_proj: dy is the gradient wrt the sublayer output.
  T* d_o_in = scratch.alloc<T>(n * qw);  // [n, Hq·d]
  T* d_out = d_o_in;                     // [n, Hq, d] gradient wrt the attention output
  T* d_gate = nullptr;                   // [n, Hq, d]
  if (dims.gated) {
    linear_grad(d_o_in, grads.o_proj, dy, saved.in<T>(Tag::o_proj_in), w.o_proj, n, qw, D, /*accumulate_dx=*/false);
    d_out = scratch.alloc<T>(n * qw);
    d_gate = scratch.alloc<T>(n * qw);
    sigmoid_gate_backward(d_out, d_gate, d_o_in, out, saved.in<T>(Tag::gate), n * qw);
  } else {
    linear_grad(d_o_in, grads.o_proj, dy, out, w.o_proj, n, qw, D, /*accumulate_dx=*/false);
  }

  T* dq = scratch.alloc<T>(n * qw);   // [n, Hq, d]
  T* dk = scratch.alloc<T>(n * kvw);  // [n, Hkv, d] summed over the query heads sharing each KV head
  T* dv = scratch.alloc<T>(n * kvw);  // [n, Hkv, d]
  AttentionSizes sizes{batch, seq, seq, dims.q_heads, dims.kv_heads, d, 1.0 / std::sqrt(double(d))};
  sizes.doc_start = pass.doc_start;
  const int32_t* selection =
      attends_sparsely(dims.indexer, pass) ? saved.in<int32_t>(Tag::attn_indices) : nullptr;  // [n, topk]
  if (pass.context != nullptr) {  // the whole keys gathered again; every rank's terms summed onto their owners
    const WholeKeys<T> whole = gather_whole_keys(k, v, batch, kvw, *pass.context, scratch);
    const int64_t m = batch * pass.context->sequence_length();
    T* dk_whole = scratch.alloc<T>(m * kvw);  // [m, Hkv, d] this rank's terms
    T* dv_whole = scratch.alloc<T>(m * kvw);  // [m, Hkv, d]
    sizes.kv_len = pass.context->sequence_length();
    pass.context->gathered_attention_backward(dq, dk_whole, dv_whole, d_out, q, whole.k, whole.v, out, lse, selection,
                                              dims.indexer.topk, sizes);
    pass.context->reduce_sequences(dk, dk_whole, batch, kvw);
    pass.context->reduce_sequences(dv, dv_whole, batch, kvw);
  } else if (selection != nullptr) {
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
  return dh;
}

template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache,
                  const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims, Arena& scratch) {
  const int64_t D = dims.hidden, qw = dims.q_width(), kvw = dims.kv_width();
  T* k_cache = cache;                    // [max_len, Hkv, d]
  T* v_cache = cache + max_len * kvw;    // [max_len, Hkv, d]
  int32_t* positions = scratch.alloc<int32_t>(n);  // [n]
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(past + i);
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

// Nothing is freed within either pass; each holds at one of its kernel calls the scratch allocated
// so far and that kernel's temporaries. Forward: (gated) the q_proj output, with RoPE's tables, then
// the indexer's forward, or its scratch with the attention's temporaries. Backward: d_o_in, (gated)
// d_out and d_gate, dq, dk, dv with the attention's temporaries or RoPE's tables; (q/k norms) dq_raw
// and dk_raw with their norms' partials; dh and (gated) d_q_and_gate with the indexer's backward,
// then with its scratch and the input norm's partials. Under context parallelism each pass gathers
// the whole sequences' keys and values before the indexer and the attention (chunk by chunk through
// the exchange), and the backward holds their gradients' terms beside them from then on.
Workspace workspace_bytes(const AttentionBlockDims& dims, const StepShape& shape) {
  const int64_t n = shape.tokens(), e = shape.element_bytes, d = dims.head_dim;
  const int64_t q = Arena::rounded(n * dims.q_width() * e), kv = Arena::rounded(n * dims.kv_width() * e);
  const int64_t q_and_gate = dims.gated ? Arena::rounded(n * dims.q_proj_out() * e) : 0;
  const int64_t rope = rope_workspace_bytes(n, dims.rope.rotary_dim, e);
  const int64_t kv_len = shape.context != nullptr ? shape.context->sequence_length() : shape.seq;
  const int64_t whole =
      shape.context != nullptr ? 2 * Arena::rounded(shape.batch * kv_len * dims.kv_width() * e) : 0;  // k, v
  const AttentionSizes sizes{shape.batch, shape.seq, kv_len, dims.q_heads, dims.kv_heads, d, 0.0};
  const auto main_attention = [&](bool backward) {
    return main_attention_workspace_bytes(dims.indexer, sizes, shape, backward);
  };
  const int64_t forward =
      q_and_gate +
      std::max(rope, whole + std::max(forward_workspace_bytes(dims.indexer, shape, dims.q_heads, dims.kv_heads, d),
                                      forward_scratch_bytes(dims.indexer, shape) + main_attention(/*backward=*/false)));
  const int64_t attention = q + (dims.gated ? 2 * q : 0) + q + 2 * kv + 2 * whole;  // d_o_in … dv, (cp) … dv_whole
  const int64_t norms = dims.has_qk_norm ? q + kv : 0;                              // dq_raw, dk_raw
  const int64_t norm_partials =
      dims.has_qk_norm ? std::max(rmsnorm_backward_workspace_bytes(n * dims.q_heads, d, true),
                                  rmsnorm_backward_workspace_bytes(n * dims.kv_heads, d, true))
                       : 0;
  const int64_t inputs = attention + norms + Arena::rounded(n * dims.hidden * e) + q_and_gate;  // … dh, d_q_and_gate
  const int64_t backward =
      std::max({attention + std::max(main_attention(/*backward=*/true), rope), attention + norms + norm_partials,
                inputs + std::max(backward_workspace_bytes(dims.indexer, shape),
                                  backward_scratch_bytes(dims.indexer, shape) +
                                      rmsnorm_backward_workspace_bytes(n, dims.hidden, true))});
  return {forward, backward};
}

// Under context parallelism: each token's key and value gathered in the forward, again in the
// backward, and their gradients summed onto their owners; the indexer's keys (sparse layers).
ContextTraffic context_traffic(const AttentionBlockDims& dims, const StepShape& shape) {
  ContextTraffic traffic = shape.context->gathered_rows(shape.batch, 2 * dims.kv_width(), shape.element_bytes).both();
  return traffic += context_traffic(dims.indexer, shape);
}

#define TRILLION_INSTANTIATE(T)                                                                                 \
  template void mixer_forward<T>(T*, const T*, const AttentionBlockWeights<T>&, const AttentionBlockDims&,        \
                                 const LayerPass&, int, Arena&);                                                  \
  template T* mixer_backward<T>(const T*, const T*, const AttentionBlockWeights<T>&, const AttentionBlockWeights<T>&, \
                                const AttentionBlockDims&, const LayerPass&, const ActivationStore&, int, Arena&); \
  template void mixer_decode<T>(T*, const T*, int64_t, int64_t, int64_t, T*, const AttentionBlockWeights<T>&,    \
                                const AttentionBlockDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
