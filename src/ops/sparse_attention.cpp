// Sparse attention over indexer-selected keys (DeepSeek-V3.2 DSA), see sparse_attention.h.
//
// Tiles: for one query position t and one key/value head, the `group` query heads that share that
// head are the rows of one small matrix (they are contiguous in q, out, dq and dout, and stay in
// L1), and the selection is processed kKeyTile keys at a time. Every product reads the selected
// key/value rows in place, never gathered: dot products against them (scores q·k, and dP = dout·v
// in backward) run as row_dots, one 64-byte vector accumulator per (head, key) whose lanes are
// summed (the head dims 64, 128 and 192 unrolled at compile time); weighted sums of rows (P·v,
// dS·k, and the dk/dv scatters) run as add_weighted_rows, vector accumulators held in registers
// across the summed rows. Both are vector kernels chosen at start-up (ops/vector_rows.h: AVX-512,
// or AVX2 with the same bits). Measured at 8192 tokens, top-k 512, 8 query and 2 kv heads of 64: both
// beat gathering the rows into a tile for an OpenBLAS gemm of 4-row operands, whose packing copy
// cost as much as the gather (docs/benchmarks.md, "Sparse attention"; software prefetching of the
// scattered rows a few keys ahead was tried and gained nothing measurable). Workspace is a few
// tiles per thread; nothing is [q_len, kv_len]. Every selected key is visible by contract,
// so there is no masking.
//
// Forward: one work item per (batch, query position), all kv heads in turn; online softmax over
// the key tiles of the row's selection, accumulating straight into out, then saving lse.
//
// Backward, determinism: one work item per (batch, kv head). It owns dk and dv of its kv head and dq
// of the query heads of its group, and walks the query positions t = 0, 1, … in order: D =
// rowsum(dout ⊙ out), P = exp(scale · q·k − lse) recomputed tile by tile, dS = P ⊙ (dP −
// D), dq of t written, and the dk/dv contributions added to the selected keys' rows in (t, column)
// order. No two items write the same element and each item's order of additions is fixed (a
// function of the sizes and indices only), so the results are bitwise independent of the thread
// count, and probabilities are computed once per (t, head) with no dq/dk pass split. All cores
// are busy when batch · kv_heads ≥ threads; with fewer items some threads idle (the alternative,
// per-query-block partial dk/dv buffers reduced in a fixed order, costs a [kv_len, dim] buffer per
// block, far more than the O(threads · tile) workspace kept here). Forward rows are independent.
//
// Indices are validated before any parallel region (TRILLION_CHECK aborts, never inside OpenMP):
// each row must be distinct visible keys followed only by −1 padding, with at least one key.
#include "ops/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

constexpr int64_t kKeyTile = 128;  // selected keys gathered per tile

int64_t round_up_64_bytes(int64_t count, int64_t elem_bytes) {
  const int64_t per_line = 64 / elem_bytes;
  return (count + per_line - 1) / per_line * per_line;
}

// Index arithmetic shared by forward and backward.
struct Geometry {
  SparseAttentionSizes s;
  int64_t group, offset;
  explicit Geometry(const SparseAttentionSizes& sizes) : s(sizes) {
    TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.qk_dim > 0 && s.v_dim > 0 &&
                       s.topk > 0,
                   "bad sparse attention sizes");
    TRILLION_CHECK(s.q_len <= s.kv_len, "sparse attention q_len ", s.q_len, " > kv_len ", s.kv_len);
    TRILLION_CHECK(s.kv_len <= std::numeric_limits<int32_t>::max(), "kv_len ", s.kv_len, " exceeds int32 indices");
    TRILLION_CHECK(s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " not a multiple of kv_heads ", s.kv_heads);
    TRILLION_CHECK(s.doc_start == nullptr || s.q_len == s.kv_len, "document masks need q_len == kv_len");
    group = s.q_heads / s.kv_heads;
    offset = s.kv_len - s.q_len;
  }
  // Keys [visible_begin(b, t), visible_end(t)) are visible to query position t of batch entry b.
  int64_t visible_begin(int64_t b, int64_t t) const { return s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0; }
  int64_t visible_end(int64_t t) const { return t + offset + 1; }
  // Offsets of (b, t, head h, 0) in q-like ([.., qk_dim]) and out-like ([.., v_dim]) tensors.
  int64_t q_index(int64_t b, int64_t t, int64_t h) const { return ((b * s.q_len + t) * s.q_heads + h) * s.qk_dim; }
  int64_t out_index(int64_t b, int64_t t, int64_t h) const { return ((b * s.q_len + t) * s.q_heads + h) * s.v_dim; }
  // Offset of (b, key j, kv head, 0) in a [batch, kv_len, kv_heads, dim] tensor.
  int64_t kv_index(int64_t b, int64_t j, int64_t kvh, int64_t dim) const {
    return ((b * s.kv_len + j) * s.kv_heads + kvh) * dim;
  }
  int64_t lse_index(int64_t b, int64_t h, int64_t t) const { return (b * s.q_heads + h) * s.q_len + t; }
};

