// Whole-model gradient check in double: the analytic gradients of Model<double> (objective = mean
// CE over the non-ignored tokens of a random batch + the router losses) against central finite
// differences, per tensor. The perturbed passes replay the routing of the unperturbed one (the
// model's DecisionLog), so a difference never flips a decision. Buffers (no gradient) are skipped.
// Options are validated: batch, seq-len ≥ 1, directions ≥ 1, max_full_elements ≥ 0, step and
// tolerance > 0 finite.
//   - every element of every tensor when the model has at most `max_full_elements` parameters;
//   - otherwise `directions` random directions per tensor (directional derivatives).
// The finite difference is the fourth-order central stencil
//   n = (8 (L(θ+h) − L(θ−h)) − (L(θ+2h) − L(θ−2h))) / (12 h),  h = step · max(1, |θ|) (directions: step),
// h = 1e-4 keeps the truncation error (O(h⁴), large when h nears the 0.02 scale of weights that feed
// RMSNorms) near 1e-8 relative or below.
//
// What the differences cannot resolve is not counted against the gradient (docs/architecture.md,
// "The gradient check"):
//   - Rounding. Each loss carries about κ·ε·|L| of rounding (ε = 2⁻⁵², κ = 16 for a forward pass),
//     and the stencil's weights sum to 18/12, so n is uncertain by floor = 1.5·κ·ε·|L| / h. An
//     element's excess is max(0, |analytic − n| − floor); a tensor's rel_err is its largest excess
//     over max |n|.
//   - Kinks (ReLU in the indexer's scores, top-k boundaries the replay does not pin). From L(θ) and
//     the stencil's points, the slopes' second differences over [θ−2h, θ+h] and [θ−h, θ+2h]
//       T− = (L(θ+h) − 3 L(θ) + 3 L(θ−h) − L(θ−2h)) / h,   T+ = (L(θ+2h) − 3 L(θ+h) + 3 L(θ) − L(θ−h)) / h
//     are h²·L‴ on a smooth loss, while a slope jump anywhere in (θ−2h, θ+2h) moves n by at most half
//     of K = max(|T−|, |T+|) (the worst case is a kink next to θ). When an element's excess is over
//     tolerance · (the tensor's max |n|) and such a kink could account for it (K/2 + 4·floor ≥ excess;
//     K's own rounding is 16/3 floors), its difference is taken again at h/2, up to 3 times: a
//     smooth loss's K falls 4× per halving and a kink leaves the span unless it lies within 2h/8 of
//     θ, while a wrong gradient's error stays. An element a kink still explains at h/8 is skipped
//     and counted. The one-sided differences would not do: they agree for a kink at 2h/3.
//   - Vacuous checks still fail: a tensor none of whose compared elements has |n| above its floor
//     (a zero numeric gradient, or every element skipped) gets rel_err = +∞. A non-finite analytic or
//     numeric value gets rel_err = NaN, which fails too.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/model.h"
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
  // The relative error a tensor may have beyond the differences' noise floor.
  double tolerance = 1e-6;
  // Sparse attention layers: the mode and the indexer loss of the checked objective. The indexer's
  // inputs are detached, so its tensors are checked against the full objective and every other
  // tensor against the objective without the indexer loss.
  IndexerMode indexer_mode = IndexerMode::sparse;
  double indexer_loss_coef = 1.0;
  // Document masks (Model::set_document_mask): this token ends a document, and the batch holds it at
  // about one position in four, so documents of a few tokens cross every boundary; −1: off.
  int32_t document_eos = -1;
};

