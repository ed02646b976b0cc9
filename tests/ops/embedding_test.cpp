// Embedding lookup: forward copies rows, backward sums repeated tokens (against finite differences
// and a plain loop) and does not depend on the thread count.
#include "ops/embedding.h"

#include <gtest/gtest.h>

#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

TEST(Embedding, ForwardCopiesRowsAndBackwardMatchesFiniteDifferences) {
  const int64_t vocab = 11, d = 5;
  const std::vector<int32_t> tokens = {3, 0, 3, 10, 7, 3, 0};  // repeated ids; some ids never used
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<double> table = random_values(vocab * d, 1);
  std::vector<double> out(n * d);
  embedding_forward<double>(out.data(), table.data(), tokens.data(), n, d, vocab);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out[i * d + j], table[tokens[i] * d + j]);

  const std::vector<double> r = random_values(n * d, 2);
  auto loss = [&] {
    std::vector<double> y(n * d);
    embedding_forward<double>(y.data(), table.data(), tokens.data(), n, d, vocab);
    return test::weighted_sum(y, r);
  };
  const std::vector<double> prior = random_values(vocab * d, 3);
  std::vector<double> dtable = prior;
  embedding_backward<double>(dtable.data(), r.data(), tokens.data(), n, d, vocab);
  for (size_t i = 0; i < dtable.size(); ++i) dtable[i] -= prior[i];  // accumulates (+=)
  test::expect_gradients_match(loss, {{"table", &table, &dtable}});
}

TEST(Embedding, BackwardSumsInTokenOrderIndependentOfThreads) {
  const int64_t vocab = 97, d = 33, n = 1001;
  std::vector<int32_t> tokens(n);
  CounterRng rng(5, "tokens");
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % 13);  // heavy repetition
  tokens[n - 1] = static_cast<int32_t>(vocab - 1);
  const std::vector<float> dout = test::cast_values<float>(random_values(n * d, 6));
  // Plain loop in token order: the order the header promises.
  std::vector<float> expected(vocab * d, 0.5f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) expected[tokens[i] * d + j] += dout[i * d + j];
  std::vector<float> one(vocab * d, 0.5f), two(vocab * d, 0.5f);
  test::with_threads(1, [&] { embedding_backward<float>(one.data(), dout.data(), tokens.data(), n, d, vocab); });
  test::with_threads(2, [&] { embedding_backward<float>(two.data(), dout.data(), tokens.data(), n, d, vocab); });
  EXPECT_EQ(one, expected);
  EXPECT_EQ(two, expected);
}

}  // namespace
}  // namespace trillion
