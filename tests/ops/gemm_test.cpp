// gemm against a plain triple loop (all transpose cases, strides, alpha/beta) and the linear layer's
// backward against finite differences, including its accumulate and skip options; sizes beyond the
// BLAS integer range are refused.
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::cast_values;
using test::random_values;
using test::relative_error;

template <class T>
void check_gemm_against_loops(bool trans_a, bool trans_b, double tolerance) {
  const int64_t m = 7, n = 11, k = 5, pad = 3;
  const int64_t lda = (trans_a ? m : k) + pad, ldb = (trans_b ? k : n) + pad, ldc = n + pad;
  const int64_t a_rows = trans_a ? k : m, b_rows = trans_b ? n : k;
  std::vector<double> a = random_values(a_rows * lda, 1), b = random_values(b_rows * ldb, 2);
  std::vector<double> c = random_values(m * ldc, 3);
  const double alpha = 0.7, beta = -1.3;
  std::vector<double> expected = c;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p)
        sum += (trans_a ? a[p * lda + i] : a[i * lda + p]) * (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      expected[i * ldc + j] = alpha * sum + beta * c[i * ldc + j];
    }
  std::vector<T> at = cast_values<T>(a), bt = cast_values<T>(b), ct = cast_values<T>(c);
  gemm<T>(trans_a, trans_b, m, n, k, T(alpha), at.data(), lda, bt.data(), ldb, T(beta), ct.data(), ldc);
  EXPECT_LE(relative_error(ct, expected), tolerance) << "trans_a=" << trans_a << " trans_b=" << trans_b;
  // Padding columns of c are untouched.
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n; j < ldc; ++j) EXPECT_EQ(ct[i * ldc + j], T(c[i * ldc + j]));
}

TEST(Gemm, MatchesLoopsForAllTransposes) {
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) {
      check_gemm_against_loops<double>(trans_a, trans_b, 1e-14);
      check_gemm_against_loops<float>(trans_a, trans_b, 1e-6);
    }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, in = 7, out = 3;
  std::vector<double> x = random_values(rows * in, 10), w = random_values(out * in, 11);
  const std::vector<double> r = random_values(rows * out, 12);
  auto loss = [&] {
    std::vector<double> y(rows * out);
    linear_forward<double>(y.data(), x.data(), w.data(), rows, in, out);
    return test::weighted_sum(y, r);
  };
  // dx accumulates onto a prior value and dw onto a prior value: subtract them to get the gradient.
  const std::vector<double> dx_prior = random_values(rows * in, 13), dw_prior = random_values(out * in, 14);
  std::vector<double> dx = dx_prior, dw = dw_prior;
  linear_backward<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(), rows, in, out, true);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx_prior[i];
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw_prior[i];
  test::expect_gradients_match(loss, {{"x", &x, &dx}, {"w", &w, &dw}});

  // Written mode overwrites dx; a null dw is skipped.
  std::vector<double> dx_written = dx_prior;
  linear_backward<double>(dx_written.data(), nullptr, r.data(), x.data(), w.data(), rows, in, out, false);
  EXPECT_LE(relative_error(dx_written, dx), 1e-14);
  // A null dx is skipped and dw still accumulates.
  std::vector<double> dw_only = dw_prior;
  linear_backward<double>(nullptr, dw_only.data(), r.data(), x.data(), w.data(), rows, in, out, false);
  for (size_t i = 0; i < dw_only.size(); ++i) dw_only[i] -= dw_prior[i];
  EXPECT_LE(relative_error(dw_only, dw), 1e-14);
}

TEST(Linear, FloatAgreesWithDouble) {
  const int64_t rows = 9, in = 13, out = 6;
  const std::vector<double> x = random_values(rows * in, 20), w = random_values(out * in, 21);
  std::vector<double> y(rows * out);
  linear_forward<double>(y.data(), x.data(), w.data(), rows, in, out);
  std::vector<float> xf = cast_values<float>(x), wf = cast_values<float>(w), yf(rows * out);
  linear_forward<float>(yf.data(), xf.data(), wf.data(), rows, in, out);
  EXPECT_LE(relative_error(yf, y), 1e-5);
}

// Sizes and strides beyond the 32-bit BLAS integer abort before the call instead of wrapping.
// No data is touched: the check runs first, so null pointers are safe here.
TEST(GemmDeathTest, RejectsSizesBeyondBlasInt) {
  const int64_t too_big = int64_t(1) << 31;  // INT32_MAX + 1
  EXPECT_DEATH(gemm<float>(false, false, too_big, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1),
               "BLAS integer limit");
  EXPECT_DEATH(gemm<double>(false, false, 1, 1, too_big, 1.0, nullptr, too_big, nullptr, 1, 0.0, nullptr, 1),
               "BLAS integer limit");
  EXPECT_DEATH(gemm<float>(false, false, 2, 2, 2, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, too_big),
               "BLAS integer limit");
}

}  // namespace
}  // namespace trillion
