// Multi-head latent attention: forward (training and weight-absorbed decoding) and backward. See mla.h.
#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/family.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sparse_attention.h"

namespace trillion {

MlaDims MlaDims::from_config(const ModelConfig& config, bool sparse) {
  const Family family = family_of(config.model_type);
  MlaDims dims;
  dims.hidden = config.hidden_size;
  dims.heads = config.num_attention_heads;
  dims.q_lora_rank = config.q_lora_rank;
  dims.kv_lora_rank = config.kv_lora_rank;
  dims.nope = config.qk_nope_head_dim;
  dims.rope_dim = config.qk_rope_head_dim;
  dims.v = config.v_head_dim;
  dims.rotary = family.mla_rope;
  dims.rope = config.rope_spec(config.qk_rope_head_dim, config.rope_interleave);
  dims.scale = 1.0 / std::sqrt(double(dims.qk())) * (family.yarn_softmax_mscale ? config.yarn_softmax_factor() : 1.0);
  dims.bias = config.attention_bias;
  dims.latent_norm = {1e-6, false};
  dims.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  if (sparse) dims.indexer = IndexerDims::from_config(config, /*from_latent=*/true);
  return dims;
}

namespace {

// The query and the latent of n tokens from the normed input h[n, D] (no RoPE yet).
template <class T>
struct Latents {
  T* q_a;       // [n, r_q]        q_a_proj(h) (q_lora_rank > 0)
  T* q_a_rstd;  // [n]
  T* q_latent;  // [n, r_q]        q_a_layernorm output
  T* q;         // [n, H, qk]      query, [nope | rope] per head
  T* kv_a;      // [n, r_kv + rope] kv_a_proj_with_mqa(h): [c_raw | k_rot]
  T* kv_rstd;   // [n]
  T* latent;    // [n, r_kv]       c = kv_a_layernorm(c_raw)
};

// Where `saves` puts the latents (the store, or scratch).
template <class T>
Latents<T> latent_buffers(const SavedWriter& saves, const MlaDims& dims) {
  using Tag = ActivationTag;
  Latents<T> p{};
  if (dims.q_lora_rank > 0) {
    p.q_a = saves.out<T>(Tag::mla_q_a);            // [n, r_q]
    p.q_a_rstd = saves.out<T>(Tag::mla_q_a_rstd);  // [n]
    p.q_latent = saves.out<T>(Tag::mla_q_latent);  // [n, r_q]
  }
  p.q = saves.out<T>(Tag::q);                // [n, H, qk]
  p.kv_a = saves.out<T>(Tag::mla_kv_a);      // [n, r_kv + rope]
  p.kv_rstd = saves.out<T>(Tag::mla_kv_rstd);  // [n]
  p.latent = saves.out<T>(Tag::mla_latent);  // [n, r_kv]
  return p;
}

template <class T>
void project_latents(const Latents<T>& p, const T* h, int64_t n, const MlaWeights<T>& w, const MlaDims& dims) {
  const int64_t D = dims.hidden, rq = dims.q_lora_rank, rkv = dims.kv_lora_rank;
  if (rq == 0) {
    linear(p.q, h, w.q_proj, n, D, dims.q_width(), /*accumulate=*/false);
  } else {
    linear(p.q_a, h, w.q_a_proj, n, D, rq, /*accumulate=*/false);
    rmsnorm_forward(p.q_latent, p.q_a_rstd, p.q_a, w.q_a_norm, n, rq, dims.latent_norm.eps, false);
    linear(p.q, p.q_latent, w.q_b_proj, n, rq, dims.q_width(), /*accumulate=*/false);
  }
  linear(p.kv_a, h, w.kv_a_proj, n, D, dims.kv_a_out(), /*accumulate=*/false);
  // kv_a_layernorm over the first r_kv columns of each row (row stride r_kv + rope)
  T* c_raw = p.latent;  // [n, r_kv] the latent's input, normalized in place
  for (int64_t t = 0; t < n; ++t) std::memcpy(c_raw + t * rkv, p.kv_a + t * dims.kv_a_out(), rkv * sizeof(T));
  rmsnorm_forward(p.latent, p.kv_rstd, c_raw, w.kv_a_norm, n, rkv, dims.latent_norm.eps, false);
}

// RoPE (DeepSeek) on the rope part of every query head and on the shared k_rot of kv_a[n, r_kv + rope].
template <class T>
void rotate_positions(T* q, T* kv_a, const int32_t* positions, int64_t n, const MlaDims& dims, bool backward) {
  if (!dims.rotary) return;
  const auto rotate = backward ? rope_backward<T> : rope_forward<T>;
  rotate(q, positions, n, dims.heads, dims.qk(), dims.nope, dims.rope);
  rotate(kv_a, positions, n, 1, dims.kv_a_out(), dims.kv_lora_rank, dims.rope);
}

// k[n, H, qk] = [k_nope | k_rot] and v[n, H, v] from kv[n, H, nope + v] = kv_b_proj(c) and kv_a's k_rot.
template <class T>
void expand_keys(T* k, T* v, const T* kv, const T* kv_a, int64_t n, const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, r = dims.rope_dim, dv = dims.v, qk = dims.qk();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hd = 0; hd < H; ++hd) {
      const T* row = kv + (t * H + hd) * (nope + dv);
      std::memcpy(k + (t * H + hd) * qk, row, nope * sizeof(T));
      std::memcpy(k + (t * H + hd) * qk + nope, kv_a + t * dims.kv_a_out() + dims.kv_lora_rank, r * sizeof(T));
      std::memcpy(v + (t * H + hd) * dv, row + nope, dv * sizeof(T));
    }
}

// Context parallelism: the keys and values of the whole sequences, built from the group's latents
// and rotated keys (r_kv + rope elements per token gathered, never the expanded keys); m = batch ·
// the whole sequence's length.
template <class T>
struct WholeKeys {
  T* rows;         // [m, r_kv + rope]  [c | k_rot] of every position
  T* latent;       // [m, r_kv]         c, contiguous (kv_b_proj's operand)
  T* k;            // [m, H, qk]
  T* v;            // [m, H, v]
};

// latent [n, r_kv] and kv_a [n, r_kv + rope] (its k_rot rotated) are this rank's tokens'.
template <class T>
WholeKeys<T> gather_whole_keys(const T* latent, const T* kv_a, int64_t batch, int64_t seq, const MlaWeights<T>& w,
                               const MlaDims& dims, ContextExchange& context, Arena& scratch) {
  const int64_t n = batch * seq, rkv = dims.kv_lora_rank, cw = dims.kv_a_out();
  const int64_t m = batch * context.sequence_length();
  T* own = scratch.alloc<T>(n * cw);  // [n, r_kv + rope] this rank's [c | k_rot]
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(own + t * cw, latent + t * rkv, rkv * sizeof(T));
    std::memcpy(own + t * cw + rkv, kv_a + t * cw + rkv, dims.rope_dim * sizeof(T));
  }
  WholeKeys<T> whole{scratch.alloc<T>(m * cw), scratch.alloc<T>(m * rkv), scratch.alloc<T>(m * dims.q_width()),
                     scratch.alloc<T>(m * dims.o_width())};
  context.gather_sequences(whole.rows, own, batch, cw);
  for (int64_t t = 0; t < m; ++t) std::memcpy(whole.latent + t * rkv, whole.rows + t * cw, rkv * sizeof(T));
  T* kv = scratch.alloc<T>(m * dims.kv_b_out());  // [m, H, nope + v]
  const WholeSequencesDropoutScope whole_rows;    // LoRA's masks of the whole sequences' tokens
  linear(kv, whole.latent, w.kv_b_proj, m, rkv, dims.kv_b_out(), /*accumulate=*/false);
  expand_keys(whole.k, whole.v, kv, whole.rows, m, dims);
  return whole;
}

}  // namespace

