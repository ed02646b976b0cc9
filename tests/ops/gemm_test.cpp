// gemm against a plain triple loop (all transpose cases, strides, alpha/beta) and the linear layer's
// backward against finite differences, including its accumulate and skip options; sizes beyond the
// BLAS integer range are refused. Each float backend (oneDNN, OpenBLAS) against double within
// float's rounding bound, at odd sizes, repeatable to the bit, and callable from the kernels' OpenMP
// regions.
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
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

// Runs f with `backend` as the float backend, then restores the one before.
template <class F>
void with_backend(GemmBackend backend, const F& f) {
  const GemmBackend before = gemm_backend();
  set_gemm_backend(backend);
  f();
  set_gemm_backend(before);
}

constexpr GemmBackend kFloatBackends[] = {GemmBackend::onednn, GemmBackend::openblas};

// A float product of odd sizes (no vector width divides them) against the same product in double
// of the same float inputs: each element within the dot product's rounding bound
// |c − ref| ≤ γ · (|alpha| Σ_p |a_ip b_pj| + |beta c_ij|), γ = (k + 2) · ε (ε = 2⁻²⁴, the sum's k
// roundings and those of alpha and beta), doubled for the order a blocked kernel sums in. beta 0
// must not read c (NaN there).
void check_float_backend(GemmBackend backend, bool trans_a, bool trans_b, float beta) {
  const int64_t m = 67, n = 129, k = 91, pad = 5;
  const int64_t lda = (trans_a ? m : k) + pad, ldb = (trans_b ? k : n) + pad, ldc = n + pad;
  const std::vector<float> a = cast_values<float>(random_values((trans_a ? k : m) * lda, 31));
  const std::vector<float> b = cast_values<float>(random_values((trans_b ? n : k) * ldb, 32));
  std::vector<float> c = cast_values<float>(random_values(m * ldc, 33));
  if (beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> c_before = c;
  const float alpha = 0.75f;
  with_backend(backend, [&] {
    gemm<float>(trans_a, trans_b, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  });
  const double gamma = 2.0 * double(k + 2) * std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double product = double(trans_a ? a[p * lda + i] : a[i * lda + p]) *
                                double(trans_b ? b[j * ldb + p] : b[p * ldb + j]);
        ref += product;
        magnitude += std::abs(product);
      }
      const double old = beta == 0.0f ? 0.0 : double(c_before[i * ldc + j]);
      ref = double(alpha) * ref + double(beta) * old;
      const double bound = gamma * (double(alpha) * magnitude + std::abs(double(beta) * old));
      ASSERT_LE(std::abs(double(c[i * ldc + j]) - ref), bound)
          << gemm_backend_name(backend) << " trans_a=" << trans_a << " trans_b=" << trans_b << " beta=" << beta
          << " at (" << i << ", " << j << ")";
    }
  for (int64_t i = 0; i < m; ++i)  // padding columns untouched
    for (int64_t j = n; j < ldc; ++j) ASSERT_TRUE(std::memcmp(&c[i * ldc + j], &c_before[i * ldc + j], sizeof(float)) == 0);
}

TEST(Gemm, EachFloatBackendMatchesDoubleWithinFloatRounding) {
  for (const GemmBackend backend : kFloatBackends)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (float beta : {0.0f, 1.0f, -0.5f}) check_float_backend(backend, trans_a, trans_b, beta);
}

// The same product twice gives the same bits; inside an OpenMP region each thread's product (the
// libraries run nested work on the calling thread) equals the one-thread product outside it.
TEST(Gemm, EachFloatBackendIsRepeatableAndRunsInsideParallelRegions) {
  const int64_t m = 45, n = 77, k = 130;
  const std::vector<float> a = cast_values<float>(random_values(m * k, 41)), b = cast_values<float>(random_values(k * n, 42));
  for (const GemmBackend backend : kFloatBackends) {
    with_backend(backend, [&] {
      test::expect_same_bits_inside_regions(
          [&] {
            std::vector<float> c(m * n);  // [m, n]
            gemm<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);  // b read as [n, k]
            return c;
          },
          gemm_backend_name(backend));
    });
  }
}

TEST(Gemm, BackendNamesRoundTripAndAnUnknownOneIsRefused) {
  for (const GemmBackend backend : kFloatBackends)
    EXPECT_EQ(gemm_backend_from_name(gemm_backend_name(backend), "--gemm"), backend);
  try {
    gemm_backend_from_name("mkl", "--gemm");
    ADD_FAILURE() << "mkl was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--gemm mkl: expected onednn or openblas");
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
