// The vector kernels of ops/vector_exp.h with AVX-512 (this file is compiled with -mavx512f): 16
// floats or 8 doubles per instruction, the tail under a mask, 2^k by vscalefps; only AVX-512F
// instructions, which every AVX-512 CPU has.
#include <limits>

#include "ops/simd_intrinsics.h"
#include "ops/vector_exp.h"
#include "ops/vector_lane_tree.h"
#include "ops/vector_rows.h"

namespace trillion {
namespace {

__mmask16 tail_mask16(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1);
}
__mmask8 tail_mask8(int64_t remaining) { return remaining >= 8 ? __mmask8(0xFF) : __mmask8((1u << remaining) - 1); }

__m256 low_half(__m512 v) { return _mm512_castps512_ps256(v); }
__m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
__m256d low_half(__m512d v) { return _mm512_castpd512_pd256(v); }
__m256d high_half(__m512d v) { return _mm512_extractf64x4_pd(v, 1); }

// exp(v) per lane; v is clamped to [−87, 88.8] (NaN passes: the clamps' second operand wins),
// below −87 gives 0 and above the float range p·2^k overflows to +inf.
__m512 exp_ps(__m512 v) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(lo, v));
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

// exp(v) per lane, v clamped to [−708, 709.9].
__m512d exp_pd(__m512d v) {
  const __m512d lo = _mm512_set1_pd(-708.0);
  const __m512d c = _mm512_min_pd(_mm512_set1_pd(709.9), _mm512_max_pd(lo, v));
  const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(c, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.93147180369123816490e-01), c);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.90821492927058770002e-10), r);
  __m512d p = _mm512_set1_pd(1.0 / 479001600);
  constexpr double kInvFactorial[12] = {1.0,       1.0,        1.0 / 2,      1.0 / 6,       1.0 / 24,       1.0 / 120,
                                        1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800};
  for (int i = 11; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFactorial[i]));
  const __m512d e = _mm512_scalef_pd(p, k);
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(v, lo, _CMP_LT_OQ), e, _mm512_setzero_pd());
}

float exp_shifted_sum_f32(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask16(n - j);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), s));
    _mm512_mask_storeu_ps(x + j, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  return lane_tree_sum(low_half(acc), high_half(acc));
}

double exp_shifted_sum_f64(double* x, int64_t n, double shift) {
  const __m512d s = _mm512_set1_pd(shift);
  __m512d acc = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 m = tail_mask8(n - j);
    const __m512d e = exp_pd(_mm512_sub_pd(_mm512_maskz_loadu_pd(m, x + j), s));
    _mm512_mask_storeu_pd(x + j, m, e);
    acc = _mm512_mask_add_pd(acc, m, acc, e);
  }
  return lane_tree_sum(low_half(acc), high_half(acc));
}

float max_value_f32(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 acc = neg_inf;
  for (int64_t j = 0; j < n; j += 16) acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(neg_inf, tail_mask16(n - j), x + j));
  return lane_tree_max(low_half(acc), high_half(acc));
}

double max_value_f64(const double* x, int64_t n) {
  const __m512d neg_inf = _mm512_set1_pd(-std::numeric_limits<double>::infinity());
  __m512d acc = neg_inf;
  for (int64_t j = 0; j < n; j += 8) acc = _mm512_max_pd(acc, _mm512_mask_loadu_pd(neg_inf, tail_mask8(n - j), x + j));
  return lane_tree_max(low_half(acc), high_half(acc));
}

// Eight candidates per step: the order-preserving score bits (ops/indexer_select.h's pack_rank) in
// 32-bit lanes, widened into the high halves of 64-bit lanes above ~key, then a compress-store of
// the lanes that pass the filter.
int64_t append_ranked_candidates(uint64_t* list, int64_t count, const float* scores, int64_t n, int64_t j0,
                                 bool filter, uint64_t bar) {
  const __m512i bar_v = _mm512_set1_epi64(static_cast<long long>(bar));
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFll);
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t c = 0; c < n; c += 8) {
    const __mmask8 valid = tail_mask8(n - c);
    // score + 0 folds −0 into +0; every NaN becomes the positive quiet NaN; ordered = bits ^
    // (sign-extended sign | sign bit)
    const __m512 loaded = _mm512_add_ps(_mm512_maskz_loadu_ps(valid, scores + c), _mm512_setzero_ps());
    const __m512 x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(loaded, loaded, _CMP_UNORD_Q), loaded,
                                          _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i ordered = _mm512_xor_si512(bits, _mm512_or_si512(_mm512_srai_epi32(bits, 31), sign));
    const __m512i keys = _mm512_add_epi64(_mm512_set1_epi64(j0 + c), lane);
    const __m512i packed = _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(ordered)), 32),
                                           _mm512_xor_si512(keys, low32));  // low half: ~key
    const __mmask8 keep = filter ? __mmask8(valid & _mm512_cmpgt_epu64_mask(packed, bar_v)) : valid;
    _mm512_mask_compressstoreu_epi64(list + count, keep, packed);
    count += __builtin_popcount(static_cast<unsigned>(keep));
  }
  return count;
}

}  // namespace

const VectorKernels& avx512_vector_kernels() {
  static const VectorKernels kernels{exp_shifted_sum_f32, exp_shifted_sum_f64, max_value_f32, max_value_f64,
                                     append_ranked_candidates, row_kernels()};
  return kernels;
}

}  // namespace trillion
