// RMSNorm (plain and zero-centred: weight used as 1 + w) and LayerNorm with bias, forward and
// backward. Rows are independent items; RMSNorm's sums over a row run in double in eight lanes
// (core/lane_sum.h), LayerNorm's in index order. The weight (and bias) gradients are summed over
// fixed blocks of kRowBlock rows (one partial per block), then the partials in block order, so they
// do not depend on the thread count.
#include "ops/norm.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/lane_sum.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

constexpr int64_t kRowBlock = 64;

}  // namespace

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t d, double eps, bool zero_centred) {
  PhaseScope scope(Phase::elementwise);
  TRILLION_CHECK(d > 0 && rows >= 0, "rmsnorm sizes rows=", rows, " d=", d);
  const T weight_offset = zero_centred ? T(1) : T(0);
  parallel_for(rows, d, [&](int64_t r) {
    const T* xr = x + r * d;  // [d]
    T* yr = y + r * d;        // [d]
    const double sum_sq = lane_sum(d, [&](int64_t j) { return static_cast<double>(xr[j]) * xr[j]; });
    const T inv = static_cast<T>(1.0 / std::sqrt(sum_sq / static_cast<double>(d) + eps));
    rstd[r] = inv;
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * inv) * (weight_offset + w[j]);
  });
}

int64_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t d, bool has_dw) {
  return has_dw ? (rows + kRowBlock - 1) / kRowBlock * d * int64_t(sizeof(double)) : 0;
}

int64_t layer_norm_backward_workspace_bytes(int64_t rows, int64_t d, bool has_dw, bool has_db) {
  return rmsnorm_backward_workspace_bytes(rows, d, has_dw) + rmsnorm_backward_workspace_bytes(rows, d, has_db);
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                      bool zero_centred, bool accumulate_dx) {
  PhaseScope scope(Phase::elementwise);
  TRILLION_CHECK(d > 0 && rows >= 0, "rmsnorm sizes rows=", rows, " d=", d);
  const T weight_offset = zero_centred ? T(1) : T(0);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // Per-block partial weight gradients, [blocks, d], in double.
  Buffer<double> dw_partial(dw != nullptr ? blocks * d : 0);
  parallel_for(blocks, kRowBlock * d, [&](int64_t b) {
    const int64_t row_end = std::min(rows, (b + 1) * kRowBlock);
    double* dw_block = dw != nullptr ? dw_partial.data() + b * d : nullptr;  // [d]
    for (int64_t r = b * kRowBlock; r < row_end; ++r) {
      const T* xr = x + r * d;    // [d]
      const T* dyr = dy + r * d;  // [d]
      T* dxr = dx + r * d;        // [d]
      const double inv = rstd[r];
      // With g = dy · weight and x̂ = x · rstd: dx = rstd · (g − x̂ · mean(g · x̂)).
      const double dot = lane_sum(d, [&](int64_t j) {
        const double g = static_cast<double>(dyr[j]) * (weight_offset + w[j]);
        return g * xr[j] * inv;
      });
      const double mean_dot = dot / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) {
        const double xhat = xr[j] * inv;
        const double g = static_cast<double>(dyr[j]) * (weight_offset + w[j]);
        const T grad = static_cast<T>(inv * (g - xhat * mean_dot));
        dxr[j] = accumulate_dx ? dxr[j] + grad : grad;
        if (dw_block != nullptr) dw_block[j] += static_cast<double>(dyr[j]) * xhat;
      }
    }
  });
  if (dw == nullptr) return;
  // dw[d] += Σ_blocks dw_partial[b, :], blocks in order.
  parallel_for(d, blocks, [&](int64_t j) {
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) sum += dw_partial[b * d + j];
    dw[j] += static_cast<T>(sum);
  });
}

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows, int64_t d,
                        double eps) {
  PhaseScope scope(Phase::elementwise);
  TRILLION_CHECK(d > 0 && rows >= 0, "layer_norm sizes rows=", rows, " d=", d);
  parallel_for(rows, d, [&](int64_t r) {
    const T* xr = x + r * d;  // [d]
    T* yr = y + r * d;        // [d]
    double sum = 0.0;
    for (int64_t j = 0; j < d; ++j) sum += xr[j];
    const double mu = sum / static_cast<double>(d);
    double sum_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sum_sq += (xr[j] - mu) * (xr[j] - mu);
    const double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(d) + eps);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(inv);
    for (int64_t j = 0; j < d; ++j) yr[j] = static_cast<T>((xr[j] - mu) * inv * w[j] + b[j]);
  });
}

template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         int64_t rows, int64_t d, bool accumulate_dx) {
  PhaseScope scope(Phase::elementwise);
  TRILLION_CHECK(d > 0 && rows >= 0, "layer_norm sizes rows=", rows, " d=", d);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // Per-block partial weight and bias gradients, [blocks, d] each, in double.
  Buffer<double> dw_partial(dw != nullptr ? blocks * d : 0), db_partial(db != nullptr ? blocks * d : 0);
  parallel_for(blocks, kRowBlock * d, [&](int64_t blk) {
    const int64_t row_end = std::min(rows, (blk + 1) * kRowBlock);
    double* dw_block = dw != nullptr ? dw_partial.data() + blk * d : nullptr;  // [d]
    double* db_block = db != nullptr ? db_partial.data() + blk * d : nullptr;  // [d]
    for (int64_t r = blk * kRowBlock; r < row_end; ++r) {
      const T* xr = x + r * d;    // [d]
      const T* dyr = dy + r * d;  // [d]
      T* dxr = dx + r * d;        // [d]
      const double mu = mean[r], inv = rstd[r];
      // With g = dy · w: dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)).
      double g_sum = 0.0, g_xhat_sum = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        const double g = static_cast<double>(dyr[j]) * w[j];
        g_sum += g;
        g_xhat_sum += g * (xr[j] - mu) * inv;
      }
      const double g_mean = g_sum / static_cast<double>(d), g_xhat_mean = g_xhat_sum / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) {
        const double xhat = (xr[j] - mu) * inv;
        const double g = static_cast<double>(dyr[j]) * w[j];
        const T grad = static_cast<T>(inv * (g - g_mean - xhat * g_xhat_mean));
        dxr[j] = accumulate_dx ? dxr[j] + grad : grad;
        if (dw_block != nullptr) dw_block[j] += static_cast<double>(dyr[j]) * xhat;
        if (db_block != nullptr) db_block[j] += dyr[j];
      }
    }
  });
  // dw[d] += Σ_blocks dw_partial[blk, :] and db likewise, blocks in order.
  parallel_for(d, 2 * blocks, [&](int64_t j) {
    double dw_sum = 0.0, db_sum = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (dw != nullptr) dw_sum += dw_partial[blk * d + j];
      if (db != nullptr) db_sum += db_partial[blk * d + j];
    }
    if (dw != nullptr) dw[j] += static_cast<T>(dw_sum);
    if (db != nullptr) db[j] += static_cast<T>(db_sum);
  });
}

#define TRILLION_INSTANTIATE_NORM(T)                                                                      \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double, bool);           \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, bool, \
                                    bool);                                                               \
  template void layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double); \
  template void layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, \
                                       int64_t, bool);
TRILLION_INSTANTIATE_NORM(float)
TRILLION_INSTANTIATE_NORM(double)
#undef TRILLION_INSTANTIATE_NORM

}  // namespace trillion
