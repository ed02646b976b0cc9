// Sparse attention over indexer-selected keys (DeepSeek-V3.2 DSA), see sparse_attention.h.
//
// Tiles: for one query position t and one key/value head, the `group` query heads that share that
// head are the rows of one small matrix (contiguous in q, out, dq and dout, and in L1), and the
// selection is processed kKeyTile keys at a time. Every product reads the selected key/value rows
// in place, never gathered into a tile: dot products against them (scores q·k, and dP = dout·v in
// backward) run as row_dots, weighted sums of rows (P·v, dS·k, and dk/dv's sums) as
// add_weighted_rows, both vector kernels chosen at start-up (ops/vector_rows.h: AVX-512, or AVX2
// with the same bits). With random selections there is no dense block to hand a GEMM: at top-k
// 512 of 8192 keys two neighbouring queries share 1/16 of their keys, and packing the gathered
// rows for an OpenBLAS gemm of 4-row operands cost as much as the gather (docs/benchmarks.md,
// "Sparse attention").
//
// Locality: the selected rows are scattered over the whole sequence, so the kernels work one kv
// head at a time (all threads on the same head), its key and value rows copied out of the
// interleaved [.., kv_heads, dim] layout into one contiguous [kv_len, dim] matrix (HeadRows): one
// head of MLA's shape at 8192 keys is 10 MB and stays in the last-level cache, where all heads'
// rows (84 MB) did not, and interleaved rows a power of two apart shared a fraction of the cache
// sets. Nothing is [q_len, kv_len].
//
// Forward: per kv head, one work item per query position; online softmax over the key tiles of the
// row's selection, accumulating straight into out, then saving lse.
//
// Backward, in chunks of query positions (SparseAttentionTiling.chunk_terms terms each):
// - query-major, one item per query: D = rowsum(dout ⊙ out), P = exp(scale · q·k − lse)
//   recomputed tile by tile, dS = P ⊙ (dP − D), dq of the query written, and P and scale · dS kept
//   [chunk, group, topk];
// - key-major, one item per key: the chunk's pairs counting-sorted by key (KeyMajorPairs), dv[j] +=
//   Σ P · dout and dk[j] += Σ scale · dS · q over the pairs that select key j, in (query, column,
//   query head) order, each dk/dv row loaded and stored once per kKeyTile terms.
// No two items write the same element, every sum's order is a function of the sizes and indices
// only, so the results are bitwise independent of the thread count and of the chunk size, and all
// threads are busy whatever the number of heads.
//
// Under the bf16 matmul precision (ops/gemm.h), the float kernels read q, k, v and dout as their
// bf16 rounding: the head copies hold bf16 rows, widened exactly on load (half the bytes the
// scattered reads move, though not faster at MLA's shape: docs/benchmarks.md, "Sparse attention
// in bf16"), and each query's own rows are rounded into the thread's workspace, so every product
// has bf16 operands and float accumulation, as the dense tiles' GEMMs under bf16. P, dS, the
// softmax, lse and every sum stay float. The copies are made even for one kv head (then nothing is
// read in place).
//
// Indices are validated before any parallel region (TRILLION_CHECK aborts, never inside OpenMP):
// each row must be distinct visible keys followed only by −1 padding, with at least one key.
#include "ops/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

constexpr int64_t kKeyTile = 128;  // selected keys per tile, and terms per flush of the key-major pass

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
    TRILLION_CHECK(s.q_len * s.q_heads <= std::numeric_limits<int32_t>::max(), "q_len · q_heads ",
                   s.q_len * s.q_heads, " exceeds int32 query row numbers");
    TRILLION_CHECK(s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " not a multiple of kv_heads ", s.kv_heads);
    group = s.q_heads / s.kv_heads;
    offset = s.kv_len - s.q_len;
  }
  // Keys [visible_begin(b, t), visible_end(t)) are visible to query position t of batch entry b.
  int64_t visible_begin(int64_t b, int64_t t) const { return s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0; }
  int64_t visible_end(int64_t t) const { return t + offset + 1; }
  // Offsets of (b, t, head h, 0) in q-like ([.., qk_dim]) and out-like ([.., v_dim]) tensors.
  int64_t q_index(int64_t b, int64_t t, int64_t h) const { return ((b * s.q_len + t) * s.q_heads + h) * s.qk_dim; }
  int64_t out_index(int64_t b, int64_t t, int64_t h) const { return ((b * s.q_len + t) * s.q_heads + h) * s.v_dim; }
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

