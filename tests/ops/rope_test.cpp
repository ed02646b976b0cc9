// Rotary embedding: forward against the formula of rope.h (full and partial rotary, half-split and
// interleaved pairs, a span at an offset, YaRN's attention factor), YaRN's inv_freq against the
// transformers formula written out here, backward against finite differences, backward ∘ forward =
// identity without YaRN, float against double, tables shared by position against per-token tables.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

constexpr int64_t kTokens = 5, kHeads = 3, kHeadDim = 10;
const std::vector<int32_t> kPositions = {0, 1, 7, 130, 4095};

RopeSpec spec(int64_t rotary_dim, double theta, bool interleaved = false) {
  RopeSpec rope;
  rope.rotary_dim = rotary_dim;
  rope.theta = theta;
  rope.interleaved = interleaved;
  return rope;
}

RopeSpec yarn_spec(int64_t rotary_dim, bool interleaved) {
  RopeSpec rope = spec(rotary_dim, 10000.0, interleaved);
  rope.yarn = {4.0, 16.0, 32.0, 1.0, true};
  rope.attention_factor = 1.1386;
  return rope;
}

// transformers' _compute_yarn_parameters, line by line (without truncate's rounding when !truncate).
std::vector<double> yarn_inv_freq_formula(const RopeSpec& rope) {
  const double dim = double(rope.rotary_dim), base = rope.theta;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(rope.yarn.original_max_positions / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double low = correction_dim(rope.yarn.beta_fast), high = correction_dim(rope.yarn.beta_slow);
  if (rope.yarn.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  std::vector<double> inv_freq;
  for (int64_t i = 0; i < rope.rotary_dim / 2; ++i) {
    const double pos_freq = std::pow(base, 2.0 * double(i) / dim);
    const double extrapolation_factor = 1 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    inv_freq.push_back(1 / (rope.yarn.factor * pos_freq) * (1 - extrapolation_factor) +
                       1 / pos_freq * extrapolation_factor);
  }
  return inv_freq;
}

// Rotates the span [offset, offset + rotary_dim) of x[tokens, heads, stride] and compares with the formula.
void check_forward_formula(const RopeSpec& rope, int64_t stride, int64_t offset) {
  const std::vector<double> x = random_values(kTokens * kHeads * stride, 1);
  std::vector<double> y = x;
  rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, stride, offset, rope);
  const std::vector<double> inv_freq =
      rope.yarn.factor > 0 ? yarn_inv_freq_formula(rope) : rope_inv_freq(spec(rope.rotary_dim, rope.theta));
  const int64_t half = rope.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    if (rope.yarn.factor == 0) {
      EXPECT_NEAR(inv_freq[i], std::pow(rope.theta, -2.0 * i / rope.rotary_dim), 1e-15);
    }
  }
  const double m = rope.attention_factor;
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t o = (t * kHeads + h) * stride;
      std::vector<bool> rotated(stride, false);
      for (int64_t i = 0; i < half; ++i) {
        const double theta = kPositions[t] * inv_freq[i];
        const int64_t a = o + offset + (rope.interleaved ? 2 * i : i);
        const int64_t b = a + (rope.interleaved ? 1 : half);
        EXPECT_NEAR(y[a], m * (x[a] * std::cos(theta) - x[b] * std::sin(theta)), 1e-12);
        EXPECT_NEAR(y[b], m * (x[b] * std::cos(theta) + x[a] * std::sin(theta)), 1e-12);
        rotated[a - o] = rotated[b - o] = true;
      }
      for (int64_t i = 0; i < stride; ++i) {
        if (!rotated[i]) {
          EXPECT_EQ(y[o + i], x[o + i]) << "pass-through dim " << i;
        }
      }
    }
}

TEST(Rope, ForwardMatchesFormulaFullAndPartial) {
  check_forward_formula(spec(kHeadDim, 10000.0), kHeadDim, 0);
  check_forward_formula(spec(4, 10000.0), kHeadDim, 0);  // partial_rotary_factor 0.4
}

