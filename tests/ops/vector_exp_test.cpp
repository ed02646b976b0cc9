// The vector kernels of ops/vector_exp.h on each instruction set the CPU has: exp within ~1 ulp of
// std::exp with the documented edges (underflow to 0, overflow to +inf, NaN kept), the maximum, and
// the AVX2 and AVX-512 kernels giving the same bits on random rows of every length up to 70, and the
// indexer's candidate packing equal to the scalar pack_rank loop.
#include "ops/vector_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "ops/finite_diff.h"
#include "ops/indexer_select.h"

namespace trillion {
namespace {

class VectorExp : public ::testing::TestWithParam<VectorIsa> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << "this CPU lacks " << vector_isa_name(GetParam());
    previous_ = vector_isa();
    set_vector_isa(GetParam());
  }
  void TearDown() override {
    if (cpu_supports(GetParam())) set_vector_isa(previous_);
  }
  VectorIsa previous_ = VectorIsa::avx2;
};

TEST_P(VectorExp, MatchesStdExpAtTheEdges) {
  EXPECT_EQ(vector_isa(), GetParam());
  std::vector<double> xd;
  for (int i = 0; i < 1000; ++i) xd.push_back(-120.0 + 0.1337 * i);
  xd.push_back(-INFINITY);
  xd.push_back(-800.0);
  std::vector<float> xf(xd.begin(), xd.end());
  std::vector<float> ef = xf;
  std::vector<double> ed = xd;
  const float sum_f = exp_shifted_sum(ef.data(), int64_t(ef.size()), 2.0f);
  const double sum_d = exp_shifted_sum(ed.data(), int64_t(ed.size()), 2.0);
  double want_sum = 0;
  for (size_t i = 0; i < xd.size(); ++i) {
    const double want = std::exp(xd[i] - 2.0);
    want_sum += want;
    EXPECT_NEAR(ed[i], want, 4e-16 * want) << xd[i];
    if (xd[i] - 2.0 > -87.0) {
      EXPECT_NEAR(ef[i], std::exp(xf[i] - 2.0f), 3e-7 * want) << xf[i];
    }
  }
  EXPECT_EQ(ef[1000], 0.0f);
  EXPECT_EQ(ed[1001], 0.0);
  EXPECT_NEAR(sum_d, want_sum, 1e-14 * want_sum);
  EXPECT_NEAR(sum_f, want_sum, 1e-6 * want_sum);
  EXPECT_EQ(max_value(xd.data(), int64_t(xd.size())), xd[999]);
  EXPECT_EQ(max_value(xf.data(), 3), xf[2]);

  // Overflow, +inf and NaN; the tail of a 5-element row.
  float edges_f[5] = {89.0f, INFINITY, NAN, 88.0f, -88.0f};
  double edges_d[5] = {710.0, INFINITY, NAN, 709.0, -709.0};
  EXPECT_TRUE(std::isnan(exp_shifted_sum(edges_f, 5, 0.0f)));
  EXPECT_TRUE(std::isnan(exp_shifted_sum(edges_d, 5, 0.0)));
  EXPECT_EQ(edges_f[0], INFINITY);
  EXPECT_EQ(edges_f[1], INFINITY);
  EXPECT_TRUE(std::isnan(edges_f[2]));
  EXPECT_NEAR(edges_f[3], std::exp(88.0f), 3e-7 * std::exp(88.0));
  EXPECT_EQ(edges_f[4], 0.0f);
  EXPECT_EQ(edges_d[0], INFINITY);
  EXPECT_EQ(edges_d[1], INFINITY);
  EXPECT_TRUE(std::isnan(edges_d[2]));
  EXPECT_NEAR(edges_d[3], std::exp(709.0), 4e-16 * std::exp(709.0));
  EXPECT_EQ(edges_d[4], 0.0);
}

// Every length to 37 (tails of each step) from a nonzero count and key offset, unfiltered and
// filtered at a bar among the scores, with NaN, ±0, ±inf and ties inside: the same list, in the same
// order, as the scalar pack_rank loop.
TEST_P(VectorExp, AppendRankedCandidatesMatchesPackRank) {
  const CounterRng rng(5, "ranked candidates");
  uint64_t counter = 0;
  for (int64_t n = 0; n <= 37; ++n) {
    std::vector<float> scores(n);  // [n]
    for (int64_t i = 0; i < n; ++i) scores[i] = static_cast<float>(std::round(rng.normal(counter++) * 4.0) / 2.0);
    const float specials[] = {NAN, -0.0f, 0.0f, INFINITY, -INFINITY, -NAN};
    for (int64_t i = 0; i < n; i += 5) scores[i] = specials[(i / 5) % 6];
    const int64_t j0 = 1000 + 3 * n, start = n % 3;
    for (const bool filter : {false, true}) {
      const uint64_t bar = n > 0 ? indexer_select::pack_rank(scores[n / 2], j0 + n / 2) : 0;
      std::vector<uint64_t> want(start + n, 7), got(start + n, 7);  // the first `start` entries are kept
      int64_t want_count = start;
      for (int64_t c = 0; c < n; ++c) {
        const uint64_t packed = indexer_select::pack_rank(scores[c], j0 + c);
        if (!filter || packed > bar) want[want_count++] = packed;
      }
      const int64_t got_count =
          vector_kernels().append_ranked_candidates(got.data(), start, scores.data(), n, j0, filter, bar);
      ASSERT_EQ(got_count, want_count) << "n " << n << " filter " << filter;
      want.resize(want_count);
      got.resize(got_count);
      EXPECT_EQ(got, want) << "n " << n << " filter " << filter;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, VectorExp, ::testing::Values(VectorIsa::avx2, VectorIsa::avx512),
                         [](const ::testing::TestParamInfo<VectorIsa>& info) { return vector_isa_name(info.param); });

template <class T>
void expect_same_bits(const char* what, T a, T b) {
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(T)), 0) << what << ": " << a << " vs " << b;
}

template <class T>
void check_isas_agree(const CounterRng& rng) {
  uint64_t counter = 0;
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<T> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(rng.normal(counter++) * 30.0);
    if (n > 5) x[3] = -std::numeric_limits<T>::infinity(), x[5] = T(-0.0);
    const T shift = static_cast<T>(rng.normal(counter++));
    std::vector<T> x2 = x, x5 = x;
    const T max2 = test::with_isa(VectorIsa::avx2, [&] { return max_value(x2.data(), n); });
    const T max5 = test::with_isa(VectorIsa::avx512, [&] { return max_value(x5.data(), n); });
    expect_same_bits("max", max2, max5);
    const T sum2 = test::with_isa(VectorIsa::avx2, [&] { return exp_shifted_sum(x2.data(), n, shift); });
    const T sum5 = test::with_isa(VectorIsa::avx512, [&] { return exp_shifted_sum(x5.data(), n, shift); });
    expect_same_bits("sum", sum2, sum5);
    EXPECT_TRUE(n == 0 || std::memcmp(x2.data(), x5.data(), n * sizeof(T)) == 0) << "n " << n;  // empty: null data
  }
}

TEST(VectorExpIsas, Avx2AndAvx512GiveTheSameBits) {
  if (!cpu_supports(VectorIsa::avx512)) GTEST_SKIP() << "this CPU lacks avx512: one instruction set only";
  check_isas_agree<float>(CounterRng(17, "vector exp float"));
  check_isas_agree<double>(CounterRng(17, "vector exp double"));
}

}  // namespace
}  // namespace trillion
