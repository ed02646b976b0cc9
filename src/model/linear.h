// The one helper through which every weight matmul of the model passes: y = x · Wᵀ (+ b), written
// or accumulated into y (residual-accumulating projections add straight into the residual stream).
// This is where an adapter attaches: LoRA adds its pair to LinearWeights and both functions add
// (α / r) · B · A · x here, so no module changes (the grouped expert GEMM in ops/moe_experts.h is
// the other such place; the fused LM-head cross-entropy computes its logits tile by tile inside
// ops/cross_entropy.h, where a head adapter would attach).
// Gradient rule: dx written (=) or accumulated (+=) as the caller says; dW and db accumulate (+=);
// a null grads.weight / grads.bias (frozen) skips it, a null dx skips the input gradient.
#pragma once

#include <cstdint>

#include "ops/gemm.h"

namespace trillion {

// Pointers into a flat buffer (parameters or their gradients), Hugging Face shapes.
template <class T>
struct LinearWeights {
  T* weight = nullptr;  // [out, in]
  T* bias = nullptr;    // [out], or null (no bias)
};

// y[rows, out] (= or +=) x[rows, in] · weightᵀ + bias. `operands`: the products' operand precision
// (ops/gemm.h); Operands::fp32 keeps float under the bf16 precision.
template <class T>
void linear(T* y, const T* x, const LinearWeights<T>& w, int64_t rows, int64_t in, int64_t out, bool accumulate,
            Operands operands = Operands::as_set);

// dx[rows, in] (= or +=) dy · weight;  grads.weight += dyᵀ · x;  grads.bias += Σ_rows dy.
template <class T>
void linear_grad(T* dx, const LinearWeights<T>& grads, const T* dy, const T* x, const LinearWeights<T>& w,
                 int64_t rows, int64_t in, int64_t out, bool accumulate_dx, Operands operands = Operands::as_set);

}  // namespace trillion
