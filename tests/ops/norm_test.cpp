// RMSNorm (plain and zero-centred) and LayerNorm with bias: forward against the formula, backward
// against finite differences (dx written and accumulated, dw/db accumulated), float against double,
// thread-count independence.
#include "ops/norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

void check_backward(bool zero_centred) {
  const int64_t rows = 7, d = 9;
  const double eps = 1e-6;
  std::vector<double> x = random_values(rows * d, 1, 2.0), w = random_values(d, 2);
  const std::vector<double> r = random_values(rows * d, 3);
  auto loss = [&] {
    std::vector<double> y(rows * d), rstd(rows);
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, d, eps, zero_centred);
    return test::weighted_sum(y, r);
  };
  std::vector<double> y(rows * d), rstd(rows);
  rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, d, eps, zero_centred);
  const std::vector<double> dx_prior = random_values(rows * d, 4), dw_prior = random_values(d, 5);
  std::vector<double> dx = dx_prior, dw = dw_prior;
  rmsnorm_backward<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, d, zero_centred,
                           true);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx_prior[i];
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw_prior[i];
  test::expect_gradients_match(loss, {{"x", &x, &dx}, {"w", &w, &dw}});

  // Written mode overwrites dx; a null dw is skipped.
  std::vector<double> dx_written = dx_prior;
  rmsnorm_backward<double>(dx_written.data(), nullptr, r.data(), x.data(), w.data(), rstd.data(), rows, d,
                           zero_centred, false);
  EXPECT_LE(test::relative_error(dx_written, dx), 1e-13);
}

TEST(RmsNorm, PlainBackwardMatchesFiniteDifferences) { check_backward(false); }
TEST(RmsNorm, ZeroCentredBackwardMatchesFiniteDifferences) { check_backward(true); }

TEST(RmsNorm, ForwardMatchesFormulaAndZeroCentredIsPlainWithOnePlusW) {
  const int64_t rows = 5, d = 13;
  const double eps = 1e-5;
  const std::vector<double> x = random_values(rows * d, 6, 3.0), w = random_values(d, 7);
  std::vector<double> w_plus_one(d);
  for (int64_t j = 0; j < d; ++j) w_plus_one[j] = 1.0 + w[j];
  std::vector<double> plain(rows * d), centred(rows * d), rstd(rows);
  rmsnorm_forward<double>(centred.data(), rstd.data(), x.data(), w.data(), rows, d, eps, true);
  rmsnorm_forward<double>(plain.data(), rstd.data(), x.data(), w_plus_one.data(), rows, d, eps, false);
  EXPECT_LE(test::relative_error(centred, plain), 1e-15);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0.0;
    for (int64_t j = 0; j < d; ++j) ms += x[r * d + j] * x[r * d + j] / d;
    const double inv = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[r], inv, 1e-14 * inv);
    for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(plain[r * d + j], x[r * d + j] * inv * w_plus_one[j], 1e-13);
  }
}

TEST(RmsNorm, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  const int64_t rows = 301, d = 67;  // several row blocks, the last one partial
  const std::vector<double> x = random_values(rows * d, 8, 2.0), w = random_values(d, 9), dy = random_values(rows * d, 10);
  std::vector<double> y(rows * d), rstd(rows), dx(rows * d), dw(d);
  rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, d, 1e-6, true);
  rmsnorm_backward<double>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, d, true, false);

  const std::vector<float> xf = test::cast_values<float>(x), wf = test::cast_values<float>(w);
  const std::vector<float> dyf = test::cast_values<float>(dy);
  std::vector<float> results[2][4];  // per thread count: y, rstd, dx, dw
  for (int threads : {1, 2}) {
    std::vector<float>* out = results[threads - 1];
    out[0].assign(rows * d, 0.f), out[1].assign(rows, 0.f), out[2].assign(rows * d, 0.f), out[3].assign(d, 0.f);
    test::with_threads(threads, [&] {
      rmsnorm_forward<float>(out[0].data(), out[1].data(), xf.data(), wf.data(), rows, d, 1e-6, true);
      rmsnorm_backward<float>(out[2].data(), out[3].data(), dyf.data(), xf.data(), wf.data(), out[1].data(), rows, d,
                              true, false);
    });
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "output " << i;
  EXPECT_LE(test::relative_error(results[0][0], y), 1e-5);
  EXPECT_LE(test::relative_error(results[0][2], dx), 1e-5);
  EXPECT_LE(test::relative_error(results[0][3], dw), 1e-5);
}

