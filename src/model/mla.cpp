// Multi-head latent attention: forward (training, expanded on one rank and weight-absorbed under context
// parallelism, and weight-absorbed decoding) and backward. See mla.h.
#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/decoder_layer.h"
#include "model/family.h"
#include "model/mla_absorbed.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sparse_attention.h"

namespace trillion {

MlaDims MlaDims::from_config(const ModelConfig& config, int layer, bool sparse) {
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
  const std::string kv_b = decoder_layer_prefix(layer) + "self_attn.kv_b_proj";
  if (config.lora != nullptr && config.lora->targets_module(kv_b)) dims.kv_b_adapter_rank = config.lora->rank_of(kv_b);
  dims.base_frozen = config.lora != nullptr;
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

}  // namespace

template <class T>
void expand_keys(T* k, T* v, const T* kv, const T* kv_a, int64_t n, const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, r = dims.rope_dim, dv = dims.v, qk = dims.qk();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hd = 0; hd < H; ++hd) {
      const T* row = kv + (t * H + hd) * (nope + dv);  // [nope + v]
      std::memcpy(k + (t * H + hd) * qk, row, nope * sizeof(T));
      std::memcpy(k + (t * H + hd) * qk + nope, kv_a + t * dims.kv_a_out() + dims.kv_lora_rank, r * sizeof(T));
      std::memcpy(v + (t * H + hd) * dv, row + nope, dv * sizeof(T));
    }
}

template <class T>
void expanded_attention_backward(const LatentGrads<T>& g, const T* d_out, const T* q, const T* latent, const T* k,
                                 const T* v, const T* out, const T* lse, const int32_t* selection,
                                 const LinearWeights<T>& kv_b, const LinearWeights<T>& kv_b_grads, const MlaDims& dims,
                                 const AttentionSizes& sizes, Arena& scratch) {
  const int64_t n = sizes.batch * sizes.q_len, H = dims.heads, nope = dims.nope, dv = dims.v, qk = dims.qk();
  T* dk = scratch.alloc<T>(n * dims.q_width());   // [n, H, qk]
  T* d_v = scratch.alloc<T>(n * dims.o_width());  // [n, H, v]
  if (selection != nullptr)
    sparse_attention_backward(g.dq, dk, d_v, d_out, q, k, v, out, lse, selection,
                              sparse_sizes(sizes, dims.indexer.topk));
  else
    attention_backward(g.dq, dk, d_v, d_out, q, k, v, out, lse, sizes);
  // d_kv[n, H, nope + v] = [dk_nope | dv]; d k_rot = Σ_heads dk_rot; dc = d_kv · kv_b_proj.
  T* d_kv = scratch.alloc<T>(n * dims.kv_b_out());  // [n, H, nope + v]
  for (int64_t t = 0; t < n; ++t) {
    T* d_rot = g.d_kv_a + t * dims.kv_a_out() + dims.kv_lora_rank;  // [rope]
    std::fill(d_rot, d_rot + dims.rope_dim, T(0));
    for (int64_t hd = 0; hd < H; ++hd) {
      const T* dk_row = dk + (t * H + hd) * qk;  // [qk]
      std::memcpy(d_kv + (t * H + hd) * (nope + dv), dk_row, nope * sizeof(T));
      std::memcpy(d_kv + (t * H + hd) * (nope + dv) + nope, d_v + (t * H + hd) * dv, dv * sizeof(T));
      for (int64_t i = 0; i < dims.rope_dim; ++i) d_rot[i] += dk_row[nope + i];
    }
  }
  linear_grad(g.d_latent, kv_b_grads, d_kv, latent, kv_b, n, dims.kv_lora_rank, dims.kv_b_out(), false);
}

