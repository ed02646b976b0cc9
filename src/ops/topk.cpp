// Deterministic row-wise top-k (see topk.h).
//
// The ranking is the strict total order "score descending, then index ascending", NaN above every
// number (ranks_above), so the k selected positions and their order are unique and any correct
// selection algorithm yields the same answer. Two row kernels:
//  - small k (≤ kInsertionMaxK, the MoE router's case): one pass over the row keeping the best k
//    so far sorted in the output row itself (insertion). Positions are visited in increasing order,
//    so a later entry displaces an earlier one only if its score is strictly larger. No scratch.
//  - larger k (the sparse-attention indexer's case): nth_element on a per-thread scratch copy of
//    the positions, then a sort of the first k, both with the same total order.
// Rows are independent work items.
#include "ops/topk.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"

namespace trillion {
namespace {

constexpr int64_t kInsertionMaxK = 32;

// Whether score x ranks above y: larger, with NaN above every number (and two NaNs equal).
template <class T>
bool ranks_above(T x, T y) {
  return std::isnan(x) ? !std::isnan(y) : x > y;
}
template <class T>
bool ranks_equal(T x, T y) {
  return x == y || (std::isnan(x) && std::isnan(y));
}

// out[k] ← the top-k positions of row[n] by insertion (k ≤ kInsertionMaxK).
template <class T>
void topk_row_insertion(int32_t* out, const T* row, int64_t n, int64_t k) {
  int64_t filled = 0;
  for (int64_t j = 0; j < n; ++j) {
    const T s = row[j];
    // Equal scores keep the earlier (smaller) position ahead, so only a strictly larger score enters
    // a full list or moves up past an entry.
    if (filled == k && !ranks_above(s, row[out[k - 1]])) continue;
    int64_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && ranks_above(s, row[out[pos - 1]])) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = static_cast<int32_t>(j);
  }
}

// out[k] ← the top-k positions of row[n] by selection then sort; scratch[n] is overwritten.
template <class T>
void topk_row_select(int32_t* out, const T* row, int64_t n, int64_t k, int32_t* scratch) {
  const auto before = [row](int32_t a, int32_t b) {
    return ranks_above(row[a], row[b]) || (ranks_equal(row[a], row[b]) && a < b);
  };
  std::iota(scratch, scratch + n, 0);
  if (k < n) std::nth_element(scratch, scratch + (k - 1), scratch + n, before);
  std::sort(scratch, scratch + k, before);
  std::copy(scratch, scratch + k, out);
}

}  // namespace

int64_t topk_rows_workspace_bytes(int64_t n, int64_t k, int threads) {
  return k <= kInsertionMaxK ? 0 : threads * n * int64_t(sizeof(int32_t));
}

template <class T>
void topk_rows(int32_t* indices, const T* scores, int64_t rows, int64_t n, int64_t k) {
  TRILLION_CHECK(rows >= 0 && n >= 1 && k >= 1 && k <= n, "topk sizes rows=", rows, " n=", n, " k=", k);
  TRILLION_CHECK(n <= std::numeric_limits<int32_t>::max(), "topk row length ", n, " exceeds int32 indices");
  const bool use_insertion = k <= kInsertionMaxK;
  // Per-thread position scratch, [threads, n], for the selection kernel only.
  Buffer<int32_t> scratch(use_insertion ? 0 : static_cast<int64_t>(num_threads()) * n);
  parallel_for(rows, n, [&](int64_t r) {
    const T* row = scores + r * n;  // [n]
    int32_t* out = indices + r * k;  // [k]
    if (use_insertion) {
      topk_row_insertion(out, row, n, k);
    } else {
      topk_row_select(out, row, n, k, scratch.data() + static_cast<int64_t>(omp_get_thread_num()) * n);
    }
  });
}

template void topk_rows<float>(int32_t*, const float*, int64_t, int64_t, int64_t);
template void topk_rows<double>(int32_t*, const double*, int64_t, int64_t, int64_t);

}  // namespace trillion
