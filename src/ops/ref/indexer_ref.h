// Plain lightning indexer (ops/indexer.h) built from separate steps: the full score matrix
// I [batch, q_len, kv_len] (−inf where invisible), a full std::stable_sort per row for the top-k,
// the main attention's probabilities materialized one head at a time as [q_len, kv_len] matrices,
// and the KL loss and its gradients by the textbook formulas. It is the test oracle of the
// streamed kernels and the baseline ("full score matrix, full sort") of their benchmark; it is
// neither fast nor frugal. Layouts, visibility, tie rule and gradient rule are those of indexer.h.
#pragma once

#include <cstdint>

#include "ops/indexer.h"

namespace trillion {

// scores[batch, q_len, kv_len] ← I[b, t, s] for visible keys, −inf elsewhere.
template <class T>
void indexer_ref_scores(T* scores, const T* q, const T* k, const T* w, const IndexerSizes& sizes);

// indices[batch, q_len, topk] ← per row, the visible keys stable-sorted by score descending, NaN first (so
// ties keep key order), the first min(topk, visible) of them, then −1.
template <class T>
void indexer_ref_topk(int32_t* indices, const T* q, const T* k, const T* w, const IndexerSizes& sizes);

// lse[batch, target.heads, q_len] ← log Σ_{s ∈ S_t} exp(target.scale · q_main[t, h] · k_main[s, h / group]),
// the log-sum-exp a sparse attention over `indices` saves (target.lse is not read).
template <class T>
void indexer_ref_selected_lse(T* lse, const int32_t* indices, const IndexerTarget& target,
                              const IndexerSizes& sizes);

// Same contract as indexer_loss: dq, dk, dw (=) receive coef · dL/d(q, k, w); returns the loss
// before coef, the selected mass and the best mass.
template <class T>
IndexerLossResult indexer_ref_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                                   const IndexerTarget& target, IndexerLossMode mode, double coef,
                                   const IndexerSizes& sizes);

}  // namespace trillion
