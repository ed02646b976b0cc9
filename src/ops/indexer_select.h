// The lightning indexer's streamed top-k selection (ops/indexer.cpp, indexer_topk): candidates
// (score, key) packed into integers ordered by rank, a branch-free quickselect that compacts a
// candidate list to its best topk, the radix sort of the final list, and the per-query running
// list that key blocks are offered to in increasing key order (also the dense loss's best mass: the
// sum of each query's top-k probabilities). Internal to indexer.cpp.
//
// Rank: "score descending, then key ascending" (the tie rule of docs/architecture.md, "Determinism",
// as ops/topk.h), NaN above
// every number as in ops/topk.h. The order is total and strict over distinct keys, so every
// selection step picks a unique set, independent of the algorithm and of the thread count.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "ops/vector_exp.h"

namespace trillion::indexer_select {

// A candidate (score, key) packed into one unsigned integer whose descending order is the ranking
// "score descending, then key ascending": the score's bits made order-preserving (−0 folded into
// +0 first, so equal scores tie; every NaN made the positive quiet NaN, which orders above +∞)
// above the bitwise complement of the key. Integer comparisons keep
// selection and sorting cheap and branch-light. 64 bits for float scores, 128 for double.
template <class T>
struct PackedRank;
template <>
struct PackedRank<float> {
  using Bits = uint32_t;
  using Packed = uint64_t;
};
template <>
struct PackedRank<double> {
  using Bits = uint64_t;
  using Packed = unsigned __int128;
};

template <class T>
typename PackedRank<T>::Packed pack_rank(T score, int64_t key) {
  using Bits = typename PackedRank<T>::Bits;
  using Packed = typename PackedRank<T>::Packed;
  constexpr Bits sign = Bits(1) << (8 * sizeof(Bits) - 1);
  const Bits bits = std::isnan(score) ? std::bit_cast<Bits>(std::numeric_limits<T>::quiet_NaN())
                                      : std::bit_cast<Bits>(T(score + T(0)));
  const Bits ordered = (bits & sign) != 0 ? ~bits : (bits | sign);
  return (Packed(ordered) << 32) | Packed(~static_cast<uint32_t>(key));
}

template <class Packed>
int32_t unpack_key(Packed packed) {
  return static_cast<int32_t>(~static_cast<uint32_t>(packed));
}

// The score pack_rank packed (−0 as +0, a NaN as the quiet NaN).
template <class T>
T unpack_score(typename PackedRank<T>::Packed packed) {
  using Bits = typename PackedRank<T>::Bits;
  constexpr Bits sign = Bits(1) << (8 * sizeof(Bits) - 1);
  const Bits ordered = static_cast<Bits>(packed >> 32);
  return std::bit_cast<T>((ordered & sign) != 0 ? Bits(ordered & ~sign) : Bits(~ordered));
}

// Sorts list[count] descending by an LSD radix sort over the bytes of Packed (8-bit digits; a
// byte that every element shares is skipped, e.g. the high bytes of small complemented keys);
// scratch[count] is overwritten. No data-dependent branches, unlike a comparison sort.
template <class Packed>
void radix_sort_descending(Packed* list, Packed* scratch, int64_t count) {
  Packed* from = list;
  Packed* to = scratch;
  for (int shift = 0; shift < 8 * int(sizeof(Packed)); shift += 8) {
    int64_t bucket_start[256] = {};  // histogram, then first output slot per digit
    for (int64_t i = 0; i < count; ++i) ++bucket_start[255 - int((from[i] >> shift) & 0xFF)];
    if (bucket_start[255 - int((from[0] >> shift) & 0xFF)] == count) continue;
    int64_t next = 0;
    for (int64_t& slot : bucket_start) next += std::exchange(slot, next);
    for (int64_t i = 0; i < count; ++i) to[bucket_start[255 - int((from[i] >> shift) & 0xFF)]++] = from[i];
    std::swap(from, to);
  }
  if (from != list) std::copy(from, from + count, list);
}

// Moves the k largest of list[0, count) (distinct values, 0 < k < count) to list[0, k), in no
// particular order, by quickselect: median-of-three pivot, then a branch-free partition through
// scratch[count] (each value is written at both open ends and one end advances), which avoids the
// mispredicted branch per comparison of std::nth_element on random scores. The set moved is the
// unique top k, as with any selection algorithm.
template <class Packed>
void select_largest(Packed* list, Packed* scratch, int64_t count, int64_t k) {
  int64_t begin = 0, end = count;  // the k − begin largest of list[begin, end) are still to be found
  while (k > begin && k < end) {
    const int64_t m = end - begin;
    Packed* range = list + begin;
    if (m <= 16) {  // insertion sort, descending
      for (int64_t i = 1; i < m; ++i)
        for (int64_t j = i; j > 0 && range[j] > range[j - 1]; --j) std::swap(range[j], range[j - 1]);
      return;
    }
    const Packed a = range[0], b = range[m / 2], c = range[m - 1];
    const Packed pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of three
    int64_t front = 0, back = m;  // scratch[0, front): > pivot; scratch[back, m): ≤ pivot
    for (int64_t i = 0; i < m; ++i) {
      const Packed x = range[i];
      const bool above = x > pivot;
      scratch[front] = x;
      scratch[back - 1] = x;
      front += above;
      back -= !above;
    }
    std::copy(scratch, scratch + m, range);
    // The pivot is ≤ itself and the median of three distinct values has one above it: 0 < front < m.
    if (begin + front >= k) end = begin + front;
    else begin += front;
  }
}

// Appends pack_rank(scores[c], j0 + c) for c < n to list (returns the new count), only those
// ranking before `bar` when filter is set: the candidates in key order, as a scalar loop would.
template <class T, class Packed>
int64_t append_candidates(Packed* list, int64_t count, const T* scores, int64_t n, int64_t j0, bool filter,
                          Packed bar) {
  for (int64_t c = 0; c < n; ++c) {
    const Packed candidate = pack_rank(scores[c], j0 + c);
    if (filter && !(candidate > bar)) continue;
    list[count++] = candidate;
  }
  return count;
}

// The float case eight candidates at a time, through the vector kernels of the instruction set in
// use (ops/vector_exp.h: the same values in the same order).
template <>
inline int64_t append_candidates<float, uint64_t>(uint64_t* list, int64_t count, const float* scores, int64_t n,
                                                  int64_t j0, bool filter, uint64_t bar) {
  return vector_kernels().append_ranked_candidates(list, count, scores, n, j0, filter, bar);
}

// One query's running top-k over the keys seen so far (keys arrive in increasing order).
template <class T>
struct RunningTopk {
  using Packed = typename PackedRank<T>::Packed;
  // Both [2·topk + the largest key block offered]:
  Packed* list;     // candidates; at the end [topk] kept + [topk] sort scratch
  Packed* scratch;  // the compaction's, shared by the queries of one thread
  int64_t count = 0;
  int64_t topk = 0;
  bool compacted = false;  // worst_kept is then the worst of the topk kept candidates
  Packed worst_kept = 0;

