// SwiGLU and sigmoid-gate activations, forward and backward; elementwise, so any split of the
// elements over threads gives the same results. σ(z) = 1 / (1 + exp(−z)) with the exps in blocks
// through the vector kernel.
#include "ops/activation.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "core/phase_clock.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

// Elements per parallel item: each item's exps go through the vector kernel at once.
constexpr int64_t kBlock = 4096;

template <class Body>
void for_blocks(int64_t count, const Body& body) {
  parallel_for((count + kBlock - 1) / kBlock, kBlock, [&](int64_t b) {
    const int64_t begin = b * kBlock;
    body(begin, std::min(kBlock, count - begin));
  });
}

// out[0, n) = exp(−z[0, n)) through the vector kernel.
template <class T>
void exp_negated(T* out, const T* z, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = -z[c];
  exp_shifted_sum(out, n, T(0));
}

}  // namespace

template <class T>
void sigmoid_span(T* s, const T* z, int64_t n) {
  exp_negated(s, z, n);
  for (int64_t c = 0; c < n; ++c) s[c] = T(1) / (T(1) + s[c]);
}

template <class T>
void swiglu_span(T* out, const T* gate, const T* up, int64_t count) {
  // out[count] = gate · up / (1 + exp(−gate)) = silu(gate) · up
  exp_negated(out, gate, count);
  for (int64_t c = 0; c < count; ++c) out[c] = gate[c] * up[c] / (T(1) + out[c]);
}

template <class T>
void swiglu_span_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  // s = σ(gate): d gate = dout · up · s · (1 + gate · (1 − s)),  d up = dout · gate · s
  exp_negated(dgate, gate, count);
  for (int64_t c = 0; c < count; ++c) {
    const T s = T(1) / (T(1) + dgate[c]);
    const T g = gate[c], u = up[c], d = dout[c];
    dgate[c] = d * u * s * (T(1) + g * (T(1) - s));
    dup[c] = d * g * s;
  }
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  for_blocks(count, [&](int64_t i, int64_t n) { swiglu_span(out + i, gate + i, up + i, n); });
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  for_blocks(count, [&](int64_t i, int64_t n) { swiglu_span_backward(dgate + i, dup + i, dout + i, gate + i, up + i, n); });
}

template <class T>
void sigmoid_gate_forward(T* out, const T* x, const T* gate, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  // out[count] = x / (1 + exp(−gate)) = x · σ(gate)
  for_blocks(count, [&](int64_t i, int64_t n) {
    exp_negated(out + i, gate + i, n);
    for (int64_t c = i; c < i + n; ++c) out[c] = x[c] / (T(1) + out[c]);
  });
}

template <class T>
void sigmoid_gate_backward(T* dx, T* dgate, const T* dout, const T* x, const T* gate, int64_t count) {
  PhaseScope scope(Phase::elementwise);
  // s = σ(gate): dx = dout · s,  d gate = dout · x · s · (1 − s)
  for_blocks(count, [&](int64_t i, int64_t n) {
    exp_negated(dgate + i, gate + i, n);
    for (int64_t c = i; c < i + n; ++c) {
      const T s = T(1) / (T(1) + dgate[c]);
      dx[c] = dout[c] * s;
      dgate[c] = dout[c] * x[c] * s * (T(1) - s);
    }
  });
}

#define TRILLION_INSTANTIATE_ACTIVATION(T)                                                       \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                              \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);               \
  template void sigmoid_gate_forward<T>(T*, const T*, const T*, int64_t);                        \
  template void sigmoid_gate_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);         \
  template void sigmoid_span<T>(T*, const T*, int64_t);                                          \
  template void swiglu_span<T>(T*, const T*, const T*, int64_t);                                 \
  template void swiglu_span_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
TRILLION_INSTANTIATE_ACTIVATION(float)
TRILLION_INSTANTIATE_ACTIVATION(double)
#undef TRILLION_INSTANTIATE_ACTIVATION

}  // namespace trillion