// What is wrong with a row of indices (a row's status is its key count ≥ 1, or one of these).
enum RowError : int32_t { kNoKey = -1, kNotVisible = -2, kDuplicate = -3, kKeyAfterPadding = -4 };

// Scans one row indices[topk]: returns its count of valid keys or a RowError, with the offending
// column in *bad_column. marks[kv_len] is all zero on entry and on return.
int32_t scan_row(const int32_t* row, int64_t topk, int64_t visible_begin, int64_t visible_end, uint8_t* marks,
                 int64_t* bad_column) {
  int32_t count = 0, error = 0;
  bool padded = false;
  for (int64_t c = 0; c < topk && error == 0; ++c) {
    const int32_t j = row[c];
    if (j == -1) {
      padded = true;
      continue;
    }
    if (padded) error = kKeyAfterPadding;
    else if (j < visible_begin || j >= visible_end) error = kNotVisible;
    else if (marks[j] != 0) error = kDuplicate;
    else {
      marks[j] = 1;
      ++count;
      continue;
    }
    *bad_column = c;
  }
  for (int32_t c = 0; c < count; ++c) marks[row[c]] = 0;  // the valid keys are exactly the first count
  if (error != 0) return error;
  return count == 0 ? int32_t(kNoKey) : count;
}

// Elements of selected_counts' counts [batch, q_len] and of its marks [threads, kv_len].
int64_t counts_count(const SparseAttentionSizes& s) { return s.batch * s.q_len; }
int64_t marks_count(const SparseAttentionSizes& s, int threads) { return int64_t(threads) * s.kv_len; }

// Validates every row of indices; returns the key counts [batch, q_len].
Buffer<int32_t> selected_counts(const int32_t* indices, const Geometry& geo) {
  const SparseAttentionSizes& s = geo.s;
  const int64_t rows = counts_count(s);
  Buffer<int32_t> counts(rows);                           // [batch, q_len]
  Buffer<uint8_t> marks(marks_count(s, num_threads()));  // [threads, kv_len]
  parallel_for(rows, s.topk, [&](int64_t r) {
    int64_t unused_column = 0;
    const int64_t b = r / s.q_len, t = r % s.q_len;
    counts[r] = scan_row(indices + r * s.topk, s.topk, geo.visible_begin(b, t), geo.visible_end(t),
                         marks.data() + int64_t(omp_get_thread_num()) * s.kv_len, &unused_column);
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (counts[r] > 0) continue;
    const int64_t b = r / s.q_len, t = r % s.q_len;
    int64_t c = 0;
    scan_row(indices + r * s.topk, s.topk, geo.visible_begin(b, t), geo.visible_end(t), marks.data(), &c);
    const int32_t j = indices[r * s.topk + c];
    TRILLION_CHECK(counts[r] != kNoKey, "sparse attention indices row (", b, ", ", t, ") selects no key");
    TRILLION_CHECK(counts[r] != kNotVisible, "sparse attention indices[", b, ", ", t, ", ", c, "] = ", j,
                   " is not a key visible to query ", t, " (", geo.visible_begin(b, t), " <= j < ", geo.visible_end(t), ")");
    TRILLION_CHECK(counts[r] != kDuplicate, "sparse attention indices[", b, ", ", t, ", ", c, "] = ", j,
                   " repeats a key of its row");
    TRILLION_CHECK(counts[r] != kKeyAfterPadding, "sparse attention indices[", b, ", ", t, ", ", c, "] = ", j,
                   " follows -1 padding");
  }
  return counts;
}

// Elements of one thread's forward workspace: scores [group, kKeyTile], row_max, row_sum [group].
int64_t forward_per_thread(const Geometry& geo, int64_t elem_bytes) {
  return round_up_64_bytes(geo.group * kKeyTile + 2 * geo.group, elem_bytes);
}

// Elements of one thread's backward workspace: probs, dprobs [group, kKeyTile], lse_rows, dot_rows [group].
int64_t backward_per_thread(const Geometry& geo, int64_t elem_bytes) {
  return round_up_64_bytes(2 * geo.group * kKeyTile + 2 * geo.group, elem_bytes);
}

// A kernel's peak bytes of Buffers: the counts, with the marks, then the per-thread workspace.
int64_t kernel_bytes(const SparseAttentionSizes& s, int threads, int64_t per_thread, int64_t element_bytes) {
  return counts_count(s) * int64_t(sizeof(int32_t)) +
         std::max(marks_count(s, threads) * int64_t(sizeof(uint8_t)), per_thread * threads * element_bytes);
}

}  // namespace

