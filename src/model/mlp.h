// The dense SwiGLU MLP sublayer of a decoder layer (Llama / Qwen3):
//   h = RMSNorm(x);  x ← x + down_proj(silu(gate_proj(h)) · up_proj(h))
// Training forward saves through the ActivationStore (tags mlp_input … mlp_act); decoding runs
// the same math without saving. Gradient rule: the residual gradient dx is accumulated (+=) with
// the sublayer's input gradient; parameter gradients accumulate (+=).
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "memory/activation_store.h"

namespace trillion {

struct MlpDims {
  int64_t hidden = 0;        // D
  int64_t intermediate = 0;  // I
  double eps = 1e-6;
  bool zero_centred = false;  // post_attention_layernorm is y = x̂(1 + w)
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct MlpWeights {
  T* norm = nullptr;       // [D]   post_attention_layernorm
  T* gate_proj = nullptr;  // [I, D]
  T* up_proj = nullptr;    // [I, D]
  T* down_proj = nullptr;  // [D, I]
};

// x[n, D] += MLP(RMSNorm(x)); saves under `layer` when `store` is non-null (training), otherwise
// keeps everything in `scratch` (decoding).
template <class T>
void mlp_forward(T* x, int64_t n, const MlpWeights<T>& w, const MlpDims& dims, ActivationStore* store, int layer,
                 Arena& scratch);

// dx[n, D]: gradient wrt the sublayer output on entry, wrt its input x on return (+=).
template <class T>
void mlp_backward(T* dx, int64_t n, const MlpWeights<T>& w, const MlpWeights<T>& grads, const MlpDims& dims,
                  const ActivationStore& store, int layer, Arena& scratch);

}  // namespace trillion
