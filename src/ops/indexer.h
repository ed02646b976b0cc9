// The lightning indexer of DeepSeek-V3.2's sparse attention: a cheap score of every visible key for
// each query, the top-k selection it feeds, and the indexer's training loss against the main
// attention (docs/architecture.md, "The lightning indexer" and "The indexer's loss").
//
//   I[b, t, s] = Σ_h w[b, t, h] · ReLU(scale · q[b, t, h] · k[b, s])   for visible keys s
//
// (the caller folds index_n_heads^−½ into w and passes scale = index_head_dim^−½; RoPE and the key's
// LayerNorm are the caller's). Visibility is bottom-right causal as in ops/attention.h: key s is
// visible to query t iff s ≤ t + kv_len − q_len; with document masks (doc_start [batch, q_len], key
// positions) only doc_start[t] ≤ s ≤ t + kv_len − q_len are.
//
// Layouts: q, dq [batch, q_len, heads, head_dim]; k, dk [batch, kv_len, head_dim] (one key head);
//   w, dw [batch, q_len, heads]; indices [batch, q_len, topk] int32.
// Nothing here stores a [q_len, kv_len] matrix: scores are produced and consumed key block by key
// block per query block.
#pragma once

#include <cstdint>

namespace trillion {

struct IndexerSizes {
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t heads = 0;     // H_I
  int64_t head_dim = 0;  // d_I
  int64_t topk = 0;      // columns of indices
  double scale = 0.0;    // inside the ReLU, usually head_dim^−½
  const int32_t* doc_start =
      nullptr;  // [batch, q_len] first visible key per query (0 ≤ it ≤ t + kv_len − q_len); null: 0
};

// Top-k selection, streamed: indices[b, t, :] ← the min(topk, visible_t) visible keys with the largest
// I[b, t, s], ordered by score descending then key ascending (the tie rule of docs/architecture.md,
// "Determinism", as ops/topk.h;
// a NaN score ranks first, as there), padded with −1. Deterministic and independent of the thread
// count.
template <class T>
void indexer_topk(int32_t* indices, const T* q, const T* k, const T* w, const IndexerSizes& sizes);

// The main attention whose distribution the indexer learns (detached: no gradient flows to it).
// Its probabilities are recomputed from q, k and the forward's lse, never stored:
//   P_h[t, s] = exp(scale · q[t, h] · k[s, h / (heads / kv_heads)] − lse[h, t]).
struct IndexerTarget {
  const void* q = nullptr;    // T [batch, q_len, heads, qk_dim]
  const void* k = nullptr;    // T [batch, kv_len, kv_heads, qk_dim]
  const void* lse = nullptr;  // T [batch, heads, q_len]: of the dense causal attention (warm-up) or of
                              //   the sparse attention over `indices` (sparse mode)
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t qk_dim = 0;
  double scale = 0.0;
};

enum class IndexerLossMode {
  kDense,   // warm-up: KL over every visible key; main attention dense
  kSparse,  // both distributions renormalized over the selected set
};

struct IndexerLossResult {
  double loss = 0.0;             // mean over the batch · q_len queries of KL(p[t] ‖ softmax(I[t]))
  double selected_mass = 0.0;    // mean over queries of Σ_{s ∈ S_t} p[t, s] (p over all visible keys in
                                 //   dense mode; 1 in sparse mode, where p lives on S_t)
  double best_mass = 0.0;        // mean over queries of the most mass any topk visible keys hold (the sum
                                 //   of p[t]'s topk largest): selected_mass's ceiling; 1 in sparse mode
};

// Forward and backward of the indexer loss in one pass (the loss scale is known up front):
//   p[t, s] = (1/heads) Σ_h P_h[t, s]            (each P_h sums to 1 over its key set, so p does)
//   L = coef · mean_t KL(p[t, ·] ‖ softmax(I[t, ·]))  over visible keys (dense) or over S_t (sparse)
// dq, dk, dw receive coef · dL/d(q, k, w) (=, written). indices: the selection S (used by sparse mode,
// and by both modes for selected_mass). Dense mode streams in two passes (the log-sum-exp of I, then
// KL and gradients), never heads × [q_len, kv_len] in memory. Returns the loss before coef.
template <class T>
IndexerLossResult indexer_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                               const IndexerTarget& target, IndexerLossMode mode, double coef,
                               const IndexerSizes& sizes);

// The bytes of indexer_topk's and indexer_loss's temporaries (Buffers) with `threads` OpenMP threads
// and element_bytes = sizeof(T), for the memory plan (of the target only its sizes are read): the
// top-k's per-thread score tiles and candidate lists; the loss's per-thread tiles and accumulators
// and its per-item partial sums.
int64_t indexer_topk_workspace_bytes(const IndexerSizes& sizes, int threads, int64_t element_bytes);
int64_t indexer_loss_workspace_bytes(const IndexerTarget& target, IndexerLossMode mode, const IndexerSizes& sizes,
                                     int threads, int64_t element_bytes);

}  // namespace trillion
