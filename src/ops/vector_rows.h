// Sparse attention's row kernels (ops/sparse_attention.cpp), written once on 64-byte chunks and
// compiled once per instruction set by ops/vector_exp_avx512.cpp and ops/vector_exp_avx2.cpp into
// their VectorKernels tables (ops/vector_exp.h), which start-up chooses between:
//
// - row_dots: dots[g · ld + c] ← scale · Σ_e a[g · dim + e] · row(c)[e] for g < rows, c < count,
//   the rows of a small [rows, dim] matrix (a few query heads, in L1) against rows read in place
//   (no gather, no packing). Per (g, c) one 64-byte accumulator over dim's full chunks, its lanes
//   summed in the fixed tree of ops/vector_lane_tree.h, then the scalar tail. The set's rows are
//   taken four at a time against blocks of a's rows (see dots_of_rows).
// - add_weighted_rows: dst[dim] += Σ_c weights[c · weight_stride] · row(c)[0, dim), c = 0 .. count − 1
//   in order. dst is walked in 64-byte chunks held in registers across all c (four chunks at a
//   time), so each row is read once per chunk and dst loaded and stored once; the tail is the same
//   sum, scalar. The rows are scattered (selected keys, or the queries that selected a key), so the
//   part of row c + 8 that the next loads need is prefetched: without it each row's first load
//   waited on the last-level cache (a quarter of this kernel's samples in sparse attention at MLA's
//   shape; the prefetch cut that backward by a fifth, docs/benchmarks.md).
//
// A chunk is one AVX-512 register, or two AVX2 registers as two 32-byte halves: a 64-byte GCC
// vector type without AVX-512 is lowered through the stack. Either way lane i of a chunk sums the
// same products in the same order (no contraction: -ffp-contract=off), so both instruction sets
// give the same bits.
//
// The rows read in place may be bf16 where a, dst and the weights are float (sparse attention
// under the bf16 precision): each chunk of 16 bf16 (32 bytes) is widened to 16 floats on load,
// exactly, so the sums are those of float rows holding the bf16 values, on half the bytes.
//
// Everything is in an unnamed namespace on purpose, as in ops/vector_lane_tree.h: each kernel file
// compiles its own copy for its own instruction set.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/bf16.h"
#include "ops/vector_exp.h"
#include "ops/vector_lane_tree.h"

namespace trillion {
namespace {

#if defined(__AVX512F__)
// 64 bytes of T as one vector value (one AVX-512 register).
template <class T>
struct Chunk {
  typedef T type __attribute__((vector_size(64)));
  static constexpr int64_t kLanes = 64 / sizeof(T);
  static type load(const T* p) {
    type v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static void store(T* p, const type& v) { std::memcpy(p, &v, sizeof(v)); }
  // 16 bf16 as the 16 floats they hold (T = float): zero-extended to 32 bits, shifted up.
  static type widen(const bf16* p) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return type(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)));
  }
  static T lane_sum(const type& v) {
    typename Halves<T>::type halves[2];  // lanes [0, kLanes / 2), [kLanes / 2, kLanes)
    std::memcpy(halves, &v, sizeof(halves));
    return lane_tree_sum(halves[0], halves[1]);
  }
};
#else
// 64 bytes of T as two 32-byte vector values (two AVX2 registers).
template <class T>
struct Chunk {
  typedef T half __attribute__((vector_size(32)));
  struct type {
    half lo, hi;  // lanes [0, kLanes / 2), [kLanes / 2, kLanes)
    type& operator+=(const type& o) {
      lo += o.lo;
      hi += o.hi;
      return *this;
    }
    friend type operator*(const type& a, const type& b) { return {a.lo * b.lo, a.hi * b.hi}; }
    friend type operator*(T w, const type& b) { return {w * b.lo, w * b.hi}; }
  };
  static constexpr int64_t kLanes = 64 / sizeof(T);
  static type load(const T* p) {
    type v;
    std::memcpy(&v.lo, p, sizeof(half));
    std::memcpy(&v.hi, p + kLanes / 2, sizeof(half));
    return v;
  }
  static void store(T* p, const type& v) {
    std::memcpy(p, &v.lo, sizeof(half));
    std::memcpy(p + kLanes / 2, &v.hi, sizeof(half));
  }
  // 16 bf16 as the 16 floats they hold (T = float), eight per half.
  static type widen(const bf16* p) {
    const auto half_of = [](const bf16* at) {
      const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
      return half(_mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)));
    };
    return {half_of(p), half_of(p + kLanes / 2)};
  }
  static T lane_sum(const type& v) {
    typename Halves<T>::type lo, hi;
    std::memcpy(&lo, &v.lo, sizeof(lo));
    std::memcpy(&hi, &v.hi, sizeof(hi));
    return lane_tree_sum(lo, hi);
  }
};
#endif