// Whether the float kernels read bf16 rows: under the bf16 matmul precision.
bool rows_in_bf16() { return matmul_precision() == MatmulPrecision::bf16; }

// A query's own rows x[n] as products read them: x itself, or (bf16 rows) x rounded to bf16 in
// the thread's scratch[n].
template <class T, class R>
const T* operand_rows(const T* x, int64_t n, T* scratch) {
  if constexpr (std::is_same_v<R, T>) return x;
  else {
    for (int64_t i = 0; i < n; ++i) scratch[i] = round_to_bf16(x[i]);
    return scratch;
  }
}

// Elements of one thread's forward workspace: scores [group, kKeyTile], row_max, row_sum [group],
// then with bf16 rows the query's rounded rows [group, qk_dim].
int64_t forward_per_thread(const Geometry& geo, int64_t elem_bytes, bool bf16_rows) {
  const int64_t rounded = bf16_rows ? geo.group * geo.s.qk_dim : 0;
  return round_up_64_bytes(geo.group * kKeyTile + 2 * geo.group + rounded, elem_bytes);
}

// Elements of one thread's backward workspace: probs, dprobs [group, kKeyTile], lse_rows, dot_rows
// [group], a key's gathered weights [2, kKeyTile] (with their rows in gathered_rows), then with
// bf16 rows the query's rounded q and dout rows [group, qk_dim + v_dim].
int64_t backward_per_thread(const Geometry& geo, int64_t elem_bytes, bool bf16_rows) {
  const int64_t rounded = bf16_rows ? geo.group * (geo.s.qk_dim + geo.s.v_dim) : 0;
  return round_up_64_bytes(2 * geo.group * kKeyTile + 2 * geo.group + 2 * kKeyTile + rounded, elem_bytes);
}

// One head's rows of a [batch, len, heads, dim] tensor as a contiguous [len, dim] matrix. With
// several heads a head's rows interleave with the others' at a stride of heads · dim elements (a
// power of two times 64 bytes at the usual dims), so its scattered rows share a fraction of the
// cache sets and many more pages: at MLA's shape reading them from such a copy halved the time of
// both passes (docs/benchmarks.md, "Sparse attention"). With one head the tensor is that matrix and
// nothing is copied, unless the copy's rows R are bf16 (rounded from T = float).
template <class T, class R = T>
class HeadRows {
 public:
  HeadRows(int64_t len, int64_t heads, int64_t dim)
      : len_(len), heads_(heads), dim_(dim), copy_(copy_count(len, heads, dim, !std::is_same_v<R, T>)) {}
  static int64_t copy_count(int64_t len, int64_t heads, int64_t dim, bool converted) {
    return heads > 1 || converted ? len * dim : 0;
  }

  // Head h of batch entry b of x, [len, dim].
  const R* load(const T* x, int64_t b, int64_t h) {
    if constexpr (std::is_same_v<R, T>) {
      if (heads_ == 1) return x + b * len_ * dim_;
      parallel_for(len_, dim_, [&](int64_t j) { std::copy_n(row(x, b, j, h), dim_, copy_.data() + j * dim_); });
    } else {
      parallel_for(len_, dim_, [&](int64_t j) { to_bf16(row(x, b, j, h), copy_.data() + j * dim_, dim_); });
    }
    return copy_.data();
  }
  // Zeroed rows [len, dim] to accumulate head h of batch entry b of x in; store() writes them to x.
  T* zeroed(T* x, int64_t b, int64_t h) {
    T* rows = heads_ == 1 ? x + b * len_ * dim_ : copy_.data();
    parallel_for(len_, dim_, [&](int64_t j) { std::fill_n(rows + j * dim_, dim_, T(0)); });
    return rows;
  }
  void store(T* x, int64_t b, int64_t h) const {
    if (heads_ == 1) return;
    parallel_for(len_, dim_, [&](int64_t j) { std::copy_n(copy_.data() + j * dim_, dim_, row(x, b, j, h)); });
  }

