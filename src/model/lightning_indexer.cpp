// The lightning indexer of a sparse attention layer: projections, selection, the fused loss and
// its backward through the projections. See lightning_indexer.h.
#include "model/lightning_indexer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/indexer.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace trillion {

IndexerDims IndexerDims::from_config(const ModelConfig& config, bool from_latent) {
  IndexerDims dims;
  dims.heads = config.index_n_heads;
  dims.head_dim = config.index_head_dim;
  dims.topk = config.index_topk;
  dims.hidden = config.hidden_size;
  dims.from_latent = from_latent;
  dims.q_in = from_latent ? config.q_lora_rank : config.hidden_size;
  const int64_t rotary = from_latent ? config.qk_rope_head_dim : config.rotary_dim();
  if (rotary > dims.head_dim)
    fail(config.source, ": field \"index_head_dim\": got ", dims.head_dim, "; expected at least the ", rotary,
         " rotated dims of the indexer's query and key (", from_latent ? "qk_rope_head_dim" : "the rotary dim", ")");
  dims.rope = config.rope_spec(rotary, /*interleaved=*/false);
  dims.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  return dims;
}

namespace {

// doc_start: the pass's document masks ([batch, q_len] key positions, null: none).
IndexerSizes sizes_of(const IndexerDims& dims, int64_t batch, int64_t q_len, int64_t kv_len,
                      const int32_t* doc_start = nullptr) {
  return {batch, q_len, kv_len, dims.heads, dims.head_dim, dims.topk, 1.0 / std::sqrt(double(dims.head_dim)),
          doc_start};
}

// q[n, H_I, d_I], k_raw / k [n, d_I] with mean / rstd [n], w [n, H_I] of n tokens at `positions`.
template <class T>
void project(T* q, T* k_raw, T* k_mean, T* k_rstd, T* k, T* w_out, const T* q_in, const T* h,
             const int32_t* positions, int64_t n, const IndexerWeights<T>& w, const IndexerDims& dims) {
  const int64_t hd = dims.heads * dims.head_dim, D = dims.hidden;
  linear(q, q_in, w.wq, n, dims.q_in, hd, /*accumulate=*/false);
  rope_forward(q, positions, n, dims.heads, dims.head_dim, 0, dims.rope);
  linear(k_raw, h, w.wk, n, D, dims.head_dim, /*accumulate=*/false);
  layer_norm_forward(k, k_mean, k_rstd, k_raw, w.k_norm_weight, w.k_norm_bias, n, dims.head_dim, 1e-6);
  rope_forward(k, positions, n, 1, dims.head_dim, 0, dims.rope);
  linear(w_out, h, w.weights_proj, n, D, dims.heads, /*accumulate=*/false);
  const T head_scale = T(1.0 / std::sqrt(double(dims.heads)));
  for (int64_t i = 0; i < n * dims.heads; ++i) w_out[i] *= head_scale;
}

// The loss is computed whenever its coefficient is on (evaluation reports it too); its gradients are
// kept only by a pass that saves (train, recompute).
bool loss_on(const LayerPass& pass) { return SavedExtent::of(pass).indexer_loss; }
// The same of a training step's shape (its forward always has the model's IndexerTraining).
bool loss_on(const StepShape& shape) { return shape.extent().indexer_loss; }
// The loss's mode in a pass of this indexer mode: over the selection (sparse), else every visible key.
IndexerLossMode loss_mode(IndexerMode mode) {
  return mode == IndexerMode::sparse ? IndexerLossMode::kSparse : IndexerLossMode::kDense;
}

// Under context parallelism, each of this rank's chunks of each row as a call of its own, its
// queries against the keys up to its end (bottom-right causal): fn(row, chunk).
template <class Fn>
void for_each_chunk(const LayerPass& pass, Fn&& fn) {
  for (int64_t b = 0; b < pass.batch; ++b)
    for (const ContextChunk& chunk : pass.context->chunks()) fn(b, chunk);
}

// Under context parallelism, the document masks of a chunk starting at local token `first` (their
// global positions index the whole sequences' keys), or null without masks.
const int32_t* chunk_doc_start(const LayerPass& pass, int64_t first) {
  return pass.doc_start != nullptr ? pass.doc_start + first : nullptr;
}

}  // namespace

