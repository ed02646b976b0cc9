// The vector kernels of ops/vector_exp.h with AVX2 + FMA (this file is compiled with -mavx2 -mfma
// -mno-avx512f, so no AVX-512 instruction can slip in): the same operations as the AVX-512 kernels
// on the same 64-byte lane layout, as two 32-byte halves, so the results are the same bits. 2^k is
// built in the exponent bits as 2^⌊k/2⌋ · 2^(k − ⌊k/2⌋), both exact, so p · 2^k rounds once, as
// vscalefps does.
#include <limits>

#include "ops/simd_intrinsics.h"
#include "ops/vector_exp.h"
#include "ops/vector_lane_tree.h"
#include "ops/vector_rows.h"

namespace trillion {
namespace {

// Lanes [offset, offset + 8) of a 16-float step (or [offset, offset + 4) of an 8-double one) that
// lie below n: an all-ones lane for each.
__m256i lanes_below_f32(int64_t remaining) {
  const int r = remaining > 8 ? 8 : remaining < 0 ? 0 : static_cast<int>(remaining);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
__m256i lanes_below_f64(int64_t remaining) {
  const int64_t r = remaining > 4 ? 4 : remaining < 0 ? 0 : remaining;
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(r), _mm256_setr_epi64x(0, 1, 2, 3));
}

__m256 pow2_ps(__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); }
__m256d pow2_pd(__m128i k) {
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(k, _mm_set1_epi32(1023))), 52));
}

// exp(v) per lane, as the AVX-512 kernel computes it (the clamps keep k in [−126, 128]).
__m256 exp_ps(__m256 v) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 c = _mm256_min_ps(_mm256_set1_ps(88.8f), _mm256_max_ps(lo, v));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), c);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ki = _mm256_cvtps_epi32(k);
  const __m256i k1 = _mm256_srai_epi32(ki, 1);
  const __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, pow2_ps(k1)), pow2_ps(_mm256_sub_epi32(ki, k1)));
  return _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(v, lo, _CMP_LT_OQ));
}

// exp(v) per lane (k in [−1022, 1024]).
__m256d exp_pd(__m256d v) {
  const __m256d lo = _mm256_set1_pd(-708.0);
  const __m256d c = _mm256_min_pd(_mm256_set1_pd(709.9), _mm256_max_pd(lo, v));
  const __m256d k = _mm256_round_pd(_mm256_mul_pd(c, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(6.93147180369123816490e-01), c);
  r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.90821492927058770002e-10), r);
  __m256d p = _mm256_set1_pd(1.0 / 479001600);
  constexpr double kInvFactorial[12] = {1.0,       1.0,        1.0 / 2,      1.0 / 6,       1.0 / 24,       1.0 / 120,
                                        1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800};
  for (int i = 11; i >= 0; --i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kInvFactorial[i]));
  const __m128i ki = _mm256_cvtpd_epi32(k);
  const __m128i k1 = _mm_srai_epi32(ki, 1);
  const __m256d e = _mm256_mul_pd(_mm256_mul_pd(p, pow2_pd(k1)), pow2_pd(_mm_sub_epi32(ki, k1)));
  return _mm256_blendv_pd(e, _mm256_setzero_pd(), _mm256_cmp_pd(v, lo, _CMP_LT_OQ));
}

// x[0, 8) of a half ← exp(x − s) where the lane is below n; returns the new values there, 0 elsewhere.
__m256 exp_half(float* x, __m256i lanes, __m256 s) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x, lanes), s));
  _mm256_maskstore_ps(x, lanes, e);
  return _mm256_and_ps(e, _mm256_castsi256_ps(lanes));
}
__m256d exp_half(double* x, __m256i lanes, __m256d s) {
  const __m256d e = exp_pd(_mm256_sub_pd(_mm256_maskload_pd(x, lanes), s));
  _mm256_maskstore_pd(x, lanes, e);
  return _mm256_and_pd(e, _mm256_castsi256_pd(lanes));
}

float exp_shifted_sum_f32(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc_lo = _mm256_setzero_ps(), acc_hi = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    acc_lo = _mm256_add_ps(acc_lo, exp_half(x + j, lanes_below_f32(n - j), s));
    acc_hi = _mm256_add_ps(acc_hi, exp_half(x + j + 8, lanes_below_f32(n - j - 8), s));
  }
  return lane_tree_sum(acc_lo, acc_hi);
}