// Saved in mixer_forward's order: the query latent (q LoRA), the query, kv_a and the latent, the
// expanded keys and values, the attention's output and log-sum-exp, then the indexer's (sparse layers).
std::vector<SavedTensor> saved_tensors(const MlaDims& dims, const SavedExtent& extent) {
  using Tag = ActivationTag;
  const int64_t n = extent.tokens(), H = dims.heads, rq = dims.q_lora_rank;
  std::vector<SavedTensor> list;
  if (rq > 0)
    list.insert(list.end(), {{Tag::mla_q_a, {n, rq}},        // [n, r_q]
                             {Tag::mla_q_a_rstd, {n}},       // [n]
                             {Tag::mla_q_latent, {n, rq}, true, /*operand=*/true}});  // [n, r_q] q_b_proj's, wq's input
  // Attention reads q, k and v only as operands of products: the dense tiles' GEMMs, and sparse
  // attention's row products, which under the bf16 precision read their bf16 rounding too.
  list.insert(list.end(), {{Tag::q, {n, H, dims.qk()}, true, /*operand=*/true},  // [n, H, qk]
                           {Tag::mla_kv_a, {n, dims.kv_a_out()}},      // [n, r_kv + rope]
                           {Tag::mla_kv_rstd, {n}},                    // [n]
                           {Tag::mla_latent, {n, dims.kv_lora_rank}, true, /*operand=*/true}});  // [n, r_kv] kv_b_proj's input
  // Under context parallelism the keys and values span the whole sequences: the backward builds
  // them again from the gathered latents instead.
  if (!extent.sequence_split)
    list.insert(list.end(), {{Tag::k, {n, H, dims.qk()}, true, /*operand=*/true},  // [n, H, qk]
                             {Tag::v, {n, H, dims.v}, true, /*operand=*/true}});   // [n, H, v]
  list.insert(list.end(), {{Tag::attn_out, {n, dims.o_width()}},              // [n, H·v]
                           {Tag::attn_lse, {extent.batch, H, extent.seq}}});  // [batch, H, seq]
  const std::vector<SavedTensor> indexer = saved_tensors(dims.indexer, extent);
  list.insert(list.end(), indexer.begin(), indexer.end());
  return list;
}

