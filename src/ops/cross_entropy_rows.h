// One logits row of the LM-head loss turned into its gradient in place, shared by the loss that
// forms its gradients in the forward (ops/cross_entropy.cpp) and the plain 3-GEMM reference
// (ops/ref/cross_entropy_ref.cpp), so both compute softmax with one exp per element and sums in
// double:
//   lse = max + log Σ exp(logit − max),  loss = lse − logit[target]
//   dlogits = scale · (1 + 2 z lse) · softmax − scale · onehot(target)   (0 for an ignored target)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cross_entropy.h"

namespace trillion {

// row[vocab]: the logits on entry, dlogits on return; lse and loss (lse − logit[target]) returned.
template <class T>
void logits_row_to_gradient(T* row, int64_t vocab, int32_t target, double scale, double z_loss_coef, double& lse,
                            double& loss) {
  const T target_logit = target == kIgnoreIndex ? T(0) : row[target];
  const T row_max = *std::max_element(row, row + vocab);
  double exp_sum = 0.0;
  for (int64_t j = 0; j < vocab; ++j) {
    row[j] = std::exp(row[j] - row_max);
    exp_sum += static_cast<double>(row[j]);
  }
  lse = static_cast<double>(row_max) + std::log(exp_sum);
  loss = lse - static_cast<double>(target_logit);
  if (target == kIgnoreIndex) {
    std::fill(row, row + vocab, T(0));
    return;
  }
  const T softmax_weight = static_cast<T>(scale * (1.0 + 2.0 * z_loss_coef * lse) / exp_sum);
  for (int64_t j = 0; j < vocab; ++j) row[j] *= softmax_weight;
  row[target] -= static_cast<T>(scale);
}

}  // namespace trillion