template <class T>
IndexerOutputs<T> indexer_forward(const T* q_in, const T* h, const IndexerWeights<T>& w, const IndexerDims& dims,
                                  const LayerPass& pass, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t batch = pass.batch, seq = pass.seq, n = batch * seq;
  // wk's output and its LayerNorm statistics are saved for the loss's backward, else temporaries.
  const SavedWriter saves(saved_tensors(dims, SavedExtent::of(pass)), pass.store, layer, scratch);
  T* k_raw = saves.out<T>(Tag::idx_k_raw);    // [n, d_I]
  T* k_mean = saves.out<T>(Tag::idx_k_mean);  // [n]
  T* k_rstd = saves.out<T>(Tag::idx_k_rstd);  // [n]
  IndexerOutputs<T> out;
  out.q = scratch.alloc<T>(n * dims.heads * dims.head_dim);
  out.k = scratch.alloc<T>(n * dims.head_dim);
  out.w = scratch.alloc<T>(n * dims.heads);
  project(out.q, k_raw, k_mean, k_rstd, out.k, out.w, q_in, h, pass.positions, n, w, dims);
  out.kv_len = seq;
  if (pass.context != nullptr) {  // the whole sequences' keys, from the group
    out.kv_len = pass.context->sequence_length();
    T* keys = scratch.alloc<T>(batch * out.kv_len * dims.head_dim);  // [batch, kv_len, d_I]
    pass.context->gather_sequences(keys, out.k, batch, dims.head_dim);
    out.k = keys;
  }
  const int64_t hd = dims.heads * dims.head_dim;
  int32_t* selection = saves.out<int32_t>(Tag::attn_indices);  // [n, topk]
  const auto select = [&](int32_t* indices) {
    if (pass.context == nullptr) {
      indexer_topk(indices, out.q, out.k, out.w, sizes_of(dims, batch, seq, seq, pass.doc_start));
      return;
    }
    for_each_chunk(pass, [&](int64_t b, const ContextChunk& c) {
      const int64_t first = b * seq + c.offset;  // the chunk's first local token
      indexer_topk(indices + first * dims.topk, out.q + first * hd, out.k + b * out.kv_len * dims.head_dim,
                   out.w + first * dims.heads, sizes_of(dims, 1, c.size(), c.end, chunk_doc_start(pass, first)));
    });
  };
  if (pass.keeps_decisions()) {
    const int32_t* decided = pass.decisions->decide(DecisionKind::selection, layer, n * dims.topk, select);
    std::copy(decided, decided + n * dims.topk, selection);
  } else {
    select(selection);
  }
  out.selection = selection;
  return out;
}

template <class T>
void indexer_train(const IndexerOutputs<T>& out, const T* q, const T* k, const T* lse, int64_t heads, int64_t kv_heads,
                   int64_t qk_dim, double scale, const IndexerDims& dims, const LayerPass& pass, int layer,
                   Arena& scratch) {
  using Tag = ActivationTag;
  if (!loss_on(pass)) return;
  const int64_t batch = pass.batch, seq = pass.seq;
  const SavedWriter saves(saved_tensors(dims, SavedExtent::of(pass)), pass.store, layer, scratch);
  T* dq = saves.out<T>(Tag::idx_dq);  // [n, H_I, d_I]
  T* dk = saves.out<T>(Tag::idx_dk);  // [n, d_I]
  T* dw = saves.out<T>(Tag::idx_dw);  // [n, H_I]
  const IndexerLossMode mode = loss_mode(pass.indexer->mode);
  IndexerLossResult r;
  if (pass.context == nullptr) {
    const IndexerTarget target{q, k, lse, heads, kv_heads, qk_dim, scale};
    r = indexer_loss(dq, dk, dw, out.q, out.k, out.w, out.selection, target, mode, pass.indexer->grad_scale,
                     sizes_of(dims, batch, seq, seq, pass.doc_start));
  } else {
    const int64_t n = batch * seq, kv_len = out.kv_len, di = dims.head_dim, hd = dims.heads * di;
    T* dk_whole = scratch.alloc<T>(batch * kv_len * di);  // [batch, kv_len, d_I] this rank's terms
    T* dk_chunk = scratch.alloc<T>(kv_len * di);          // [chunk end, d_I]
    T* lse_chunk = scratch.alloc<T>(heads * seq);         // [heads, chunk]
    std::fill(dk_whole, dk_whole + batch * kv_len * di, T(0));
    for_each_chunk(pass, [&](int64_t b, const ContextChunk& c) {
      const int64_t first = b * seq + c.offset;          // the chunk's first local token
      const double share = double(c.size()) / double(n);  // of this rank's mean over its tokens
      for (int64_t hh = 0; hh < heads; ++hh)
        std::copy_n(lse + (b * heads + hh) * seq + c.offset, c.size(), lse_chunk + hh * c.size());
      const IndexerTarget target{q + first * heads * qk_dim, k + b * kv_len * kv_heads * qk_dim, lse_chunk, heads,
                                 kv_heads, qk_dim, scale};
      const IndexerLossResult part = indexer_loss(
          dq + first * hd, dk_chunk, dw + first * dims.heads, out.q + first * hd, out.k + b * kv_len * di,
          out.w + first * dims.heads, out.selection + first * dims.topk, target, mode, pass.indexer->grad_scale * share,
          sizes_of(dims, 1, c.size(), c.end, chunk_doc_start(pass, first)));
      for (int64_t i = 0; i < c.end * di; ++i) dk_whole[b * kv_len * di + i] += dk_chunk[i];
      r.loss += part.loss * share;
      r.selected_mass += part.selected_mass * share;
      r.best_mass += part.best_mass * share;
    });
    pass.context->reduce_sequences(dk, dk_whole, batch, di);  // every rank's terms onto the keys' owners
  }
  if (pass.result != nullptr) pass.result->indexer.push_back({layer, r.loss, r.selected_mass, r.best_mass});
}

