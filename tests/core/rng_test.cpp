// The counter-based RNG: values depend on (seed, stream, counter) only, and look random.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trillion {
namespace {

TEST(CounterRng, SameKeyAndCounterGiveSameValue) {
  CounterRng a(7, "model.embed_tokens.weight"), b(7, "model.embed_tokens.weight");
  EXPECT_EQ(a.bits(12345), b.bits(12345));
  EXPECT_NE(a.bits(12345), a.bits(12346));
  EXPECT_NE(a.bits(5), CounterRng(8, "model.embed_tokens.weight").bits(5));
  EXPECT_NE(a.bits(5), CounterRng(7, "lm_head.weight").bits(5));
}

TEST(CounterRng, NormalHasUnitMomentsAndUniformIsOpen) {
  CounterRng rng(1, 2);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal(i);
    sum += x;
    sum_sq += x * x;
    const double u = rng.uniform(i);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

}  // namespace
}  // namespace trillion
