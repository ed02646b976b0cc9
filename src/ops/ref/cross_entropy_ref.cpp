// Plain LM head + cross-entropy (see cross_entropy_ref.h): full logits, two-pass log-sum-exp per row
// in double, full dlogits, then two gemms for the gradients. The plain 3-gemm variant computes each
// row's exps once in T (as the fused forward_backward does), so it is also a fair timing baseline.
#include "ops/ref/cross_entropy_ref.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/cross_entropy_rows.h"
#include "ops/gemm.h"

namespace trillion {

template <class T>
CrossEntropyResult lm_head_cross_entropy_forward_ref(T* lse, const T* h, const T* w, const int32_t* targets,
                                                     int64_t rows, int64_t d, int64_t vocab) {
  Buffer<T> logits(rows * vocab);  // [rows, vocab]
  gemm<T>(false, true, rows, vocab, d, T(1), h, d, w, d, T(0), logits.data(), vocab);
  parallel_for(rows, [&](int64_t r) {
    const T* row = logits.data() + r * vocab;  // [vocab]
    const double row_max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - row_max);
    lse[r] = static_cast<T>(row_max + std::log(sum));
  });
  CrossEntropyResult result;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    TRILLION_CHECK(targets[r] >= 0 && targets[r] < vocab, "target ", targets[r], " at row ", r);
    result.loss_sum += static_cast<double>(lse[r]) - static_cast<double>(logits[r * vocab + targets[r]]);
    ++result.count;
  }
  return result;
}

template <class T>
void lm_head_cross_entropy_backward_ref(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, const T* lse,
                                        double scale, int64_t rows, int64_t d, int64_t vocab) {
  Buffer<T> dlogits(rows * vocab);  // [rows, vocab]
  gemm<T>(false, true, rows, vocab, d, T(1), h, d, w, d, T(0), dlogits.data(), vocab);
  parallel_for(rows, [&](int64_t r) {
    T* row = dlogits.data() + r * vocab;  // [vocab]
    if (targets[r] == kIgnoreIndex) {
      std::fill(row, row + vocab, T(0));
      return;
    }
    for (int64_t j = 0; j < vocab; ++j) {
      const double softmax = std::exp(static_cast<double>(row[j]) - static_cast<double>(lse[r]));
      row[j] = static_cast<T>(scale * (softmax - (j == targets[r] ? 1.0 : 0.0)));
    }
  });
  gemm<T>(false, false, rows, d, vocab, T(1), dlogits.data(), vocab, w, d, T(0), dh, d);
  gemm<T>(true, false, vocab, d, rows, T(1), dlogits.data(), vocab, h, d, T(1), dw, d);
}

template <class T>
CrossEntropyResult lm_head_cross_entropy_plain(T* dh, T* dw, T* lse, const T* h, const T* w, const int32_t* targets,
                                               double scale, double z_loss_coef, int64_t rows, int64_t d,
                                               int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r)
    TRILLION_CHECK(targets[r] == kIgnoreIndex || (targets[r] >= 0 && targets[r] < vocab), "target ", targets[r],
                   " at row ", r);
  if (rows == 0) return {};
  Buffer<T> dlogits(rows * vocab);    // [rows, vocab]: logits, then exp(logit − row max), then dlogits
  Buffer<double> row_lse(rows);       // [rows]
  Buffer<double> row_loss(rows);      // [rows] lse − logit[target]
  gemm<T>(false, true, rows, vocab, d, T(1), h, d, w, d, T(0), dlogits.data(), vocab);
  parallel_for(rows, [&](int64_t r) {
    logits_row_to_gradient(dlogits.data() + r * vocab, vocab, targets[r], scale, z_loss_coef, row_lse[r], row_loss[r]);
  });
  CrossEntropyResult result;
  for (int64_t r = 0; r < rows; ++r) {
    if (lse != nullptr) lse[r] = static_cast<T>(row_lse[r]);
    if (targets[r] == kIgnoreIndex) continue;
    result.loss_sum += row_loss[r];
    result.z_loss_sum += row_lse[r] * row_lse[r];
    ++result.count;
  }
  gemm<T>(false, false, rows, d, vocab, T(1), dlogits.data(), vocab, w, d, T(0), dh, d);
  gemm<T>(true, false, vocab, d, rows, T(1), dlogits.data(), vocab, h, d, T(1), dw, d);
  return result;
}

#define TRILLION_INSTANTIATE_CROSS_ENTROPY_REF(T)                                                           \
  template CrossEntropyResult lm_head_cross_entropy_forward_ref<T>(T*, const T*, const T*, const int32_t*, \
                                                                    int64_t, int64_t, int64_t);            \
  template void lm_head_cross_entropy_backward_ref<T>(T*, T*, const T*, const T*, const int32_t*, const T*, \
                                                      double, int64_t, int64_t, int64_t);                   \
  template CrossEntropyResult lm_head_cross_entropy_plain<T>(T*, T*, T*, const T*, const T*, const int32_t*,      \
                                                             double, double, int64_t, int64_t, int64_t);
TRILLION_INSTANTIATE_CROSS_ENTROPY_REF(float)
TRILLION_INSTANTIATE_CROSS_ENTROPY_REF(double)
#undef TRILLION_INSTANTIATE_CROSS_ENTROPY_REF

}  // namespace trillion
