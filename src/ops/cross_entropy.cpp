// Fused LM head + cross-entropy (Cut Cross-Entropy style) on CPU.
//
// Forward: row chunks are independent items (parallel); each chunk walks the vocabulary tiles in
// order, computes the tile's logits with one gemm and folds them into an online log-sum-exp kept in
// double per row.
// Backward: row chunks run in order; inside a chunk the vocabulary tiles are the parallel items. A
// tile recomputes its logits, forms dlogits = scale · (softmax − onehot) and
//   dw[tile rows] += dlogitsᵀ · h[chunk]   (the tile owns those rows of dw; chunks add in order),
//   dh_partial[tile] = dlogits · w[tile]   (one partial per tile, summed in tile order afterwards).
// Forward-backward: row chunks run in order, each with three parallel steps: the chunk's logits
// [chunk_rows, vocab] (vocabulary tiles are the items), the softmax and dlogits in place (rows are the
// items; a row's log-sum-exp sums its exps in vocabulary order), then the two gradient gemms as one
// item list: dh[chunk, column block] = dlogits · w[:, column block] (the whole vocabulary in one gemm,
// so no partials) and dw[tile rows] += dlogits[:, tile]ᵀ · h[chunk] (chunks add in order). Under the
// bf16 precision the softmax step also rounds dlogits into a bf16 copy the gradient gemms read.
// Every gemm runs single-threaded inside the OpenMP team and every sum has an order fixed by the
// sizes and the tiling, so results do not depend on the thread count.
#include "ops/cross_entropy.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"
#include "ops/cross_entropy_rows.h"
#include "ops/gemm.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

struct Tiles {
  int64_t row_chunk;    // rows per chunk
  int64_t chunks;       // ceil(rows / row_chunk)
  int64_t vocab_tile;   // vocabulary entries per tile
  int64_t vocab_tiles;  // ceil(vocab / vocab_tile)
};

Tiles make_tiles(int64_t rows, int64_t vocab, const CrossEntropyTiling& tiling) {
  TRILLION_CHECK(tiling.row_chunk > 0 && tiling.vocab_tile > 0 && tiling.max_vocab_tiles > 0,
                 "cross-entropy tiling must be positive");
  Tiles t;
  t.row_chunk = std::max<int64_t>(1, std::min(tiling.row_chunk, rows));
  t.chunks = (rows + t.row_chunk - 1) / t.row_chunk;
  t.vocab_tile = std::min(vocab, std::max(tiling.vocab_tile, (vocab + tiling.max_vocab_tiles - 1) / tiling.max_vocab_tiles));
  t.vocab_tiles = (vocab + t.vocab_tile - 1) / t.vocab_tile;
  return t;
}

void check_targets(const int32_t* targets, int64_t rows, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r)
    TRILLION_CHECK(targets[r] == kIgnoreIndex || (targets[r] >= 0 && targets[r] < vocab), "target ", targets[r],
                   " at row ", r, " outside [0, ", vocab, ") and not the ignore index");
}

// Columns of dh per gradient item of forward_backward.
constexpr int64_t kDhColumnBlock = 256;

}  // namespace

int64_t forward_backward_row_chunk(int64_t rows, int64_t vocab, int64_t element_bytes,
                                   const CrossEntropyTiling& tiling) {
  TRILLION_CHECK(tiling.chunk_logits_bytes > 0 && tiling.row_chunk > 0, "cross-entropy tiling must be positive");
  const int64_t rows_in_budget = tiling.chunk_logits_bytes / (vocab * element_bytes);
  return std::clamp<int64_t>(std::min(rows_in_budget, rows), 1, tiling.row_chunk);
}

int64_t forward_backward_workspace_bytes(int64_t rows, int64_t vocab, int64_t element_bytes, bool bf16_products,
                                         const CrossEntropyTiling& tiling) {
  if (rows == 0) return 0;
  const int64_t row_chunk = forward_backward_row_chunk(rows, vocab, element_bytes, tiling);
  const bool copy = bf16_products && tiling.bf16_dlogits && element_bytes == int64_t(sizeof(float));
  // chunk_logits (and its bf16 copy), row_lse, row_loss
  const int64_t logits_bytes = element_bytes + (copy ? int64_t(sizeof(bf16)) : 0);
  return row_chunk * vocab * logits_bytes + 2 * row_chunk * int64_t(sizeof(double));
}

