// Products with bfloat16 operands (ops/gemm.h): gemm_bf16 against double within float
// accumulation's rounding bound (the products of bf16 values are exact in float), at odd sizes,
// every transpose, padded strides and beta 0 not reading c; a float product under the bf16 matmul
// precision equals the double product of its operands rounded to bf16 within that bound, and the
// double product of its float operands within bf16's (2⁻⁷ relative per product); Operands::fp32
// keeps float operands; a registered bf16 copy is what such a product reads of an operand inside
// its buffer; both are repeatable to the bit and callable inside OpenMP regions; one primitive per
// thread serves products of every size and stride.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "ops/finite_diff.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

using test::cast_values;
using test::random_values;

constexpr double kFloatEps = 0x1.0p-24;  // float's unit roundoff
constexpr double kBf16Eps = 0x1.0p-8;    // bf16's: 8 significant bits

struct Problem {
  bool trans_a, trans_b;
  int64_t m, n, k, pad;
  float alpha, beta;
  int64_t lda() const { return (trans_a ? m : k) + pad; }
  int64_t ldb() const { return (trans_b ? k : n) + pad; }
  int64_t ldc() const { return n + pad; }
  int64_t a_size() const { return (trans_a ? k : m) * lda(); }
  int64_t b_size() const { return (trans_b ? n : k) * ldb(); }
};

// Each element of c against alpha · Σ_p a_ip b_pj + beta · c_before in double, within
// slack · Σ_p |a_ip b_pj| + γ(|alpha| Σ_p |a_ip b_pj| + |beta c|), γ = 2(k + 2)ε (float's sum, as
// tests/ops/gemm_test.cpp derives it); padding columns untouched.
void expect_product(const Problem& p, const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& c_before, const std::vector<float>& c, double slack, const char* what) {
  const double gamma = 2.0 * double(p.k + 2) * kFloatEps;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double product = double(p.trans_a ? a[q * p.lda() + i] : a[i * p.lda() + q]) *
                               double(p.trans_b ? b[j * p.ldb() + q] : b[q * p.ldb() + j]);
        ref += product;
        magnitude += std::abs(product);
      }
      const double old = p.beta == 0.0f ? 0.0 : double(c_before[i * p.ldc() + j]);
      ref = double(p.alpha) * ref + double(p.beta) * old;
      const double bound =
          (slack + gamma) * std::abs(double(p.alpha)) * magnitude + gamma * std::abs(double(p.beta) * old);
      ASSERT_LE(std::abs(double(c[i * p.ldc() + j]) - ref), bound)
          << what << " m=" << p.m << " n=" << p.n << " k=" << p.k << " trans_a=" << p.trans_a
          << " trans_b=" << p.trans_b << " beta=" << p.beta << " at (" << i << ", " << j << ")";
    }
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = p.n; j < p.ldc(); ++j)
      ASSERT_TRUE(std::memcmp(&c[i * p.ldc() + j], &c_before[i * p.ldc() + j], sizeof(float)) == 0) << what;
}

std::vector<float> initial_c(const Problem& p, uint64_t seed) {
  std::vector<float> c = cast_values<float>(random_values(p.m * p.ldc(), seed));
  if (p.beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  return c;
}

std::vector<Problem> problems() {
  std::vector<Problem> all;
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (float beta : {0.0f, 1.0f, -0.5f}) all.push_back({trans_a, trans_b, 67, 129, 91, 5, 0.75f, beta});
  // Edges: single rows, columns and terms; an empty sum leaves beta · c.
  all.push_back({false, true, 1, 1, 1, 0, 1.0f, 0.0f});
  all.push_back({true, false, 1, 5, 3, 2, 1.0f, 1.0f});
  all.push_back({false, false, 3, 1, 7, 1, -2.0f, 0.5f});
  all.push_back({false, false, 4, 6, 0, 1, 1.0f, 0.5f});
  return all;
}

// gemm_bf16 of random operands (seeds seed, seed + 1) onto a random c (seed + 2) against double.
void expect_gemm_bf16_product(const Problem& p, uint64_t seed) {
  std::vector<float> a = cast_values<float>(random_values(p.a_size(), seed));
  std::vector<float> b = cast_values<float>(random_values(p.b_size(), seed + 1));
  std::vector<bf16> a16(a.size()), b16(b.size());
  to_bf16(a.data(), a16.data(), int64_t(a.size()));
  to_bf16(b.data(), b16.data(), int64_t(b.size()));
  to_float(a16.data(), a.data(), int64_t(a.size()));  // the values the product sees
  to_float(b16.data(), b.data(), int64_t(b.size()));
  const std::vector<float> c_before = initial_c(p, seed + 2);
  std::vector<float> c = c_before;
  gemm_bf16(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a16.data(), p.lda(), b16.data(), p.ldb(), p.beta, c.data(),
            p.ldc());
  expect_product(p, a, b, c_before, c, 0.0, "gemm_bf16");
}

TEST(GemmBf16, MatchesDoubleOfItsOperandsWithinFloatAccumulation) {
  RecordProperty("native", bf16_matmul_is_native() ? "oneDNN bf16 matmul" : "widened to float");
  for (const Problem& p : problems()) expect_gemm_bf16_product(p, 51);
}

TEST(GemmBf16, FloatProductsUnderTheBf16PrecisionRoundTheirOperands) {
  for (const Problem& p : problems()) {
    const std::vector<float> a = cast_values<float>(random_values(p.a_size(), 61));
    const std::vector<float> b = cast_values<float>(random_values(p.b_size(), 62));
    std::vector<float> a_rounded = a, b_rounded = b;
    for (float& x : a_rounded) x = round_to_bf16(x);
    for (float& x : b_rounded) x = round_to_bf16(x);
    const std::vector<float> c_before = initial_c(p, 63);
    std::vector<float> c = c_before, c_fp32 = c_before, c_float_operands = c_before;
    {
      const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
      gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), b.data(), p.ldb(), p.beta, c.data(),
                  p.ldc());
      gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), b.data(), p.ldb(), p.beta,
                  c_float_operands.data(), p.ldc(), Operands::fp32);
    }
    gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), b.data(), p.ldb(), p.beta,
                c_fp32.data(), p.ldc());
    expect_product(p, a_rounded, b_rounded, c_before, c, 0.0, "bf16 precision vs its rounded operands");
    // Each product of rounded operands is within (1 + u)² − 1 ≤ 2u + u² of the exact one.
    expect_product(p, a, b, c_before, c, 2.0 * kBf16Eps + kBf16Eps * kBf16Eps, "bf16 precision vs float operands");
    EXPECT_EQ(0, std::memcmp(c_float_operands.data(), c_fp32.data(), c.size() * sizeof(float)))
        << "Operands::fp32 under the bf16 precision is the float product";
    if (p.k >= 3) {
      EXPECT_NE(c, c_fp32) << "the bf16 precision rounded nothing";
    }
  }
}

