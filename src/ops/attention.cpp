// Tiled causal GQA attention (FlashAttention-2 style), see attention.h.
//
// Tiles: a query tile is kQTile query positions of all `group` query heads that share one key/value
// head, stacked as the rows (position, head) of one matrix, so each matrix product against the
// shared key/value tile serves the whole group. Matrix products are single-threaded gemm() calls
// (ops/gemm.h) inside the OpenMP region (OpenBLAS's OpenMP build runs serially when called from a
// parallel region). Only tiles that straddle the causal diagonal or a document start (doc_start) are
// masked; tiles above the diagonal, and in the forward those before every row's document, are skipped.
//
// Forward: one work item per (batch, kv head, query tile); online softmax over key tiles, saving
// lse. Backward: D = rowsum(dout ⊙ out), then one work item per (batch, kv head, key tile) that
// owns its dk/dv rows and walks the query tiles below the diagonal, recomputing P = exp(S − lse).
// Its dq contribution is added to dq in increasing key-tile order: a per-query-tile turn counter
// makes each item wait for its predecessor's contribution (items start in increasing order, so the
// predecessor is always running or done). Results are therefore independent of the thread count.
#include "ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/turns.h"
#include "ops/gemm.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

constexpr int64_t kQTile = 64;  // query positions per tile (rows = kQTile · group)
constexpr int64_t kKTile = 128;  // key positions per tile

int64_t round_up_64_bytes(int64_t count, int64_t elem_bytes) {
  const int64_t per_line = 64 / elem_bytes;
  return (count + per_line - 1) / per_line * per_line;
}

// Index arithmetic shared by forward and backward.
struct Geometry {
  AttentionSizes s;
  int64_t dv, group, q_stride, k_stride, out_stride, v_stride, offset, q_tiles, k_tiles, rows_max;
  explicit Geometry(const AttentionSizes& sizes) : s(sizes) {
    TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.head_dim > 0 && s.kv_heads > 0 && s.q_heads > 0,
                   "bad attention sizes");
    TRILLION_CHECK(s.q_len <= s.kv_len, "attention q_len ", s.q_len, " > kv_len ", s.kv_len);
    TRILLION_CHECK(s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " not a multiple of kv_heads ", s.kv_heads);
    dv = s.value_dim();
    group = s.q_heads / s.kv_heads;
    q_stride = s.q_heads * s.head_dim;
    k_stride = s.kv_heads * s.head_dim;
    out_stride = s.q_heads * dv;
    v_stride = s.kv_heads * dv;
    offset = s.kv_len - s.q_len;
    q_tiles = (s.q_len + kQTile - 1) / kQTile;
    k_tiles = (s.kv_len + kKTile - 1) / kKTile;
    rows_max = kQTile * group;
  }
  // Keys [visible_begin(b, t), visible_end(t)) are visible to query position t of row b.
  int64_t visible_end(int64_t t) const { return t + offset + 1; }
  int64_t visible_begin(int64_t b, int64_t t) const { return s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0; }
  // The largest visible_begin of the rows [t0, t1): tiles of keys before it hold hidden keys.
  int64_t latest_begin(int64_t b, int64_t t0, int64_t t1) const {
    int64_t latest = 0;
    for (int64_t t = t0; t < t1 && s.doc_start != nullptr; ++t) latest = std::max(latest, visible_begin(b, t));
    return latest;
  }
  // Offsets of element (b, t, head h, 0) in q-like / out-like tensors and of (b, j, kv head, 0) in
  // k-like / v-like tensors.
  int64_t q_index(int64_t b, int64_t t, int64_t h) const { return (b * s.q_len + t) * q_stride + h * s.head_dim; }
  int64_t out_index(int64_t b, int64_t t, int64_t h) const { return (b * s.q_len + t) * out_stride + h * dv; }
  int64_t k_index(int64_t b, int64_t j, int64_t kvh) const { return (b * s.kv_len + j) * k_stride + kvh * s.head_dim; }
  int64_t v_index(int64_t b, int64_t j, int64_t kvh) const { return (b * s.kv_len + j) * v_stride + kvh * dv; }
  int64_t lse_index(int64_t b, int64_t h, int64_t t) const { return (b * s.q_heads + h) * s.q_len + t; }
};