template <class T>
void mixer_forward(T* x, const T* h, const MlaWeights<T>& w, const MlaDims& dims, const LayerPass& pass, int layer,
                   Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t batch = pass.batch, seq = pass.seq, n = batch * seq, D = dims.hidden, H = dims.heads;
  const int64_t rkv = dims.kv_lora_rank;
  const SavedWriter saves(saved_tensors(dims, SavedExtent::of(pass)), pass.store, layer, scratch);
  const Latents<T> p = latent_buffers<T>(saves, dims);
  project_latents(p, h, n, w, dims);
  rotate_positions(p.q, p.kv_a, pass.positions, n, dims, /*backward=*/false);

  // The keys and values: of this rank's tokens, or under context parallelism of the whole sequences,
  // built from the group's latents.
  const T* k = nullptr;  // [batch, kv_len, H, qk]
  const T* v = nullptr;  // [batch, kv_len, H, v]
  int64_t kv_len = seq;
  if (pass.context != nullptr) {
    const WholeKeys<T> whole = gather_whole_keys(p.latent, p.kv_a, batch, seq, w, dims, *pass.context, scratch);
    k = whole.k, v = whole.v, kv_len = pass.context->sequence_length();
  } else {
    T* kv = scratch.alloc<T>(n * dims.kv_b_out());  // [n, H, nope + v]
    linear(kv, p.latent, w.kv_b_proj, n, rkv, dims.kv_b_out(), /*accumulate=*/false);
    T* keys = saves.out<T>(Tag::k);    // [n, H, qk]
    T* values = saves.out<T>(Tag::v);  // [n, H, v]
    expand_keys(keys, values, kv, p.kv_a, n, dims);
    k = keys, v = values;
  }

  const AttentionSizes sizes{batch, seq, kv_len, H, H, dims.qk(), dims.scale, dims.v, pass.doc_start};
  T* out = saves.out<T>(Tag::attn_out);  // [n, H·v]
  T* lse = saves.out<T>(Tag::attn_lse);  // [batch, H, seq]
  IndexerOutputs<T> selected;
  if (dims.indexer.enabled()) selected = indexer_forward(p.q_latent, h, w.indexer, dims.indexer, pass, layer, scratch);
  const int32_t* selection = attends_sparsely(dims.indexer, pass) ? selected.selection : nullptr;  // [n, topk]
  if (pass.context != nullptr)  // chunk by chunk over the whole keys (the selection: global positions)
    pass.context->gathered_attention_forward(out, lse, p.q, k, v, selection, dims.indexer.topk, sizes);
  else if (selection != nullptr)
    sparse_attention_forward(out, lse, p.q, k, v, selection, sparse_sizes(sizes, dims.indexer.topk));
  else
    attention_forward(out, lse, p.q, k, v, sizes);
  if (dims.indexer.enabled())
    indexer_train(selected, p.q, k, lse, H, H, dims.qk(), dims.scale, dims.indexer, pass, layer, scratch);
  linear(x, out, w.o_proj, n, dims.o_width(), D, /*accumulate=*/true);  // residual: x[n, D] += o_proj(out)
}

