// The unigram and bigram baselines: the unigram's add-one formula, the bigram's Kneser-Ney formula
// worked by hand, every context's distribution summing to one, bigrams kept inside their streams,
// only the targets fit and scored, and a predictable sequence scored far below the unigram.
#include "data/baselines.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace trillion {
namespace {

TEST(UnigramBaseline, IsAddOneSmoothedCrossEntropy) {
  const std::vector<int32_t> kFit = {0, 0, 1}, kEval = {0, 2, 1};
  // fit counts {0: 2, 1: 1, 2: 0}, vocab 3: p = (count + 1) / (3 + 3) = {1/2, 1/3, 1/6}.
  const double nats = unigram_baseline_nats({kFit}, {kEval}, 3);
  EXPECT_NEAR(nats, (std::log(2.0) + std::log(6.0) + std::log(3.0)) / 3.0, 1e-12);
  EXPECT_NEAR(unigram_baseline_nats({}, {kEval}, 10), std::log(10.0), 1e-12) << "no fit tokens: uniform";
  const std::vector<int32_t> fit_head = {0}, fit_tail = {0, 1}, eval_head = {0, 2}, eval_tail = {1};
  EXPECT_EQ(unigram_baseline_nats({fit_head, fit_tail}, {eval_head, eval_tail}, 3), nats) << "streams count as one";
}

TEST(BigramBaseline, IsInterpolatedKneserNeyWorkedByHand) {
  // Bigrams of 0 1 0 1 0 2: (0 1) twice, (1 0) twice, (0 2) once. n1 = 1, n2 = 2: D = 1 / 5.
  // c(0 ·) = 3, N1+(0 ·) = 2; N1+(· 0) = N1+(· 1) = N1+(· 2) = 1, N1+(· ·) = 3, T = 3, V = 4.
  const std::vector<int32_t> fit = {0, 1, 0, 1, 0, 2};
  const BigramBaseline bigram({fit}, 4);
  const double d = 0.2;
  EXPECT_DOUBLE_EQ(bigram.discount(), d);
  const double low_seen = (1 - d) / 3 + d * 3 / 3 / 4;  // P_low(0) = P_low(1) = P_low(2)
  const double low_unseen = d * 3 / 3 / 4;              // P_low(3)
  EXPECT_NEAR(bigram.probability(-1, 1), low_seen, 1e-15);
  EXPECT_NEAR(bigram.probability(-1, 3), low_unseen, 1e-15);
  EXPECT_NEAR(bigram.probability(0, 1), (2 - d) / 3 + d * 2 / 3 * low_seen, 1e-15);
  EXPECT_NEAR(bigram.probability(0, 0), d * 2 / 3 * low_seen, 1e-15);
  EXPECT_NEAR(bigram.probability(0, 3), d * 2 / 3 * low_unseen, 1e-15);
  EXPECT_NEAR(bigram.probability(2, 1), low_seen, 1e-15) << "2 never precedes a token: the lower order";
  const std::vector<int32_t> eval = {0, 1, 3};
  EXPECT_NEAR(
      bigram.cross_entropy({eval}),
      -(std::log(low_seen) + std::log((2 - d) / 3 + d * 2 / 3 * low_seen) + std::log(d * 1 / 2 * low_unseen)) / 3,
      1e-14)
      << "c(1 ·) = 2, N1+(1 ·) = 1";
}

TEST(BigramBaseline, EveryContextSumsToOne) {
  std::mt19937 rng(7);
  std::vector<int32_t> head(300), tail(40);  // a skewed draw over 23 of a vocabulary of 29
  for (int32_t& id : head) id = static_cast<int32_t>(rng() % 23 * (rng() % 3 == 0));
  for (int32_t& id : tail) id = static_cast<int32_t>(rng() % 23);
  const BigramBaseline bigram({head, tail}, 29);
  EXPECT_GT(bigram.discount(), 0.0);
  EXPECT_LT(bigram.discount(), 1.0);
  for (int32_t previous = -1; previous < 29; ++previous) {
    double sum = 0.0;
    for (int32_t next = 0; next < 29; ++next) {
      EXPECT_GT(bigram.probability(previous, next), 0.0) << previous << " → " << next;
      sum += bigram.probability(previous, next);
    }
    EXPECT_NEAR(sum, 1.0, 1e-12) << "context " << previous;
  }
  EXPECT_NEAR(BigramBaseline({}, 10).probability(3, 4), 0.1, 1e-15) << "no fit bigram: uniform";
}

TEST(BigramBaseline, KeepsBigramsInsideTheirStreams) {
  const std::vector<int32_t> first = {0, 1, 0, 1}, second = {2, 3, 2, 3}, joined = {0, 1, 0, 1, 2, 3, 2, 3};
  const BigramBaseline split({first, second}, 5), whole({joined}, 5);
  // (1 2) spans the two streams: unseen after 1 (about 0.08) unless they are one stream (0.45).
  EXPECT_GT(whole.probability(1, 2), 4 * split.probability(1, 2));
  // Scoring: each stream's first token has no token before it.
  double nats = 0.0;
  for (const std::vector<int32_t>* stream : {&first, &second})
    for (size_t t = 0; t < stream->size(); ++t)
      nats -= std::log(split.probability(t == 0 ? -1 : (*stream)[t - 1], (*stream)[t]));
  EXPECT_NEAR(split.cross_entropy({first, second}), nats / 8, 1e-14);
  EXPECT_GT(std::abs(split.cross_entropy({joined}) - nats / 8), 1e-3) << "one stream: 2 scored after 1";
}

TEST(Baselines, FitAndScoreOnlyTheTargets) {
  const auto context = [](int32_t id) { return static_cast<int32_t>(static_cast<uint32_t>(id) | kNotTargetBit); };
  // Unigram: the targets 0 and 2 of the fit, vocab 3: p(2) = (1 + 1) / (2 + 3); 1 is scored nowhere.
  const std::vector<int32_t> fit = {0, context(1), context(1), 2}, eval = {context(1), 2};
  EXPECT_NEAR(unigram_baseline_nats({fit}, {eval}, 3), std::log(5.0 / 2.0), 1e-12);
  // Bigram: (0 1) twice; (1 0) has no target and counts nowhere, as if the streams were cut there.
  const std::vector<int32_t> masked = {context(0), 1, context(0), 1}, pair = {0, 1};
  const BigramBaseline with_contexts({masked}, 4), cut({pair, pair}, 4);
  for (int32_t previous = -1; previous < 4; ++previous)
    for (int32_t next = 0; next < 4; ++next)
      EXPECT_EQ(with_contexts.probability(previous, next), cut.probability(previous, next)) << previous << " " << next;
  const std::vector<int32_t> scored = {context(0), 1};
  EXPECT_NEAR(with_contexts.cross_entropy({scored}), -std::log(with_contexts.probability(0, 1)), 1e-15);
}

TEST(BigramBaseline, ScoresAPredictableSequenceFarBelowTheUnigram) {
  std::vector<int32_t> cycle(3000);  // 0 1 2 … 9 0 1 …: every token follows from the one before
  for (size_t t = 0; t < cycle.size(); ++t) cycle[t] = static_cast<int32_t>(t % 10);
  const std::vector<int32_t> eval(cycle.begin(), cycle.begin() + 200);
  EXPECT_NEAR(unigram_baseline_nats({cycle}, {eval}, 16), std::log(10.0), 0.01);
  EXPECT_LT(bigram_baseline_nats({cycle}, {eval}, 16), 0.05);
}

}  // namespace
}  // namespace trillion