// Saved in mixer_forward's order: the query latent (q LoRA), the query, kv_a and the latent, the
// expanded keys and values and the attention's output (under context parallelism the absorbed
// form's output over the latents instead), its log-sum-exp, then the indexer's (sparse layers).
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
  // Under context parallelism the keys span the whole sequences: the backward gathers their rows
  // again, and the absorbed form's output keeps its latent width (W_UV's gradient reads it).
  if (extent.sequence_split)
    list.push_back({Tag::mla_out_latent, {n, H, dims.absorbed_latent()}});  // [n, H, L]
  else
    list.insert(list.end(), {{Tag::k, {n, H, dims.qk()}, true, /*operand=*/true},  // [n, H, qk]
                             {Tag::v, {n, H, dims.v}, true, /*operand=*/true},     // [n, H, v]
                             {Tag::attn_out, {n, dims.o_width()}}});               // [n, H·v]
  list.push_back({Tag::attn_lse, {extent.batch, H, extent.seq}});                  // [batch, H, seq]
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

  // The attention's operands: one rank's expanded keys and values, or under context parallelism the
  // absorbed form over the whole sequences' rows (model/mla_absorbed.h).
  const T* q = p.q;       // [n, H, qk], or the absorbed queries [n, H, L + rope]
  const T* k = nullptr;   // [batch, kv_len, H, qk], or the rows [batch, kv_len, L + rope]
  const T* v = nullptr;   // [batch, kv_len, H, v], or the latents [batch, kv_len, L]
  T* attended = nullptr;  // [n, H, v], or over the latents [n, H, L]
  AttentionSizes sizes = expanded_sizes(dims, batch, seq, pass.doc_start);
  const T* w_e = nullptr;  // [H·(nope + v), L] the absorbed weight
  T* expanded = nullptr;   // [n, H·v] under cp: o_proj's input, from the output over the latents
  if (pass.context != nullptr) {
    sizes = absorbed_sizes(dims, batch, seq, pass.context->sequence_length(), pass.doc_start);
    const AbsorbedOperands<T> operands =
        absorbed_operands(p.q, p.latent, p.kv_a, w.kv_b_proj, dims, sizes, *pass.context, scratch);
    w_e = operands.w_e, q = operands.q_abs, k = operands.whole.rows, v = operands.whole.latent;
    attended = saves.out<T>(Tag::mla_out_latent);
    expanded = scratch.alloc<T>(n * dims.o_width());
  } else {
    T* kv = scratch.alloc<T>(n * dims.kv_b_out());  // [n, H, nope + v]
    linear(kv, p.latent, w.kv_b_proj, n, rkv, dims.kv_b_out(), /*accumulate=*/false);
    T* keys = saves.out<T>(Tag::k);    // [n, H, qk]
    T* values = saves.out<T>(Tag::v);  // [n, H, v]
    expand_keys(keys, values, kv, p.kv_a, n, dims);
    k = keys, v = values, attended = saves.out<T>(Tag::attn_out);
  }

  T* lse = saves.out<T>(Tag::attn_lse);  // [batch, H, seq]
  IndexerOutputs<T> selected;
  if (dims.indexer.enabled()) selected = indexer_forward(p.q_latent, h, w.indexer, dims.indexer, pass, layer, scratch);
  const int32_t* selection = attends_sparsely(dims.indexer, pass) ? selected.selection : nullptr;  // [n, topk]
  if (pass.context != nullptr)  // chunk by chunk over the whole rows (the selection: global positions)
    pass.context->gathered_attention_forward(attended, lse, q, k, v, selection, dims.indexer.topk, sizes);
  else if (selection != nullptr)
    sparse_attention_forward(attended, lse, q, k, v, selection, sparse_sizes(sizes, dims.indexer.topk));
  else
    attention_forward(attended, lse, q, k, v, sizes);
  if (dims.indexer.enabled())
    indexer_train(selected, q, k, lse, H, sizes.kv_heads, sizes.head_dim, dims.scale, dims.indexer, pass, layer,
                  scratch);
  if (expanded != nullptr) expand_outputs(expanded, attended, w_e, dims.absorbed_latent(), n, dims);
  const T* out = expanded != nullptr ? expanded : attended;             // [n, H·v]
  linear(x, out, w.o_proj, n, dims.o_width(), D, /*accumulate=*/true);  // residual: x[n, D] += o_proj(out)
}