template <class T>
T* mixer_backward(const T* dy, const T* h, const MlaWeights<T>& w, const MlaWeights<T>& grads, const MlaDims& dims,
                  const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t batch = pass.batch, seq = pass.seq, n = batch * seq, D = dims.hidden, H = dims.heads;
  const int64_t rq = dims.q_lora_rank, rkv = dims.kv_lora_rank, nope = dims.nope, dv = dims.v, qk = dims.qk();
  const SavedReader saved(saved_tensors(dims, SavedExtent::of(pass)), store, layer);
  const T* q = saved.in<T>(Tag::q);                  // [n, H, qk]
  const T* kv_a = saved.in<T>(Tag::mla_kv_a);        // [n, r_kv + rope]
  const T* kv_rstd = saved.in<T>(Tag::mla_kv_rstd);  // [n]
  const T* latent = saved.in<T>(Tag::mla_latent);    // [n, r_kv]
  const T* out = saved.in<T>(Tag::attn_out);         // [n, H·v]
  const T* lse = saved.in<T>(Tag::attn_lse);         // [batch, H, seq]

  T* d_out = scratch.alloc<T>(n * dims.o_width());  // [n, H, v]; dy is the gradient wrt the sublayer output
  linear_grad(d_out, grads.o_proj, dy, out, w.o_proj, n, dims.o_width(), D, /*accumulate_dx=*/false);
  // The keys as the forward attended to them, with their latents: of this rank's tokens, or under
  // context parallelism of the whole sequences, from the group's latents again (m = batch · kv_len).
  const T* k = nullptr;            // [m, H, qk]
  const T* v = nullptr;            // [m, H, v]
  const T* key_latent = latent;    // [m, r_kv]
  int64_t kv_len = seq;
  if (pass.context != nullptr) {
    const WholeKeys<T> whole = gather_whole_keys(latent, kv_a, batch, seq, w, dims, *pass.context, scratch);
    k = whole.k, v = whole.v, key_latent = whole.latent, kv_len = pass.context->sequence_length();
  } else {
    k = saved.in<T>(Tag::k), v = saved.in<T>(Tag::v);
  }
  const int64_t m = batch * kv_len;
  const AttentionSizes sizes{batch, seq, kv_len, H, H, qk, dims.scale, dv, pass.doc_start};
  T* dq = scratch.alloc<T>(n * dims.q_width());   // [n, H, qk]
  T* dk = scratch.alloc<T>(m * dims.q_width());   // [m, H, qk]
  T* d_v = scratch.alloc<T>(m * dims.o_width());  // [m, H, v]
  const int32_t* selection =
      attends_sparsely(dims.indexer, pass) ? saved.in<int32_t>(Tag::attn_indices) : nullptr;  // [n, topk]
  if (pass.context != nullptr) {  // dk, d_v: this rank's terms of every position's
    pass.context->gathered_attention_backward(dq, dk, d_v, d_out, q, k, v, out, lse, selection, dims.indexer.topk,
                                              sizes);
  } else if (selection != nullptr) {
    sparse_attention_backward(dq, dk, d_v, d_out, q, k, v, out, lse, selection, sparse_sizes(sizes, dims.indexer.topk));
  } else {
    attention_backward(dq, dk, d_v, d_out, q, k, v, out, lse, sizes);
  }

  // Back through the key expansion: d_kv[m, H, nope + v] = [dk_nope | dv]; d_rows[m, r_kv + rope] =
  // [dc | d k_rot], d k_rot = Σ_heads dk_rot and dc = d_kv · kv_b_proj.
  T* d_kv = scratch.alloc<T>(m * dims.kv_b_out());   // [m, H, nope + v]
  T* d_rows = scratch.alloc<T>(m * dims.kv_a_out());  // [m, r_kv + rope]
  for (int64_t t = 0; t < m; ++t) {
    T* d_rot = d_rows + t * dims.kv_a_out() + rkv;  // [rope]
    std::fill(d_rot, d_rot + dims.rope_dim, T(0));
    for (int64_t hd = 0; hd < H; ++hd) {
      const T* dk_row = dk + (t * H + hd) * qk;
      std::memcpy(d_kv + (t * H + hd) * (nope + dv), dk_row, nope * sizeof(T));
      std::memcpy(d_kv + (t * H + hd) * (nope + dv) + nope, d_v + (t * H + hd) * dv, dv * sizeof(T));
      for (int64_t i = 0; i < dims.rope_dim; ++i) d_rot[i] += dk_row[nope + i];
    }
  }
  T* d_latent = scratch.alloc<T>(m * rkv);  // [m, r_kv]
  {
    const WholeSequencesDropoutScope whole_rows;  // under cp, m rows of whole sequences
    linear_grad(d_latent, grads.kv_b_proj, d_kv, key_latent, w.kv_b_proj, m, rkv, dims.kv_b_out(), false);
  }
  // Under context parallelism each rank's terms are summed onto the tokens' owners: d_kv_a[n, r_kv + rope].
  T* d_kv_a = d_rows;
  if (pass.context != nullptr) {
    for (int64_t t = 0; t < m; ++t) std::memcpy(d_rows + t * dims.kv_a_out(), d_latent + t * rkv, rkv * sizeof(T));
    d_kv_a = scratch.alloc<T>(n * dims.kv_a_out());
    pass.context->reduce_sequences(d_kv_a, d_rows, batch, dims.kv_a_out());
    for (int64_t t = 0; t < n; ++t) std::memcpy(d_latent + t * rkv, d_kv_a + t * dims.kv_a_out(), rkv * sizeof(T));
  }
  rotate_positions(dq, d_kv_a, pass.positions, n, dims, /*backward=*/true);

  // kv_a_layernorm's backward of dc = d_latent[n, r_kv] into d_kv_a's first r_kv columns.
  T* c_raw = scratch.alloc<T>(n * rkv);    // [n, r_kv]
  T* d_c_raw = scratch.alloc<T>(n * rkv);  // [n, r_kv]
  for (int64_t t = 0; t < n; ++t) std::memcpy(c_raw + t * rkv, kv_a + t * dims.kv_a_out(), rkv * sizeof(T));
  rmsnorm_backward(d_c_raw, grads.kv_a_norm, d_latent, c_raw, w.kv_a_norm, kv_rstd, n, rkv, false, false);
  for (int64_t t = 0; t < n; ++t) std::memcpy(d_kv_a + t * dims.kv_a_out(), d_c_raw + t * rkv, rkv * sizeof(T));

  // dh = the input gradients of the query and kv_a projections.
  T* dh = scratch.alloc<T>(n * D);  // [n, D]
  if (rq == 0) {
    linear_grad(dh, grads.q_proj, dq, h, w.q_proj, n, D, dims.q_width(), /*accumulate_dx=*/false);
  } else {
    const T* q_a = saved.in<T>(Tag::mla_q_a);            // [n, r_q]
    const T* q_a_rstd = saved.in<T>(Tag::mla_q_a_rstd);  // [n]
    const T* q_latent = saved.in<T>(Tag::mla_q_latent);  // [n, r_q]
    T* d_q_latent = scratch.alloc<T>(n * rq);  // [n, r_q]
    T* d_q_a = scratch.alloc<T>(n * rq);       // [n, r_q]
    linear_grad(d_q_latent, grads.q_b_proj, dq, q_latent, w.q_b_proj, n, rq, dims.q_width(), false);
    rmsnorm_backward(d_q_a, grads.q_a_norm, d_q_latent, q_a, w.q_a_norm, q_a_rstd, n, rq, false, false);
    linear_grad(dh, grads.q_a_proj, d_q_a, h, w.q_a_proj, n, D, rq, /*accumulate_dx=*/false);
    if (dims.indexer.enabled()) indexer_backward(q_latent, h, w.indexer, grads.indexer, dims.indexer, pass, store, layer, scratch);
  }
  linear_grad(dh, grads.kv_a_proj, d_kv_a, h, w.kv_a_proj, n, D, dims.kv_a_out(), /*accumulate_dx=*/true);
  return dh;
}

