// Plain LM head + cross-entropy: materializes the full logits[rows, vocab] with one gemm and computes
// the loss and gradients the textbook way. It is the test oracle and the benchmark baseline of the
// fused kernel in ops/cross_entropy.h, with the same arguments, saved tensor and gradient rule
// (dh written, dw accumulated); memory is O(rows · vocab).
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

}  // namespace trillion