int64_t forward_then_backward_workspace_bytes(int64_t rows, int64_t d, int64_t vocab, int64_t element_bytes,
                                              int threads, const CrossEntropyTiling& tiling) {
  if (rows == 0) return 0;
  const Tiles tiles = make_tiles(rows, vocab, tiling);
  const int64_t tile = threads * tiles.row_chunk * tiles.vocab_tile * element_bytes;  // scratch
  const int64_t forward = tile + rows * int64_t(sizeof(double)) + threads * 3 * tiles.row_chunk * int64_t(sizeof(double));
  const int64_t backward = tile + tiles.vocab_tiles * tiles.row_chunk * d * element_bytes;  // + dh_partial
  return std::max(forward, backward);
}

template <class T>
CrossEntropyResult lm_head_cross_entropy_forward(T* lse, const T* h, const T* w, const int32_t* targets,
                                                 int64_t rows, int64_t d, int64_t vocab,
                                                 const CrossEntropyTiling& tiling) {
  PhaseScope scope(Phase::loss);
  TRILLION_CHECK(rows >= 0 && d > 0 && vocab > 0, "cross-entropy sizes rows=", rows, " d=", d, " vocab=", vocab);
  check_targets(targets, rows, vocab);
  if (rows == 0) return {};
  const Tiles tiles = make_tiles(rows, vocab, tiling);
  const int64_t tile_elems = tiles.row_chunk * tiles.vocab_tile;
  Buffer<T> scratch(num_threads() * tile_elems);  // [threads, row_chunk, vocab_tile] logits
  Buffer<double> row_loss(rows);                  // [rows] lse − logit[target], 0 where ignored
  // Per-thread running statistics: [threads, 3, row_chunk] = run_max, run_sum, target_logit.
  Buffer<double> row_stats(num_threads() * 3 * tiles.row_chunk);
  parallel_for_dynamic(tiles.chunks, [&](int64_t c) {
    T* logits = scratch.data() + omp_get_thread_num() * tile_elems;  // [chunk_rows, tile_cols]
    const int64_t r0 = c * tiles.row_chunk;
    const int64_t chunk_rows = std::min(tiles.row_chunk, rows - r0);
    double* run_max = row_stats.data() + omp_get_thread_num() * 3 * tiles.row_chunk;  // [chunk_rows]
    double* run_sum = run_max + tiles.row_chunk;                                       // [chunk_rows]
    double* target_logit = run_sum + tiles.row_chunk;                                  // [chunk_rows]
    std::fill(run_max, run_max + chunk_rows, -std::numeric_limits<double>::infinity());
    std::fill(run_sum, run_sum + chunk_rows, 0.0);
    std::fill(target_logit, target_logit + chunk_rows, 0.0);
    for (int64_t t = 0; t < tiles.vocab_tiles; ++t) {
      const int64_t v0 = t * tiles.vocab_tile;
      const int64_t tile_cols = std::min(tiles.vocab_tile, vocab - v0);
      // logits[chunk_rows, tile_cols] = h[r0 : r0 + chunk_rows, d] · w[v0 : v0 + tile_cols, d]ᵀ
      gemm<T>(false, true, chunk_rows, tile_cols, d, T(1), h + r0 * d, d, w + v0 * d, d, T(0), logits, tile_cols);
      for (int64_t r = 0; r < chunk_rows; ++r) {
        T* row = logits + r * tile_cols;  // [tile_cols]: the logits, then their exps
        const int32_t target = targets[r0 + r];
        if (target >= v0 && target < v0 + tile_cols) target_logit[r] = row[target - v0];
        // As logits_row_to_gradient sums a whole row (ops/cross_entropy_rows.h): one tile gives its bits.
        const T tile_max = max_value(row, tile_cols);
        const double tile_sum = static_cast<double>(exp_shifted_sum(row, tile_cols, tile_max));
        const double new_max = std::max(run_max[r], static_cast<double>(tile_max));
        run_sum[r] = run_sum[r] * std::exp(run_max[r] - new_max) + tile_sum * std::exp(tile_max - new_max);
        run_max[r] = new_max;
      }
    }
    for (int64_t r = 0; r < chunk_rows; ++r) {
      const double row_lse = run_max[r] + std::log(run_sum[r]);
      lse[r0 + r] = static_cast<T>(row_lse);
      row_loss[r0 + r] = targets[r0 + r] == kIgnoreIndex ? 0.0 : row_lse - target_logit[r];
    }
  });
  CrossEntropyResult result;
  for (int64_t r = 0; r < rows; ++r) {
    result.loss_sum += row_loss[r];
    result.count += targets[r] != kIgnoreIndex;
  }
  return result;
}

