// Next-token sampling: greedy, temperature, nucleus truncation and the draw itself.
#include "train/sampling.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace trillion {
namespace {

TEST(Sampling, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<double> logits = {0.1, 2.0, -1.0, 2.0};
  const SamplingOptions greedy{0.0, 1.0};
  for (double u : {0.01, 0.5, 0.99}) EXPECT_EQ(sample_token(logits, greedy, u), 1);
}

TEST(Sampling, TemperatureScalesSoftmax) {
  const std::vector<double> logits = {1.0, 2.0, 0.0};
  const std::vector<double> p = sampling_distribution(logits, {2.0, 1.0});
  const double z = std::exp(0.5) + std::exp(1.0) + 1.0;
  EXPECT_NEAR(p[0], std::exp(0.5) / z, 1e-15);
  EXPECT_NEAR(p[1], std::exp(1.0) / z, 1e-15);
  EXPECT_NEAR(p[2], 1.0 / z, 1e-15);
}

TEST(Sampling, TopPKeepsSmallestNucleusAndRenormalizes) {
  // Probabilities 0.5, 0.25, 0.15, 0.1 (as log-probabilities).
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.1), std::log(0.25)};
  const std::vector<double> p = sampling_distribution(logits, {1.0, 0.7});
  EXPECT_NEAR(p[1], 0.5 / 0.75, 1e-12);
  EXPECT_NEAR(p[3], 0.25 / 0.75, 1e-12);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[2], 0.0);
  // The draw walks the nucleus in token order: u below 2/3 gives token 1, above gives token 3.
  EXPECT_EQ(sample_token(logits, {1.0, 0.7}, 0.6), 1);
  EXPECT_EQ(sample_token(logits, {1.0, 0.7}, 0.7), 3);
}

TEST(Sampling, FrequenciesFollowTheDistribution) {
  const std::vector<double> logits = {0.0, std::log(3.0)};  // p = 0.25, 0.75
  const CounterRng rng(7, "sampling-test");
  int ones = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) ones += sample_token(logits, {1.0, 1.0}, rng.uniform(i));
  EXPECT_NEAR(ones / static_cast<double>(kDraws), 0.75, 0.01);
}

}  // namespace
}  // namespace trillion
