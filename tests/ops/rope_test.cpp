// Rotary embedding: forward against the formula of rope.h (full and partial rotary), backward
// against finite differences, backward ∘ forward = identity, float against double.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

constexpr int64_t kTokens = 5, kHeads = 3, kHeadDim = 10;
const std::vector<int32_t> kPositions = {0, 1, 7, 130, 4095};

void check_forward_formula(int64_t rotary_dim) {
  const double base = 10000.0;
  const std::vector<double> x = random_values(kTokens * kHeads * kHeadDim, 1);
  std::vector<double> y = x;
  rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, rotary_dim, base);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t o = (t * kHeads + h) * kHeadDim;
      for (int64_t i = 0; i < half; ++i) {
        const double theta = kPositions[t] * std::pow(base, -2.0 * i / rotary_dim);
        EXPECT_NEAR(y[o + i], x[o + i] * std::cos(theta) - x[o + i + half] * std::sin(theta), 1e-12);
        EXPECT_NEAR(y[o + i + half], x[o + i + half] * std::cos(theta) + x[o + i] * std::sin(theta), 1e-12);
      }
      for (int64_t i = rotary_dim; i < kHeadDim; ++i) EXPECT_EQ(y[o + i], x[o + i]) << "pass-through dim " << i;
    }
}

TEST(Rope, ForwardMatchesFormulaFullAndPartial) {
  check_forward_formula(kHeadDim);
  check_forward_formula(4);  // partial_rotary_factor 0.4
}

void check_backward(int64_t rotary_dim) {
  const double base = 500.0;
  std::vector<double> x = random_values(kTokens * kHeads * kHeadDim, 2);
  const std::vector<double> r = random_values(x.size(), 3);
  auto loss = [&] {
    std::vector<double> y = x;
    rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, rotary_dim, base);
    return test::weighted_sum(y, r);
  };
  std::vector<double> dx = r;
  rope_backward<double>(dx.data(), kPositions.data(), kTokens, kHeads, kHeadDim, rotary_dim, base);
  test::expect_gradients_match(loss, {{"x", &x, &dx}});
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  check_backward(kHeadDim);
  check_backward(6);
}

TEST(Rope, BackwardInvertsForwardAndFloatAgreesWithDouble) {
  const std::vector<double> x = random_values(kTokens * kHeads * kHeadDim, 4);
  std::vector<double> y = x;
  rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 8, 10000.0);
  std::vector<float> yf = test::cast_values<float>(x);
  rope_forward<float>(yf.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 8, 10000.0);
  EXPECT_LE(test::relative_error(yf, y), 1e-6);
  rope_backward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 8, 10000.0);
  EXPECT_LE(test::relative_error(y, x), 1e-14);
}

}  // namespace
}  // namespace trillion