 private:
  template <class P>
  P* row(P* x, int64_t b, int64_t j, int64_t h) const { return x + ((b * len_ + j) * heads_ + h) * dim_; }
  int64_t len_, heads_, dim_;
  Buffer<R> copy_;  // [len, dim] when heads > 1 or R is bf16
};

// Query positions per chunk of the backward: as many as fill tiling.chunk_terms terms, a query's
// being topk · group (the query heads that share a kv head).
int64_t chunk_queries(const SparseAttentionSizes& s, const SparseAttentionTiling& tiling) {
  TRILLION_CHECK(tiling.chunk_terms > 0 && tiling.chunk_terms <= std::numeric_limits<int32_t>::max(),
                 "sparse attention tiling: chunk_terms ", tiling.chunk_terms, " outside [1, 2^31)");
  return std::clamp<int64_t>(tiling.chunk_terms / (s.topk * (s.q_heads / s.kv_heads)), 1, s.q_len);
}

// One query chunk's selected (query, column) pairs sorted by key, a counting sort: the pairs that
// select key j are [begin(j), end(j)), in (query, column) order, pair s being column column(s) of
// the chunk's query query(s). (Sorting in parallel, each thread a range of queries, was slower:
// the threads' pairs of a key are neighbours, so their writes shared cache lines.)
class KeyMajorPairs {
 public:
  KeyMajorPairs(int64_t kv_len, int64_t max_pairs) : key_begin_(kv_len + 1), query_(max_pairs), column_(max_pairs) {}

  // indices [queries, topk] and counts [queries] of the chunk's rows; every key is below key_end.
  void sort(const int32_t* indices, const int32_t* counts, int64_t queries, int64_t topk, int64_t key_end) {
    key_end_ = key_end;
    int32_t* begin = key_begin_.data();  // [key_end + 1]
    std::fill_n(begin, key_end + 1, 0);
    for (int64_t i = 0; i < queries; ++i)
      for (int32_t c = 0; c < counts[i]; ++c) ++begin[indices[i * topk + c] + 1];
    for (int64_t j = 0; j < key_end; ++j) begin[j + 1] += begin[j];
    for (int64_t i = 0; i < queries; ++i)
      for (int32_t c = 0; c < counts[i]; ++c) {
        const int32_t s = begin[indices[i * topk + c]]++;
        query_[s] = int32_t(i);
        column_[s] = c;
      }
    // Each begin[j] has advanced to the end of key j, the start of key j + 1: shift them back.
    std::copy_backward(begin, begin + key_end, begin + key_end + 1);
    begin[0] = 0;
  }
  int64_t size() const { return key_begin_[key_end_]; }
  int64_t begin(int64_t j) const { return key_begin_[j]; }
  int64_t end(int64_t j) const { return key_begin_[j + 1]; }
  int64_t query(int64_t s) const { return query_[s]; }
  int64_t column(int64_t s) const { return column_[s]; }

  // Bytes of a KeyMajorPairs for kv_len keys and max_pairs pairs.
  static int64_t bytes(int64_t kv_len, int64_t max_pairs) {
    return (kv_len + 1 + 2 * max_pairs) * int64_t(sizeof(int32_t));
  }

 private:
  Buffer<int32_t> key_begin_;  // [kv_len + 1]
  Buffer<int32_t> query_;      // [max_pairs]
  Buffer<int32_t> column_;     // [max_pairs]
  int64_t key_end_ = 0;
};

