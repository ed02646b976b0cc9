// Fused LM head + cross-entropy that never materializes [rows, vocab] logits: rows are processed
// in chunks and the vocabulary in tiles with an online log-sum-exp (Cut Cross-Entropy style), so at
// most [row_chunk, vocab_tile] logits exist at a time. Targets equal to kIgnoreIndex (−100) are
// skipped. Forward saves lse[rows]; backward recomputes each tile's logits (4 gemm passes, lowest
// memory). lm_head_cross_entropy_forward_backward instead forms the gradients during the forward
// (the loss scale is known up front): it keeps one chunk's [row_chunk, vocab] logits, so it does 3
// gemm passes (logits, dh, dw) with memory bounded by chunk_logits_bytes.
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
// forward_backward shrinks its row chunk below row_chunk so that the chunk's [row_chunk, vocab]
// logits take at most chunk_logits_bytes (at least one row); 32 MiB is 64 rows at vocab 131072 in float.
struct CrossEntropyTiling {
  int64_t row_chunk = 256;
  int64_t vocab_tile = 1024;
  int64_t max_vocab_tiles = 32;
  int64_t chunk_logits_bytes = int64_t(32) << 20;
  // forward_backward under the bf16 precision: the softmax pass also writes each chunk's dlogits
  // rounded to bf16, a registered copy (ops/gemm.h) its gradient products read instead of each dh
  // column block and dw tile rounding its part again; off, the same bits.
  bool bf16_dlogits = true;
};

struct CrossEntropyResult {
  double loss_sum = 0.0;    // Σ over counted rows of (lse − logit[target])
  int64_t count = 0;        // rows whose target is not kIgnoreIndex
  double z_loss_sum = 0.0;  // Σ counted lse² (forward_backward only)
};

// logits = h[rows, d] · w[vocab, d]ᵀ (never stored); lse[rows] saved (rows with ignored targets too).
template <class T>
CrossEntropyResult lm_head_cross_entropy_forward(T* lse, const T* h, const T* w, const int32_t* targets,
                                                 int64_t rows, int64_t d, int64_t vocab,
                                                 const CrossEntropyTiling& tiling = {});

// With dlogits = scale · (softmax(logits) − onehot(target)) for counted rows, 0 for ignored:
// dh[rows, d] = dlogits · w;  dw[vocab, d] += dlogitsᵀ · h (null dw: a frozen head, skipped). scale is the loss weight per token
// (1 / non-ignored tokens of the whole optimizer step).
template <class T>
void lm_head_cross_entropy_backward(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, const T* lse,
                                    double scale, int64_t rows, int64_t d, int64_t vocab,
                                    const CrossEntropyTiling& tiling = {});

// Rows per chunk of forward_backward for T of element_bytes bytes (see CrossEntropyTiling).
int64_t forward_backward_row_chunk(int64_t rows, int64_t vocab, int64_t element_bytes,
                                   const CrossEntropyTiling& tiling = {});

// The bytes of the temporaries each call allocates (its Buffers, counted in the fast tier), for the
// memory plan: forward_backward's (bf16_products: under the bf16 precision), and the larger of
// forward's and backward's, at `threads` threads.
int64_t forward_backward_workspace_bytes(int64_t rows, int64_t vocab, int64_t element_bytes, bool bf16_products,
                                         const CrossEntropyTiling& tiling = {});
int64_t forward_then_backward_workspace_bytes(int64_t rows, int64_t d, int64_t vocab, int64_t element_bytes,
                                              int threads, const CrossEntropyTiling& tiling = {});

// Loss and gradients in one call. The objective is scale · Σ_counted [(lse − logit[target]) + z_loss_coef · lse²]
// (PaLM z-loss; z_loss_coef = 0 turns it off), so with p = softmax(logits)
//   dlogits = scale · (p · (1 + 2 · z_loss_coef · lse) − onehot(target)) for counted rows, 0 for ignored;
//   dh[rows, d] = dlogits · w (written);  dw[vocab, d] += dlogitsᵀ · h (accumulated; null: skipped).
// lse[rows] is written when not null (ignored rows too). Returns loss_sum, count and z_loss_sum, which
// exclude scale and z_loss_coef. Results are bitwise identical for any thread count.
template <class T>
CrossEntropyResult lm_head_cross_entropy_forward_backward(T* dh, T* dw, T* lse, const T* h, const T* w,
                                                          const int32_t* targets, double scale, double z_loss_coef,
                                                          int64_t rows, int64_t d, int64_t vocab,
                                                          const CrossEntropyTiling& tiling = {});

}  // namespace trillion
