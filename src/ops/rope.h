// Rotary position embedding, non-interleaved (rotate_half) form as in Llama/Qwen, applied to the first
// rotary_dim dims of each head (partial_rotary_factor · head_dim; the rest pass through).
// For pair i < rotary_dim/2 at position p: θ = p · base^(−2i/rotary_dim),
//   y[i] = x[i] cos θ − x[i + r/2] sin θ,  y[i + r/2] = x[i + r/2] cos θ + x[i] sin θ.
// Works in place. The backward is the rotation by −θ (in place on the gradient).
// Saves nothing: the backward needs only the positions, which are the caller's.
// Gradient rule: the input gradient is written (=), in place over the output gradient.
#pragma once

#include <cstdint>

namespace trillion {

// x[tokens, heads, head_dim] rotated in place; positions[tokens].
template <class T>
void rope_forward(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t rotary_dim, double base);

// dx[tokens, heads, head_dim]: the gradient wrt the output on entry, wrt the input on return.
template <class T>
void rope_backward(T* dx, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                   int64_t rotary_dim, double base);

}  // namespace trillion