template <class T>
void mixer_decode(T* x, const T* h, int64_t n, int64_t past, int64_t max_len, T* cache, const MlaWeights<T>& w,
                  const MlaDims& dims, Arena& scratch) {
  const int64_t D = dims.hidden, H = dims.heads, rkv = dims.kv_lora_rank;
  const int64_t nope = dims.nope, r = dims.rope_dim, dv = dims.v, qk = dims.qk(), cw = dims.kv_a_out();
  TRILLION_CHECK(past + n <= max_len, "MLA decode past ", past, " + n ", n, " > max_len ", max_len);
  int32_t* positions = scratch.alloc<int32_t>(n);  // [n]
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(past + i);
  const SavedWriter temporaries(saved_tensors(dims, SavedExtent{1, n}), nullptr, 0, scratch);
  const Latents<T> p = latent_buffers<T>(temporaries, dims);
  project_latents(p, h, n, w, dims);
  rotate_positions(p.q, p.kv_a, positions, n, dims, /*backward=*/false);
  for (int64_t t = 0; t < n; ++t) {  // cache rows past..: [c | k_rot]
    std::memcpy(cache + (past + t) * cw, p.latent + t * rkv, rkv * sizeof(T));
    std::memcpy(cache + (past + t) * cw + rkv, p.kv_a + t * cw + rkv, r * sizeof(T));
  }
  const int64_t len = past + n;
  T* values = scratch.alloc<T>(len * rkv);  // [len, r_kv]: the latents, contiguous
  for (int64_t j = 0; j < len; ++j) std::memcpy(values + j * rkv, cache + j * cw, rkv * sizeof(T));

  // Absorbed query q_abs[n, H, r_kv + rope] = [W_UK[h]ᵀ q_nope | q_rot] per head.
  const T* kv_b = merged_weight(w.kv_b_proj, rkv, dims.kv_b_out(), scratch);  // [H·(nope + v), r_kv]
  T* q_abs = scratch.alloc<T>(n * H * cw);
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uk = kv_b + hd * (nope + dv) * rkv;  // [nope, r_kv]
    gemm<T>(false, false, n, rkv, nope, T(1), p.q + hd * qk, H * qk, w_uk, rkv, T(0), q_abs + hd * cw, H * cw);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(q_abs + (t * H + hd) * cw + rkv, p.q + (t * H + hd) * qk + nope, r * sizeof(T));
  }
  const AttentionSizes sizes{1, n, len, H, 1, cw, dims.scale, rkv};
  T* out_latent = scratch.alloc<T>(n * H * rkv);  // [n, H, r_kv]
  T* lse = scratch.alloc<T>(H * n);               // [1, H, n]
  if (dims.indexer.enabled()) {
    T* index_keys = cache + max_len * cw;  // [max_len, d_I]
    const int32_t* selection = indexer_decode(p.q_latent, h, n, past, index_keys, w.indexer, dims.indexer, scratch);
    sparse_attention_forward(out_latent, lse, q_abs, cache, values, selection, sparse_sizes(sizes, dims.indexer.topk));
  } else {
    attention_forward(out_latent, lse, q_abs, cache, values, sizes);
  }
  T* out = scratch.alloc<T>(n * dims.o_width());  // [n, H, v] = per head out_latent · W_UVᵀ
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uv = kv_b + (hd * (nope + dv) + nope) * rkv;  // [v, r_kv]
    gemm<T>(false, true, n, dv, rkv, T(1), out_latent + hd * rkv, H * rkv, w_uv, rkv, T(0), out + hd * dv, H * dv);
  }
  linear(x, out, w.o_proj, n, dims.o_width(), D, /*accumulate=*/true);  // residual: x[n, D] += o_proj(out)
}

