// L2 norm, decay gate and gated RMSNorm (ops/linear_attention_gates.h): forward against the
// formulas, backward against finite differences in double, float against double, and the
// softplus threshold.
#include "ops/linear_attention_gates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

TEST(L2Norm, UnitRowsAndGradient) {
  const int64_t rows = 7, d = 5;
  std::vector<double> x = random_values(rows * d, 1), y(rows * d), inv(rows), dx(rows * d);
  const std::vector<double> r = random_values(rows * d, 2);
  l2norm_forward(y.data(), inv.data(), x.data(), rows, d, 1e-6);
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0.0, norm_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sum += y[i * d + j] * y[i * d + j], norm_sq += x[i * d + j] * x[i * d + j];
    EXPECT_NEAR(sum, norm_sq / (norm_sq + 1e-6), 1e-14);
  }
  l2norm_backward(dx.data(), r.data(), y.data(), inv.data(), rows, d);
  const auto loss = [&] {
    std::vector<double> out(rows * d), scratch(rows);
    l2norm_forward(out.data(), scratch.data(), x.data(), rows, d, 1e-6);
    return test::weighted_sum(out, r);
  };
  test::expect_gradients_match(loss, {{"x", &x, &dx}}, 1e-8);
}

// GDN (one column per head) and KDA (K columns per head) shapes; a, A_log and dt_bias gradients.
TEST(DecayGate, MatchesTheFormulaAndFiniteDifferences) {
  for (const int64_t group : {1, 3}) {
    const int64_t rows = 6, heads = 2, cols = heads * group;
    std::vector<double> a = random_values(rows * cols, 3, 4.0), A_log = random_values(heads, 4);
    std::vector<double> dt_bias = random_values(cols, 5);
    a[0] = 25.0;  // above the softplus threshold: softplus(x) = x
    const std::vector<double> r = random_values(rows * cols, 6);
    std::vector<double> g(rows * cols);
    decay_gate_forward(g.data(), a.data(), A_log.data(), dt_bias.data(), rows, cols, group);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c) {
        const double u = a[i * cols + c] + dt_bias[c];
        const double softplus = u > 20 ? u : std::log(1.0 + std::exp(u));
        EXPECT_NEAR(g[i * cols + c], -std::exp(A_log[c / group]) * softplus, 1e-12);
      }
    std::vector<double> da(rows * cols), dA(heads, 0.0), ddt(cols, 0.0);
    decay_gate_backward(da.data(), dA.data(), ddt.data(), r.data(), a.data(), A_log.data(), dt_bias.data(), rows,
                        cols, group);
    const auto loss = [&] {
      std::vector<double> out(rows * cols);
      decay_gate_forward(out.data(), a.data(), A_log.data(), dt_bias.data(), rows, cols, group);
      return test::weighted_sum(out, r);
    };
    test::expect_gradients_match(loss, {{"a", &a, &da}, {"A_log", &A_log, &dA}, {"dt_bias", &dt_bias, &ddt}}, 1e-7);
  }
}

TEST(GatedRmsNorm, BothGatesMatchTheFormulaAndFiniteDifferences) {
  // d = 37: several column blocks of the dw sum, the last partial.
  for (const auto& [act, d] : {std::pair{GateActivation::silu, int64_t{6}}, {GateActivation::sigmoid, int64_t{6}},
                               {GateActivation::silu, int64_t{37}}}) {
    const int64_t rows = 5;
    std::vector<double> x = random_values(rows * d, 7), z = random_values(rows * d, 8, 3.0);
    std::vector<double> w = random_values(d, 9);
    const std::vector<double> r = random_values(rows * d, 10);
    std::vector<double> y(rows * d), rstd(rows);
    gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, d, 1e-6, act);
    for (int64_t i = 0; i < rows; ++i) {
      double ms = 0.0;
      for (int64_t j = 0; j < d; ++j) ms += x[i * d + j] * x[i * d + j] / double(d);
      for (int64_t j = 0; j < d; ++j) {
        const double zz = z[i * d + j], s = 1.0 / (1.0 + std::exp(-zz));
        const double gate = act == GateActivation::silu ? zz * s : s;
        EXPECT_NEAR(y[i * d + j], w[j] * x[i * d + j] / std::sqrt(ms + 1e-6) * gate, 1e-13);
      }
    }
    std::vector<double> dx(rows * d), dz(rows * d), dw(d, 0.0);
    gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), r.data(), x.data(), z.data(), w.data(), rstd.data(), rows,
                           d, act);
    const auto loss = [&] {
      std::vector<double> out(rows * d), scratch(rows);
      gated_rmsnorm_forward(out.data(), scratch.data(), x.data(), z.data(), w.data(), rows, d, 1e-6, act);
      return test::weighted_sum(out, r);
    };
    test::expect_gradients_match(loss, {{"x", &x, &dx}, {"z", &z, &dz}, {"w", &w, &dw}}, 1e-8);
  }
}

TEST(GatedRmsNorm, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  const int64_t rows = 37, d = 16;
  const std::vector<double> x = random_values(rows * d, 11), z = random_values(rows * d, 12), w = random_values(d, 13);
  const std::vector<double> dy = random_values(rows * d, 14);
  std::vector<double> y(rows * d), rstd(rows), dx(rows * d), dz(rows * d), dw(d, 0.0);
  gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, d, 1e-6, GateActivation::silu);
  gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), dy.data(), x.data(), z.data(), w.data(), rstd.data(), rows,
                         d, GateActivation::silu);
  const auto xf = test::cast_values<float>(x), zf = test::cast_values<float>(z), wf = test::cast_values<float>(w);
  const auto dyf = test::cast_values<float>(dy);
  std::vector<std::vector<float>> runs;
  for (const int threads : {1, 2}) {
    std::vector<float> yf(y.size()), rf(rows), dxf(dx.size()), dzf(dz.size()), dwf(d, 0.0f);
    test::with_threads(threads, [&] {
      gated_rmsnorm_forward(yf.data(), rf.data(), xf.data(), zf.data(), wf.data(), rows, d, 1e-6, GateActivation::silu);
      gated_rmsnorm_backward(dxf.data(), dzf.data(), dwf.data(), dyf.data(), xf.data(), zf.data(), wf.data(), rf.data(),
                             rows, d, GateActivation::silu);
    });
    EXPECT_LE(test::relative_error(yf, y), 1e-6);
    EXPECT_LE(test::relative_error(dxf, dx), 1e-5);
    EXPECT_LE(test::relative_error(dzf, dz), 1e-5);
    EXPECT_LE(test::relative_error(dwf, dw), 1e-5);
    std::vector<float> all = yf;
    for (const auto* v : {&dxf, &dzf, &dwf}) all.insert(all.end(), v->begin(), v->end());
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace trillion
