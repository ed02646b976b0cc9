// The lightning indexer of a sparse attention layer (DeepSeek-V3.2's DSA), as a part a mixer kind
// owns: it scores every visible key for each query, selects the top-k keys the layer's attention
// then runs over, and trains itself against the layer's main attention (docs/architecture.md, "The
// lightning indexer" and "The indexer's loss"; ops/indexer.h has the math).
// H_I heads of d_I, r = qk_rope_head_dim:
//   q_I = wq(q_in)                  [n, H_I, d_I]  q_in: MLA's query latent (q_a_layernorm output,
//                                                 tensor indexer.wq_b) or, on a plain attention
//                                                 layer, its normed input h (tensor indexer.wq)
//   k_I = LayerNorm_1e-6(wk(h))     [n, d_I]       one key per token (indexer.wk, indexer.k_norm
//                                                 with weight and bias)
//   RoPE (half-split, the model's theta and YaRN) on the first r dims of q_I and k_I
//   w_I = weights_proj(h) · H_I^−½   [n, H_I]
//   I[t, s] = Σ_h w_I[t, h] · ReLU(d_I^−½ · q_I[t, h] · k_I[s])  → top-min(index_topk, t + 1) keys
// The selection goes through the decision log (recorded once, replayed by gradcheck and
// recomputation). The indexer's inputs are detached: the LM loss never reaches it (a selection has
// no gradient) and its loss trains only its own tensors. The loss (IndexerTraining) is computed with
// its gradients in the forward, since its scale is known up front; the backward only carries those
// gradients through the indexer's projections. Saved: the selection, wk's output with its LayerNorm
// statistics, and the gradients wrt q_I, k_I, w_I when the loss is on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/memory_sizes.h"
#include "model/param_rows.h"
#include "model/step.h"
#include "ops/attention.h"
#include "ops/rope.h"
#include "ops/sparse_attention.h"

