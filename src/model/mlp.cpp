// Dense SwiGLU MLP: forward and backward. See mlp.h.
#include "model/mlp.h"

#include "ops/activation.h"

namespace trillion {
namespace {

struct MlpTags {
  ActivationTag gate, up, act;
};

MlpTags tags_of(const MlpDims& dims) {
  using Tag = ActivationTag;
  return dims.shared_expert ? MlpTags{Tag::shared_gate, Tag::shared_up, Tag::shared_act}
                            : MlpTags{Tag::mlp_gate, Tag::mlp_up, Tag::mlp_act};
}

}  // namespace

template <class T>
void mlp_forward(T* y, const T* h, int64_t n, const MlpWeights<T>& w, const MlpDims& dims, bool accumulate,
                 ActivationStore* store, int layer, Arena& scratch) {
  const int64_t D = dims.hidden, I = dims.intermediate;
  const MlpTags tags = tags_of(dims);
  const SavedWriter saves(saved_tensors(dims, n), store, layer, scratch);
  T* gate = saves.out<T>(tags.gate);  // [n, I]
  T* up = saves.out<T>(tags.up);      // [n, I]
  T* act = saves.out<T>(tags.act);    // [n, I] silu(gate) · up
  linear(gate, h, w.gate_proj, n, D, I, /*accumulate=*/false);
  linear(up, h, w.up_proj, n, D, I, /*accumulate=*/false);
  swiglu_forward(act, gate, up, n * I);
  linear(y, act, w.down_proj, n, I, D, accumulate);
}

template <class T>
void mlp_backward(T* dh, const T* dy, const T* h, int64_t n, const MlpWeights<T>& w, const MlpWeights<T>& grads,
                  const MlpDims& dims, const ActivationStore& store, int layer, Arena& scratch) {
  const int64_t D = dims.hidden, I = dims.intermediate;
  const MlpTags tags = tags_of(dims);
  const SavedReader saved(saved_tensors(dims, n), store, layer);
  const T* gate = saved.in<T>(tags.gate);  // [n, I]
  const T* up = saved.in<T>(tags.up);      // [n, I]
  const T* act = saved.in<T>(tags.act);    // [n, I]
  T* d_act = scratch.alloc<T>(n * I);  // [n, I]
  linear_grad(d_act, grads.down_proj, dy, act, w.down_proj, n, I, D, /*accumulate_dx=*/false);
  T* d_gate = scratch.alloc<T>(n * I);  // [n, I]
  T* d_up = scratch.alloc<T>(n * I);    // [n, I]
  swiglu_backward(d_gate, d_up, d_act, gate, up, n * I);
  linear_grad(dh, grads.gate_proj, d_gate, h, w.gate_proj, n, D, I, /*accumulate_dx=*/true);
  linear_grad(dh, grads.up_proj, d_up, h, w.up_proj, n, D, I, /*accumulate_dx=*/true);
}

std::vector<SavedTensor> saved_tensors(const MlpDims& dims, int64_t tokens) {
  const MlpTags tags = tags_of(dims);
  const int64_t I = dims.intermediate;
  return {{tags.gate, {tokens, I}},                                 // [n, I]
          {tags.up, {tokens, I}},                                   // [n, I]
          {tags.act, {tokens, I}, /*kept=*/true, /*operand=*/true}};  // [n, I] down_proj's input
}

// Training forward: nothing in scratch (its three tensors are saved); backward: d_act, d_gate, d_up [n, I].
Workspace workspace_bytes(const MlpDims& dims, const StepShape& shape) {
  return {0, 3 * Arena::rounded(shape.tokens() * dims.intermediate * shape.element_bytes)};
}

#define TRILLION_INSTANTIATE(T)                                                                              \
  template void mlp_forward<T>(T*, const T*, int64_t, const MlpWeights<T>&, const MlpDims&, bool,             \
                               ActivationStore*, int, Arena&);                                                \
  template void mlp_backward<T>(T*, const T*, const T*, int64_t, const MlpWeights<T>&, const MlpWeights<T>&,  \
                                const MlpDims&, const ActivationStore&, int, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