// Bytes of the backward's shared buffers: the gathered rows [threads, kKeyTile] (int32), two chunks'
// KeyMajorPairs, P and dS [chunk, group, topk].
int64_t chunk_bytes(const Geometry& geo, const SparseAttentionTiling& tiling, int threads, int64_t element_bytes) {
  const int64_t pairs = chunk_queries(geo.s, tiling) * geo.s.topk;
  return threads * kKeyTile * int64_t(sizeof(int32_t)) + 2 * KeyMajorPairs::bytes(geo.s.kv_len, pairs) +
         2 * pairs * geo.group * element_bytes;
}

// Bytes of the HeadRows copies of k and v (forward), and of dk, dv and the group's q and dout
// (backward); the rows read are bf16 (2 bytes) or elements, the accumulated dk and dv elements.
int64_t forward_head_copy_bytes(const SparseAttentionSizes& s, int64_t element_bytes, bool bf16_rows) {
  const int64_t row_bytes = bf16_rows ? int64_t(sizeof(bf16)) : element_bytes;
  return HeadRows<char>::copy_count(s.kv_len, s.kv_heads, s.qk_dim + s.v_dim, bf16_rows) * row_bytes;
}
int64_t backward_head_copy_bytes(const Geometry& geo, int64_t element_bytes, bool bf16_rows) {
  const SparseAttentionSizes& s = geo.s;
  const int64_t row_bytes = bf16_rows ? int64_t(sizeof(bf16)) : element_bytes;
  return forward_head_copy_bytes(s, element_bytes, false) + forward_head_copy_bytes(s, element_bytes, bf16_rows) +
         HeadRows<char>::copy_count(s.q_len, s.kv_heads, geo.group * (s.qk_dim + s.v_dim), bf16_rows) * row_bytes;
}

// A kernel's peak bytes of Buffers: the counts, with the marks, then the per-thread workspace and
// the shared buffers.
int64_t kernel_bytes(const SparseAttentionSizes& s, int threads, int64_t per_thread, int64_t shared_bytes,
                     int64_t element_bytes) {
  return counts_count(s) * int64_t(sizeof(int32_t)) +
         std::max(marks_count(s, threads) * int64_t(sizeof(uint8_t)), per_thread * threads * element_bytes + shared_bytes);
}

}  // namespace

int64_t sparse_attention_forward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                 int64_t element_bytes, bool bf16_rows) {
  return kernel_bytes(sizes, threads, forward_per_thread(Geometry(sizes), element_bytes, bf16_rows),
                      forward_head_copy_bytes(sizes, element_bytes, bf16_rows), element_bytes);
}

int64_t sparse_attention_backward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                  int64_t element_bytes, bool bf16_rows,
                                                  const SparseAttentionTiling& tiling) {
  const Geometry geo(sizes);
  return kernel_bytes(sizes, threads, backward_per_thread(geo, element_bytes, bf16_rows),
                      backward_head_copy_bytes(geo, element_bytes, bf16_rows) +
                          chunk_bytes(geo, tiling, threads, element_bytes),
                      element_bytes);
}