// dst[rows = (t − t0)·group + g, width] ← src[b, t, kvh·group + g, :] for t in [t0, t1), src having
// rows of q_heads · width (q-like: width head_dim; out-like: width v_dim).
template <class T>
void gather_group_rows(T* dst, const T* src, int64_t width, const Geometry& geo, int64_t b, int64_t kvh, int64_t t0,
                       int64_t t1) {
  const int64_t chunk = geo.group * width;  // a group's heads are contiguous at one position
  for (int64_t t = t0; t < t1; ++t)
    std::memcpy(dst + (t - t0) * chunk, src + ((b * geo.s.q_len + t) * geo.s.q_heads + kvh * geo.group) * width,
                chunk * sizeof(T));
}

// Sets scores[r, c] = −inf where key j0 + c is not visible to row r's position t0 + r / group of
// batch row b (after the diagonal, or before the query's document).
template <class T>
void mask_hidden(T* scores, int64_t ld, int64_t rows, int64_t cols, const Geometry& geo, int64_t b, int64_t t0,
                 int64_t j0) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r / geo.group;
    const int64_t first_hidden = std::max<int64_t>(geo.visible_end(t) - j0, 0);
    const int64_t last_hidden_before = std::min<int64_t>(geo.visible_begin(b, t) - j0, cols);
    for (int64_t c = 0; c < last_hidden_before; ++c) scores[r * ld + c] = -std::numeric_limits<T>::infinity();
    for (int64_t c = first_hidden; c < cols; ++c) scores[r * ld + c] = -std::numeric_limits<T>::infinity();
  }
}

// Elements of one thread's forward workspace: q_rows [rows, d], acc [rows, dv], scores [rows, kKTile],
// row_max, row_sum [rows].
int64_t forward_per_thread(const Geometry& geo, int64_t elem_bytes) {
  const int64_t rows = geo.rows_max;
  return round_up_64_bytes(rows * (geo.s.head_dim + geo.dv) + rows * kKTile + 2 * rows, elem_bytes);
}

// Elements of one thread's backward workspace: q_rows, dq_part [rows, d]; dout_rows [rows, dv]; probs,
// dprobs [rows, kKTile]; lse_rows, dot_rows [rows]; dk_acc [kKTile, d]; dv_acc [kKTile, dv].
int64_t backward_per_thread(const Geometry& geo, int64_t elem_bytes) {
  const int64_t rows = geo.rows_max, d = geo.s.head_dim;
  return round_up_64_bytes(rows * (2 * d + geo.dv) + 2 * rows * kKTile + 2 * rows + kKTile * (d + geo.dv), elem_bytes);
}

// Elements of the backward's row_dot [batch, q_heads, q_len].
int64_t row_dot_count(const AttentionSizes& s) { return s.batch * s.q_heads * s.q_len; }

}  // namespace

int64_t attention_forward_workspace_bytes(const AttentionSizes& sizes, int threads, int64_t element_bytes) {
  return forward_per_thread(Geometry(sizes), element_bytes) * threads * element_bytes;
}