template <class T>
void lm_head_cross_entropy_backward(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, const T* lse,
                                    double scale, int64_t rows, int64_t d, int64_t vocab,
                                    const CrossEntropyTiling& tiling) {
  PhaseScope scope(Phase::loss);
  TRILLION_CHECK(rows >= 0 && d > 0 && vocab > 0, "cross-entropy sizes rows=", rows, " d=", d, " vocab=", vocab);
  check_targets(targets, rows, vocab);
  if (rows == 0) return;
  const Tiles tiles = make_tiles(rows, vocab, tiling);
  const int64_t tile_elems = tiles.row_chunk * tiles.vocab_tile;
  const T weight = static_cast<T>(scale);
  Buffer<T> scratch(num_threads() * tile_elems);                     // [threads, row_chunk, vocab_tile] dlogits
  Buffer<T> dh_partial(tiles.vocab_tiles * tiles.row_chunk * d);     // [vocab_tiles, row_chunk, d]
  for (int64_t c = 0; c < tiles.chunks; ++c) {
    const int64_t r0 = c * tiles.row_chunk;
    const int64_t chunk_rows = std::min(tiles.row_chunk, rows - r0);
    const T* h_chunk = h + r0 * d;  // [chunk_rows, d]
    parallel_for_dynamic(tiles.vocab_tiles, [&](int64_t t) {
      T* dlogits = scratch.data() + omp_get_thread_num() * tile_elems;  // [chunk_rows, tile_cols]
      const int64_t v0 = t * tiles.vocab_tile;
      const int64_t tile_cols = std::min(tiles.vocab_tile, vocab - v0);
      const T* w_tile = w + v0 * d;  // [tile_cols, d]
      gemm<T>(false, true, chunk_rows, tile_cols, d, T(1), h_chunk, d, w_tile, d, T(0), dlogits, tile_cols);
      for (int64_t r = 0; r < chunk_rows; ++r) {
        T* row = dlogits + r * tile_cols;  // [tile_cols]
        const int32_t target = targets[r0 + r];
        if (target == kIgnoreIndex) {
          std::fill(row, row + tile_cols, T(0));
          continue;
        }
        exp_shifted_sum(row, tile_cols, lse[r0 + r]);  // softmax (the sum is not needed)
        for (int64_t j = 0; j < tile_cols; ++j) row[j] *= weight;
        if (target >= v0 && target < v0 + tile_cols) row[target - v0] -= weight;
      }
      // dw[v0 : v0 + tile_cols, d] += dlogitsᵀ · h_chunk
      if (dw != nullptr)
        gemm<T>(true, false, tile_cols, d, chunk_rows, T(1), dlogits, tile_cols, h_chunk, d, T(1), dw + v0 * d, d);
      // dh_partial[t][chunk_rows, d] = dlogits · w_tile
      gemm<T>(false, false, chunk_rows, d, tile_cols, T(1), dlogits, tile_cols, w_tile, d, T(0),
              dh_partial.data() + t * tiles.row_chunk * d, d);
    });
    // dh[r0 + r, :] = Σ_t dh_partial[t][r, :], tiles in order.
    parallel_for(chunk_rows, tiles.vocab_tiles * d, [&](int64_t r) {
      T* out = dh + (r0 + r) * d;  // [d]
      const T* first = dh_partial.data() + r * d;
      std::copy(first, first + d, out);
      for (int64_t t = 1; t < tiles.vocab_tiles; ++t) {
        const T* part = dh_partial.data() + (t * tiles.row_chunk + r) * d;
        for (int64_t j = 0; j < d; ++j) out[j] += part[j];
      }
    });
  }
}