// Row c of a RowSet (ops/vector_exp.h).
template <class R>
inline const R* row_of(const RowSet<R>& set, int64_t c) {
  return set.base + (set.index != nullptr ? int64_t(set.index[c]) : c) * set.stride;
}

// A chunk of T from a row of R: T itself, or bf16 widened to float.
template <class T, class R>
typename Chunk<T>::type load_chunk(const R* p) {
  if constexpr (std::is_same_v<R, T>) return Chunk<T>::load(p);
  else {
    static_assert(std::is_same_v<T, float> && std::is_same_v<R, bf16>, "rows are T, or bf16 for float");
    return Chunk<T>::widen(p);
  }
}
inline float value_of(bf16 x) { return to_float(x); }
template <class T>
T value_of(T x) {
  return x;
}

// Rows of a whose dots run together, each against the same loaded chunks of kKeys rows of the set:
// kRowBlock · kKeys accumulators, kKeys row chunks and one chunk of a (21 of AVX-512's 32 registers
// at four rows). On AVX2 a chunk is two registers, so one row's four accumulators take 8 of 16.
// With more query heads than a block, each block reads the keys' rows again (from L1).
#if defined(__AVX512F__)
constexpr int64_t kRowBlock = 4;
#else
constexpr int64_t kRowBlock = 1;
#endif

// The dots of rows row[0, kKeys) of the set against rows a[0, kRows): each chunk of the set's rows
// is loaded once for the kRows rows of a, each chunk of a once for the kKeys rows, and the
// kRows · kKeys independent chains keep the adders busy (one chain per dot is bound by the add
// latency); each dot is still its own chain over the chunks in order, lanes summed in the tree,
// then the scalar tail, so its bits do not depend on kRows or kKeys.
template <int64_t kKeys, int64_t kRows, class T, class R>
void dots_of_rows(T* __restrict dots, int64_t ld, const T* __restrict a, int64_t dim, const R* const (&row)[kKeys],
                  int64_t full, T scale) {
  using V = Chunk<T>;
  typename V::type acc[kRows][kKeys] = {};
  for (int64_t e0 = 0; e0 < full; e0 += V::kLanes) {
    typename V::type row_chunk[kKeys];
    for (int64_t i = 0; i < kKeys; ++i) row_chunk[i] = load_chunk<T>(row[i] + e0);
    for (int64_t g = 0; g < kRows; ++g) {
      const typename V::type a_chunk = V::load(a + g * dim + e0);
      for (int64_t i = 0; i < kKeys; ++i) acc[g][i] += a_chunk * row_chunk[i];
    }
  }
  for (int64_t g = 0; g < kRows; ++g)
    for (int64_t i = 0; i < kKeys; ++i) {
      T sum = full > 0 ? V::lane_sum(acc[g][i]) : T(0);
      for (int64_t e = full; e < dim; ++e) sum += a[g * dim + e] * value_of(row[i][e]);
      dots[g * ld + i] = scale * sum;
    }
}

// row_dots for kRows rows of a (one row block), dim's count of 64-byte chunks known at compile
// time (kChunks > 0: no tail, the loop unrolls) or any dim (kChunks = 0): rows of the set four at a
// time, then one at a time. The first two cache lines of the rows two blocks ahead are prefetched
// (the hardware follows a row once its first lines are read). The set's rows are the inner loop, so
// nothing invariant across row blocks is left for the compiler to hoist (gcc hoisted all 48 chunks
// of four 192-wide rows out of a loop over a's rows and stored them on the stack, to read them back
// from there: sparse attention's forward at MLA's shape ran 1.15× slower, docs/benchmarks.md).
template <int64_t kChunks, int64_t kRows, class T, class R>
void row_block_dots(T* __restrict dots, int64_t ld, const T* __restrict a, const RowSet<R>& set, int64_t count,
                    int64_t dim, T scale) {
  constexpr int64_t kKeys = 4;
  const int64_t full = kChunks > 0 ? kChunks * Chunk<T>::kLanes : dim / Chunk<T>::kLanes * Chunk<T>::kLanes;
  int64_t c = 0;
  for (; c + kKeys <= count; c += kKeys) {
    if (c + 3 * kKeys <= count)
      for (int64_t i = 0; i < kKeys; ++i) {
        const char* ahead = reinterpret_cast<const char*>(row_of(set, c + 2 * kKeys + i));
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + 64);
      }
    const R* const row[kKeys] = {row_of(set, c), row_of(set, c + 1), row_of(set, c + 2), row_of(set, c + 3)};
    dots_of_rows<kKeys, kRows>(dots + c, ld, a, dim, row, full, scale);
  }
  for (; c < count; ++c) {
    const R* const row[1] = {row_of(set, c)};
    dots_of_rows<1, kRows>(dots + c, ld, a, dim, row, full, scale);
  }
}

