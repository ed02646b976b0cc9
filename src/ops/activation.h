// Elementwise activations with their backward side by side.
//   SwiGLU:       out = silu(gate) · up            (dense MLP; gate_proj and up_proj are separate)
//   sigmoid gate: out = x · sigmoid(gate)          (Qwen3-Next gated attention output)
// Saves nothing: the backward recomputes from its inputs. Input gradients are written (=).
#pragma once

#include <cstdint>

namespace trillion {

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count);
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count);
// The same on the calling thread (the MoE experts run one per permuted row inside their items).
// Every exp goes through the vector kernel (ops/vector_exp.h): out is first exp(−gate), dgate too.
template <class T>
void swiglu_span(T* out, const T* gate, const T* up, int64_t count);
template <class T>
void swiglu_span_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count);

// s[0, n) = σ(z[0, n)) on the calling thread, the exps through the vector kernel; s may be z.
template <class T>
void sigmoid_span(T* s, const T* z, int64_t n);

template <class T>
void sigmoid_gate_forward(T* out, const T* x, const T* gate, int64_t count);
template <class T>
void sigmoid_gate_backward(T* dx, T* dgate, const T* dout, const T* x, const T* gate, int64_t count);

}  // namespace trillion