int64_t attention_backward_workspace_bytes(const AttentionSizes& sizes, int threads, int64_t element_bytes) {
  return (row_dot_count(sizes) + backward_per_thread(Geometry(sizes), element_bytes) * threads) * element_bytes;
}

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& sizes) {
  const Geometry geo(sizes);
  const int64_t d = sizes.head_dim, dv = geo.dv;
  const int64_t rows_max = geo.rows_max;
  const int64_t per_thread = forward_per_thread(geo, sizeof(T));  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  const int64_t items = sizes.batch * sizes.kv_heads * geo.q_tiles;
  const T scale = T(sizes.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();

  parallel_for_dynamic(items, [&](int64_t item) {
    // Largest query tiles (most key tiles) first for load balance.
    const int64_t qt = geo.q_tiles - 1 - item % geo.q_tiles;
    const int64_t kvh = (item / geo.q_tiles) % sizes.kv_heads;
    const int64_t b = item / (geo.q_tiles * sizes.kv_heads);
    T* q_rows = workspace.data() + per_thread * omp_get_thread_num();  // [rows, d]
    T* acc = q_rows + rows_max * d;                                     // [rows, dv]
    T* scores = acc + rows_max * dv;                                    // [rows, kKTile]
    T* row_max = scores + rows_max * kKTile;                            // [rows]
    T* row_sum = row_max + rows_max;                                    // [rows]

    const int64_t t0 = qt * kQTile, t1 = std::min(t0 + kQTile, sizes.q_len);
    const int64_t rows = (t1 - t0) * geo.group;
    gather_group_rows(q_rows, q, d, geo, b, kvh, t0, t1);
    std::fill(acc, acc + rows * dv, T(0));
    std::fill(row_max, row_max + rows, neg_inf);
    std::fill(row_sum, row_sum + rows, T(0));

    const int64_t key_end = geo.visible_end(t1 - 1);  // keys beyond are hidden from every row
    const int64_t latest_begin = geo.latest_begin(b, t0, t1);
    // Key tiles before every row's document are skipped.
    for (int64_t j0 = geo.visible_begin(b, t0) / kKTile * kKTile; j0 < key_end; j0 += kKTile) {
      const int64_t cols = std::min(kKTile, key_end - j0);
      const T* k_tile = k + geo.k_index(b, j0, kvh);  // [cols, d], row stride k_stride
      const T* v_tile = v + geo.v_index(b, j0, kvh);  // [cols, dv], row stride v_stride
      // scores[rows, cols] = scale · q_rows k_tileᵀ
      gemm<T>(false, true, rows, cols, d, scale, q_rows, d, k_tile, geo.k_stride, T(0), scores, kKTile);
      if (j0 + cols > geo.visible_end(t0) || latest_begin > j0) mask_hidden(scores, kKTile, rows, cols, geo, b, t0, j0);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = scores + r * kKTile;
        // Every row sees its own position, so once a tile holds a visible key row_max is a finite
        // score (finite inputs) and the first rescale is exp(−inf) = 0. Until then (document
        // masks: tiles before this row's document) the row's probabilities are zero.
        const T new_max = std::max(row_max[r], max_value(row, cols));
        if (new_max == neg_inf) {
          std::fill(row, row + cols, T(0));
          continue;
        }
        const T rescale = std::exp(row_max[r] - new_max);
        row_sum[r] = row_sum[r] * rescale + exp_shifted_sum(row, cols, new_max);
        row_max[r] = new_max;
        T* acc_row = acc + r * dv;
        for (int64_t c = 0; c < dv; ++c) acc_row[c] *= rescale;
      }
      // acc[rows, dv] += P v_tile
      gemm<T>(false, false, rows, dv, cols, T(1), scores, kKTile, v_tile, geo.v_stride, T(1), acc, dv);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / geo.group, h = kvh * geo.group + r % geo.group;
      const T inv = T(1) / row_sum[r];
      T* out_row = out + geo.out_index(b, t, h);
      for (int64_t c = 0; c < dv; ++c) out_row[c] = acc[r * dv + c] * inv;
      lse[geo.lse_index(b, h, t)] = row_max[r] + std::log(row_sum[r]);
    }
  });
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionSizes& sizes) {
  const Geometry geo(sizes);
  const int64_t d = sizes.head_dim, dvd = geo.dv;
  const int64_t rows_max = geo.rows_max;
  const T scale = T(sizes.scale);

  // row_dot[batch, q_heads, q_len] = rowsum(dout ⊙ out); dq starts at zero.
  Buffer<T> row_dot(row_dot_count(sizes));
  parallel_for(sizes.batch * sizes.q_len, sizes.q_heads * geo.dv, [&](int64_t bt) {
    const int64_t b = bt / sizes.q_len, t = bt % sizes.q_len;
    for (int64_t h = 0; h < sizes.q_heads; ++h) {
      const T* o_row = out + geo.out_index(b, t, h);
      const T* do_row = dout + geo.out_index(b, t, h);
      T dot = 0;
      for (int64_t c = 0; c < dvd; ++c) dot += o_row[c] * do_row[c];
      row_dot[geo.lse_index(b, h, t)] = dot;
    }
    std::fill(dq + geo.q_index(b, t, 0), dq + geo.q_index(b, t, 0) + geo.q_stride, T(0));
  });

  const int64_t per_thread = backward_per_thread(geo, sizeof(T));  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  // Turn counter per (batch, kv head, query tile): the number of key tiles whose dq contribution
  // has been added.
  const int64_t counters = sizes.batch * sizes.kv_heads * geo.q_tiles;
  std::unique_ptr<Turn[]> dq_turn(new Turn[counters]);
  std::atomic<int64_t> next_item{0};
  const int64_t items = sizes.batch * sizes.kv_heads * geo.k_tiles;

  parallel_region([&] {
    T* q_rows = workspace.data() + per_thread * omp_get_thread_num();  // [rows, d]
    T* dout_rows = q_rows + rows_max * d;                               // [rows, dv]
    T* dq_part = dout_rows + rows_max * dvd;                            // [rows, d]
    T* probs = dq_part + rows_max * d;                                  // [rows, kKTile]: P, then dS
    T* dprobs = probs + rows_max * kKTile;                              // [rows, kKTile]
    T* lse_rows = dprobs + rows_max * kKTile;                           // [rows]
    T* dot_rows = lse_rows + rows_max;                                  // [rows]
    T* dk_acc = dot_rows + rows_max;                                    // [kKTile, d]
    T* dv_acc = dk_acc + kKTile * d;                                    // [kKTile, dv]
    // Items are claimed in increasing order, which the dq turn order relies on.
    for (int64_t item = next_item.fetch_add(1); item < items; item = next_item.fetch_add(1)) {
      const int64_t kt = item % geo.k_tiles;
      const int64_t kvh = (item / geo.k_tiles) % sizes.kv_heads;
      const int64_t b = item / (geo.k_tiles * sizes.kv_heads);
      const int64_t j0 = kt * kKTile, cols = std::min(kKTile, sizes.kv_len - j0);
      const T* k_tile = k + geo.k_index(b, j0, kvh);  // [cols, d], row stride k_stride
      const T* v_tile = v + geo.v_index(b, j0, kvh);  // [cols, dv], row stride v_stride
      std::fill(dk_acc, dk_acc + cols * d, T(0));
      std::fill(dv_acc, dv_acc + cols * dvd, T(0));
      // First query position that sees key j0 (document masks hide more, never less).
      const int64_t first_t = std::max<int64_t>(j0 - geo.offset, 0);
      for (int64_t qt = first_t / kQTile; qt < geo.q_tiles; ++qt) {
        const int64_t t0 = qt * kQTile, t1 = std::min(t0 + kQTile, sizes.q_len);
        const int64_t rows = (t1 - t0) * geo.group;
        gather_group_rows(q_rows, q, d, geo, b, kvh, t0, t1);
        gather_group_rows(dout_rows, dout, dvd, geo, b, kvh, t0, t1);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t idx = geo.lse_index(b, kvh * geo.group + r % geo.group, t0 + r / geo.group);
          lse_rows[r] = lse[idx];
          dot_rows[r] = row_dot[idx];
        }
        // probs[rows, cols] = exp(scale · q_rows k_tileᵀ − lse)
        gemm<T>(false, true, rows, cols, d, scale, q_rows, d, k_tile, geo.k_stride, T(0), probs, kKTile);
        if (j0 + cols > geo.visible_end(t0) || geo.latest_begin(b, t0, t1) > j0)
          mask_hidden(probs, kKTile, rows, cols, geo, b, t0, j0);
        for (int64_t r = 0; r < rows; ++r) exp_shifted_sum(probs + r * kKTile, cols, lse_rows[r]);
        // dv_acc[cols, dv] += Pᵀ dout_rows;  dprobs[rows, cols] = dout_rows v_tileᵀ
        gemm<T>(true, false, cols, dvd, rows, T(1), probs, kKTile, dout_rows, dvd, T(1), dv_acc, dvd);
        gemm<T>(false, true, rows, cols, dvd, T(1), dout_rows, dvd, v_tile, geo.v_stride, T(0), dprobs, kKTile);
        // dS = P ⊙ (dP − D), in probs
        for (int64_t r = 0; r < rows; ++r) {
          T* p = probs + r * kKTile;
          const T* dp = dprobs + r * kKTile;
          const T dot = dot_rows[r];
          for (int64_t c = 0; c < cols; ++c) p[c] *= dp[c] - dot;
        }
        // dk_acc[cols, d] += scale · dSᵀ q_rows;  dq_part[rows, d] = scale · dS k_tile
        gemm<T>(true, false, cols, d, rows, scale, probs, kKTile, q_rows, d, T(1), dk_acc, d);
        gemm<T>(false, false, rows, d, cols, scale, probs, kKTile, k_tile, geo.k_stride, T(0), dq_part, d);
        Turn& turn = dq_turn[(b * sizes.kv_heads + kvh) * geo.q_tiles + qt];
        turn.wait_for(kt);
        for (int64_t r = 0; r < rows; ++r) {
          T* dq_row = dq + geo.q_index(b, t0 + r / geo.group, kvh * geo.group + r % geo.group);
          const T* part = dq_part + r * d;
          for (int64_t c = 0; c < d; ++c) dq_row[c] += part[c];
        }
        turn.pass_to(kt + 1);
      }
      for (int64_t j = 0; j < cols; ++j) {
        std::memcpy(dk + geo.k_index(b, j0 + j, kvh), dk_acc + j * d, d * sizeof(T));
        std::memcpy(dv + geo.v_index(b, j0 + j, kvh), dv_acc + j * dvd, dvd * sizeof(T));
      }
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionSizes&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionSizes&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionSizes&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttentionSizes&);

}  // namespace trillion
