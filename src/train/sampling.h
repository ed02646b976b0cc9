// Next-token sampling for generation: temperature scaling and nucleus (top-p) truncation, driven by
// one uniform number per token from the counter-based RNG (so a seed reproduces a generation).
// Temperature 0 is greedy decoding (argmax; ties go to the lowest token id).
#pragma once

#include <cstdint>
#include <vector>

namespace trillion {

struct SamplingOptions {
  double temperature = 1.0;  // ≥ 0; 0 = greedy
  double top_p = 1.0;        // in (0, 1]: keep the smallest set of most likely tokens with mass ≥ top_p
};

// logits [vocab]; uniform in (0, 1).
int32_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, double uniform);

// The probabilities sample_token draws from (after temperature and top-p; zero outside the
// nucleus), for tests and inspection. Greedy gives a one-hot vector.
std::vector<double> sampling_distribution(const std::vector<double>& logits, const SamplingOptions& options);

}  // namespace trillion
