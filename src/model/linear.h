// The one helper through which every weight matmul of the model passes: y = x · Wᵀ (+ b), written
// or accumulated into y (residual-accumulating projections add straight into the residual stream).
// This is where a LoRA adapter attaches (PEFT's LoRA, model/lora_config.h): a linear layer that
// carries one adds scaling · (x · Aᵀ) · Bᵀ here, so no module changes (the grouped expert GEMM in
// ops/moe_experts.h is the other such place; MLA's absorbed form reads kv_b_proj's pair through
// lora_down and merged_weight below, model/mla_absorbed.h; the fused LM-head cross-entropy computes
// its logits tile by tile inside ops/cross_entropy.h, where a head adapter would attach).
// Gradient rule: dx written (=) or accumulated (+=) as the caller says; dW, db, dA and dB
// accumulate (+=); a null gradient pointer (a frozen tensor) skips it, a null dx skips the input
// gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "ops/gemm.h"
#include "ops/moe_experts.h"

namespace trillion {

// A LoRA adapter's pair, Hugging Face (PEFT) shapes: the update of the layer's weight is
// scaling · B · A. `rank` and `scaling` are set on the parameters' side only.
template <class T>
struct LoraPair {
  T* a = nullptr;  // [rank, in]  lora_A.weight
  T* b = nullptr;  // [out, rank] lora_B.weight
  int64_t rank = 0;
  double scaling = 0.0;  // lora_alpha / rank, or lora_alpha / √rank with use_rslora
  double dropout = 0.0;  // lora_dropout: on the adapter's input, during a LoraDropoutPass
  uint64_t stream = 0;   // its masks' random stream: the module's name hashed
};

// PEFT's lora_dropout, applied to a pair's input x (the pair then reads x ⊙ m / (1 − p)) while a
// pass is set: the trainer sets one around each micro-batch's forward and backward (never for
// evaluation or generation), the gradient check around its passes. The mask of element (token i, input c)
// is a pure function of (seed, step, the pair's stream, token(i) · in + c), drawn from the
// counter-based RNG, so forward, recompute and backward see the same mask, for any thread count,
// and a token gets its mask whichever rank trains it.
struct LoraDropoutPass {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_token = 0;  // of these rows in the step's whole batch (data parallel: this rank's first)
  // Context parallelism: each row holds the tokens of its sequence (`seq` long) at these global
  // positions (empty: all of them, in order).
  std::vector<int32_t> positions = {};
  int64_t seq = 0;
  // Token i of the pass's rows, as an index into the step's whole batch.
  int64_t token(int64_t i) const {
    if (positions.empty()) return first_token + i;
    const int64_t held = static_cast<int64_t>(positions.size());
    return first_token + i / held * seq + positions[i % held];
  }
};
// Sets the pass for its lifetime (null: none), restoring the one before.
class LoraDropoutScope {
 public:
  explicit LoraDropoutScope(const LoraDropoutPass* pass);
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;

 private:
  const LoraDropoutPass* previous_;
};

// Pointers into a flat buffer (parameters or their gradients), Hugging Face shapes.
template <class T>
struct LinearWeights {
  T* weight = nullptr;  // [out, in]
  T* bias = nullptr;    // [out], or null (no bias)
  LoraPair<T> lora;     // a == null: no adapter
};

// Routed experts' stacked weight [E, out, in], which the grouped expert GEMM reads, and the LoRA
// pairs on it (ops/moe_experts.h; model/param_rows.h declares them).
template <class T>
struct ExpertWeights {
  T* weight = nullptr;                   // [E, out, in]
  std::vector<ExpertLoraPair<T>> lora;  // none, one on all rows, or one per part (gate_proj, up_proj)
};

// y[rows, out] (= or +=) x[rows, in] · weightᵀ + bias + scaling · (x · Aᵀ) · Bᵀ. `operands`: the products' operand precision
// (ops/gemm.h); Operands::fp32 keeps float under the bf16 precision.
template <class T>
void linear(T* y, const T* x, const LinearWeights<T>& w, int64_t rows, int64_t in, int64_t out, bool accumulate,
            Operands operands = Operands::as_set);

// With dropout in a pass, x ⊙ m / (1 − p) in place of x in the adapter's products (and its dx term masked).
// dx[rows, in] (= or +=) dy · (weight + scaling · B · A);  grads.weight += dyᵀ · x;  grads.bias += Σ_rows dy;
// with u = x · Aᵀ [rows, rank] (recomputed) and g = scaling · dy · B [rows, rank]:
// grads.lora.b += scaling · dyᵀ · u;  grads.lora.a += gᵀ · x.
template <class T>
void linear_grad(T* dx, const LinearWeights<T>& grads, const T* dy, const T* x, const LinearWeights<T>& w,
                 int64_t rows, int64_t in, int64_t out, bool accumulate_dx, Operands operands = Operands::as_set);

// A pair's down projection alone, u[rows, rank] = x' · Aᵀ with x' = x, or under dropout in a pass
// x ⊙ m / (1 − p) (MLA's absorbed form attends over [x | scaling · u], model/mla_absorbed.h), and
// its backward: dx[rows, in] += du · A (⊙ m / (1 − p) under dropout); grad_a (null: frozen) += duᵀ · x'.
template <class T>
void lora_down(T* u, const T* x, const LoraPair<T>& pair, int64_t rows, int64_t in);
template <class T>
void lora_down_grad(T* dx, T* grad_a, const T* du, const T* x, const LoraPair<T>& pair, int64_t rows, int64_t in);

// The layer's weight as an [out, in] matrix, for kernels that read it other than through linear()
// (MLA's absorbed decode): `weight` itself, or with an adapter W + scaling · B · A, formed in
// `scratch` with float operands.
template <class T>
const T* merged_weight(const LinearWeights<T>& w, int64_t in, int64_t out, Arena& scratch);

}  // namespace trillion
