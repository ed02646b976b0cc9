// Causal depthwise conv1d + SiLU (ops/conv1d.h): against a plain formula, backward against finite
// differences in double, packed segments against separate runs, decoding with the carried window
// against the full forward, float against double, and thread-count independence.
#include "ops/conv1d.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

// The formula, one output at a time: silu(Σ_j w[c, j] x[t − W + 1 + j, c]), zero before `first`.
std::vector<double> plain_conv(const std::vector<double>& x, const std::vector<double>& w, int64_t B, int64_t T,
                               int64_t C, int64_t W) {
  std::vector<double> y(B * T * C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double a = 0.0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t src = t - W + 1 + j;
          if (src >= 0) a += w[c * W + j] * x[(b * T + src) * C + c];
        }
        y[(b * T + t) * C + c] = a / (1.0 + std::exp(-a));
      }
  return y;
}

TEST(Conv1dSilu, ForwardMatchesTheFormulaAndBackwardMatchesFiniteDifferences) {
  // C = 70: several channel blocks of the dw sum and σ chunks, the last of each partial.
  for (const auto& [W, C] : {std::pair<int64_t, int64_t>{1, 5}, {4, 5}, {4, 70}}) {
    const int64_t B = 2, T = 11;
    const Conv1dSizes sizes{B, T, C, W, 0};
    std::vector<double> x = random_values(B * T * C, 1), w = random_values(C * W, 2);
    const std::vector<double> r = random_values(B * T * C, 3);  // loss = Σ y ⊙ r
    std::vector<double> y(B * T * C);
    conv1d_silu_forward(y.data(), x.data(), w.data(), nullptr, sizes);
    EXPECT_LE(test::relative_error(y, plain_conv(x, w, B, T, C, W)), 1e-15) << "W " << W << " C " << C;
    std::vector<double> dx(x.size()), dw(w.size(), 0.0);
    conv1d_silu_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), nullptr, sizes);
    const auto loss = [&] { return test::weighted_sum(plain_conv(x, w, B, T, C, W), r); };
    test::expect_gradients_match(loss, {{"x", &x, &dx}, {"w", &w, &dw}}, 1e-8);
  }
}

// The window resets at every segment start: a packed row equals its segments run one by one.
TEST(Conv1dSilu, PackedSegmentsEqualSeparateRuns) {
  const int64_t C = 3, W = 4;
  const std::vector<int32_t> cu = {0, 5, 5, 6, 14};  // lengths 5, 0, 1, 8
  const int64_t T = cu.back(), N = int64_t(cu.size()) - 1;
  const std::vector<double> x = random_values(T * C, 4), w = random_values(C * W, 5), dy = random_values(T * C, 6);
  std::vector<double> y(T * C), dx(T * C), dw(C * W, 0.0);
  const Conv1dSizes packed{1, T, C, W, N};
  conv1d_silu_forward(y.data(), x.data(), w.data(), cu.data(), packed);
  conv1d_silu_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), cu.data(), packed);
  std::vector<double> dw_sum(C * W, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t first = cu[n], len = cu[n + 1] - cu[n];
    if (len == 0) continue;
    const Conv1dSizes one{1, len, C, W, 0};
    std::vector<double> ys(len * C), dxs(len * C);
    conv1d_silu_forward(ys.data(), x.data() + first * C, w.data(), nullptr, one);
    conv1d_silu_backward(dxs.data(), dw_sum.data(), dy.data() + first * C, x.data() + first * C, w.data(), nullptr, one);
    for (int64_t i = 0; i < len * C; ++i) {
      EXPECT_EQ(y[first * C + i], ys[i]) << "segment " << n;
      EXPECT_EQ(dx[first * C + i], dxs[i]) << "segment " << n;
    }
  }
  EXPECT_LE(test::relative_error(dw, dw_sum), 1e-14);
}

// Decoding token by token (and two at a time) through the window equals the full forward; the
// window ends holding the last W − 1 inputs.
TEST(Conv1dSilu, DecodeWithTheCarriedWindowEqualsTheFullForward) {
  const int64_t B = 2, T = 9, C = 4, W = 4;
  const Conv1dSizes sizes{B, T, C, W, 0};
  const std::vector<double> x = random_values(B * T * C, 7), w = random_values(C * W, 8);
  std::vector<double> full(B * T * C);
  conv1d_silu_forward(full.data(), x.data(), w.data(), nullptr, sizes);
  for (const int64_t step : {1, 3}) {
    std::vector<double> history(B * (W - 1) * C, 0.0), y(B * T * C);
    for (int64_t t0 = 0; t0 < T; t0 += step) {
      std::vector<double> xs(B * step * C), ys(B * step * C);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < step * C; ++i) xs[b * step * C + i] = x[(b * T + t0) * C + i];
      conv1d_silu_decode(ys.data(), history.data(), xs.data(), w.data(), step, sizes);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < step * C; ++i) y[(b * T + t0) * C + i] = ys[b * step * C + i];
    }
    EXPECT_LE(test::relative_error(y, full), 1e-15) << "step " << step;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (W - 1) * C; ++i)
        EXPECT_EQ(history[b * (W - 1) * C + i], x[(b * T + T - W + 1) * C + i]);
  }
}

TEST(Conv1dSilu, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  const int64_t B = 3, T = 40, C = 33, W = 4;
  const Conv1dSizes sizes{B, T, C, W, 0};
  const std::vector<double> x = random_values(B * T * C, 9, 3.0), w = random_values(C * W, 10), dy = random_values(B * T * C, 11);
  std::vector<double> y(B * T * C), dx(B * T * C), dw(C * W, 0.0);
  conv1d_silu_forward(y.data(), x.data(), w.data(), nullptr, sizes);
  conv1d_silu_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), nullptr, sizes);
  const std::vector<float> xf = test::cast_values<float>(x), wf = test::cast_values<float>(w);
  const std::vector<float> dyf = test::cast_values<float>(dy);
  std::vector<std::vector<float>> runs;
  for (const int threads : {1, 2}) {
    std::vector<float> yf(y.size()), dxf(dx.size()), dwf(dw.size(), 0.0f);
    test::with_threads(threads, [&] {
      conv1d_silu_forward(yf.data(), xf.data(), wf.data(), nullptr, sizes);
      conv1d_silu_backward(dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), nullptr, sizes);
    });
    EXPECT_LE(test::relative_error(yf, y), 1e-6);
    EXPECT_LE(test::relative_error(dxf, dx), 1e-5);
    EXPECT_LE(test::relative_error(dwf, dw), 1e-5);
    runs.push_back(yf);
    runs.back().insert(runs.back().end(), dxf.begin(), dxf.end());
    runs.back().insert(runs.back().end(), dwf.begin(), dwf.end());
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace trillion
