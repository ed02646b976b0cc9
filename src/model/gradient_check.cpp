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

// Halvings of the step that may confirm a kink: each divides a smooth loss's K by 4 and moves a
// kink out of the span unless it lies within 2h/2ⁿ of θ, while a wrong gradient's error stays.
constexpr int kKinkHalvings = 3;

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

void TensorComparison::add(double analytic, double h, const FiniteDifference& d) {
  samples_.push_back({analytic, h, d});
}

TensorCheck TensorComparison::finish(double tolerance, const Redo& redo) {
  for (const Sample& s : samples_) check_.max_ref = std::max(check_.max_ref, std::abs(s.difference.numeric));
  const double allowed = tolerance * check_.max_ref;
  const auto kink_explains = [&](double analytic, const FiniteDifference& d) {
    const double excess = std::abs(analytic - d.numeric) - d.noise_floor;
    return excess > allowed && 0.5 * d.kink_measure + 4.0 * d.noise_floor >= excess;
  };
  double max_excess = 0.0;
  bool above_noise = false, finite = true;
  for (int64_t i = 0; i < static_cast<int64_t>(samples_.size()); ++i) {
    const double analytic = samples_[i].analytic;
    FiniteDifference d = samples_[i].difference;
    double h = samples_[i].h;
    if (kink_explains(analytic, d)) ++check_.refined;
    for (int halving = 0; halving < kKinkHalvings && kink_explains(analytic, d); ++halving) d = redo(i, h /= 2);
    if (kink_explains(analytic, d)) {
      ++check_.skipped;
      continue;
    }
    ++check_.checked;
    const double error = std::abs(analytic - d.numeric);
    finite = finite && std::isfinite(analytic) && std::isfinite(d.numeric);
    check_.max_abs_err = std::max(check_.max_abs_err, error);
    check_.noise_floor = std::max(check_.noise_floor, d.noise_floor);
    max_excess = std::max(max_excess, error - d.noise_floor);
    above_noise = above_noise || std::abs(d.numeric) > d.noise_floor;
  }
  check_.rel_err = !finite       ? std::numeric_limits<double>::quiet_NaN()
                   : above_noise ? max_excess / check_.max_ref
                                 : std::numeric_limits<double>::infinity();
  return check_;
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
  if (options.document_eos >= V)
    fail("gradient check: --document-eos ", options.document_eos, " is outside the vocab of ", V, " tokens");
  const CounterRng eos_rng(options.seed, "gradcheck.documents");
  for (int64_t i = 0; i < n && options.document_eos >= 0; ++i)
    if (eos_rng.bits(i) % 4 == 0) batch.tokens[i] = options.document_eos;
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

template <class T>
void draw_lora_b(Model<T>& model, uint64_t seed) {
  for (const ParamSpec& spec : model.table().entries()) {
    if (!spec.adapter || !spec.name.ends_with(".lora_B.weight")) continue;
    const CounterRng rng(seed, spec.name);
    T* values = model.params() + spec.offset;
    for (int64_t i = 0; i < spec.numel(); ++i) values[i] = static_cast<T>(0.02 * rng.normal(static_cast<uint64_t>(i)));
  }
}
template void draw_lora_b<float>(Model<float>&, uint64_t);
template void draw_lora_b<double>(Model<double>&, uint64_t);

void compute_analytic_gradient(Model<double>& model, const GradientCheckBatch& batch, const GradientCheckOptions& options) {
  model.init_weights(options.seed);
  draw_lora_b(model, options.seed + 1);
  model.set_lora_dropout(LoraDropoutPass{.seed = options.seed});  // one mask for every pass of the check
  if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
  if (options.document_eos >= 0) model.set_document_mask(options.document_eos);
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
    TensorCheck check;
    if (report.full) {
      const auto difference = [&](int64_t i, double h) {
        const double original = theta[i];
        const FiniteDifference d = finite_difference(
            [&](double delta) {
              theta[i] = original + delta;
              return loss();
            },
            loss0, h);
        theta[i] = original;
        return d;
      };
      for (int64_t i = 0; i < numel; ++i) {
        const double h = options.step * std::max(1.0, std::abs(theta[i]));
        comparison.add(grad[i], h, difference(i, h));
      }
      check = comparison.finish(options.tolerance, difference);
    } else {
      const CounterRng direction_rng(options.seed, "gradcheck.direction." + spec.name);
      std::vector<double> original(theta, theta + numel), direction(numel);  // [numel] each
      const auto set_direction = [&](int64_t k) {  // direction ← the k-th random unit vector
        double norm_sq = 0.0;
        for (int64_t i = 0; i < numel; ++i) {
          direction[i] = direction_rng.normal(static_cast<uint64_t>(k * numel + i));
          norm_sq += direction[i] * direction[i];
        }
        for (int64_t i = 0; i < numel; ++i) direction[i] /= std::sqrt(norm_sq);
      };
      const auto difference = [&](int64_t k, double h) {
        set_direction(k);
        const FiniteDifference d = finite_difference(
            [&](double delta) {
              for (int64_t i = 0; i < numel; ++i) theta[i] = original[i] + delta * direction[i];
              return loss();
            },
            loss0, h);
        std::copy(original.begin(), original.end(), theta);
        return d;
      };
      for (int64_t k = 0; k < options.directions; ++k) {
        set_direction(k);
        double directional = 0.0;
        for (int64_t i = 0; i < numel; ++i) directional += grad[i] * direction[i];
        comparison.add(directional, options.step, difference(k, options.step));
      }
      check = comparison.finish(options.tolerance, difference);
    }
    report.checked += check.checked;
    report.skipped += check.skipped;
    report.refined += check.refined;
    const bool worse = std::isnan(check.rel_err) ? !std::isnan(report.max_rel_err) : check.rel_err > report.max_rel_err;
    if (report.tensors.empty() || worse) {
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