template <class T>
void indexer_backward(const T* q_in, const T* h, const IndexerWeights<T>& w, const IndexerWeights<T>& grads,
                      const IndexerDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                      Arena& scratch) {
  using Tag = ActivationTag;
  if (!store.contains(Tag::idx_dq, layer)) return;  // the loss was off in this forward
  const int64_t n = pass.batch * pass.seq, hd = dims.heads * dims.head_dim, D = dims.hidden, di = dims.head_dim;
  SavedExtent extent = SavedExtent::of(pass);
  extent.indexer_loss = true;  // as in that forward
  const SavedReader saved(saved_tensors(dims, extent), store, layer);
  T* dq = scratch.alloc<T>(n * hd);  // [n, H_I, d_I]
  T* dk = scratch.alloc<T>(n * di);  // [n, d_I]
  T* dw = scratch.alloc<T>(n * dims.heads);  // [n, H_I] wrt weights_proj's output
  std::memcpy(dq, saved.in<T>(Tag::idx_dq), n * hd * sizeof(T));
  std::memcpy(dk, saved.in<T>(Tag::idx_dk), n * di * sizeof(T));
  const T* dw_scaled = saved.in<T>(Tag::idx_dw);  // [n, H_I]
  const T head_scale = T(1.0 / std::sqrt(double(dims.heads)));
  for (int64_t i = 0; i < n * dims.heads; ++i) dw[i] = dw_scaled[i] * head_scale;
  rope_backward(dq, pass.positions, n, dims.heads, di, 0, dims.rope);
  rope_backward(dk, pass.positions, n, 1, di, 0, dims.rope);
  // Detached inputs: only the indexer's own tensors get gradients (null dx).
  linear_grad<T>(nullptr, grads.wq, dq, q_in, w.wq, n, dims.q_in, hd, false);
  T* dk_raw = scratch.alloc<T>(n * di);  // [n, d_I]
  layer_norm_backward(dk_raw, grads.k_norm_weight, grads.k_norm_bias, dk, saved.in<T>(Tag::idx_k_raw), w.k_norm_weight,
                      saved.in<T>(Tag::idx_k_mean), saved.in<T>(Tag::idx_k_rstd), n, di, /*accumulate_dx=*/false);
  linear_grad<T>(nullptr, grads.wk, dk_raw, h, w.wk, n, D, di, false);
  linear_grad<T>(nullptr, grads.weights_proj, dw, h, w.weights_proj, n, D, dims.heads, false);
}