int64_t sparse_attention_forward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                 int64_t element_bytes) {
  return kernel_bytes(sizes, threads, forward_per_thread(Geometry(sizes), element_bytes), element_bytes);
}

int64_t sparse_attention_backward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                  int64_t element_bytes) {
  return kernel_bytes(sizes, threads, backward_per_thread(Geometry(sizes), element_bytes), element_bytes);
}

template <class T>
void sparse_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                              const SparseAttentionSizes& sizes) {
  const Geometry geo(sizes);
  const Buffer<int32_t> counts = selected_counts(indices, geo);  // [batch, q_len]
  const int64_t group = geo.group, qk_dim = sizes.qk_dim, v_dim = sizes.v_dim;
  const int64_t per_thread = forward_per_thread(geo, sizeof(T));  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  const T scale = T(sizes.scale);

  const int64_t row_work = sizes.topk * sizes.q_heads * (qk_dim + v_dim);  // a full row's multiply-adds
  parallel_for_dynamic(sizes.batch * sizes.q_len, row_work, [&](int64_t row) {
    const int64_t b = row / sizes.q_len, t = row % sizes.q_len;
    const int32_t* selected = indices + row * sizes.topk;  // [count] key positions
    const int64_t count = counts[row];
    T* scores = workspace.data() + per_thread * omp_get_thread_num();  // [group, kKeyTile]
    T* row_max = scores + group * kKeyTile;                            // [group]
    T* row_sum = row_max + group;                                      // [group]
    for (int64_t kvh = 0; kvh < sizes.kv_heads; ++kvh) {
      const T* q_rows = q + geo.q_index(b, t, kvh * group);  // [group, qk_dim]
      T* out_rows = out + geo.out_index(b, t, kvh * group);  // [group, v_dim]: unnormalized until the end
      std::fill(out_rows, out_rows + group * v_dim, T(0));
      std::fill(row_max, row_max + group, -std::numeric_limits<T>::infinity());
      std::fill(row_sum, row_sum + group, T(0));
      for (int64_t c0 = 0; c0 < count; c0 += kKeyTile) {
        const int64_t n = std::min(kKeyTile, count - c0);
        // scores[group, n] = scale · q_rows · k[b, selected[c0 + c], kvh], read in place
        const RowSet<T> k_rows{k + geo.kv_index(b, 0, kvh, qk_dim), sizes.kv_heads * qk_dim, selected + c0};
        row_dots(scores, kKeyTile, q_rows, group, k_rows, n, qk_dim, scale);
        for (int64_t g = 0; g < group; ++g) {
          T* score_row = scores + g * kKeyTile;
          // The first tile's rescale is exp(−inf − finite) = 0 on the zero accumulator.
          const T new_max = std::max(row_max[g], max_value(score_row, n));
          const T rescale = std::exp(row_max[g] - new_max);
          row_sum[g] = row_sum[g] * rescale + exp_shifted_sum(score_row, n, new_max);
          row_max[g] = new_max;
          T* out_row = out_rows + g * v_dim;
          for (int64_t e = 0; e < v_dim; ++e) out_row[e] *= rescale;
        }
        // out_rows[g] += Σ_c P[g, c] v[b, selected[c0 + c], kvh], read in place
        const RowSet<T> v_rows{v + geo.kv_index(b, 0, kvh, v_dim), sizes.kv_heads * v_dim, selected + c0};
        for (int64_t g = 0; g < group; ++g)
          add_weighted_rows(out_rows + g * v_dim, scores + g * kKeyTile, 1, n, v_rows, v_dim);
      }
      for (int64_t g = 0; g < group; ++g) {
        const T inv = T(1) / row_sum[g];
        T* out_row = out_rows + g * v_dim;
        for (int64_t e = 0; e < v_dim; ++e) out_row[e] *= inv;
        lse[geo.lse_index(b, kvh * group + g, t)] = row_max[g] + std::log(row_sum[g]);
      }
    }
  });
}