// row_block_dots for the last n ≤ kRows rows of a block, kRows known at compile time.
template <int64_t kChunks, int64_t kRows, class T, class R>
void short_row_block_dots(int64_t n, T* dots, int64_t ld, const T* a, const RowSet<R>& set, int64_t count,
                          int64_t dim, T scale) {
  if constexpr (kRows > 1)
    if (n < kRows) return short_row_block_dots<kChunks, kRows - 1>(n, dots, ld, a, set, count, dim, scale);
  row_block_dots<kChunks, kRows>(dots, ld, a, set, count, dim, scale);
}

// row_dots with a compile-time chunk count: a's rows in blocks of kRowBlock, the last one shorter.
template <int64_t kChunks, class T, class R>
void row_dots_fixed(T* dots, int64_t ld, const T* a, int64_t rows, const RowSet<R>& set, int64_t count, int64_t dim,
                    T scale) {
  for (int64_t g = 0; g < rows; g += kRowBlock)
    short_row_block_dots<kChunks, kRowBlock>(std::min(kRowBlock, rows - g), dots + g * ld, ld, a + g * dim, set,
                                             count, dim, scale);
}

// The head dims of the benchmark and model shapes (64, 128, 192 floats; half as many doubles)
// specialized, any other dim generic. Same sums in the same order either way.
template <class T, class R>
void row_dots(T* dots, int64_t ld, const T* a, int64_t rows, const RowSet<R>& set, int64_t count, int64_t dim,
              T scale) {
  constexpr int64_t lanes = Chunk<T>::kLanes;
  if (dim == 4 * lanes) row_dots_fixed<4>(dots, ld, a, rows, set, count, dim, scale);
  else if (dim == 8 * lanes) row_dots_fixed<8>(dots, ld, a, rows, set, count, dim, scale);
  else if (dim == 12 * lanes) row_dots_fixed<12>(dots, ld, a, rows, set, count, dim, scale);
  else row_dots_fixed<0>(dots, ld, a, rows, set, count, dim, scale);
}

template <class T, class R>
void add_weighted_rows(T* __restrict dst, const T* __restrict weights, int64_t weight_stride, int64_t count,
                       const RowSet<R>& set, int64_t dim) {
  using V = Chunk<T>;
  int64_t e0 = 0;
  for (; e0 + 4 * V::kLanes <= dim; e0 += 4 * V::kLanes) {  // four independent accumulator chains
    typename V::type acc0 = V::load(dst + e0), acc1 = V::load(dst + e0 + V::kLanes),
                     acc2 = V::load(dst + e0 + 2 * V::kLanes), acc3 = V::load(dst + e0 + 3 * V::kLanes);
    for (int64_t c = 0; c < count; ++c) {
      const T w = weights[c * weight_stride];
      const R* row = row_of(set, c) + e0;
      if (c + 8 < count) {
        const char* ahead = reinterpret_cast<const char*>(row_of(set, c + 8) + e0);
        for (int64_t byte = 0; byte < 4 * V::kLanes * int64_t(sizeof(R)); byte += 64) __builtin_prefetch(ahead + byte);
      }
      acc0 += w * load_chunk<T>(row);
      acc1 += w * load_chunk<T>(row + V::kLanes);
      acc2 += w * load_chunk<T>(row + 2 * V::kLanes);
      acc3 += w * load_chunk<T>(row + 3 * V::kLanes);
    }
    V::store(dst + e0, acc0);
    V::store(dst + e0 + V::kLanes, acc1);
    V::store(dst + e0 + 2 * V::kLanes, acc2);
    V::store(dst + e0 + 3 * V::kLanes, acc3);
  }
  for (; e0 + V::kLanes <= dim; e0 += V::kLanes) {
    typename V::type acc = V::load(dst + e0);  // dst[e0, e0 + kLanes)
    for (int64_t c = 0; c < count; ++c) acc += weights[c * weight_stride] * load_chunk<T>(row_of(set, c) + e0);
    V::store(dst + e0, acc);
  }
  for (; e0 < dim; ++e0) {
    T acc = dst[e0];
    for (int64_t c = 0; c < count; ++c) acc += weights[c * weight_stride] * value_of(row_of(set, c)[e0]);
    dst[e0] = acc;
  }
}

// This instruction set's table of the kernels above (ops/vector_exp.h).
inline RowKernels row_kernels() {
  return {row_dots<float, float>,         row_dots<double, double>,         row_dots<float, bf16>,
          add_weighted_rows<float, float>, add_weighted_rows<double, double>, add_weighted_rows<float, bf16>};
}

}  // namespace
}  // namespace trillion
