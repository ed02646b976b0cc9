// Temperature + nucleus sampling (see sampling.h).
#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace trillion {

std::vector<double> sampling_distribution(const std::vector<double>& logits, const SamplingOptions& options) {
  TRILLION_CHECK(!logits.empty(), "empty logits");
  TRILLION_CHECK(options.temperature >= 0.0 && options.top_p > 0.0 && options.top_p <= 1.0, "temperature ",
                 options.temperature, " top_p ", options.top_p);
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<double> probs(vocab, 0.0);  // [vocab]
  if (options.temperature == 0.0) {
    probs[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0;
    return probs;
  }
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp((logits[i] - max_logit) / options.temperature);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  if (options.top_p >= 1.0) return probs;
  // Most likely first; ties by token id ascending.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  double kept_mass = 0.0;
  int64_t kept = 0;
  while (kept < vocab && kept_mass < options.top_p) kept_mass += probs[order[kept++]];
  std::vector<double> nucleus(vocab, 0.0);  // [vocab]
  for (int64_t i = 0; i < kept; ++i) nucleus[order[i]] = probs[order[i]] / kept_mass;
  return nucleus;
}

int32_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, double uniform) {
  const std::vector<double> probs = sampling_distribution(logits, options);
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(probs.size()); ++i) {
    if (probs[i] == 0.0) continue;
    cumulative += probs[i];
    last_nonzero = i;
    if (uniform < cumulative) return i;
  }
  return last_nonzero;  // uniform beyond the rounded total
}

}  // namespace trillion
