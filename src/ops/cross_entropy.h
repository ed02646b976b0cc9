// Fused LM head + cross-entropy that never materializes [rows, vocab] logits: rows are processed
// in chunks and the vocabulary in tiles with an online log-sum-exp (Cut Cross-Entropy style), so at
// most [row_chunk, vocab_tile] logits exist at a time. Targets equal to kIgnoreIndex (−100) are
// skipped. Forward saves lse[rows]; backward recomputes each tile's logits.
// Gradient rule: dh written (=); dw accumulates (+=) (dw is the embedding table's gradient when
// the head is tied).
#pragma once

#include <cstdint>

namespace trillion {

constexpr int32_t kIgnoreIndex = -100;

// Tile sizes. The vocabulary tile grows beyond vocab_tile so that there are at most max_vocab_tiles
// tiles (the backward keeps one [row_chunk, d] partial of dh per tile). Forward and backward must
// use the same tiling so that the backward recomputes exactly the forward's logits; results depend on
// the tiling by rounding only, and never on the thread count. Tests pass small tiles.
struct CrossEntropyTiling {
  int64_t row_chunk = 256;
  int64_t vocab_tile = 1024;
  int64_t max_vocab_tiles = 32;
};

struct CrossEntropyResult {
  double loss_sum = 0.0;  // Σ over counted rows of (lse − logit[target])
  int64_t count = 0;      // rows whose target is not kIgnoreIndex
};

// logits = h[rows, d] · w[vocab, d]ᵀ (never stored); lse[rows] saved (rows with ignored targets too).
template <class T>
CrossEntropyResult lm_head_cross_entropy_forward(T* lse, const T* h, const T* w, const int32_t* targets,
                                                 int64_t rows, int64_t d, int64_t vocab,
                                                 const CrossEntropyTiling& tiling = {});

// With dlogits = scale · (softmax(logits) − onehot(target)) for counted rows, 0 for ignored:
// dh[rows, d] = dlogits · w;  dw[vocab, d] += dlogitsᵀ · h. scale is the loss weight per token
// (1 / non-ignored tokens of the whole optimizer step).
template <class T>
void lm_head_cross_entropy_backward(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, const T* lse,
                                    double scale, int64_t rows, int64_t d, int64_t vocab,
                                    const CrossEntropyTiling& tiling = {});

}  // namespace trillion
