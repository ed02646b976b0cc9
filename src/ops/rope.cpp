// Rotary position embedding (rotate_half form), forward and backward, in place.
// inv_freq[i] = base^(−2i/rotary_dim) as Hugging Face computes it; angles, cosines and sines are
// computed in double per (token, pair) into a [tokens, rotary_dim/2] table before the rotation (no
// allocation inside the parallel loops) and shared by all heads of the token. The backward is the
// same rotation with the sine negated.
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"

namespace trillion {
namespace {

// Rotates x[tokens, heads, head_dim] by +θ (direction = 1) or −θ (direction = −1).
template <class T>
void rotate(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
            double base, double direction) {
  TRILLION_CHECK(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0, "rope rotary_dim ", rotary_dim,
                 " must be even and at most head_dim ", head_dim);
  const int64_t half = rotary_dim / 2;
  if (half == 0) return;
  std::vector<double> inv_freq(half);  // [half]
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rotary_dim));
  // Angles, cosines and sines in double, rounded to T once; the table is filled before the rotation
  // so the rotation loop allocates nothing.
  Buffer<T> cos_table(tokens * half);  // [tokens, half]
  Buffer<T> sin_table(tokens * half);  // [tokens, half], sign of `direction` folded in
  parallel_for(tokens, [&](int64_t t) {
    T* cos_theta = cos_table.data() + t * half;  // [half]
    T* sin_theta = sin_table.data() + t * half;  // [half]
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(positions[t]) * inv_freq[i];
      cos_theta[i] = static_cast<T>(std::cos(theta));
      sin_theta[i] = static_cast<T>(direction * std::sin(theta));
    }
  });
  parallel_for(tokens, [&](int64_t t) {
    const T* cos_theta = cos_table.data() + t * half;  // [half]
    const T* sin_theta = sin_table.data() + t * half;  // [half]
    for (int64_t h = 0; h < heads; ++h) {
      T* head = x + (t * heads + h) * head_dim;  // [head_dim]
      for (int64_t i = 0; i < half; ++i) {
        const T first = head[i], second = head[i + half];
        head[i] = first * cos_theta[i] - second * sin_theta[i];
        head[i + half] = second * cos_theta[i] + first * sin_theta[i];
      }
    }
  });
}

}  // namespace

template <class T>
void rope_forward(T* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t rotary_dim, double base) {
  rotate(x, positions, tokens, heads, head_dim, rotary_dim, base, 1.0);
}

template <class T>
void rope_backward(T* dx, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                   int64_t rotary_dim, double base) {
  rotate(dx, positions, tokens, heads, head_dim, rotary_dim, base, -1.0);
}

#define TRILLION_INSTANTIATE_ROPE(T)                                                                \
  template void rope_forward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double); \
  template void rope_backward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double);
TRILLION_INSTANTIATE_ROPE(float)
TRILLION_INSTANTIATE_ROPE(double)
#undef TRILLION_INSTANTIATE_ROPE

}  // namespace trillion