template <class T>
void sparse_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const T* lse, const int32_t* indices, const SparseAttentionSizes& sizes) {
  const Geometry geo(sizes);
  const Buffer<int32_t> counts = selected_counts(indices, geo);  // [batch, q_len]
  const int64_t group = geo.group, qk_dim = sizes.qk_dim, v_dim = sizes.v_dim;
  const int64_t per_thread = backward_per_thread(geo, sizeof(T));  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  const T scale = T(sizes.scale);

  parallel_for_dynamic(sizes.batch * sizes.kv_heads, [&](int64_t item) {
    const int64_t b = item / sizes.kv_heads, kvh = item % sizes.kv_heads;
    T* probs = workspace.data() + per_thread * omp_get_thread_num();  // [group, kKeyTile]: P, then scale · dS
    T* dprobs = probs + group * kKeyTile;                              // [group, kKeyTile]
    T* lse_rows = dprobs + group * kKeyTile;                           // [group]
    T* dot_rows = lse_rows + group;                                    // [group]
    for (int64_t j = 0; j < sizes.kv_len; ++j) {
      std::fill(dk + geo.kv_index(b, j, kvh, qk_dim), dk + geo.kv_index(b, j, kvh, qk_dim) + qk_dim, T(0));
      std::fill(dv + geo.kv_index(b, j, kvh, v_dim), dv + geo.kv_index(b, j, kvh, v_dim) + v_dim, T(0));
    }
    for (int64_t t = 0; t < sizes.q_len; ++t) {
      const int64_t row = b * sizes.q_len + t;
      const int32_t* selected = indices + row * sizes.topk;  // [count] key positions
      const int64_t count = counts[row];
      const T* q_rows = q + geo.q_index(b, t, kvh * group);        // [group, qk_dim]
      const T* dout_rows = dout + geo.out_index(b, t, kvh * group);  // [group, v_dim]
      const T* out_rows = out + geo.out_index(b, t, kvh * group);    // [group, v_dim]
      T* dq_rows = dq + geo.q_index(b, t, kvh * group);              // [group, qk_dim]
      std::fill(dq_rows, dq_rows + group * qk_dim, T(0));
      for (int64_t g = 0; g < group; ++g) {
        T dot = 0;
        for (int64_t e = 0; e < v_dim; ++e) dot += dout_rows[g * v_dim + e] * out_rows[g * v_dim + e];
        dot_rows[g] = dot;
        lse_rows[g] = lse[geo.lse_index(b, kvh * group + g, t)];
      }
      for (int64_t c0 = 0; c0 < count; c0 += kKeyTile) {
        const int64_t n = std::min(kKeyTile, count - c0);
        // The selected keys' rows, read in place: k_rows [n, qk_dim], v_rows [n, v_dim].
        const RowSet<T> k_rows{k + geo.kv_index(b, 0, kvh, qk_dim), sizes.kv_heads * qk_dim, selected + c0};
        const RowSet<T> v_rows{v + geo.kv_index(b, 0, kvh, v_dim), sizes.kv_heads * v_dim, selected + c0};
        // probs[group, n] = exp(scale · q_rows · k_rows − lse);  dprobs[group, n] = dout_rows · v_rows
        row_dots(probs, kKeyTile, q_rows, group, k_rows, n, qk_dim, scale);
        for (int64_t g = 0; g < group; ++g) exp_shifted_sum(probs + g * kKeyTile, n, lse_rows[g]);
        row_dots(dprobs, kKeyTile, dout_rows, group, v_rows, n, v_dim, T(1));
        // dv[selected key c] += Σ_g P[g, c] dout_rows[g]
        const RowSet<T> dout_set{dout_rows, v_dim, nullptr};  // [group, v_dim]
        for (int64_t c = 0; c < n; ++c)
          add_weighted_rows(dv + geo.kv_index(b, selected[c0 + c], kvh, v_dim), probs + c, kKeyTile, group,
                            dout_set, v_dim);
        // probs ← scale · dS = scale · P ⊙ (dP − D)
        for (int64_t g = 0; g < group; ++g) {
          T* p = probs + g * kKeyTile;
          const T* dp = dprobs + g * kKeyTile;
          const T dot = dot_rows[g];
          for (int64_t c = 0; c < n; ++c) p[c] = scale * (p[c] * (dp[c] - dot));
        }
        // dq_rows[g] += Σ_c scale · dS[g, c] k_rows[c]
        for (int64_t g = 0; g < group; ++g)
          add_weighted_rows(dq_rows + g * qk_dim, probs + g * kKeyTile, 1, n, k_rows, qk_dim);
        // dk[selected key c] += Σ_g scale · dS[g, c] q_rows[g]
        const RowSet<T> q_set{q_rows, qk_dim, nullptr};  // [group, qk_dim]
        for (int64_t c = 0; c < n; ++c)
          add_weighted_rows(dk + geo.kv_index(b, selected[c0 + c], kvh, qk_dim), probs + c, kKeyTile, group, q_set,
                            qk_dim);
      }
    }
  });
}

template void sparse_attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                              const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                               const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                               const float*, const float*, const float*, const int32_t*,
                                               const SparseAttentionSizes&);
template void sparse_attention_backward<double>(double*, double*, double*, const double*, const double*,
                                                const double*, const double*, const double*, const double*,
                                                const int32_t*, const SparseAttentionSizes&);

}  // namespace trillion