struct TensorCheck {
  std::string name;
  int64_t checked = 0;      // elements or directions compared
  int64_t refined = 0;      // elements or directions whose step was halved for a suspected kink
  int64_t skipped = 0;      // of those, the ones a kink still explained at the smallest step
  double max_abs_err = 0.0;  // max |analytic − numeric| over the compared ones
  double max_ref = 0.0;      // max |numeric| over every element or direction, skipped ones included
  double noise_floor = 0.0;  // the largest rounding floor among them (0 when not from finite differences)
  double rel_err = 0.0;      // max excess over its floor / max_ref; +∞ when no |numeric| rose above
                             // its floor, NaN when a value is not finite
  bool vacuous() const { return std::isinf(rel_err); }
};

struct GradientCheckReport {
  std::vector<TensorCheck> tensors;
  double max_rel_err = 0.0;
  std::string worst_tensor;
  int64_t checked = 0;  // all elements or directions compared
  int64_t refined = 0;  // all whose step was halved for a suspected kink
  int64_t skipped = 0;  // all skipped at kinks
  bool full = true;     // every element (false: random directions)
  // Every tensor within tolerance and none vacuous.
  bool passed(double tolerance) const;
};

GradientCheckReport check_model_gradients(const ModelConfig& config, const GradientCheckOptions& options);

// The checked step: its random batch (seeded; one target ignored) and the loss scales of its
// objective (lm = 1 / counted targets). Validates the options.
struct GradientCheckBatch {
  std::vector<int32_t> tokens, targets;  // [batch, seq] each
  LossScales scales;
};
GradientCheckBatch gradient_check_batch(const ModelConfig& config, const GradientCheckOptions& options);

// One element's (or direction's) differences from f(δ) = the loss at θ + δ, f(0) = loss0, step h.
struct FiniteDifference {
  double numeric;       // the fourth-order central difference
  double noise_floor;   // its rounding uncertainty, 1.5·κ·ε·|loss0| / h
  double kink_measure;  // K = max(|T−|, |T+|)
};
FiniteDifference finite_difference(const std::function<double(double)>& f, double loss0, double h);

// One tensor's comparison: add() each element's (or direction's) analytic value, first step and
// differences; finish() compares them against the tensor's scale. An element fails when its error
// beyond its floor exceeds tolerance · (the tensor's max |n|); when a kink could account for that
// excess, redo(sample, h) takes its differences again at half the step, up to 3 times, and an
// element a kink still explains then is skipped. A non-finite value fails the tensor (rel_err NaN).
class TensorComparison {
 public:
  using Redo = std::function<FiniteDifference(int64_t sample, double h)>;
  explicit TensorComparison(std::string name) { check_.name = std::move(name); }
  void add(double analytic, double h, const FiniteDifference& d);
  TensorCheck finish(double tolerance, const Redo& redo);

 private:
  struct Sample {
    double analytic;
    double h;  // the first step
    FiniteDifference difference;
  };
  std::vector<Sample> samples_;
  TensorCheck check_;
};

// Draws every LoRA B of the model from N(0, 0.02²) (by (seed, name, index)): at its initial B = 0,
// each A's gradient is identically zero and a check of it vacuous.
template <class T>
void draw_lora_b(Model<T>& model, uint64_t seed);

// check_model_gradients in its two halves, so that a test can hand the second a gradient of its own.
// The first seeds the weights (and draws LoRA's B), sets the indexer's training, leaves the
// analytic gradient of the batch's objective in model.grads() and the routing recorded for replay.
void compute_analytic_gradient(Model<double>& model, const GradientCheckBatch& batch, const GradientCheckOptions& options);
// Compares `analytic` [trainable_size] with finite differences of the model's objective; the model's
// weights are restored after each perturbation.
GradientCheckReport check_gradients_numerically(Model<double>& model, const GradientCheckBatch& batch,
                                                const double* analytic, const GradientCheckOptions& options);

// Per tensor, max |gradient − reference| over max |reference| (a tensor whose reference is all
// zero gets its max |gradient|), for the trainable tensors of `table`; both [trainable_size].
std::vector<TensorCheck> compare_gradients(const ParamTable& table, const double* gradient, const double* reference);

}  // namespace trillion
