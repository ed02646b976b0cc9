// Whole-model gradient check in double: the analytic gradients of Model<double> (objective = mean
// CE over the non-ignored tokens of a random batch + the router losses) against central finite
// differences, per tensor. The perturbed passes replay the routing of the unperturbed one (the
// model's DecisionLog), so a difference never flips a decision. Buffers (no gradient) are skipped.
// Relative error per tensor: max|analytic − numeric| / max|numeric|; a tensor whose numeric
// gradient is exactly zero gets +∞ (the comparison would check nothing), so it fails.
// Options are validated: batch, seq-len ≥ 1, directions ≥ 1, max_full_elements ≥ 0, step > 0 finite.
//   - every element of every tensor when the model has at most `max_full_elements` parameters;
//   - otherwise `directions` random directions per tensor (directional derivatives).
// The finite difference is the fourth-order central stencil
//   (8 (L(θ+h) − L(θ−h)) − (L(θ+2h) − L(θ−2h))) / (12 h),  h = step · max(1, |θ|),
// h = 1e-4 keeps both the truncation error (O(h⁴), large when h nears the 0.02 scale of weights
// that feed RMSNorms) and the rounding error (O(ε·L / h)) near 1e-8 relative or below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "model/step.h"

namespace trillion {

struct GradientCheckOptions {
  int64_t batch = 2;
  int64_t seq = 7;
  uint64_t seed = 1;  // weights, tokens, targets and directions
  int64_t max_full_elements = 20000;
  int64_t directions = 4;
  double step = 1e-4;
  // Sparse attention layers: the mode and the indexer loss of the checked objective. The indexer's
  // inputs are detached, so its tensors are checked against the full objective and every other
  // tensor against the objective without the indexer loss.
  IndexerMode indexer_mode = IndexerMode::sparse;
  double indexer_loss_coef = 1.0;
};

struct TensorCheck {
  std::string name;
  int64_t checked = 0;  // elements or directions
  double max_abs_err = 0.0;
  double max_ref = 0.0;  // max |numeric|
  double rel_err = 0.0;  // +∞ when max_ref is 0
};

struct GradientCheckReport {
  std::vector<TensorCheck> tensors;
  double max_rel_err = 0.0;
  std::string worst_tensor;
  int64_t checked = 0;  // all elements or directions checked
  bool full = true;     // every element (false: random directions)
};

GradientCheckReport check_model_gradients(const ModelConfig& config, const GradientCheckOptions& options);

// The checked step: its random batch (seeded; one target ignored) and the loss scales of its
// objective (lm = 1 / counted targets). Validates the options.
struct GradientCheckBatch {
  std::vector<int32_t> tokens, targets;  // [batch, seq] each
  LossScales scales;
};
GradientCheckBatch gradient_check_batch(const ModelConfig& config, const GradientCheckOptions& options);

// Per tensor, max |gradient − reference| over max |reference| (a tensor whose reference is all
// zero gets its max |gradient|), for the trainable tensors of `table`; both [trainable_size].
std::vector<TensorCheck> compare_gradients(const ParamTable& table, const double* gradient, const double* reference);

}  // namespace trillion