namespace {

// The forward with the selected rows read as R (T, or bf16 for float).
template <class T, class R>
void forward_with_rows(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                       const SparseAttentionSizes& sizes) {
  const Geometry geo(sizes);
  const Buffer<int32_t> counts = selected_counts(indices, geo);  // [batch, q_len]
  const int64_t group = geo.group, qk_dim = sizes.qk_dim, v_dim = sizes.v_dim;
  const int64_t per_thread = forward_per_thread(geo, sizeof(T), !std::is_same_v<R, T>);  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  const T scale = T(sizes.scale);

  HeadRows<T, R> k_head(sizes.kv_len, sizes.kv_heads, qk_dim), v_head(sizes.kv_len, sizes.kv_heads, v_dim);
  for (int64_t b = 0; b < sizes.batch; ++b) {
    for (int64_t kvh = 0; kvh < sizes.kv_heads; ++kvh) {
      const R* k_rows_of_head = k_head.load(k, b, kvh);  // [kv_len, qk_dim]
      const R* v_rows_of_head = v_head.load(v, b, kvh);  // [kv_len, v_dim]
      parallel_for_dynamic(sizes.q_len, sizes.topk * group * (qk_dim + v_dim), [&](int64_t t) {
        const int64_t row = b * sizes.q_len + t;
        const int32_t* selected = indices + row * sizes.topk;  // [count] key positions
        const int64_t count = counts[row];
        T* scores = workspace.data() + per_thread * omp_get_thread_num();  // [group, kKeyTile]
        T* row_max = scores + group * kKeyTile;                            // [group]
        T* row_sum = row_max + group;                                      // [group]
        T* rounded_q = row_sum + group;                                    // [group, qk_dim] with bf16 rows
        // [group, qk_dim]
        const T* q_rows = operand_rows<T, R>(q + geo.q_index(b, t, kvh * group), group * qk_dim, rounded_q);
        T* out_rows = out + geo.out_index(b, t, kvh * group);  // [group, v_dim]: unnormalized until the end
        std::fill(out_rows, out_rows + group * v_dim, T(0));
        std::fill(row_max, row_max + group, -std::numeric_limits<T>::infinity());
        std::fill(row_sum, row_sum + group, T(0));
        for (int64_t c0 = 0; c0 < count; c0 += kKeyTile) {
          const int64_t n = std::min(kKeyTile, count - c0);
          // scores[group, n] = scale · q_rows · k[b, selected[c0 + c], kvh], read in place
          const RowSet<R> k_rows{k_rows_of_head, qk_dim, selected + c0};
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
          const RowSet<R> v_rows{v_rows_of_head, v_dim, selected + c0};
          for (int64_t g = 0; g < group; ++g)
            add_weighted_rows(out_rows + g * v_dim, scores + g * kKeyTile, 1, n, v_rows, v_dim);
        }
        for (int64_t g = 0; g < group; ++g) {
          const T inv = T(1) / row_sum[g];
          T* out_row = out_rows + g * v_dim;
          for (int64_t e = 0; e < v_dim; ++e) out_row[e] *= inv;
          lse[geo.lse_index(b, kvh * group + g, t)] = row_max[g] + std::log(row_sum[g]);
        }
      });
    }
  }
}

// The backward with the selected rows, and the queries' rows gathered by key, read as R.
template <class T, class R>
void backward_with_rows(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const int32_t* indices, const SparseAttentionSizes& sizes,
                        const SparseAttentionTiling& tiling) {
  const Geometry geo(sizes);
  const Buffer<int32_t> counts = selected_counts(indices, geo);  // [batch, q_len]
  const int64_t group = geo.group, qk_dim = sizes.qk_dim, v_dim = sizes.v_dim;
  const int64_t per_thread = backward_per_thread(geo, sizeof(T), !std::is_same_v<R, T>);  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  const int64_t chunk = chunk_queries(sizes, tiling), max_pairs = chunk * sizes.topk;
  KeyMajorPairs sorted_pairs[2] = {KeyMajorPairs(sizes.kv_len, max_pairs), KeyMajorPairs(sizes.kv_len, max_pairs)};
  Buffer<T> chunk_probs(max_pairs * group);     // [chunk, group, topk]: P
  Buffer<T> chunk_dscores(max_pairs * group);   // [chunk, group, topk]: scale · dS
  Buffer<int32_t> gathered_rows(kKeyTile * num_threads());  // [threads, kKeyTile]
  const T scale = T(sizes.scale);

  const int64_t kv_len = sizes.kv_len, q_len = sizes.q_len, kv_heads = sizes.kv_heads, topk = sizes.topk;
  HeadRows<T, R> k_head(kv_len, kv_heads, qk_dim), v_head(kv_len, kv_heads, v_dim);
  HeadRows<T> dk_head(kv_len, kv_heads, qk_dim), dv_head(kv_len, kv_heads, v_dim);
  HeadRows<T, R> q_group(q_len, kv_heads, group * qk_dim), dout_group(q_len, kv_heads, group * v_dim);
  // Chunks are numbered in the order the loops below take them, (b, kvh, t0); chunk n's pairs are
  // sorted into sorted_pairs[n % 2] by one thread while the others start the previous chunk's
  // query-major pass (sorting is sequential).
  const int64_t chunks_per_head = (q_len + chunk - 1) / chunk, chunks = sizes.batch * kv_heads * chunks_per_head;
  const auto sort_chunk = [&](int64_t number) {
    const int64_t b = number / (kv_heads * chunks_per_head), t0 = number % chunks_per_head * chunk;
    const int64_t t1 = std::min(q_len, t0 + chunk);
    sorted_pairs[number % 2].sort(indices + (b * q_len + t0) * topk, counts.data() + b * q_len + t0, t1 - t0, topk,
                            geo.visible_end(t1 - 1));
  };
  sort_chunk(0);
  int64_t chunk_number = 0;
  for (int64_t b = 0; b < sizes.batch; ++b) {
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
      const R* k_rows_of_head = k_head.load(k, b, kvh);  // [kv_len, qk_dim]
      const R* v_rows_of_head = v_head.load(v, b, kvh);  // [kv_len, v_dim]
      T* dk_rows_of_head = dk_head.zeroed(dk, b, kvh);   // [kv_len, qk_dim]
      T* dv_rows_of_head = dv_head.zeroed(dv, b, kvh);   // [kv_len, v_dim]
      // Query head g of the group at position t is row t · group + g of these.
      const R* q_rows_of_group = q_group.load(q, b, kvh);           // [q_len · group, qk_dim]
      const R* dout_rows_of_group = dout_group.load(dout, b, kvh);  // [q_len · group, v_dim]
      for (int64_t t0 = 0; t0 < q_len; t0 += chunk, ++chunk_number) {
        const int64_t t1 = std::min(q_len, t0 + chunk), key_end = geo.visible_end(t1 - 1);
        const KeyMajorPairs& pairs = sorted_pairs[chunk_number % 2];
        const int64_t sorts = chunk_number + 1 < chunks ? 1 : 0;  // item 0 sorts the next chunk
        // Query-major: P, dS and dq of each query, P and dS kept for the key-major pass.
        parallel_for_dynamic(sorts + t1 - t0, topk * group * (qk_dim + v_dim), [&](int64_t item) {
          if (item < sorts) return sort_chunk(chunk_number + 1);
          const int64_t i = item - sorts, t = t0 + i, row = b * q_len + t;
          const int32_t* selected = indices + row * topk;  // [count] key positions
          const int64_t count = counts[row];
          T* probs = workspace.data() + per_thread * omp_get_thread_num();  // [group, kKeyTile]: P, then scale · dS
          T* dprobs = probs + group * kKeyTile;                              // [group, kKeyTile]
          T* lse_rows = dprobs + group * kKeyTile;                           // [group]
          T* dot_rows = lse_rows + group;                                    // [group]
          T* rounded_q = dot_rows + group + 2 * kKeyTile;                    // [group, qk_dim] with bf16 rows
          T* rounded_dout = rounded_q + group * qk_dim;                      // [group, v_dim] with bf16 rows
          // [group, qk_dim]
        const T* q_rows = operand_rows<T, R>(q + geo.q_index(b, t, kvh * group), group * qk_dim, rounded_q);
          const T* dout_rows =
              operand_rows<T, R>(dout + geo.out_index(b, t, kvh * group), group * v_dim, rounded_dout);  // [group, v_dim]
          const T* out_rows = out + geo.out_index(b, t, kvh * group);   // [group, v_dim]
          T* dq_rows = dq + geo.q_index(b, t, kvh * group);             // [group, qk_dim]
          T* kept_probs = chunk_probs.data() + i * group * topk;        // [group, topk]
          T* kept_dscores = chunk_dscores.data() + i * group * topk;    // [group, topk]
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
            const RowSet<R> k_rows{k_rows_of_head, qk_dim, selected + c0};
            const RowSet<R> v_rows{v_rows_of_head, v_dim, selected + c0};
            // probs[group, n] = exp(scale · q_rows · k_rows − lse);  dprobs[group, n] = dout_rows · v_rows
            row_dots(probs, kKeyTile, q_rows, group, k_rows, n, qk_dim, scale);
            for (int64_t g = 0; g < group; ++g) exp_shifted_sum(probs + g * kKeyTile, n, lse_rows[g]);
            row_dots(dprobs, kKeyTile, dout_rows, group, v_rows, n, v_dim, T(1));
            for (int64_t g = 0; g < group; ++g) std::copy_n(probs + g * kKeyTile, n, kept_probs + g * topk + c0);
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
            for (int64_t g = 0; g < group; ++g) std::copy_n(probs + g * kKeyTile, n, kept_dscores + g * topk + c0);
          }
        });
        // Key-major: dv[j] += Σ P · dout and dk[j] += Σ scale · dS · q over the pairs selecting key j,
        // in (t, column, g) order, each row of dk and dv loaded and stored once per kKeyTile terms.
        const int64_t mean_terms = std::max<int64_t>(1, pairs.size() * group / key_end);
        parallel_for_dynamic(key_end, mean_terms * (qk_dim + v_dim), [&](int64_t j) {
          T* weights = workspace.data() + per_thread * omp_get_thread_num() + 2 * group * kKeyTile + 2 * group;
          T* dscore_weights = weights + kKeyTile;                                 // [kKeyTile]
          int32_t* rows = gathered_rows.data() + kKeyTile * omp_get_thread_num();  // [kKeyTile]
          const RowSet<R> dout_set{dout_rows_of_group, v_dim, rows};  // [terms, v_dim]
          const RowSet<R> q_set{q_rows_of_group, qk_dim, rows};       // [terms, qk_dim]
          int64_t terms = 0;
          const auto flush = [&] {
            add_weighted_rows(dv_rows_of_head + j * v_dim, weights, 1, terms, dout_set, v_dim);
            add_weighted_rows(dk_rows_of_head + j * qk_dim, dscore_weights, 1, terms, q_set, qk_dim);
            terms = 0;
          };
          for (int64_t p = pairs.begin(j); p < pairs.end(j); ++p) {
            const int64_t i = pairs.query(p), c = pairs.column(p);
            for (int64_t g = 0; g < group; ++g) {
              if (terms == kKeyTile) flush();
              rows[terms] = int32_t((t0 + i) * group + g);
              weights[terms] = chunk_probs[(i * group + g) * topk + c];
              dscore_weights[terms] = chunk_dscores[(i * group + g) * topk + c];
              ++terms;
            }
          }
          if (terms > 0) flush();
        });
      }
      dk_head.store(dk, b, kvh);
      dv_head.store(dv, b, kvh);
    }
  }
}

}  // namespace

template <class T>
void sparse_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                              const SparseAttentionSizes& sizes) {
  if constexpr (std::is_same_v<T, float>)
    if (rows_in_bf16()) return forward_with_rows<T, bf16>(out, lse, q, k, v, indices, sizes);
  forward_with_rows<T, T>(out, lse, q, k, v, indices, sizes);
}

template <class T>
void sparse_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const T* lse, const int32_t* indices, const SparseAttentionSizes& sizes,
                               const SparseAttentionTiling& tiling) {
  if constexpr (std::is_same_v<T, float>)
    if (rows_in_bf16()) return backward_with_rows<T, bf16>(dq, dk, dv, dout, q, k, v, out, lse, indices, sizes, tiling);
  backward_with_rows<T, T>(dq, dk, dv, dout, q, k, v, out, lse, indices, sizes, tiling);
}

template void sparse_attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                              const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                               const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                               const float*, const float*, const float*, const int32_t*,
                                               const SparseAttentionSizes&, const SparseAttentionTiling&);
template void sparse_attention_backward<double>(double*, double*, double*, const double*, const double*,
                                                const double*, const double*, const double*, const double*,
                                                const int32_t*, const SparseAttentionSizes&, const SparseAttentionTiling&);

}  // namespace trillion