TEST(LayerNorm, ForwardMatchesFormula) {
  const int64_t rows = 5, d = 13;
  const double eps = 1e-6;
  std::vector<double> x = random_values(rows * d, 11, 3.0);
  for (int64_t j = 0; j < d; ++j) x[j] += 50.0;  // a row far from zero mean
  const std::vector<double> w = random_values(d, 12), b = random_values(d, 13);
  std::vector<double> y(rows * d), mean(rows), rstd(rows);
  layer_norm_forward<double>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d, eps);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0.0, var = 0.0;
    for (int64_t j = 0; j < d; ++j) mu += x[r * d + j] / d;
    for (int64_t j = 0; j < d; ++j) var += (x[r * d + j] - mu) * (x[r * d + j] - mu) / d;
    const double inv = 1.0 / std::sqrt(var + eps);
    EXPECT_NEAR(mean[r], mu, 1e-13 * std::max(1.0, std::abs(mu)));
    EXPECT_NEAR(rstd[r], inv, 1e-13 * inv);
    for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(y[r * d + j], (x[r * d + j] - mu) * inv * w[j] + b[j], 1e-12);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 7, d = 9;
  const double eps = 1e-6;
  std::vector<double> x = random_values(rows * d, 14, 2.0), w = random_values(d, 15), b = random_values(d, 16);
  const std::vector<double> r = random_values(rows * d, 17);
  auto loss = [&] {
    std::vector<double> y(rows * d), mean(rows), rstd(rows);
    layer_norm_forward<double>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d, eps);
    return test::weighted_sum(y, r);
  };
  std::vector<double> y(rows * d), mean(rows), rstd(rows);
  layer_norm_forward<double>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d, eps);
  const std::vector<double> dx_prior = random_values(rows * d, 18), dw_prior = random_values(d, 19);
  const std::vector<double> db_prior = random_values(d, 20);
  std::vector<double> dx = dx_prior, dw = dw_prior, db = db_prior;
  layer_norm_backward<double>(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), rows, d, true);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx_prior[i];
  for (int64_t j = 0; j < d; ++j) dw[j] -= dw_prior[j], db[j] -= db_prior[j];
  test::expect_gradients_match(loss, {{"x", &x, &dx}, {"w", &w, &dw}, {"b", &b, &db}});

  // Written mode overwrites dx; null dw and db are skipped.
  std::vector<double> dx_written = dx_prior;
  layer_norm_backward<double>(dx_written.data(), nullptr, nullptr, r.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), rows, d, false);
  EXPECT_LE(test::relative_error(dx_written, dx), 1e-13);
}

TEST(LayerNorm, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  const int64_t rows = 301, d = 67;  // several row blocks, the last one partial
  const std::vector<double> x = random_values(rows * d, 21, 2.0), w = random_values(d, 22), b = random_values(d, 23);
  const std::vector<double> dy = random_values(rows * d, 24);
  std::vector<double> y(rows * d), mean(rows), rstd(rows), dx(rows * d), dw(d), db(d);
  layer_norm_forward<double>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d, 1e-6);
  layer_norm_backward<double>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), rows, d, false);
  const std::vector<float> xf = test::cast_values<float>(x), wf = test::cast_values<float>(w);
  const std::vector<float> bf = test::cast_values<float>(b), dyf = test::cast_values<float>(dy);
  std::vector<float> results[2][6];  // per thread count: y, mean, rstd, dx, dw, db
  for (int threads : {1, 2}) {
    std::vector<float>* out = results[threads - 1];
    out[0].assign(rows * d, 0.f), out[1].assign(rows, 0.f), out[2].assign(rows, 0.f);
    out[3].assign(rows * d, 0.f), out[4].assign(d, 0.f), out[5].assign(d, 0.f);
    test::with_threads(threads, [&] {
      layer_norm_forward<float>(out[0].data(), out[1].data(), out[2].data(), xf.data(), wf.data(), bf.data(), rows,
                                d, 1e-6);
      layer_norm_backward<float>(out[3].data(), out[4].data(), out[5].data(), dyf.data(), xf.data(), wf.data(),
                                 out[1].data(), out[2].data(), rows, d, false);
    });
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "output " << i;
  EXPECT_LE(test::relative_error(results[0][0], y), 1e-5);
  EXPECT_LE(test::relative_error(results[0][3], dx), 1e-5);
  EXPECT_LE(test::relative_error(results[0][4], dw), 1e-5);
  EXPECT_LE(test::relative_error(results[0][5], db), 1e-5);
}

}  // namespace
}  // namespace trillion
