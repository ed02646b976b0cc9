// Whole-model gradient check against central finite differences. See gradient_check.h.
#include "model/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "model/lightning_indexer.h"

namespace trillion {
namespace {

// The rounding of one forward pass's loss, in units of ε · |L| (see the header).
constexpr double kLossRoundingUnits = 16.0;

// Accumulates one tensor's differences; finish() compares them against the tensor's scale.
class TensorComparison {
 public:
  explicit TensorComparison(std::string name) { check_.name = std::move(name); }

  void add(double analytic, const FiniteDifference& d) { samples_.push_back({analytic, d}); }

  // An element fails when its error beyond its floor exceeds tolerance · (the tensor's max |n|),
  // unless a kink inside its step could account for that excess: then it is skipped.
  TensorCheck finish(double tolerance) {
    for (const Sample& s : samples_) check_.max_ref = std::max(check_.max_ref, std::abs(s.difference.numeric));
    const double allowed = tolerance * check_.max_ref;
    double max_excess = 0.0;
    bool above_noise = false;
    for (const auto& [analytic, d] : samples_) {
      const double error = std::abs(analytic - d.numeric), excess = error - d.noise_floor;
      if (excess > allowed && 0.5 * d.kink_measure + 4.0 * d.noise_floor >= excess) {
        ++check_.skipped;
        continue;
      }
      ++check_.checked;
      check_.max_abs_err = std::max(check_.max_abs_err, error);
      check_.noise_floor = std::max(check_.noise_floor, d.noise_floor);
      max_excess = std::max(max_excess, excess);
      above_noise = above_noise || std::abs(d.numeric) > d.noise_floor;
    }
    check_.rel_err = above_noise ? max_excess / check_.max_ref : std::numeric_limits<double>::infinity();
    return check_;
  }

 private:
  struct Sample {
    double analytic;
    FiniteDifference difference;
  };
  std::vector<Sample> samples_;
  TensorCheck check_;
};

}  // namespace

FiniteDifference finite_difference(const std::function<double(double)>& f, double loss0, double h) {
  const double plus1 = f(h), minus1 = f(-h), plus2 = f(2 * h), minus2 = f(-2 * h);
  FiniteDifference d;
  d.numeric = (8.0 * (plus1 - minus1) - (plus2 - minus2)) / (12.0 * h);
  d.noise_floor = 1.5 * kLossRoundingUnits * std::numeric_limits<double>::epsilon() * std::abs(loss0) / h;
  // The slopes' second differences over [−2h, h] and [−h, 2h].
  const double lower = (plus1 - 3.0 * loss0 + 3.0 * minus1 - minus2) / h;
  const double upper = (plus2 - 3.0 * plus1 + 3.0 * loss0 - minus1) / h;
  d.kink_measure = std::max(std::abs(lower), std::abs(upper));
  return d;
}

bool GradientCheckReport::passed(double tolerance) const {
  if (checked == 0) return false;
  return std::all_of(tensors.begin(), tensors.end(), [&](const TensorCheck& t) { return t.rel_err <= tolerance; });
}

GradientCheckBatch gradient_check_batch(const ModelConfig& config, const GradientCheckOptions& options) {
  if (options.batch <= 0 || options.seq <= 0)
    fail("gradient check: --batch ", options.batch, " and --seq-len ", options.seq, ": expected positive integers");
  if (!(options.step > 0.0) || !std::isfinite(options.step))
    fail("gradient check: --step ", options.step, ": expected a positive finite number");
  if (!(options.tolerance > 0.0) || !std::isfinite(options.tolerance))
    fail("gradient check: --tolerance ", options.tolerance, ": expected a positive finite number");
  if (options.directions < 1) fail("gradient check: --directions ", options.directions, ": expected at least 1");
  if (options.max_full_elements < 0)
    fail("gradient check: --max-elements ", options.max_full_elements, ": expected a non-negative integer");
  const int64_t n = options.batch * options.seq, V = config.vocab_size;
  GradientCheckBatch batch;
  batch.tokens.resize(n);
  batch.targets.resize(n);
  const CounterRng token_rng(options.seed, "gradcheck.tokens"), target_rng(options.seed, "gradcheck.targets");
  for (int64_t i = 0; i < n; ++i) {
    batch.tokens[i] = static_cast<int32_t>(token_rng.bits(i) % V);
    batch.targets[i] = static_cast<int32_t>(target_rng.bits(i) % V);
  }
  if (n > 1) batch.targets[n / 2] = kIgnoreIndex;  // the ignored-target path is checked too
  const int64_t counted =
      std::count_if(batch.targets.begin(), batch.targets.end(), [](int32_t t) { return t != kIgnoreIndex; });
  if (counted == 0) fail("gradient check: every target is ignored");
  batch.scales = LossScales{1.0 / double(counted), 1.0};
  return batch;
}

std::vector<TensorCheck> compare_gradients(const ParamTable& table, const double* gradient, const double* reference) {
  std::vector<TensorCheck> checks;
  for (const ParamSpec& spec : table.entries()) {
    if (!spec.trainable()) continue;
    TensorCheck check;
    check.name = spec.name;
    check.checked = spec.numel();
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) {
      check.max_abs_err = std::max(check.max_abs_err, std::abs(gradient[i] - reference[i]));
      check.max_ref = std::max(check.max_ref, std::abs(reference[i]));
    }
    check.rel_err = check.max_ref > 0.0 ? check.max_abs_err / check.max_ref : check.max_abs_err;
    checks.push_back(check);
  }
  return checks;
}