template <class T>
const int32_t* indexer_decode(const T* q_in, const T* h, int64_t n, int64_t past, T* k_cache,
                              const IndexerWeights<T>& w, const IndexerDims& dims, Arena& scratch) {
  int32_t* positions = scratch.alloc<int32_t>(n);  // [n]
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(past + i);
  T* q = scratch.alloc<T>(n * dims.heads * dims.head_dim);  // [n, H_I, d_I]
  T* k_raw = scratch.alloc<T>(n * dims.head_dim);           // [n, d_I]
  T* k_mean = scratch.alloc<T>(n);                          // [n]
  T* k_rstd = scratch.alloc<T>(n);                          // [n]
  T* w_out = scratch.alloc<T>(n * dims.heads);              // [n, H_I]
  project(q, k_raw, k_mean, k_rstd, k_cache + past * dims.head_dim, w_out, q_in, h, positions, n, w, dims);
  int32_t* selection = scratch.alloc<int32_t>(n * dims.topk);  // [n, topk]
  indexer_topk(selection, q, k_cache, w_out, sizes_of(dims, 1, n, past + n));
  return selection;
}

// Saved in the forward's order: wk's output with its LayerNorm statistics (kept with the loss on,
// else temporaries), the selection, and with the loss on its gradients wrt q_I, k_I, w_I.
std::vector<SavedTensor> saved_tensors(const IndexerDims& dims, const SavedExtent& extent) {
  using Tag = ActivationTag;
  if (!dims.enabled()) return {};
  const int64_t n = extent.tokens();
  const bool loss = extent.indexer_loss;
  std::vector<SavedTensor> list{{Tag::idx_k_raw, {n, dims.head_dim}, loss},  // [n, d_I]
                                {Tag::idx_k_mean, {n}, loss},                // [n]
                                {Tag::idx_k_rstd, {n}, loss},                // [n]
                                {Tag::attn_indices, {n, dims.topk}}};        // [n, topk] int32
  if (loss)
    list.insert(list.end(), {{Tag::idx_dq, {n, dims.heads, dims.head_dim}},  // [n, H_I, d_I]
                             {Tag::idx_dk, {n, dims.head_dim}},              // [n, d_I]
                             {Tag::idx_dw, {n, dims.heads}}});               // [n, H_I]
  return list;
}

// The largest temporaries of the top-k's or the loss's calls in a step (bytes of their sizes): one
// over the batch, or under context parallelism one per chunk of each row, its queries against the
// keys up to its end.
template <class Bytes>
int64_t largest_call(const IndexerDims& dims, const StepShape& shape, Bytes&& bytes) {
  if (shape.context == nullptr) return bytes(sizes_of(dims, shape.batch, shape.seq, shape.seq));
  int64_t most = 0;
  for (const ContextChunk& c : shape.context->chunks())
    most = std::max(most, bytes(sizes_of(dims, 1, c.size(), c.end)));
  return most;
}

// q_I, k_I, w_I, (loss off) wk's output with its statistics, and under context parallelism the
// whole sequences' keys; the selection and the loss's gradients are saved.
int64_t forward_scratch_bytes(const IndexerDims& dims, const StepShape& shape) {
  if (!dims.enabled()) return 0;
  const int64_t n = shape.tokens(), e = shape.element_bytes, hd = dims.heads * dims.head_dim;
  const int64_t k_raw = loss_on(shape) ? 0 : Arena::rounded(n * dims.head_dim * e) + 2 * Arena::rounded(n * e);
  const int64_t keys = shape.context != nullptr
                           ? Arena::rounded(shape.batch * shape.context->sequence_length() * dims.head_dim * e)
                           : 0;  // [batch, kv_len, d_I]
  return k_raw + Arena::rounded(n * hd * e) + Arena::rounded(n * dims.head_dim * e) +
         Arena::rounded(n * dims.heads * e) + keys;
}

// The forward's scratch with the largest of its kernels' temporaries: RoPE's tables, the top-k's, and
// (loss on) the loss's, under context parallelism beside its scratch (this rank's terms of the whole
// keys' gradients, one chunk's, and the chunk's log-sum-exp).
int64_t forward_workspace_bytes(const IndexerDims& dims, const StepShape& shape, int64_t heads, int64_t kv_heads,
                                int64_t qk_dim) {
  if (!dims.enabled()) return 0;
  const int64_t e = shape.element_bytes;
  int64_t kernels = std::max(rope_workspace_bytes(shape.tokens(), dims.rope.rotary_dim, e),
                             largest_call(dims, shape, [&](const IndexerSizes& sizes) {
                               return indexer_topk_workspace_bytes(sizes, shape.threads, e);
                             }));
  if (loss_on(shape)) {
    const IndexerTarget target{nullptr, nullptr, nullptr, heads, kv_heads, qk_dim, 0.0};  // sizes only
    const IndexerLossMode mode = loss_mode(shape.indexer.mode);
    int64_t loss_scratch = 0;
    if (shape.context != nullptr) {
      const int64_t kv_len = shape.context->sequence_length(), di = dims.head_dim;
      loss_scratch = Arena::rounded(shape.batch * kv_len * di * e) + Arena::rounded(kv_len * di * e) +
                     Arena::rounded(heads * shape.seq * e);
    }
    kernels = std::max(kernels, loss_scratch + largest_call(dims, shape, [&](const IndexerSizes& sizes) {
                                  return indexer_loss_workspace_bytes(target, mode, sizes, shape.threads, e);
                                }));
  }
  return forward_scratch_bytes(dims, shape) + kernels;
}