template <class T>
T* mixer_backward(const T* dy, const T* h, const MlaWeights<T>& w, const MlaWeights<T>& grads, const MlaDims& dims,
                  const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t n = pass.batch * pass.seq, D = dims.hidden, rq = dims.q_lora_rank, rkv = dims.kv_lora_rank;
  const SavedReader saved(saved_tensors(dims, SavedExtent::of(pass)), store, layer);
  const T* q = saved.in<T>(Tag::q);                  // [n, H, qk]
  const T* kv_a = saved.in<T>(Tag::mla_kv_a);        // [n, r_kv + rope]
  const T* kv_rstd = saved.in<T>(Tag::mla_kv_rstd);  // [n]
  const T* latent = saved.in<T>(Tag::mla_latent);    // [n, r_kv]
  const T* lse = saved.in<T>(Tag::attn_lse);         // [batch, H, seq]
  const bool absorbed = pass.context != nullptr;
  // The attention's output: o_proj's input, or under context parallelism over the latents [n, H, L],
  // mapped to it again.
  const T* attended = saved.in<T>(absorbed ? Tag::mla_out_latent : Tag::attn_out);
  const T* w_e = absorbed ? absorbed_weight(w.kv_b_proj, dims, scratch) : nullptr;  // [H·(nope + v), L]
  const T* out = attended;                                                          // [n, H·v]
  if (absorbed) {
    T* expanded = scratch.alloc<T>(n * dims.o_width());
    expand_outputs(expanded, attended, w_e, dims.absorbed_latent(), n, dims);
    out = expanded;
  }
  T* d_out = scratch.alloc<T>(n * dims.o_width());  // [n, H, v]; dy is the gradient wrt the sublayer output
  linear_grad(d_out, grads.o_proj, dy, out, w.o_proj, n, dims.o_width(), D, /*accumulate_dx=*/false);
  const int32_t* selection =
      attends_sparsely(dims.indexer, pass) ? saved.in<int32_t>(Tag::attn_indices) : nullptr;  // [n, topk]
  const LatentGrads<T> g{scratch.alloc<T>(n * dims.q_width()), scratch.alloc<T>(n * rkv),
                         scratch.alloc<T>(n * dims.kv_a_out())};  // dq, dc, d_kv_a
  if (absorbed) {
    const AttentionSizes sizes =
        absorbed_sizes(dims, pass.batch, pass.seq, pass.context->sequence_length(), pass.doc_start);
    absorbed_attention_backward(g, d_out, q, latent, kv_a, attended, lse, selection, w_e, w.kv_b_proj, grads.kv_b_proj,
                                dims, sizes, *pass.context, scratch);
  } else {
    const AttentionSizes sizes = expanded_sizes(dims, pass.batch, pass.seq, pass.doc_start);
    expanded_attention_backward(g, d_out, q, latent, saved.in<T>(Tag::k), saved.in<T>(Tag::v),
                                saved.in<T>(Tag::attn_out), lse, selection, w.kv_b_proj, grads.kv_b_proj, dims, sizes,
                                scratch);
  }
  T* dq = g.dq;              // [n, H, qk]
  T* d_latent = g.d_latent;  // [n, r_kv]
  T* d_kv_a = g.d_kv_a;      // [n, r_kv + rope]
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
  const int64_t r = dims.rope_dim, cw = dims.kv_a_out();
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

  // The absorbed form (model/mla_absorbed.h) with the adapter merged: q_abs[n, H, r_kv + rope].
  const T* kv_b = merged_weight(w.kv_b_proj, rkv, dims.kv_b_out(), scratch);  // [H·(nope + v), r_kv]
  T* q_abs = scratch.alloc<T>(n * H * cw);
  absorb_queries(q_abs, p.q, kv_b, rkv, n, dims);
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
  expand_outputs(out, out_latent, kv_b, rkv, n, dims);
  linear(x, out, w.o_proj, n, dims.o_width(), D, /*accumulate=*/true);  // residual: x[n, D] += o_proj(out)
}

