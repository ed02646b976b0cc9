// Deterministic row-wise top-k: against a stable-sort reference on random rows (continuous values,
// values drawn from a small set so that most entries tie, −∞ entries), k = 1, k = n, odd sizes, both
// row kernels (small k by insertion, large k by selection); thread-count independence; NaN ranks first.
#include "ops/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

// Each row's positions stable-sorted by value descending, NaN first (ties keep ascending positions),
// first k.
template <class T>
std::vector<int32_t> topk_reference(const std::vector<T>& scores, int64_t rows, int64_t n, int64_t k) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const T* row = scores.data() + r * n;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return std::isnan(row[a]) ? !std::isnan(row[b]) : row[a] > row[b];
    });
    out.insert(out.end(), order.begin(), order.begin() + k);
  }
  return out;
}

enum class Values { continuous, few_distinct, with_infinities };

// rows·n values: uniform; or from {−1, 0, 0.5, 1, 2} (most entries tie); or uniform with about a
// third −∞ and some whole rows −∞ (so even the top entries tie at −∞).
template <class T>
std::vector<T> make_scores(int64_t rows, int64_t n, Values kind, uint64_t seed) {
  const std::vector<double> u = random_values(rows * n, seed);
  const std::vector<double> pick = random_values(rows * n, seed + 1000);
  const double small_set[5] = {-1.0, 0.0, 0.5, 1.0, 2.0};
  std::vector<T> scores(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    switch (kind) {
      case Values::continuous:
        scores[i] = static_cast<T>(u[i]);
        break;
      case Values::few_distinct:
        scores[i] = static_cast<T>(small_set[std::min<int64_t>(4, static_cast<int64_t>((pick[i] + 1.0) * 2.5))]);
        break;
      case Values::with_infinities:
        scores[i] = (pick[i] < -0.33 || (i / n) % 5 == 3) ? -std::numeric_limits<T>::infinity()
                                                            : static_cast<T>(std::round(u[i] * 4.0) / 4.0);
        break;
    }
  }
  return scores;
}

template <class T>
void check_against_reference(int64_t rows, int64_t n, int64_t k, Values kind, uint64_t seed) {
  const std::vector<T> scores = make_scores<T>(rows, n, kind, seed);
  std::vector<int32_t> indices(rows * k, -1);
  topk_rows<T>(indices.data(), scores.data(), rows, n, k);
  EXPECT_EQ(indices, topk_reference(scores, rows, n, k))
      << "rows=" << rows << " n=" << n << " k=" << k << " kind=" << static_cast<int>(kind);
}

struct Case {
  int64_t rows, n, k;
};
// Small k (insertion kernel), k = 1, k = n, odd n, and k beyond the insertion limit (selection).
const Case kCases[] = {{37, 1, 1},  {37, 7, 1},    {37, 7, 7},     {13, 33, 5},    {11, 64, 8},  {9, 31, 31},
                       {5, 257, 32}, {5, 257, 33}, {4, 1000, 100}, {3, 1001, 1001}, {7, 129, 64}};

TEST(TopK, MatchesSortReferenceOnContinuousValues) {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    check_against_reference<float>(c.rows, c.n, c.k, Values::continuous, seed++);
    check_against_reference<double>(c.rows, c.n, c.k, Values::continuous, seed++);
  }
}

TEST(TopK, TiesBreakByIndexAscending) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    check_against_reference<float>(c.rows, c.n, c.k, Values::few_distinct, seed++);
    check_against_reference<double>(c.rows, c.n, c.k, Values::few_distinct, seed++);
  }
  // A row of equal values ranks by position; a larger value later in the row goes first.
  const std::vector<double> row = {3.0, 3.0, 3.0, 5.0, 3.0};
  std::vector<int32_t> top(3);
  topk_rows<double>(top.data(), row.data(), 1, 5, 3);
  EXPECT_EQ(top, (std::vector<int32_t>{3, 0, 1}));
}

TEST(TopK, NegativeInfinityRanksLast) {
  uint64_t seed = 200;
  for (const Case& c : kCases) {
    check_against_reference<float>(c.rows, c.n, c.k, Values::with_infinities, seed++);
    check_against_reference<double>(c.rows, c.n, c.k, Values::with_infinities, seed++);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {-inf, -2.0f, -inf, -inf};
  std::vector<int32_t> top(4);
  topk_rows<float>(top.data(), row.data(), 1, 4, 4);
  EXPECT_EQ(top, (std::vector<int32_t>{1, 0, 2, 3}));
}

TEST(TopK, ThreadCountDoesNotMatter) {
  for (const Case& c : {Case{301, 97, 6}, Case{67, 513, 40}}) {
    const std::vector<float> scores = make_scores<float>(c.rows, c.n, Values::few_distinct, 300 + c.k);
    std::vector<int32_t> results[2];
    for (int threads : {1, 2}) {
      results[threads - 1].assign(c.rows * c.k, -1);
      int32_t* out = results[threads - 1].data();
      test::with_threads(threads, [&] { topk_rows<float>(out, scores.data(), c.rows, c.n, c.k); });
    }
    EXPECT_EQ(results[0], results[1]) << "k=" << c.k;
    EXPECT_EQ(results[0], topk_reference(scores, c.rows, c.n, c.k));
  }
}

// NaN ranks above every number (+∞ included), NaNs among themselves by index, in both kernels:
// a NaN upstream is selected and flows on to the loss, where the numeric guard names it.
TEST(TopK, NanScoresRankFirst) {
  const int64_t rows = 6, n = 50;
  std::vector<float> scores = make_scores<float>(rows, n, Values::continuous, 400);
  scores[4 * n + 31] = std::numeric_limits<float>::quiet_NaN();
  scores[4 * n + 7] = -std::numeric_limits<float>::quiet_NaN();
  scores[4 * n + 12] = std::numeric_limits<float>::infinity();
  for (const int64_t k : {int64_t(3), int64_t(40)}) {  // insertion, selection
    std::vector<int32_t> top(rows * k);
    topk_rows<float>(top.data(), scores.data(), rows, n, k);
    EXPECT_EQ(top[4 * k + 0], 7) << "k=" << k;
    EXPECT_EQ(top[4 * k + 1], 31) << "k=" << k;
    EXPECT_EQ(top[4 * k + 2], 12) << "k=" << k;
    EXPECT_EQ(top, topk_reference(scores, rows, n, k)) << "k=" << k;
  }
}

TEST(TopKDeathTest, BadSizesFailChecks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int64_t rows = 6, n = 50;
  std::vector<float> scores = make_scores<float>(rows, n, Values::continuous, 400);
  std::vector<int32_t> top(rows * n);
  EXPECT_DEATH(topk_rows<float>(top.data(), scores.data(), rows, n, 0), "topk sizes");
  EXPECT_DEATH(topk_rows<float>(top.data(), scores.data(), rows, n, n + 1), "topk sizes");
}

}  // namespace
}  // namespace trillion
