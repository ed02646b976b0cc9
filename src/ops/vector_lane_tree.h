// The fixed lane trees that reduce the vector kernels' 64-byte accumulators (ops/vector_exp.h),
// shared by the AVX-512 and the AVX2 kernels and the sparse attention dots, so all give the same
// bits. The accumulator is given as its two 32-byte halves (lanes 0–7 and 8–15 of floats, 0–3 and
// 4–7 of doubles): lane i is paired with lane i + 8 (i + 4), then i + 4 (i + 2), then i + 2, then
// i + 1.
//
// The functions are in an unnamed namespace on purpose: each kernel file compiles its own copy for
// its own instruction set (one shared inline definition could be taken from the AVX-512 file and
// run on an AVX2 machine).
#pragma once

#include "ops/simd_intrinsics.h"

namespace trillion {
namespace {

// The 32-byte vector type of a 64-byte accumulator's halves.
template <class T>
struct Halves;
template <>
struct Halves<float> {
  using type = __m256;
};
template <>
struct Halves<double> {
  using type = __m256d;
};

inline float lane_tree_sum(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(hi, lo);
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
  const __m128 t2 = _mm_add_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, _MM_SHUFFLE(1, 1, 1, 1))));
}

inline float lane_tree_max(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_max_ps(hi, lo);
  const __m128 t4 = _mm_max_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
  const __m128 t2 = _mm_max_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ss(t2, _mm_shuffle_ps(t2, t2, _MM_SHUFFLE(1, 1, 1, 1))));
}

inline double lane_tree_sum(__m256d lo, __m256d hi) {
  const __m256d t4 = _mm256_add_pd(hi, lo);
  const __m128d t2 = _mm_add_pd(_mm256_extractf128_pd(t4, 1), _mm256_castpd256_pd128(t4));
  return _mm_cvtsd_f64(_mm_add_sd(t2, _mm_unpackhi_pd(t2, t2)));
}

inline double lane_tree_max(__m256d lo, __m256d hi) {
  const __m256d t4 = _mm256_max_pd(hi, lo);
  const __m128d t2 = _mm_max_pd(_mm256_extractf128_pd(t4, 1), _mm256_castpd256_pd128(t4));
  return _mm_cvtsd_f64(_mm_max_sd(t2, _mm_unpackhi_pd(t2, t2)));
}

}  // namespace
}  // namespace trillion