// Loss on: dq, dk, dw, then dk_raw.
int64_t backward_scratch_bytes(const IndexerDims& dims, const StepShape& shape) {
  if (!dims.enabled() || !loss_on(shape)) return 0;
  const int64_t n = shape.tokens(), e = shape.element_bytes, di = dims.head_dim;
  return Arena::rounded(n * dims.heads * di * e) + 2 * Arena::rounded(n * di * e) + Arena::rounded(n * dims.heads * e);
}

// Loss on: dq, dk, dw with RoPE's tables; then all its scratch with the key LayerNorm's partials.
int64_t backward_workspace_bytes(const IndexerDims& dims, const StepShape& shape) {
  if (!dims.enabled() || !loss_on(shape)) return 0;
  const int64_t n = shape.tokens(), e = shape.element_bytes, di = dims.head_dim;
  const int64_t scratch = backward_scratch_bytes(dims, shape), before_dk_raw = scratch - Arena::rounded(n * di * e);
  return std::max(before_dk_raw + rope_workspace_bytes(n, dims.rope.rotary_dim, e),
                  scratch + layer_norm_backward_workspace_bytes(n, di, true, true));
}

int64_t main_attention_workspace_bytes(const IndexerDims& dims, const AttentionSizes& sizes, const StepShape& shape,
                                       bool backward) {
  const int64_t e = shape.element_bytes;
  const bool sparse = attends_sparsely(dims, shape);
  // The kernels read bf16 rows under the bf16 precision, which the plan's bf16_operands stands for.
  const bool bf16_rows = shape.bf16_operands && e == 4;
  if (shape.context != nullptr) {
    const Workspace chunks =
        shape.context->gathered_attention(sizes, sparse ? dims.topk : 0, bf16_rows, shape.threads, e);
    return backward ? chunks.backward : chunks.forward;
  }
  if (sparse) {
    const SparseAttentionSizes selected = sparse_sizes(sizes, dims.topk);
    return backward ? sparse_attention_backward_workspace_bytes(selected, shape.threads, e, bf16_rows)
                    : sparse_attention_forward_workspace_bytes(selected, shape.threads, e, bf16_rows);
  }
  return backward ? attention_backward_workspace_bytes(sizes, shape.threads, e)
                  : attention_forward_workspace_bytes(sizes, shape.threads, e);
}

// Under context parallelism the keys are gathered in the forward, and with the loss on their
// gradients' terms are summed onto their owners there too; the backward exchanges nothing.
ContextTraffic context_traffic(const IndexerDims& dims, const StepShape& shape) {
  if (!dims.enabled()) return {};
  const ContextPassTraffic keys = shape.context->gathered_rows(shape.batch, dims.head_dim, shape.element_bytes);
  return {.gathered_bytes = keys.forward.gathered_bytes,
          .reduced_bytes = loss_on(shape) ? keys.backward.reduced_bytes : 0};
}

#define TRILLION_INSTANTIATE(T)                                                                                     \
  template IndexerOutputs<T> indexer_forward<T>(const T*, const T*, const IndexerWeights<T>&, const IndexerDims&,   \
                                                const LayerPass&, int, Arena&);                                     \
  template void indexer_train<T>(const IndexerOutputs<T>&, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                 double, const IndexerDims&, const LayerPass&, int, Arena&);                        \
  template void indexer_backward<T>(const T*, const T*, const IndexerWeights<T>&, const IndexerWeights<T>&,         \
                                    const IndexerDims&, const LayerPass&, const ActivationStore&, int, Arena&);     \
  template const int32_t* indexer_decode<T>(const T*, const T*, int64_t, int64_t, T*, const IndexerWeights<T>&,     \
                                            const IndexerDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