  void compact() {
    select_largest(list, scratch, count, topk);
    count = topk;
    compacted = true;
    worst_kept = *std::min_element(list, list + topk);
  }
  // Offers the visible scores of one key block, keys j0, j0 + 1, ….
  void offer(const T* scores, int64_t visible, int64_t j0) {
    if (visible == 0) return;
    // Once the list is compacted only a candidate ranking before the worst kept one can enter
    // (a later key with an equal score ranks after it); most blocks then hold none: the best
    // candidate a block can offer is its largest score at its first key (a NaN, which ranks
    // first, always enters).
    bool nan = false;
    for (int64_t c = 0; c < visible; ++c) nan |= std::isnan(scores[c]);
    if (compacted && !nan && !(pack_rank(max_value(scores, visible), j0) > worst_kept)) return;
    if (count > 2 * topk) compact();
    count = append_candidates(list, count, scores, visible, j0, compacted, worst_kept);
  }
  // Σ of the best min(topk, count) scores (in the list's order, which depends on the scores only).
  double kept_sum() {
    if (count > topk) compact();
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) sum += static_cast<double>(unpack_score<T>(list[i]));
    return sum;
  }
  // out[topk] ← the best min(topk, count) keys in rank order, then −1.
  void write(int32_t* out) {
    if (count > topk) compact();
    if (count > 0) radix_sort_descending(list, list + count, count);  // count ≤ topk: room for scratch
    for (int64_t i = 0; i < count; ++i) out[i] = unpack_key(list[i]);
    std::fill(out + count, out + topk, -1);
  }
};

}  // namespace trillion::indexer_select