// Nothing is freed within either pass; each holds at one of its kernel calls the scratch allocated
// so far and that kernel's temporaries. Forward: (DeepSeek) RoPE's tables; then one rank's kv_b_proj
// output, or under context parallelism the whole sequences' rows (absorbed_operands: this rank's
// [e | k_rot], the gathered rows and their latents, m = batch · the whole length), the absorbed
// weight (an adapter on kv_b_proj), the absorbed queries and the expanded output, each with the
// indexer's forward, or with its scratch and the attention's temporaries (through the exchange chunk
// by chunk, over the selection on sparse layers). Backward: (cp) the absorbed weight and the
// expanded output; d_out, dq, dc and d_kv_a; then one rank's dk, d_v with the attention's
// temporaries and d_kv, or (cp) d_out_latent, dW_e, the whole rows again, q_abs, dq_abs and the whole
// rows' gradients with the attention's temporaries, then this rank's sum of them; RoPE's tables;
// c_raw, d_c_raw with kv_a_layernorm's partials; dh and (q LoRA) d_q_latent, d_q_a with
// q_a_layernorm's partials or the indexer's backward, then with its scratch and the decoder layer's
// input norm's partials. (An adapter's own temporaries, as linear()'s, are not counted.)
Workspace workspace_bytes(const MlaDims& dims, const StepShape& shape) {
  const ContextPlan* context = shape.context;
  const int64_t n = shape.tokens(), e = shape.element_bytes, rq = dims.q_lora_rank, rkv = dims.kv_lora_rank;
  const int64_t H = dims.heads;
  const auto rounded = [&](int64_t count) { return Arena::rounded(count * e); };
  const int64_t o = rounded(n * dims.o_width()), qk = rounded(n * dims.q_width()), latent = rounded(n * rkv);
  const int64_t rope = dims.rotary ? rope_workspace_bytes(n, dims.rope.rotary_dim, e) : 0;
  // The backward's gradients of the latents: dq, dc, d_kv_a.
  const int64_t latent_grads = qk + latent + rounded(n * dims.kv_a_out());
  int64_t forward = 0, attention = 0, after = 0;  // after: the backward's scratch past the attention
  if (context == nullptr) {
    const AttentionSizes sizes = expanded_sizes(dims, shape.batch, shape.seq, nullptr);
    const int64_t kv = rounded(n * dims.kv_b_out());
    forward = kv + std::max(forward_workspace_bytes(dims.indexer, shape, H, H, dims.qk()),
                            forward_scratch_bytes(dims.indexer, shape) +
                                main_attention_workspace_bytes(dims.indexer, sizes, shape, false));
    const int64_t keys = o + latent_grads + qk + o;  // d_out, the latents', dk, d_v
    attention = keys + main_attention_workspace_bytes(dims.indexer, sizes, shape, true);
    after = keys + kv;  // d_kv
  } else {
    const int64_t m = shape.batch * context->sequence_length(), width = dims.absorbed_latent();
    const int64_t row = dims.absorbed_row();
    const AttentionSizes sizes = absorbed_sizes(dims, shape.batch, shape.seq, context->sequence_length(), nullptr);
    const int64_t whole = rounded(n * row) + rounded(m * row) + rounded(m * width);
    const int64_t w_e = dims.kv_b_adapter_rank > 0 ? rounded(dims.kv_b_out() * width) : 0;
    const int64_t q_abs = rounded(n * H * row);
    forward = whole + w_e + q_abs + o +
              std::max(forward_workspace_bytes(dims.indexer, shape, H, 1, row),
                       forward_scratch_bytes(dims.indexer, shape) +
                           main_attention_workspace_bytes(dims.indexer, sizes, shape, false));
    // w_e, out, d_out, the latents', d_out_latent, dW_e, the whole rows, q_abs, dq_abs, d_rows, d_values
    const int64_t keys = w_e + 2 * o + latent_grads + rounded(n * H * width) + rounded(dims.kv_b_out() * width) +
                         whole + 2 * q_abs + rounded(m * row) + rounded(m * width);
    attention = keys + main_attention_workspace_bytes(dims.indexer, sizes, shape, true);
    after = keys + rounded(n * row);  // d_own
  }
  forward = std::max(rope, forward);
  const int64_t latents = after + 2 * latent;  // … c_raw, d_c_raw
  const int64_t inputs = latents + rounded(n * dims.hidden) + (rq > 0 ? 2 * rounded(n * rq) : 0);
  const int64_t q_lora = rq > 0 ? std::max(rmsnorm_backward_workspace_bytes(n, rq, true),
                                           backward_workspace_bytes(dims.indexer, shape))
                                : 0;
  const int64_t input_norm = (rq > 0 ? backward_scratch_bytes(dims.indexer, shape) : 0) +
                             rmsnorm_backward_workspace_bytes(n, dims.hidden, true);
  const int64_t backward = std::max({attention, after + rope, latents + rmsnorm_backward_workspace_bytes(n, rkv, true),
                                     inputs + std::max(q_lora, input_norm)});
  return {forward, backward};
}

// Under context parallelism: each token's row [e | k_rot] gathered in the forward, again in the
// backward, and their gradients summed onto their owners; the indexer's keys (sparse layers).
ContextTraffic context_traffic(const MlaDims& dims, const StepShape& shape) {
  ContextTraffic traffic = shape.context->gathered_rows(shape.batch, dims.absorbed_row(), shape.element_bytes).both();
  return traffic += context_traffic(dims.indexer, shape);
}

#define TRILLION_INSTANTIATE(T)                                                                                      \
  template void expand_keys<T>(T*, T*, const T*, const T*, int64_t, const MlaDims&);                                 \
  template void expanded_attention_backward<T>(                                                                      \
      const LatentGrads<T>&, const T*, const T*, const T*, const T*, const T*, const T*, const T*, const int32_t*,   \
      const LinearWeights<T>&, const LinearWeights<T>&, const MlaDims&, const AttentionSizes&, Arena&);              \
  template void mixer_forward<T>(T*, const T*, const MlaWeights<T>&, const MlaDims&, const LayerPass&, int, Arena&); \
  template T* mixer_backward<T>(const T*, const T*, const MlaWeights<T>&, const MlaWeights<T>&, const MlaDims&,      \
                                const LayerPass&, const ActivationStore&, int, Arena&);                              \
  template void mixer_decode<T>(T*, const T*, int64_t, int64_t, int64_t, T*, const MlaWeights<T>&, const MlaDims&,   \
                                Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
