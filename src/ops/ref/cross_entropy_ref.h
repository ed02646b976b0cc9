// Plain LM head + cross-entropy: materializes the full logits[rows, vocab] with one gemm and computes
// the loss and gradients the textbook way. It is the test oracle and the benchmark baseline of the
// fused kernel in ops/cross_entropy.h, with the same arguments, saved tensor and gradient rule
// (dh written, dw accumulated); memory is O(rows · vocab). lm_head_cross_entropy_plain is the plain
// counterpart of lm_head_cross_entropy_forward_backward: it keeps its logits, so it does 3 gemms.
#pragma once

#include <cstdint>

#include "ops/cross_entropy.h"

namespace trillion {

// lse[rows] saved; targets equal to kIgnoreIndex are skipped.
template <class T>
CrossEntropyResult lm_head_cross_entropy_forward_ref(T* lse, const T* h, const T* w, const int32_t* targets,
                                                     int64_t rows, int64_t d, int64_t vocab);

// dh[rows, d] = dlogits · w;  dw[vocab, d] += dlogitsᵀ · h;  dlogits = scale · (softmax − onehot).
template <class T>
void lm_head_cross_entropy_backward_ref(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, const T* lse,
                                        double scale, int64_t rows, int64_t d, int64_t vocab);

// Same contract as lm_head_cross_entropy_forward_backward (z-loss, lse may be null, dh written, dw
// accumulated) with the full logits[rows, vocab] stored: logits = h · wᵀ, dlogits in place,
// dh = dlogits · w, dw += dlogitsᵀ · h, each gemm over all rows (OpenBLAS threads them).
template <class T>
CrossEntropyResult lm_head_cross_entropy_plain(T* dh, T* dw, T* lse, const T* h, const T* w, const int32_t* targets,
                                               double scale, double z_loss_coef, int64_t rows, int64_t d,
                                               int64_t vocab);

}  // namespace trillion