template <class T>
CrossEntropyResult lm_head_cross_entropy_forward_backward(T* dh, T* dw, T* lse, const T* h, const T* w,
                                                          const int32_t* targets, double scale, double z_loss_coef,
                                                          int64_t rows, int64_t d, int64_t vocab,
                                                          const CrossEntropyTiling& tiling) {
  PhaseScope scope(Phase::loss);
  TRILLION_CHECK(rows >= 0 && d > 0 && vocab > 0, "cross-entropy sizes rows=", rows, " d=", d, " vocab=", vocab);
  check_targets(targets, rows, vocab);
  if (rows == 0) return {};
  const Tiles tiles = make_tiles(rows, vocab, tiling);
  const int64_t row_chunk = forward_backward_row_chunk(rows, vocab, static_cast<int64_t>(sizeof(T)), tiling);
  const int64_t chunks = (rows + row_chunk - 1) / row_chunk;
  const int64_t dh_blocks = (d + kDhColumnBlock - 1) / kDhColumnBlock;
  // [row_chunk, vocab]: the chunk's logits, then exp(logit − row max), then dlogits.
  Buffer<T> chunk_logits(row_chunk * vocab);
  Buffer<double> row_lse(row_chunk), row_loss(row_chunk);  // [row_chunk] each; row_loss = lse − logit[target]
  // Under the bf16 precision (tiling.bf16_dlogits): dlogits rounded, registered as chunk_logits' copy;
  // only the gradient products read chunk_logits as an operand, after the softmax pass writes both.
  const bool copy_dlogits =
      std::is_same_v<T, float> && tiling.bf16_dlogits && matmul_precision() == MatmulPrecision::bf16;
  Buffer<bf16> dlogits_bf16(copy_dlogits ? row_chunk * vocab : 0);  // [row_chunk, vocab]
  std::optional<RegisteredBf16Copy> registration;
  if constexpr (std::is_same_v<T, float>) {
    if (copy_dlogits) registration.emplace(chunk_logits.data(), dlogits_bf16.data(), row_chunk * vocab);
  }
  CrossEntropyResult result;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * row_chunk;
    const int64_t chunk_rows = std::min(row_chunk, rows - r0);
    const T* h_chunk = h + r0 * d;  // [chunk_rows, d]
    T* dlogits = chunk_logits.data();  // [chunk_rows, vocab]
    parallel_for_dynamic(tiles.vocab_tiles, [&](int64_t t) {
      const int64_t v0 = t * tiles.vocab_tile;
      const int64_t tile_cols = std::min(tiles.vocab_tile, vocab - v0);
      // logits[:, v0 : v0 + tile_cols] = h_chunk · w[v0 : v0 + tile_cols, d]ᵀ
      gemm<T>(false, true, chunk_rows, tile_cols, d, T(1), h_chunk, d, w + v0 * d, d, T(0), dlogits + v0, vocab);
    });
    parallel_for(chunk_rows, vocab, [&](int64_t r) {
      logits_row_to_gradient(dlogits + r * vocab, vocab, targets[r0 + r], scale, z_loss_coef, row_lse[r], row_loss[r]);
      if constexpr (std::is_same_v<T, float>) {
        if (copy_dlogits) to_bf16(dlogits + r * vocab, dlogits_bf16.data() + r * vocab, vocab);
      }
    });
    for (int64_t r = 0; r < chunk_rows; ++r) {
      if (lse != nullptr) lse[r0 + r] = static_cast<T>(row_lse[r]);
      if (targets[r0 + r] == kIgnoreIndex) continue;
      result.loss_sum += row_loss[r];
      result.z_loss_sum += row_lse[r] * row_lse[r];
      ++result.count;
    }
    // Items [0, dh_blocks) are dh column blocks (the larger gemms, scheduled first), the rest dw tiles.
    parallel_for_dynamic(dh_blocks + (dw != nullptr ? tiles.vocab_tiles : 0), [&](int64_t item) {
      if (item < dh_blocks) {
        const int64_t j0 = item * kDhColumnBlock;
        const int64_t block_cols = std::min(kDhColumnBlock, d - j0);
        // dh[r0 : r0 + chunk_rows, j0 : j0 + block_cols] = dlogits · w[:, j0 : j0 + block_cols]
        gemm<T>(false, false, chunk_rows, block_cols, vocab, T(1), dlogits, vocab, w + j0, d, T(0),
                dh + r0 * d + j0, d);
        return;
      }
      const int64_t v0 = (item - dh_blocks) * tiles.vocab_tile;
      const int64_t tile_cols = std::min(tiles.vocab_tile, vocab - v0);
      // dw[v0 : v0 + tile_cols, d] += dlogits[:, v0 : v0 + tile_cols]ᵀ · h_chunk
      gemm<T>(true, false, tile_cols, d, chunk_rows, T(1), dlogits + v0, vocab, h_chunk, d, T(1), dw + v0 * d, d);
    });
  }
  return result;
}

#define TRILLION_INSTANTIATE_CROSS_ENTROPY(T)                                                                    \
  template CrossEntropyResult lm_head_cross_entropy_forward<T>(T*, const T*, const T*, const int32_t*, int64_t, \
                                                                int64_t, int64_t, const CrossEntropyTiling&);   \
  template void lm_head_cross_entropy_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, double, \
                                                  int64_t, int64_t, int64_t, const CrossEntropyTiling&);     \
  template CrossEntropyResult lm_head_cross_entropy_forward_backward<T>(                                        \
      T*, T*, T*, const T*, const T*, const int32_t*, double, double, int64_t, int64_t, int64_t,                \
      const CrossEntropyTiling&);
TRILLION_INSTANTIATE_CROSS_ENTROPY(float)
TRILLION_INSTANTIATE_CROSS_ENTROPY(double)
#undef TRILLION_INSTANTIATE_CROSS_ENTROPY

}  // namespace trillion
