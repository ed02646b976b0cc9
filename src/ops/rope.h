// Rotary position embedding, in place, on a span of rotary_dim dims at `offset` inside each head
// (Qwen: the first partial_rotary_factor · head_dim dims; MLA: the rope part after the nope part of
// each query head, and the single shared rotary key; the lightning indexer: the first dims).
// Pair i < r/2 (r = rotary_dim) at position p is rotated by θ = p · inv_freq[i]:
//   half-split (rotate_half, Llama/Qwen):  pair (x[i], x[i + r/2])
//   interleaved (DeepSeek rope_interleave): pair (x[2i], x[2i + 1])
//   (y_a, y_b) = m · (x_a cos θ − x_b sin θ, x_b cos θ + x_a sin θ),  m = attention_factor (YaRN; else 1).
// Transformers de-interleaves the interleaved output ([evens | odds]); only q·k products of rotated
// spans are ever used and q and k are permuted alike, so keeping pairs in place is the same model.
// inv_freq is base^(−2i/r), or YaRN's blend of it with base^(−2i/r) / factor (rope_inv_freq).
// The backward is the transposed map: the rotation by −θ times m (in place on the gradient).
// Saves nothing: the backward needs only the positions, which are the caller's.
// Gradient rule: the input gradient is written (=), in place over the output gradient.
#pragma once

#include <cstdint>
#include <vector>

namespace trillion {

// YaRN (transformers' _compute_yarn_parameters): dims whose wavelength is short against
// original_max_positions keep their frequency, long ones are interpolated by 1/factor, with a
// linear ramp between the correction dims of beta_fast and beta_slow rotations.
struct YarnScaling {
  double factor = 0.0;  // 0: no YaRN
  double original_max_positions = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;  // round the correction range outwards to whole dims
};

struct RopeSpec {
  int64_t rotary_dim = 0;  // even; 0 rotates nothing
  double theta = 10000.0;  // base
  bool interleaved = false;
  double attention_factor = 1.0;  // m: scales cos and sin (YaRN's mscale ratio)
  YarnScaling yarn;
};

// inv_freq[rotary_dim / 2] of the spec, in double.
std::vector<double> rope_inv_freq(const RopeSpec& rope);

// The bytes of rope_forward's and rope_backward's temporaries (cos and sin tables of T), for the
// memory plan.
inline int64_t rope_workspace_bytes(int64_t tokens, int64_t rotary_dim, int64_t element_bytes) {
  return 2 * tokens * (rotary_dim / 2) * element_bytes;
}

// x[tokens, heads, head_stride]: dims [offset, offset + rotary_dim) of each head rotated in place.
template <class T>
void rope_forward(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_stride,
                  int64_t offset, const RopeSpec& rope);

// dx[tokens, heads, head_stride]: the gradient wrt the output on entry, wrt the input on return.
template <class T>
void rope_backward(T* dx, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_stride,
                   int64_t offset, const RopeSpec& rope);

}  // namespace trillion
