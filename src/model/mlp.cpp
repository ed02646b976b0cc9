// Dense SwiGLU MLP sublayer: forward and backward. See mlp.h.
#include "model/mlp.h"

#include <cstring>

#include "ops/activation.h"
#include "ops/gemm.h"
#include "ops/norm.h"

namespace trillion {

template <class T>
void mlp_forward(T* x, int64_t n, const MlpWeights<T>& w, const MlpDims& dims, ActivationStore* store, int layer,
                 Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t D = dims.hidden, I = dims.intermediate;
  const auto buffer = [&](Tag tag, int64_t count) { return save_or_scratch<T>(store, tag, layer, count, scratch); };
  T* input = buffer(Tag::mlp_input, n * D);  // [n, D]
  std::memcpy(input, x, n * D * sizeof(T));
  T* rstd = buffer(Tag::mlp_norm_rstd, n);   // [n]
  T* h = buffer(Tag::mlp_norm_out, n * D);   // [n, D]
  rmsnorm_forward(h, rstd, input, w.norm, n, D, dims.eps, dims.zero_centred);
  T* gate = buffer(Tag::mlp_gate, n * I);  // [n, I]
  T* up = buffer(Tag::mlp_up, n * I);      // [n, I]
  T* act = buffer(Tag::mlp_act, n * I);    // [n, I]
  linear_forward(gate, h, w.gate_proj, n, D, I);
  linear_forward(up, h, w.up_proj, n, D, I);
  swiglu_forward(act, gate, up, n * I);
  // Residual: x[n, D] += act · down_projᵀ (beta = 1 adds in place).
  gemm(false, true, n, D, I, T(1), act, I, w.down_proj, I, T(1), x, D);
}

template <class T>
void mlp_backward(T* dx, int64_t n, const MlpWeights<T>& w, const MlpWeights<T>& grads, const MlpDims& dims,
                  const ActivationStore& store, int layer, Arena& scratch) {
  using Tag = ActivationTag;
  const int64_t D = dims.hidden, I = dims.intermediate;
  const T* input = store.get<T>(Tag::mlp_input, layer, n * D);
  const T* rstd = store.get<T>(Tag::mlp_norm_rstd, layer, n);
  const T* h = store.get<T>(Tag::mlp_norm_out, layer, n * D);
  const T* gate = store.get<T>(Tag::mlp_gate, layer, n * I);
  const T* up = store.get<T>(Tag::mlp_up, layer, n * I);
  const T* act = store.get<T>(Tag::mlp_act, layer, n * I);

  T* d_act = scratch.alloc<T>(n * I);  // [n, I]
  linear_backward(d_act, grads.down_proj, dx, act, w.down_proj, n, I, D, /*accumulate_dx=*/false);
  T* d_gate = scratch.alloc<T>(n * I);  // [n, I]
  T* d_up = scratch.alloc<T>(n * I);    // [n, I]
  swiglu_backward(d_gate, d_up, d_act, gate, up, n * I);
  T* dh = scratch.alloc<T>(n * D);  // [n, D] = Σ of the gate and up projections' input gradients
  linear_backward(dh, grads.gate_proj, d_gate, h, w.gate_proj, n, D, I, /*accumulate_dx=*/false);
  linear_backward(dh, grads.up_proj, d_up, h, w.up_proj, n, D, I, /*accumulate_dx=*/true);
  rmsnorm_backward(dx, grads.norm, dh, input, w.norm, rstd, n, D, dims.zero_centred, /*accumulate_dx=*/true);
}

#define TRILLION_INSTANTIATE(T)                                                                                \
  template void mlp_forward<T>(T*, int64_t, const MlpWeights<T>&, const MlpDims&, ActivationStore*, int, Arena&); \
  template void mlp_backward<T>(T*, int64_t, const MlpWeights<T>&, const MlpWeights<T>&, const MlpDims&,         \
                                const ActivationStore&, int, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