TEST(Rope, InterleavedPairsAndSpansAtAnOffset) {
  check_forward_formula(spec(kHeadDim, 10000.0, true), kHeadDim, 0);
  check_forward_formula(spec(4, 500.0, true), kHeadDim, 6);  // MLA: [nope 6 | rope 4]
  check_forward_formula(spec(4, 500.0, false), 12, 5);       // half-split span inside a wider head
}

TEST(Rope, YarnInvFreqAndAttentionFactor) {
  for (bool truncate : {true, false}) {
    RopeSpec rope = yarn_spec(16, false);
    rope.yarn.truncate = truncate;
    const std::vector<double> got = rope_inv_freq(rope), want = yarn_inv_freq_formula(rope);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << i;
    // The ramp really blends: the first pair keeps its frequency, the last is divided by the factor.
    EXPECT_NEAR(got[0], 1.0, 1e-15);
    EXPECT_NEAR(got.back(), std::pow(10000.0, -14.0 / 16) / 4, 1e-15);
  }
  check_forward_formula(yarn_spec(kHeadDim, true), kHeadDim, 0);
  check_forward_formula(yarn_spec(4, false), kHeadDim, 6);
}

void check_backward(const RopeSpec& rope, int64_t offset) {
  std::vector<double> x = random_values(kTokens * kHeads * kHeadDim, 2);
  const std::vector<double> r = random_values(x.size(), 3);
  auto loss = [&] {
    std::vector<double> y = x;
    rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, offset, rope);
    return test::weighted_sum(y, r);
  };
  std::vector<double> dx = r;
  rope_backward<double>(dx.data(), kPositions.data(), kTokens, kHeads, kHeadDim, offset, rope);
  test::expect_gradients_match(loss, {{"x", &x, &dx}});
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  check_backward(spec(kHeadDim, 500.0), 0);
  check_backward(spec(6, 500.0), 0);
  check_backward(spec(6, 500.0, true), 4);
  check_backward(yarn_spec(8, true), 2);
}

TEST(Rope, BackwardInvertsForwardAndFloatAgreesWithDouble) {
  for (bool interleaved : {false, true}) {
    const RopeSpec rope = spec(8, 10000.0, interleaved);
    const std::vector<double> x = random_values(kTokens * kHeads * kHeadDim, 4);
    std::vector<double> y = x;
    rope_forward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 1, rope);
    std::vector<float> yf = test::cast_values<float>(x);
    rope_forward<float>(yf.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 1, rope);
    EXPECT_LE(test::relative_error(yf, y), 1e-6);
    rope_backward<double>(y.data(), kPositions.data(), kTokens, kHeads, kHeadDim, 1, rope);
    EXPECT_LE(test::relative_error(y, x), 1e-14);
  }
}

// Positions inside [0, tokens) share table rows by position (a batch repeating its positions); each
// token rotated alone takes the per-token table. Both must give the same bits, forward and backward.
TEST(Rope, SharedPositionRowsGiveTheBitsOfPerTokenRows) {
  const std::vector<int32_t> packed = {2, 0, 1, 2, 0, 1, 5, 3};  // two rows of a batch, then a tail
  const int64_t tokens = static_cast<int64_t>(packed.size());
  const RopeSpec rope = yarn_spec(8, false);
  for (const bool backward : {false, true}) {
    const auto rotate = backward ? rope_backward<float> : rope_forward<float>;
    const std::vector<float> x = test::cast_values<float>(random_values(tokens * kHeads * kHeadDim, 5));
    std::vector<float> together = x;
    rotate(together.data(), packed.data(), tokens, kHeads, kHeadDim, 2, rope);
    std::vector<float> alone = x;
    for (int64_t t = 0; t < tokens; ++t) {
      rotate(alone.data() + t * kHeads * kHeadDim, packed.data() + t, 1, kHeads, kHeadDim, 2, rope);
    }
    EXPECT_EQ(together, alone) << (backward ? "backward" : "forward");
    EXPECT_NE(together, x);
  }
}

}  // namespace
}  // namespace trillion
