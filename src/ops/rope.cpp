// Rotary position embedding (half-split or interleaved pairs, optional YaRN), forward and backward,
// in place. inv_freq as transformers computes it (in double here); angles, cosines and sines are
// computed in double per (position, pair) into a table of at most [tokens, rotary_dim/2] before the
// rotation (no allocation inside the parallel loops) and shared by all heads and all tokens at the
// position. The backward is the same map with the sine negated.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

// Rotates x[tokens, heads, head_stride] by +θ (direction = 1) or −θ (direction = −1).
template <class T>
void rotate(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_stride, int64_t offset,
            const RopeSpec& rope, double direction) {
  const int64_t r = rope.rotary_dim;
  TRILLION_CHECK(r >= 0 && r % 2 == 0 && offset >= 0 && offset + r <= head_stride, "rope rotary_dim ", r,
                 " at offset ", offset, " must be even and inside head_stride ", head_stride);
  const int64_t half = r / 2;
  if (half == 0) return;
  const std::vector<double> inv_freq = rope_inv_freq(rope);  // [half]
  // Table rows: one per position value when every position lies in [0, tokens) (the rows of a batch
  // repeat the same positions, so they share rows), else one per token. A row's values depend only on
  // its position, so both give the same bits.
  const auto [lowest, highest] = std::minmax_element(positions, positions + tokens);
  const bool by_position = tokens > 0 && *lowest >= 0 && *highest < tokens;
  const int64_t rows = by_position ? static_cast<int64_t>(*highest) + 1 : tokens;
  const auto row_of = [&](int64_t t) { return by_position ? static_cast<int64_t>(positions[t]) : t; };
  // Angles, cosines and sines in double, rounded to T once.
  Buffer<T> cos_table(rows * half);  // [rows, half]
  Buffer<T> sin_table(rows * half);  // [rows, half], sign of `direction` folded in
  parallel_for(rows, 16 * half, [&](int64_t row) {  // cos and sin: ~8 element operations each
    T* cos_theta = cos_table.data() + row * half;  // [half]
    T* sin_theta = sin_table.data() + row * half;  // [half]
    const double position = by_position ? static_cast<double>(row) : static_cast<double>(positions[row]);
    for (int64_t i = 0; i < half; ++i) {
      const double theta = position * inv_freq[i];
      cos_theta[i] = static_cast<T>(rope.attention_factor * std::cos(theta));
      sin_theta[i] = static_cast<T>(direction * rope.attention_factor * std::sin(theta));
    }
  });
  // Pair i is (span[i · a_step], span[i · a_step + b_gap]).
  const int64_t a_step = rope.interleaved ? 2 : 1, b_gap = rope.interleaved ? 1 : half;
  parallel_for(tokens, heads * half, [&](int64_t t) {
    const T* cos_theta = cos_table.data() + row_of(t) * half;  // [half]
    const T* sin_theta = sin_table.data() + row_of(t) * half;  // [half]
    for (int64_t h = 0; h < heads; ++h) {
      T* span = x + (t * heads + h) * head_stride + offset;  // [rotary_dim]
      for (int64_t i = 0; i < half; ++i) {
        T& a = span[i * a_step];
        T& b = span[i * a_step + b_gap];
        const T first = a, second = b;
        a = first * cos_theta[i] - second * sin_theta[i];
        b = second * cos_theta[i] + first * sin_theta[i];
      }
    }
  });
}

// YaRN's correction dim: the dim whose wavelength makes `rotations` turns over `positions`.
double yarn_correction_dim(double rotations, double dim, double base, double positions) {
  return dim * std::log(positions / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

std::vector<double> rope_inv_freq(const RopeSpec& rope) {
  const int64_t half = rope.rotary_dim / 2;
  const double dim = static_cast<double>(rope.rotary_dim);
  std::vector<double> inv_freq(half);  // [half]
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / dim);
  const YarnScaling& y = rope.yarn;
  if (y.factor == 0.0 || half == 0) return inv_freq;
  TRILLION_CHECK(y.factor > 0.0 && y.original_max_positions > 0.0, "bad YaRN factor ", y.factor,
                 " or original_max_positions ", y.original_max_positions);
  double low = yarn_correction_dim(y.beta_fast, dim, rope.theta, y.original_max_positions);
  double high = yarn_correction_dim(y.beta_slow, dim, rope.theta, y.original_max_positions);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // as transformers: no zero-width ramp
  for (int64_t i = 0; i < half; ++i) {
    // ramp 0 → keep the frequency (extrapolate), 1 → divide it by factor (interpolate)
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;
    inv_freq[i] = inv_freq[i] / y.factor * (1.0 - keep) + inv_freq[i] * keep;
  }
  return inv_freq;
}

template <class T>
void rope_forward(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_stride,
                  int64_t offset, const RopeSpec& rope) {
  PhaseScope scope(Phase::elementwise);
  rotate(x, positions, tokens, heads, head_stride, offset, rope, 1.0);
}

template <class T>
void rope_backward(T* dx, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_stride,
                   int64_t offset, const RopeSpec& rope) {
  PhaseScope scope(Phase::elementwise);
  rotate(dx, positions, tokens, heads, head_stride, offset, rope, -1.0);
}

#define TRILLION_INSTANTIATE_ROPE(T)                                                                       \
  template void rope_forward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, const RopeSpec&); \
  template void rope_backward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, const RopeSpec&);
TRILLION_INSTANTIATE_ROPE(float)
TRILLION_INSTANTIATE_ROPE(double)
#undef TRILLION_INSTANTIATE_ROPE

}  // namespace trillion
