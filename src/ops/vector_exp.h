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
// row_dots and add_weighted_rows are sparse attention's products against rows read in place
// (ops/vector_rows.h); for float, the rows may be bf16 (widened exactly on load).
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

#include "core/bf16.h"

namespace trillion {

enum class VectorIsa { avx2, avx512 };
const char* vector_isa_name(VectorIsa isa);
bool cpu_supports(VectorIsa isa);

// Rows of a matrix read in place: row c starts at base + (index ? index[c] : c) · stride.
template <class T>
struct RowSet {
  const T* base;
  int64_t stride;
  const int32_t* index;  // or nullptr: rows c = 0, 1, …
};

// Sparse attention's row kernels of one instruction set (ops/vector_rows.h's row_kernels(), the same
// templates in each kernel file).
struct RowKernels {
  void (*row_dots_f32)(float* dots, int64_t ld, const float* a, int64_t rows, const RowSet<float>& set,
                       int64_t count, int64_t dim, float scale);
  void (*row_dots_f64)(double* dots, int64_t ld, const double* a, int64_t rows, const RowSet<double>& set,
                       int64_t count, int64_t dim, double scale);
  void (*row_dots_f32_bf16_rows)(float* dots, int64_t ld, const float* a, int64_t rows, const RowSet<bf16>& set,
                                 int64_t count, int64_t dim, float scale);
  void (*add_weighted_rows_f32)(float* dst, const float* weights, int64_t weight_stride, int64_t count,
                                const RowSet<float>& set, int64_t dim);
  void (*add_weighted_rows_f64)(double* dst, const double* weights, int64_t weight_stride, int64_t count,
                                const RowSet<double>& set, int64_t dim);
  void (*add_weighted_rows_f32_bf16_rows)(float* dst, const float* weights, int64_t weight_stride, int64_t count,
                                          const RowSet<bf16>& set, int64_t dim);
};

// The kernels of one instruction set.
struct VectorKernels {
  float (*exp_shifted_sum_f32)(float* x, int64_t n, float shift);
  double (*exp_shifted_sum_f64)(double* x, int64_t n, double shift);
  float (*max_value_f32)(const float* x, int64_t n);
  double (*max_value_f64)(const double* x, int64_t n);
  int64_t (*append_ranked_candidates)(uint64_t* list, int64_t count, const float* scores, int64_t n, int64_t j0,
                                      bool filter, uint64_t bar);
  RowKernels rows;
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

// dots[g · ld + c] ← scale · Σ_e a[g · dim + e] · row(c)[e] for g < rows, c < count.
inline void row_dots(float* dots, int64_t ld, const float* a, int64_t rows, const RowSet<float>& set, int64_t count,
                     int64_t dim, float scale) {
  vector_kernels().rows.row_dots_f32(dots, ld, a, rows, set, count, dim, scale);
}
inline void row_dots(double* dots, int64_t ld, const double* a, int64_t rows, const RowSet<double>& set,
                     int64_t count, int64_t dim, double scale) {
  vector_kernels().rows.row_dots_f64(dots, ld, a, rows, set, count, dim, scale);
}
inline void row_dots(float* dots, int64_t ld, const float* a, int64_t rows, const RowSet<bf16>& set, int64_t count,
                     int64_t dim, float scale) {
  vector_kernels().rows.row_dots_f32_bf16_rows(dots, ld, a, rows, set, count, dim, scale);
}
// dst[dim] += Σ_c weights[c · weight_stride] · row(c)[0, dim), c = 0 .. count − 1 in order.
inline void add_weighted_rows(float* dst, const float* weights, int64_t weight_stride, int64_t count,
                              const RowSet<float>& set, int64_t dim) {
  vector_kernels().rows.add_weighted_rows_f32(dst, weights, weight_stride, count, set, dim);
}
inline void add_weighted_rows(double* dst, const double* weights, int64_t weight_stride, int64_t count,
                              const RowSet<double>& set, int64_t dim) {
  vector_kernels().rows.add_weighted_rows_f64(dst, weights, weight_stride, count, set, dim);
}
inline void add_weighted_rows(float* dst, const float* weights, int64_t weight_stride, int64_t count,
                              const RowSet<bf16>& set, int64_t dim) {
  vector_kernels().rows.add_weighted_rows_f32_bf16_rows(dst, weights, weight_stride, count, set, dim);
}

}  // namespace trillion
