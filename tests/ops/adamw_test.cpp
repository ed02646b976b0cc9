// AdamW against a hand-computed update (two steps: bias correction, decay off and on), gradient
// clipping fused into the update over spans, and the thread-count independence of the sum of squares.
#include "ops/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

// Two AdamW steps computed by hand for one element, torch.optim.AdamW's order of operations.
double hand_two_steps(double p, double g1, double g2, const AdamWHyper& hyper, bool decay) {
  double m = 0, v = 0;
  const double grads[2] = {g1, g2};
  for (int t = 1; t <= 2; ++t) {
    const double g = grads[t - 1];
    if (decay) p -= hyper.lr * hyper.weight_decay * p;
    m = hyper.beta1 * m + (1 - hyper.beta1) * g;
    v = hyper.beta2 * v + (1 - hyper.beta2) * g * g;
    const double m_hat = m / (1 - std::pow(hyper.beta1, t));
    const double v_hat = v / (1 - std::pow(hyper.beta2, t));
    p -= hyper.lr * m_hat / (std::sqrt(v_hat) + hyper.eps);
  }
  return p;
}

template <class T>
void check_two_steps(bool decay, double tolerance) {
  AdamWHyper hyper;
  hyper.lr = 0.01;
  hyper.weight_decay = 0.3;
  const std::vector<double> p0 = {0.5, -1.5, 2.0, 0.0, 3.0}, g1 = {0.1, -0.2, 3.0, 1e-3, 0.0},
                            g2 = {-0.3, -0.1, 2.0, 1e-3, 0.5};
  std::vector<T> p = test::cast_values<T>(p0), m(p0.size()), v(p0.size());
  const std::vector<T> g1t = test::cast_values<T>(g1), g2t = test::cast_values<T>(g2);
  const int64_t n = static_cast<int64_t>(p0.size());
  const std::vector<AdamWSpan> spans = {{0, n, decay}};
  adamw_step<T>(p.data(), m.data(), v.data(), g1t.data(), spans, 1, hyper);
  // After step 1 the bias-corrected update is lr · sign(g) (up to eps) for a nonzero gradient.
  EXPECT_NEAR(static_cast<double>(p[0]), p0[0] * (decay ? 1 - 0.003 : 1.0) - 0.01, 1e-6);
  adamw_step<T>(p.data(), m.data(), v.data(), g2t.data(), spans, 2, hyper);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(static_cast<double>(p[i]), hand_two_steps(p0[i], g1[i], g2[i], hyper, decay), tolerance)
        << "element " << i << " decay " << decay;
  EXPECT_NEAR(static_cast<double>(m[2]), 0.9 * 0.1 * 3.0 + 0.1 * 2.0, tolerance);
  EXPECT_NEAR(static_cast<double>(v[2]), 0.95 * 0.05 * 9.0 + 0.05 * 4.0, tolerance);
}

TEST(AdamW, TwoStepsMatchHandComputation) {
  for (bool decay : {false, true}) {
    check_two_steps<double>(decay, 1e-14);
    check_two_steps<float>(decay, 1e-6);
  }
}

TEST(AdamW, ClipFactor) {
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0);  // under the limit: unchanged
  EXPECT_DOUBLE_EQ(clip_factor(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0);   // disabled
  EXPECT_EQ(clip_factor(100.0, -1.0), 1.0);  // disabled
}

// Two tensors with a gap between them (a buffer the optimizer skips): the norm covers the spans
// only, and a step with the gradients scaled inside equals a step on pre-scaled gradients.
TEST(AdamW, GlobalNormClippingOverSpans) {
  const std::vector<double> g = {3.0, 0.0, 100.0, 0.0, 4.0, 0.0};  // [a | buffer | b]
  const std::vector<AdamWSpan> spans = {{0, 2, true}, {3, 3, false}};
  const double norm = std::sqrt(sum_of_squares<double>(g.data(), spans));
  EXPECT_DOUBLE_EQ(norm, 5.0);
  const double factor = clip_factor(norm, 1.0);
  std::vector<double> scaled = g;
  for (double& x : scaled) x *= factor;
  AdamWHyper hyper;
  hyper.lr = 0.01;
  std::vector<double> p_fused(6, 0.5), m_fused(6), v_fused(6), p_plain(6, 0.5), m_plain(6), v_plain(6);
  adamw_step<double>(p_fused.data(), m_fused.data(), v_fused.data(), g.data(), spans, 1, hyper, factor);
  adamw_step<double>(p_plain.data(), m_plain.data(), v_plain.data(), scaled.data(), spans, 1, hyper);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(m_fused[i], m_plain[i], 1e-16) << i;
    EXPECT_NEAR(p_fused[i], p_plain[i], 1e-15) << i;
  }
  EXPECT_NEAR(m_fused[0], 0.1 * 3.0 * factor, 1e-16);  // (1 − β1) · the clipped gradient
  EXPECT_EQ(p_fused[2], 0.5);  // the gap is not touched
  EXPECT_EQ(m_fused[2], 0.0);
  EXPECT_LT(p_fused[0], 0.5 * (1 - hyper.lr * hyper.weight_decay));  // decay on, then the update
}

// Many blocks, the last one partial, across spans: the same bits on 1 and 2 threads.
TEST(AdamW, SumOfSquaresIsThreadCountIndependent) {
  const int64_t n = 100003;
  const std::vector<float> g = test::cast_values<float>(test::random_values(n, 1, 3.0));
  const std::vector<AdamWSpan> spans = {{0, 40000, true}, {40000, n - 40000, false}};
  double one = 0, two = 0, plain = 0;
  test::with_threads(1, [&] { one = sum_of_squares<float>(g.data(), spans); });
  test::with_threads(2, [&] { two = sum_of_squares<float>(g.data(), spans); });
  for (float x : g) plain += static_cast<double>(x) * x;
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, plain, 1e-12 * plain);
}

}  // namespace
}  // namespace trillion
