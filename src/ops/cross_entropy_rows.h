// One logits row of the LM-head loss turned into its gradient in place, shared by the loss that
// forms its gradients in the forward (ops/cross_entropy.cpp) and the plain 3-GEMM reference
// (ops/ref/cross_entropy_ref.cpp), so both compute softmax with the same vectorized exp and sum
// (ops/vector_exp.h: the row's exps summed in the kernel's 16 float or 8 double lanes, then a fixed
// lane tree), the log-sum-exp and the loss in double:
//   lse = max + log Σ exp(logit − max),  loss = lse − logit[target]
//   dlogits = scale · (1 + 2 z lse) · softmax − scale · onehot(target)   (0 for an ignored target)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cross_entropy.h"
#include "ops/vector_exp.h"

namespace trillion {

// row[vocab]: the logits on entry, dlogits on return; lse and loss (lse − logit[target]) returned.
template <class T>
void logits_row_to_gradient(T* row, int64_t vocab, int32_t target, double scale, double z_loss_coef, double& lse,
                            double& loss) {
  const T target_logit = target == kIgnoreIndex ? T(0) : row[target];
  const T row_max = max_value(row, vocab);
  const double exp_sum = static_cast<double>(exp_shifted_sum(row, vocab, row_max));
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
