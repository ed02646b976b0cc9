// Vectorized exp and row reductions for softmax-like kernels (attention tiles).
//
// exp_shifted_sum(x, n, shift) sets x[j] = exp(x[j] − shift) for j < n and returns the sum of the
// new values; max_value returns the largest element. Arguments below the underflow bound
// (−inf included) give exactly 0; NaN stays NaN. Both reduce in a fixed order (vector lanes,
// then a fixed lane tree), so results depend only on the inputs. With AVX-512 they run 16 floats
// or 8 doubles per instruction: Cody–Waite range reduction x = k·ln2 + r, |r| ≤ ln2/2, a Taylor
// polynomial in r (degree 7 for float, 12 for double: within ~1 ulp of std::exp) and a scale by
// 2^k (vscalefps). Without AVX-512 they fall back to std::exp in a plain loop.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
// GCC 12 flags the undefined pass-through operand inside its own AVX-512 intrinsics (GCC bug
// 105593); the warning is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace trillion {

#if defined(__AVX512F__)

namespace vector_exp_detail {

inline __mmask16 tail_mask16(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1);
}
inline __mmask8 tail_mask8(int64_t remaining) {
  return remaining >= 8 ? __mmask8(0xFF) : __mmask8((1u << remaining) - 1);
}

inline __m512 exp_ps(__m512 v) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __m512 c = _mm512_max_ps(lo, v);  // NaN in v stays NaN (second operand wins)
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), c);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_scalef_ps(p, k);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), e, _mm512_setzero_ps());
}

inline __m512d exp_pd(__m512d v) {
  const __m512d lo = _mm512_set1_pd(-708.0);
  const __m512d c = _mm512_max_pd(lo, v);
  const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(c, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.93147180369123816490e-01), c);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.90821492927058770002e-10), r);
  constexpr double kInvFactorial[13] = {1.0,
                                        1.0,
                                        1.0 / 2,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600};
  __m512d p = _mm512_set1_pd(kInvFactorial[12]);
  for (int i = 11; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFactorial[i]));
  const __m512d e = _mm512_scalef_pd(p, k);
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(v, lo, _CMP_LT_OQ), e, _mm512_setzero_pd());
}

}  // namespace vector_exp_detail

inline float exp_shifted_sum(float* x, int64_t n, float shift) {
  using namespace vector_exp_detail;
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask16(n - j);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), s));
    _mm512_mask_storeu_ps(x + j, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

inline double exp_shifted_sum(double* x, int64_t n, double shift) {
  using namespace vector_exp_detail;
  const __m512d s = _mm512_set1_pd(shift);
  __m512d acc = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 m = tail_mask8(n - j);
    const __m512d e = exp_pd(_mm512_sub_pd(_mm512_maskz_loadu_pd(m, x + j), s));
    _mm512_mask_storeu_pd(x + j, m, e);
    acc = _mm512_mask_add_pd(acc, m, acc, e);
  }
  return _mm512_reduce_add_pd(acc);
}

inline float max_value(const float* x, int64_t n) {
  using namespace vector_exp_detail;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 acc = neg_inf;
  for (int64_t j = 0; j < n; j += 16)
    acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(neg_inf, tail_mask16(n - j), x + j));
  return _mm512_reduce_max_ps(acc);
}

inline double max_value(const double* x, int64_t n) {
  using namespace vector_exp_detail;
  const __m512d neg_inf = _mm512_set1_pd(-std::numeric_limits<double>::infinity());
  __m512d acc = neg_inf;
  for (int64_t j = 0; j < n; j += 8)
    acc = _mm512_max_pd(acc, _mm512_mask_loadu_pd(neg_inf, tail_mask8(n - j), x + j));
  return _mm512_reduce_max_pd(acc);
}

#pragma GCC diagnostic pop

#else  // portable fallback: the same contract, scalar

template <class T>
T exp_shifted_sum(T* x, int64_t n, T shift) {
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

template <class T>
T max_value(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

#endif

}  // namespace trillion
