// SwiGLU and sigmoid-gate activations, forward and backward; elementwise, so any split of the
// elements over threads gives the same results.
#include "ops/activation.h"

#include <cmath>

#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

template <class T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  // out[count] = gate · σ(gate) · up
  parallel_for(count, [&](int64_t i) { out[i] = gate[i] * sigmoid(gate[i]) * up[i]; });
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  // d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g)))
  parallel_for(count, [&](int64_t i) {
    const T s = sigmoid(gate[i]);
    const T silu = gate[i] * s;
    dgate[i] = dout[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
    dup[i] = dout[i] * silu;
  });
}

template <class T>
void sigmoid_gate_forward(T* out, const T* x, const T* gate, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  // out[count] = x · σ(gate)
  parallel_for(count, [&](int64_t i) { out[i] = x[i] * sigmoid(gate[i]); });
}

template <class T>
void sigmoid_gate_backward(T* dx, T* dgate, const T* dout, const T* x, const T* gate, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  parallel_for(count, [&](int64_t i) {
    const T s = sigmoid(gate[i]);
    dx[i] = dout[i] * s;
    dgate[i] = dout[i] * x[i] * s * (T(1) - s);
  });
}

#define TRILLION_INSTANTIATE_ACTIVATION(T)                                                       \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                              \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);               \
  template void sigmoid_gate_forward<T>(T*, const T*, const T*, int64_t);                        \
  template void sigmoid_gate_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
TRILLION_INSTANTIATE_ACTIVATION(float)
TRILLION_INSTANTIATE_ACTIVATION(double)
#undef TRILLION_INSTANTIATE_ACTIVATION

}  // namespace trillion