// An operand inside a registered copy's buffer is read from the copy (the source changed without a
// refresh still gives the old values' product), at any offset and with the caller's strides; one
// reaching past the buffer's end is rounded at the product; after refresh() the copy follows the
// source, and a destroyed copy is read no more.
TEST(GemmBf16, FloatProductsReadARegisteredCopyOfTheirOperands) {
  const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
  for (const Problem& p : problems()) {
    if (p.k == 0) continue;
    const int64_t offset = 3;                         // b's first element in the copied buffer
    const int64_t copied = offset + p.b_size();       // elements registered
    const int64_t extent = (p.trans_b ? p.n - 1 : p.k - 1) * p.ldb() + (p.trans_b ? p.k : p.n);  // b's reach
    const int64_t past = copied - extent + 1;         // a b starting here ends one element past the copy
    // [copied + b_size + 1]: the copied elements, then room for a b starting at `past`
    std::vector<float> buffer = cast_values<float>(random_values(copied + p.b_size() + 1, 81));
    const std::vector<float> a = cast_values<float>(random_values(p.a_size(), 82));
    std::vector<float> a_rounded = a;
    for (float& x : a_rounded) x = round_to_bf16(x);
    const auto rounded_b = [&](int64_t start) {  // [b_size]: the b at `start`'s values as bf16
      std::vector<float> b(buffer.begin() + start, buffer.begin() + start + p.b_size());
      for (float& x : b) x = round_to_bf16(x);
      return b;
    };
    const auto product = [&](int64_t start) {
      std::vector<float> c = initial_c(p, 83);
      gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), buffer.data() + start, p.ldb(),
                  p.beta, c.data(), p.ldc());
      return c;
    };
    const std::vector<float> c_before = initial_c(p, 83), b_at_copy = rounded_b(offset);
    std::optional<Bf16OperandCopy> copy(std::in_place, buffer.data(), copied);
    for (float& x : buffer) x *= -3.0f;  // not refreshed: the copy keeps the old values
    expect_product(p, a_rounded, b_at_copy, c_before, product(offset), 0.0, "the copy, stale");
    expect_product(p, a_rounded, rounded_b(past), c_before, product(past), 0.0, "an operand partly outside the copy");
    copy->refresh();
    expect_product(p, a_rounded, rounded_b(offset), c_before, product(offset), 0.0, "refreshed");
    copy.reset();
    for (float& x : buffer) x *= 0.5f;
    expect_product(p, a_rounded, rounded_b(offset), c_before, product(offset), 0.0, "unregistered");
  }
}

// The expert chain's row tiles change size every step: one primitive serves every size and stride,
// so the products of 40 row counts, 3 depths and 2 paddings build none after the first.
TEST(GemmBf16, OnePrimitiveServesEverySizeAndStride) {
  expect_gemm_bf16_product({false, true, 8, 24, 16, 0, 1.0f, 1.0f}, 61);
  const int64_t built = bf16_matmul_primitives_on_this_thread();
  for (int64_t rows = 1; rows <= 40; ++rows)
    for (int64_t k : {16, 33, 70})
      for (int64_t pad : {0, 3}) expect_gemm_bf16_product({false, true, rows, 24, k, pad, 1.0f, 1.0f}, 61);
  EXPECT_EQ(bf16_matmul_primitives_on_this_thread(), built);
}

// Twice the same bits; inside an OpenMP region each thread's product equals the one-thread product.
TEST(GemmBf16, RepeatableAndRunsInsideParallelRegions) {
  const int64_t m = 45, n = 77, k = 130;
  const std::vector<float> a = cast_values<float>(random_values(m * k, 71)), b = cast_values<float>(random_values(k * n, 72));
  const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
  test::expect_same_bits_inside_regions(
      [&] {
        std::vector<float> c(m * n);  // [m, n]
        gemm<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);  // b read as [n, k]
        return c;
      },
      "bf16 operands");
}

TEST(GemmBf16, PrecisionNamesRoundTripAndAnUnknownOneIsRefused) {
  for (const MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16})
    EXPECT_EQ(matmul_precision_from_name(matmul_precision_name(precision), "--precision"), precision);
  try {
    matmul_precision_from_name("fp16", "--precision");
    ADD_FAILURE() << "fp16 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--precision fp16: expected fp32 or bf16");
  }
}

}  // namespace
}  // namespace trillion
