// Whole-model gradient check against central finite differences. See gradient_check.h.
#include "model/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "model/lightning_indexer.h"
#include "model/model.h"

namespace trillion {
namespace {

// Fourth-order central difference of f along a coordinate (or direction) at step h.
double central_difference(const std::function<double(double)>& f, double h) {
  return (8.0 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12.0 * h);
}

}  // namespace

GradientCheckBatch gradient_check_batch(const ModelConfig& config, const GradientCheckOptions& options) {
  if (options.batch <= 0 || options.seq <= 0)
    fail("gradient check: --batch ", options.batch, " and --seq-len ", options.seq, ": expected positive integers");
  if (!(options.step > 0.0) || !std::isfinite(options.step))
    fail("gradient check: --step ", options.step, ": expected a positive finite number");
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

GradientCheckReport check_model_gradients(const ModelConfig& config, const GradientCheckOptions& options) {
  const GradientCheckBatch batch = gradient_check_batch(config, options);
  const std::vector<int32_t>& tokens = batch.tokens;
  const std::vector<int32_t>& targets = batch.targets;
  const LossScales& scales = batch.scales;
  Model<double> model(config);
  model.init_weights(options.seed);
  if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
  model.zero_grads();
  model.forward_backward(tokens.data(), targets.data(), options.batch, options.seq, scales);
  model.decisions().start_replay();  // perturbed passes keep the unperturbed routing
  const double* grads = model.grads();
  double* params = model.params();
  // The objective a tensor's gradient is of: the indexer's detached loss counts for its own tensors only.
  const auto loss_for = [&](const ParamSpec& spec) {
    const bool indexer_tensor = is_indexer_tensor(spec.name);
    return [&, indexer_tensor] {
      const StepResult r = model.forward_loss(tokens.data(), targets.data(), options.batch, options.seq);
      double total = r.objective(scales);
      for (const LossTerm& term : r.aux)
        if (term.name == "indexer_loss" && !indexer_tensor) total -= term.coef * term.value * scales.aux;
      return total;
    };
  };

  GradientCheckReport report;
  report.full = model.table().num_elements() <= options.max_full_elements;
  for (const ParamSpec& spec : model.table().entries()) {
    if (!spec.trainable()) continue;  // buffers (the router correction bias) have no gradient
    TensorCheck check;
    check.name = spec.name;
    const auto loss = loss_for(spec);
    double* theta = params + spec.offset;
    const double* grad = grads + spec.offset;
    const int64_t numel = spec.numel();
    const auto record = [&](double analytic, double numeric) {
      check.max_abs_err = std::max(check.max_abs_err, std::abs(analytic - numeric));
      check.max_ref = std::max(check.max_ref, std::abs(numeric));
      ++check.checked;
    };
    if (report.full) {
      for (int64_t i = 0; i < numel; ++i) {
        const double original = theta[i];
        const double h = options.step * std::max(1.0, std::abs(original));
        const double numeric = central_difference(
            [&](double delta) {
              theta[i] = original + delta;
              return loss();
            },
            h);
        theta[i] = original;
        record(grad[i], numeric);
      }
    } else {
      const CounterRng direction_rng(options.seed, "gradcheck.direction." + spec.name);
      std::vector<double> original(theta, theta + numel), direction(numel);
      for (int64_t k = 0; k < options.directions; ++k) {
        double norm_sq = 0.0, analytic = 0.0;
        for (int64_t i = 0; i < numel; ++i) {
          direction[i] = direction_rng.normal(static_cast<uint64_t>(k * numel + i));
          norm_sq += direction[i] * direction[i];
        }
        for (int64_t i = 0; i < numel; ++i) {
          direction[i] /= std::sqrt(norm_sq);
          analytic += grad[i] * direction[i];
        }
        const double numeric = central_difference(
            [&](double delta) {
              for (int64_t i = 0; i < numel; ++i) theta[i] = original[i] + delta * direction[i];
              return loss();
            },
            options.step);
        std::copy(original.begin(), original.end(), theta);
        record(analytic, numeric);
      }
    }
    TRILLION_CHECK(check.checked > 0, "gradient check of ", check.name, " checked nothing");
    // A numeric gradient that is exactly zero compares nothing: the tensor fails (rel_err = ∞).
    check.rel_err = check.max_ref > 0.0 ? check.max_abs_err / check.max_ref : std::numeric_limits<double>::infinity();
    report.checked += check.checked;
    if (report.tensors.empty() || check.rel_err > report.max_rel_err) {
      report.max_rel_err = check.rel_err;
      report.worst_tensor = check.name;
    }
    report.tensors.push_back(check);
  }
  return report;
}

}  // namespace trillion