double exp_shifted_sum_f64(double* x, int64_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    acc_lo = _mm256_add_pd(acc_lo, exp_half(x + j, lanes_below_f64(n - j), s));
    acc_hi = _mm256_add_pd(acc_hi, exp_half(x + j + 4, lanes_below_f64(n - j - 4), s));
  }
  return lane_tree_sum(acc_lo, acc_hi);
}

float max_value_f32(const float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const auto half = [&](const float* p, __m256i lanes) {
    return _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(p, lanes), _mm256_castsi256_ps(lanes));
  };
  __m256 acc_lo = neg_inf, acc_hi = neg_inf;
  for (int64_t j = 0; j < n; j += 16) {
    acc_lo = _mm256_max_ps(acc_lo, half(x + j, lanes_below_f32(n - j)));
    acc_hi = _mm256_max_ps(acc_hi, half(x + j + 8, lanes_below_f32(n - j - 8)));
  }
  return lane_tree_max(acc_lo, acc_hi);
}

double max_value_f64(const double* x, int64_t n) {
  const __m256d neg_inf = _mm256_set1_pd(-std::numeric_limits<double>::infinity());
  const auto half = [&](const double* p, __m256i lanes) {
    return _mm256_blendv_pd(neg_inf, _mm256_maskload_pd(p, lanes), _mm256_castsi256_pd(lanes));
  };
  __m256d acc_lo = neg_inf, acc_hi = neg_inf;
  for (int64_t j = 0; j < n; j += 8) {
    acc_lo = _mm256_max_pd(acc_lo, half(x + j, lanes_below_f64(n - j)));
    acc_hi = _mm256_max_pd(acc_hi, half(x + j + 4, lanes_below_f64(n - j - 4)));
  }
  return lane_tree_max(acc_lo, acc_hi);
}

// The AVX-512 kernel's candidates, eight per step, as two halves of four 64-bit lanes; without a
// compress-store, the lanes that pass the filter are copied in order from a stored step.
int64_t append_ranked_candidates(uint64_t* list, int64_t count, const float* scores, int64_t n, int64_t j0,
                                 bool filter, uint64_t bar) {
  const __m256i flip = _mm256_set1_epi64x(std::numeric_limits<long long>::min());  // unsigned order as signed
  const __m256i bar_v = _mm256_xor_si256(_mm256_set1_epi64x(static_cast<long long>(bar)), flip);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i low32 = _mm256_set1_epi64x(0xFFFFFFFFll);
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
  alignas(32) uint64_t step[8];  // [8] the step's packed candidates
  for (int64_t c = 0; c < n; c += 8) {
    const __m256i valid = lanes_below_f32(n - c);
    const __m256 loaded = _mm256_add_ps(_mm256_maskload_ps(scores + c, valid), _mm256_setzero_ps());
    const __m256 x = _mm256_blendv_ps(loaded, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                                      _mm256_cmp_ps(loaded, loaded, _CMP_UNORD_Q));
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i ordered = _mm256_xor_si256(bits, _mm256_or_si256(_mm256_srai_epi32(bits, 31), sign));
    unsigned keep = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(valid)));
    unsigned above = 0;
    for (int half = 0; half < 2; ++half) {
      const __m128i ordered_half = half == 0 ? _mm256_castsi256_si128(ordered) : _mm256_extracti128_si256(ordered, 1);
      const __m256i keys = _mm256_add_epi64(_mm256_set1_epi64x(j0 + c + 4 * half), lane);
      const __m256i packed = _mm256_or_si256(_mm256_slli_epi64(_mm256_cvtepu32_epi64(ordered_half), 32),
                                             _mm256_xor_si256(keys, low32));  // low half: ~key
      _mm256_store_si256(reinterpret_cast<__m256i*>(step + 4 * half), packed);
      const __m256i gt = _mm256_cmpgt_epi64(_mm256_xor_si256(packed, flip), bar_v);
      above |= static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(gt))) << (4 * half);
    }
    if (filter) keep &= above;
    for (; keep != 0; keep &= keep - 1) list[count++] = step[__builtin_ctz(keep)];
  }
  return count;
}

}  // namespace

const VectorKernels& avx2_vector_kernels() {
  static const VectorKernels kernels{exp_shifted_sum_f32, exp_shifted_sum_f64, max_value_f32, max_value_f64,
                                     append_ranked_candidates, row_kernels()};
  return kernels;
}

}  // namespace trillion
