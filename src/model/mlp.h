// The dense SwiGLU MLP, an FFN kind (Llama / Qwen3 dense layers) and the shared expert of MoE
// layers:  y (= or +=) down_proj(silu(gate_proj(h)) · up_proj(h)),  h the FFN sublayer's normed input.
// Training forward saves through the ActivationStore under the dims' tags (dense FFN: mlp_gate …
// mlp_act; shared expert: shared_gate … shared_act); a forward-only pass keeps them in scratch.
// Gradient rule: dh accumulates (+=); parameter gradients accumulate (+=).
#pragma once

#include <vector>

#include "model/memory_sizes.h"
#include <cstdint>
#include <string>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/linear.h"
#include "model/param_rows.h"
#include "model/step.h"

namespace trillion {

template <class T>
struct MlpWeights;

struct MlpDims {
  template <class T>
  using Weights = MlpWeights<T>;
  int64_t hidden = 0;        // D
  int64_t intermediate = 0;  // I
  std::string prefix = "mlp.";  // name prefix below the layer: "mlp.", "mlp.shared_expert." (qwen3_next), …
  bool shared_expert = false;   // saves under the shared_* tags (it runs beside the routed experts)
  InitStds init;
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct MlpWeights {
  LinearWeights<T> gate_proj;  // [I, D]
  LinearWeights<T> up_proj;    // [I, D]
  LinearWeights<T> down_proj;  // [D, I]
};

// The MLP's tensors, declared once (model/param_rows.h). Decode cache: none.
template <class T, class Visit>
void visit_params(MlpWeights<T>& w, const MlpDims& dims, Visit&& visit) {
  const int64_t D = dims.hidden, I = dims.intermediate;
  visit(w.gate_proj, linear_row(dims.prefix + "gate_proj.weight", {I, D}, dims.init.std_in));
  visit(w.up_proj, linear_row(dims.prefix + "up_proj.weight", {I, D}, dims.init.std_in));
  visit(w.down_proj, linear_row(dims.prefix + "down_proj.weight", {D, I}, dims.init.std_out));
}

// Training FLOPs per token (forward + backward): 6 · 3 · D · I.
inline double flops_per_token(const MlpDims& dims, int64_t /*seq*/) {
  return 18.0 * double(dims.hidden) * double(dims.intermediate);
}

// y[n, D] (= or += as `accumulate` says) MLP(h[n, D]); saves under `layer` when `store` is non-null.
template <class T>
void mlp_forward(T* y, const T* h, int64_t n, const MlpWeights<T>& w, const MlpDims& dims, bool accumulate,
                 ActivationStore* store, int layer, Arena& scratch);

// dh[n, D] += gradient wrt h from dy[n, D].
template <class T>
void mlp_backward(T* dh, const T* dy, const T* h, int64_t n, const MlpWeights<T>& w, const MlpWeights<T>& grads,
                  const MlpDims& dims, const ActivationStore& store, int layer, Arena& scratch);

// The FFN interface every FFN kind implements (model/decoder_layer.h dispatches on it):
// y[n, D] += FFN(h[n, D]) for the pass's n = batch · seq tokens; dh[n, D] += its input gradient.
template <class T>
void ffn_forward(T* y, const T* h, const MlpWeights<T>& w, const MlpDims& dims, const LayerPass& pass, int layer,
                 Arena& scratch) {
  mlp_forward(y, h, pass.batch * pass.seq, w, dims, /*accumulate=*/true, pass.store, layer, scratch);
}
template <class T>
void ffn_backward(T* dh, const T* dy, const T* h, const MlpWeights<T>& w, const MlpWeights<T>& grads,
                  const MlpDims& dims, const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch) {
  mlp_backward(dh, dy, h, pass.batch * pass.seq, w, grads, dims, store, layer, scratch);
}

// The tensors its training forward of n tokens saves (model/saved_tensors.h), and the memory plan's
// most scratch its forward or backward holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const MlpDims& dims, int64_t tokens);
inline std::vector<SavedTensor> saved_tensors(const MlpDims& dims, const SavedExtent& extent) {
  return saved_tensors(dims, extent.tokens());
}
Workspace workspace_bytes(const MlpDims& dims, const StepShape& shape);
// Its backward reads h only as gate_proj's and up_proj's operand.
constexpr InputUse input_use(const MlpDims&) { return InputUse::operand; }

}  // namespace trillion