// Nothing is freed within either pass; each holds at one of its kernel calls the scratch allocated
// so far and that kernel's temporaries. Forward: (DeepSeek) RoPE's tables; kv_b_proj's output with
// the indexer's forward, or with its scratch and the attention's temporaries. Backward: d_out, dq,
// dk, d_v with the attention's temporaries; d_kv, d_kv_a, d_latent with RoPE's tables; c_raw,
// d_c_raw with kv_a_layernorm's partials; dh and (q LoRA) d_q_latent, d_q_a with q_a_layernorm's
// partials or the indexer's backward, then with its scratch and the decoder layer's input norm's partials.
// Under context parallelism each pass first builds the whole sequences' keys (gather_whole_keys:
// this rank's [c | k_rot], the gathered rows, the latent, k, v and kv_b_proj's output, m = batch ·
// the whole length), attends through the exchange chunk by chunk (over the selection on sparse
// layers, whose indexer gathers its keys too), and the backward's key gradients span the whole
// sequences (dk, d_v, d_kv, d_rows, d_latent), beside d_kv_a of its own.
Workspace workspace_bytes(const MlaDims& dims, const StepShape& shape) {
  const ContextPlan* context = shape.context;
  const int64_t n = shape.tokens(), e = shape.element_bytes, rq = dims.q_lora_rank, rkv = dims.kv_lora_rank;
  const int64_t m = context != nullptr ? shape.batch * context->sequence_length() : n;  // the keys' rows
  const auto rounded = [&](int64_t count) { return Arena::rounded(count * e); };
  const int64_t kv = rounded(m * dims.kv_b_out()), qk = rounded(n * dims.q_width());
  const int64_t o = rounded(n * dims.o_width()), latent = rounded(n * rkv), cw = dims.kv_a_out();
  const int64_t rope = dims.rotary ? rope_workspace_bytes(n, dims.rope.rotary_dim, e) : 0;
  const AttentionSizes sizes{shape.batch, shape.seq, m / shape.batch, dims.heads, dims.heads, dims.qk(), 0.0, dims.v};
  const int64_t whole = context != nullptr ? rounded(n * cw) + rounded(m * cw) + rounded(m * rkv) +
                                                 rounded(m * dims.q_width()) + rounded(m * dims.o_width())
                                           : 0;  // gather_whole_keys's, but kv_b_proj's output
  const auto main_attention = [&](bool backward) {
    return main_attention_workspace_bytes(dims.indexer, sizes, shape, backward);
  };
  const int64_t forward =
      std::max(rope, whole + kv +
                         std::max(forward_workspace_bytes(dims.indexer, shape, dims.heads, dims.heads, dims.qk()),
                                  forward_scratch_bytes(dims.indexer, shape) + main_attention(false)));
  // d_out, (the whole keys) dq, dk, d_v.
  const int64_t attention =
      o + whole + (context != nullptr ? kv : 0) + qk + rounded(m * dims.q_width()) + rounded(m * dims.o_width());
  const int64_t keys = attention + kv + rounded(m * cw);  // … d_kv, d_rows (d_kv_a on one rank)
  const int64_t key_latent = rounded(m * rkv) + (context != nullptr ? rounded(n * cw) : 0);  // d_latent, d_kv_a
  const int64_t latents = keys + key_latent + 2 * latent;                                    // … c_raw, d_c_raw
  const int64_t inputs = latents + rounded(n * dims.hidden) + (rq > 0 ? 2 * rounded(n * rq) : 0);
  const int64_t q_lora = rq > 0 ? std::max(rmsnorm_backward_workspace_bytes(n, rq, true),
                                           backward_workspace_bytes(dims.indexer, shape))
                                : 0;
  const int64_t input_norm = (rq > 0 ? backward_scratch_bytes(dims.indexer, shape) : 0) +
                             rmsnorm_backward_workspace_bytes(n, dims.hidden, true);
  const int64_t backward =
      std::max({attention + main_attention(true), keys + key_latent + rope,
                latents + rmsnorm_backward_workspace_bytes(n, rkv, true), inputs + std::max(q_lora, input_norm)});
  return {forward, backward};
}

// Under context parallelism: each token's [c | k_rot] gathered in the forward, again in the
// backward, and their gradients summed onto their owners; the indexer's keys (sparse layers).
ContextTraffic context_traffic(const MlaDims& dims, const StepShape& shape) {
  ContextTraffic traffic = shape.context->gathered_rows(shape.batch, dims.kv_a_out(), shape.element_bytes).both();
  return traffic += context_traffic(dims.indexer, shape);
}

#define TRILLION_INSTANTIATE(T)                                                                                    \
  template void mixer_forward<T>(T*, const T*, const MlaWeights<T>&, const MlaDims&, const LayerPass&, int, Arena&); \
  template T* mixer_backward<T>(const T*, const T*, const MlaWeights<T>&, const MlaWeights<T>&, const MlaDims&,     \
                                const LayerPass&, const ActivationStore&, int, Arena&);                            \
  template void mixer_decode<T>(T*, const T*, int64_t, int64_t, int64_t, T*, const MlaWeights<T>&, const MlaDims&, \
                                Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
