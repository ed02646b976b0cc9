// Vectorized exp and row reductions for softmax-like kernels (attention tiles, the indexer, SiLU's
// exp(−x), the delta rule's decays), with the instruction set chosen at start-up.
//
// exp_shifted_sum(x, n, shift) sets x[j] = exp(x[j] − shift) for j < n and returns the sum of the
// new values; max_value returns the largest element. Arguments below the underflow bound (−87 for
// float, −708 for double; −inf included) give exactly 0, above the overflow bound +inf; NaN stays
// NaN. The method (ops/vector_exp_avx512.cpp, ops/vector_exp_avx2.cpp): Cody–Waite range reduction
// x = k·ln2 + r, |r| ≤ ln2/2, a Taylor polynomial in r (degree 7 for float, 12 for double: within
// ~1 ulp of std::exp) and an exact scale by 2^k. Both instruction sets run the same operations on
// the same 64-byte lane layout (16 floats or 8 doubles; AVX2 as two 32-byte halves) and reduce the
// lanes in the same fixed tree, so they give the same bits: results depend only on the inputs.
//
// append_ranked_candidates is the lightning indexer's candidate packing (ops/indexer_select.h): it
// appends pack_rank(scores[c], j0 + c) for c < n to list, only those above `bar` when filter is set,
// in key order, and returns the new count; eight candidates per step (a compress-store on AVX-512).
//
// The instruction set is AVX-512 where the CPU has it, AVX2 + FMA otherwise; the environment
// variable TRILLION_ISA=avx2 (or avx512) overrides the choice, so the AVX2 path runs and is tested
// on AVX-512 machines too. A CPU with neither is refused with a message naming what is missing.
#pragma once

#include <cstdint>

namespace trillion {

enum class VectorIsa { avx2, avx512 };
const char* vector_isa_name(VectorIsa isa);
bool cpu_supports(VectorIsa isa);

// The kernels of one instruction set.
struct VectorKernels {
  float (*exp_shifted_sum_f32)(float* x, int64_t n, float shift);
  double (*exp_shifted_sum_f64)(double* x, int64_t n, double shift);
  float (*max_value_f32)(const float* x, int64_t n);
  double (*max_value_f64)(const double* x, int64_t n);
  int64_t (*append_ranked_candidates)(uint64_t* list, int64_t count, const float* scores, int64_t n, int64_t j0,
                                      bool filter, uint64_t bar);
};
const VectorKernels& avx2_vector_kernels();
const VectorKernels& avx512_vector_kernels();

// The instruction set in use: TRILLION_ISA's, else the best the CPU has (decided on first use).
VectorIsa vector_isa();
// Makes `isa` the one in use from now on (tests); fails if the CPU lacks it.
void set_vector_isa(VectorIsa isa);
const VectorKernels& vector_kernels();

inline float exp_shifted_sum(float* x, int64_t n, float shift) {
  return vector_kernels().exp_shifted_sum_f32(x, n, shift);
}
inline double exp_shifted_sum(double* x, int64_t n, double shift) {
  return vector_kernels().exp_shifted_sum_f64(x, n, shift);
}
inline float max_value(const float* x, int64_t n) { return vector_kernels().max_value_f32(x, n); }
inline double max_value(const double* x, int64_t n) { return vector_kernels().max_value_f64(x, n); }

}  // namespace trillion