void compute_analytic_gradient(Model<double>& model, const GradientCheckBatch& batch, const GradientCheckOptions& options) {
  model.init_weights(options.seed);
  if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
  model.zero_grads();
  model.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch, options.seq, batch.scales);
  model.decisions().start_replay();  // perturbed passes keep the unperturbed routing
}

GradientCheckReport check_gradients_numerically(Model<double>& model, const GradientCheckBatch& batch,
                                                const double* analytic, const GradientCheckOptions& options) {
  double* params = model.params();
  // The objective a tensor's gradient is of: the indexer's detached loss counts for its own tensors only.
  const auto loss_for = [&](const ParamSpec& spec) {
    const bool indexer_tensor = is_indexer_tensor(spec.name);
    return [&, indexer_tensor] {
      const StepResult r = model.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq);
      double total = r.objective(batch.scales);
      for (const LossTerm& term : r.aux)
        if (term.name == "indexer_loss" && !indexer_tensor) total -= term.coef * term.value * batch.scales.aux;
      return total;
    };
  };

  GradientCheckReport report;
  report.full = model.table().num_elements() <= options.max_full_elements;
  for (const ParamSpec& spec : model.table().entries()) {
    if (!spec.trainable()) continue;  // buffers (the router correction bias) have no gradient
    TensorComparison comparison(spec.name);
    const auto loss = loss_for(spec);
    const double loss0 = loss();
    double* theta = params + spec.offset;
    const double* grad = analytic + spec.offset;
    const int64_t numel = spec.numel();
    if (report.full) {
      for (int64_t i = 0; i < numel; ++i) {
        const double original = theta[i];
        const auto at = [&](double delta) {
          theta[i] = original + delta;
          return loss();
        };
        const FiniteDifference d = finite_difference(at, loss0, options.step * std::max(1.0, std::abs(original)));
        theta[i] = original;
        comparison.add(grad[i], d);
      }
    } else {
      const CounterRng direction_rng(options.seed, "gradcheck.direction." + spec.name);
      std::vector<double> original(theta, theta + numel), direction(numel);  // [numel] each
      for (int64_t k = 0; k < options.directions; ++k) {
        double norm_sq = 0.0, directional = 0.0;
        for (int64_t i = 0; i < numel; ++i) {
          direction[i] = direction_rng.normal(static_cast<uint64_t>(k * numel + i));
          norm_sq += direction[i] * direction[i];
        }
        for (int64_t i = 0; i < numel; ++i) {
          direction[i] /= std::sqrt(norm_sq);
          directional += grad[i] * direction[i];
        }
        const auto along = [&](double delta) {
          for (int64_t i = 0; i < numel; ++i) theta[i] = original[i] + delta * direction[i];
          return loss();
        };
        const FiniteDifference d = finite_difference(along, loss0, options.step);
        std::copy(original.begin(), original.end(), theta);
        comparison.add(directional, d);
      }
    }
    const TensorCheck check = comparison.finish(options.tolerance);
    report.checked += check.checked;
    report.skipped += check.skipped;
    if (report.tensors.empty() || check.rel_err > report.max_rel_err) {
      report.max_rel_err = check.rel_err;
      report.worst_tensor = check.name;
    }
    report.tensors.push_back(check);
  }
  return report;
}

GradientCheckReport check_model_gradients(const ModelConfig& config, const GradientCheckOptions& options) {
  const GradientCheckBatch batch = gradient_check_batch(config, options);
  Model<double> model(config);
  compute_analytic_gradient(model, batch, options);
  return check_gradients_numerically(model, batch, model.grads(), options);
}

}  // namespace trillion