namespace trillion {

struct IndexerDims {
  int64_t heads = 0;     // H_I (0: no indexer, a dense layer)
  int64_t head_dim = 0;  // d_I
  int64_t topk = 0;      // index_topk
  int64_t hidden = 0;    // D
  int64_t q_in = 0;      // width of the query's input: q_lora_rank (MLA) or D (plain attention)
  bool from_latent = true;  // wq_b on MLA's query latent, else wq on h
  RopeSpec rope;         // half-split on the first qk_rope_head_dim dims
  InitStds init;
  static IndexerDims from_config(const ModelConfig& config, bool from_latent);
  bool enabled() const { return heads > 0; }
};

template <class T>
struct IndexerWeights {
  LinearWeights<T> wq;            // [H_I·d_I, q_in]
  LinearWeights<T> wk;            // [d_I, D]
  T* k_norm_weight = nullptr;     // [d_I]
  T* k_norm_bias = nullptr;       // [d_I]
  LinearWeights<T> weights_proj;  // [H_I, D]
};

// Whether a parameter (by its table name) is one of an indexer's: they learn only from its loss.
inline bool is_indexer_tensor(const std::string& name) { return name.find(".self_attn.indexer.") != std::string::npos; }

// Whether a layer with this indexer attends over its selection in this pass (sparse mode, the
// default without IndexerTraining), and the sparse attention's sizes from the dense ones.
inline bool attends_sparsely(const IndexerDims& dims, const LayerPass& pass) {
  return dims.enabled() && (pass.indexer == nullptr || pass.indexer->mode == IndexerMode::sparse);
}
// The same in a training step of this shape, and in a pass of this extent.
inline bool attends_sparsely(const IndexerDims& dims, const StepShape& shape) {
  return dims.enabled() && shape.indexer.mode == IndexerMode::sparse;
}
inline bool attends_sparsely(const IndexerDims& dims, const SavedExtent& extent) {
  return dims.enabled() && extent.indexer_sparse;
}
inline SparseAttentionSizes sparse_sizes(const AttentionSizes& s, int64_t topk) {
  return {s.batch, s.q_len, s.kv_len, s.q_heads, s.kv_heads, s.head_dim, s.value_dim(), topk, s.scale, s.doc_start};
}

// Names below "model.layers.{l}.self_attn.indexer." (transformers' DeepseekV32Indexer).
template <class T, class Visit>
void visit_params(IndexerWeights<T>& w, const IndexerDims& dims, Visit&& visit) {
  if (!dims.enabled()) return;
  const int64_t hd = dims.heads * dims.head_dim;
  const std::string p = "self_attn.indexer.";
  visit(w.wq,
        linear_row(p + (dims.from_latent ? "wq_b.weight" : "wq.weight"), {hd, dims.q_in}, dims.init.std_in));
  visit(w.wk, linear_row(p + "wk.weight", {dims.head_dim, dims.hidden}, dims.init.std_in));
  visit(w.k_norm_weight, norm_row(p + "k_norm.weight", dims.head_dim, NormSpec{1e-6, false}));
  visit(w.k_norm_bias, bias_row(p + "k_norm.bias", dims.head_dim));
  visit(w.weights_proj, linear_row(p + "weights_proj.weight", {dims.heads, dims.hidden}, dims.init.std_in));
}

// The keys a query attends to on average over a causal sequence of seq tokens: seq / 2, at most the
// top-k where the indexer selects (sparse layers).
inline double attended_keys(const IndexerDims& dims, int64_t seq) {
  return dims.enabled() ? std::min(double(seq) / 2.0, double(dims.topk)) : double(seq) / 2.0;
}

// Training FLOPs per token of the indexer: its projections (forward, and backward when trained) and
// the scores against seq / 2 visible keys (selection; the loss's two passes recompute them).
inline double flops_per_token(const IndexerDims& dims, int64_t seq) {
  if (!dims.enabled()) return 0.0;
  const double hd = double(dims.heads * dims.head_dim);
  const double projections = hd * double(dims.q_in) + double((dims.head_dim + dims.heads) * dims.hidden);
  return 6.0 * projections + 3.0 * 2.0 * (double(seq) / 2.0) * hd;
}

// The indexer's tensors of one forward (scratch of the current sublayer) and the selection.
// Under context parallelism (pass.context) the keys are the whole sequences', gathered from the
// group, and the selection holds global positions: each rank selects over every earlier position.
template <class T>
struct IndexerOutputs {
  T* q = nullptr;                      // [n, H_I, d_I] after RoPE
  T* k = nullptr;                      // [batch, kv_len, d_I] after LayerNorm and RoPE
  T* w = nullptr;                      // [n, H_I] head weights (· H_I^−½)
  const int32_t* selection = nullptr;  // [n, topk] int32 key positions, −1 padded
  int64_t kv_len = 0;                  // keys per row: the pass's seq, or the whole sequence's
};

// q_in[n, q_in], h[n, D] → the indexer's tensors and the selection (the decision log's, when kept).
template <class T>
IndexerOutputs<T> indexer_forward(const T* q_in, const T* h, const IndexerWeights<T>& w, const IndexerDims& dims,
                                  const LayerPass& pass, int layer, Arena& scratch);

// The indexer loss of one layer against the main attention the layer ran (detached): q [n, H, qk],
// k [batch, out.kv_len, Hkv, qk], lse [batch, H, seq] (dense in warm-up, over the selection in sparse
// mode), scale its softmax scale. Under context parallelism each local chunk is a loss of its own
// over the keys up to its end, their means weighted by their tokens, and the key gradients of every
// rank summed onto the keys' owners. With the loss on (pass.indexer with coef > 0) the loss and the selected and best
// attention masses go to pass.result; in a pass that saves (train, recompute) the gradients wrt q_I, k_I, w_I are saved
// for the backward.
template <class T>
void indexer_train(const IndexerOutputs<T>& out, const T* q, const T* k, const T* lse, int64_t heads, int64_t kv_heads,
                   int64_t qk_dim, double scale, const IndexerDims& dims, const LayerPass& pass, int layer,
                   Arena& scratch);

// grads += the indexer loss's gradients of its tensors (a no-op when the loss was off).
template <class T>
void indexer_backward(const T* q_in, const T* h, const IndexerWeights<T>& w, const IndexerWeights<T>& grads,
                      const IndexerDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                      Arena& scratch);

// Decoding: the selection [n, topk] of n new queries at positions past.. against every cached key;
// k_cache [max_len, d_I] receives the new tokens' keys at rows past.. first.
template <class T>
const int32_t* indexer_decode(const T* q_in, const T* h, int64_t n, int64_t past, T* k_cache,
                              const IndexerWeights<T>& w, const IndexerDims& dims, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h; none without an indexer). The
// memory plan's sizes of this part (model/memory_sizes.h), each 0 without an indexer: the scratch indexer_forward and indexer_backward leave in the mixer's
// arena (the mixer's later kernels run on top of it); the most its forward (indexer_forward, then
// indexer_train against a main attention of heads, kv_heads and qk_dim) and its backward hold at
// once beyond the saved tensors, its kernels' temporaries included, which the mixer adds to its own
// scratch at that point.
std::vector<SavedTensor> saved_tensors(const IndexerDims& dims, const SavedExtent& extent);
int64_t forward_scratch_bytes(const IndexerDims& dims, const StepShape& shape);
int64_t backward_scratch_bytes(const IndexerDims& dims, const StepShape& shape);
int64_t forward_workspace_bytes(const IndexerDims& dims, const StepShape& shape, int64_t heads, int64_t kv_heads,
                                int64_t qk_dim);
int64_t backward_workspace_bytes(const IndexerDims& dims, const StepShape& shape);
// The temporaries of the layer's main attention (sizes) in a training step's forward or backward:
// over the selection when the layer attends sparsely, else dense (ops/sparse_attention.h,
// ops/attention.h); under context parallelism chunk by chunk over keys the layer gathered (sizes'
// kv_len: the whole sequences').
int64_t main_attention_workspace_bytes(const IndexerDims& dims, const AttentionSizes& sizes, const StepShape& shape,
                                       bool backward);
// What its exchange receives in a step under context parallelism (shape.context).
ContextTraffic context_traffic(const IndexerDims& dims, const StepShape& shape);

}  // namespace trillion
