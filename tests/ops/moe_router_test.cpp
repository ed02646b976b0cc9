// MoE router: the fused selection and weights against the plain reference (ops/ref/moe_router_ref.h)
// for softmax and sigmoid scoring, with and without renormalization, bias and group limits, k = 1
// and k = E, tied scores; a hand-computed group-limited case; every backward (scores, weights,
// z-loss, sequence-wise aux loss) against central differences in double; expert_load against plain
// loops; float against double; thread-count independence (bitwise); CHECK failures.
//
// Finite-difference tolerance 1e-7: the losses are computed in double with steps h ≈ 1e-6, so the
// truncation error is O(h²) ≈ 1e-12 and the cancellation error about 1e-16 · |L| / h ≈ 1e-9 for the
// O(1)–O(10) losses here, two orders of magnitude below the tolerance; a wrong term is O(1).
#include "ops/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/finite_diff.h"
#include "ops/ref/moe_router_ref.h"

namespace trillion {
namespace {

using test::random_values;

constexpr double kGradTolerance = 1e-7;

// An error as "1.234e-10", recorded as a test property (visible with --gtest_output=json).
std::string sci(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", value);
  return text;
}

RouterDims make_dims(RouterScoring scoring, int64_t experts, int64_t k, bool norm, int64_t n_group = 1,
                     int64_t topk_group = 1, double scaling = 1.0) {
  RouterDims d;
  d.experts = experts, d.top_k = k, d.scoring = scoring, d.norm_topk_prob = norm;
  d.n_group = n_group, d.topk_group = topk_group, d.routed_scaling_factor = scaling;
  return d;
}

std::string describe(const RouterDims& d) {
  return std::string(d.scoring == RouterScoring::softmax ? "softmax" : "sigmoid") + " E=" + std::to_string(d.experts) +
         " k=" + std::to_string(d.top_k) + " norm=" + std::to_string(d.norm_topk_prob) +
         " groups=" + std::to_string(d.topk_group) + "/" + std::to_string(d.n_group);
}

// Logits [N, E]: uniform in [−3, 3), or quantized to multiples of 1/2 so that scores tie exactly.
std::vector<double> make_logits(int64_t n, uint64_t seed, bool quantized) {
  std::vector<double> l = random_values(n, seed, 3.0);
  if (quantized)
    for (double& v : l) v = std::round(2.0 * v) / 2.0;
  return l;
}

template <class T>
std::vector<T> scores_of(const std::vector<T>& logits, int64_t tokens, const RouterDims& d) {
  std::vector<T> s(logits.size());
  router_scores_forward<T>(s.data(), logits.data(), tokens, d);
  return s;
}

template <class T>
std::vector<int32_t> select(const std::vector<T>& scores, const T* bias, int64_t tokens, const RouterDims& d) {
  std::vector<int32_t> index(tokens * d.top_k, -1);
  router_select<T>(index.data(), scores.data(), bias, tokens, d);
  return index;
}

int64_t rows_differing(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int64_t k) {
  int64_t count = 0;
  for (size_t r = 0; r * k < a.size(); ++r)
    count += !std::equal(a.begin() + r * k, a.begin() + (r + 1) * k, b.begin() + r * k);
  return count;
}

template <class T>
void check_fused_against_reference(const RouterDims& d, bool with_bias, bool quantized, uint64_t seed) {
  const int64_t N = 37, E = d.experts, k = d.top_k;
  const std::vector<T> logits = test::cast_values<T>(make_logits(N * E, seed, quantized));
  const std::vector<T> bias = test::cast_values<T>(random_values(E, seed + 1, 0.3));
  const T* bias_ptr = with_bias ? bias.data() : nullptr;
  const std::vector<T> scores = scores_of(logits, N, d);
  const std::vector<int32_t> index = select(scores, bias_ptr, N, d);
  std::vector<int32_t> index_ref(N * k, -1);
  router_select_ref<T>(index_ref.data(), scores.data(), bias_ptr, N, d);
  ASSERT_EQ(index, index_ref) << describe(d) << " bias=" << with_bias << " quantized=" << quantized;

  const double tol = std::is_same_v<T, double> ? 1e-15 : 1e-7;
  std::vector<T> weight(N * k), weight_ref(N * k);
  router_weights_forward<T>(weight.data(), scores.data(), index.data(), N, d);
  router_weights_forward_ref<T>(weight_ref.data(), scores.data(), index.data(), N, d);
  EXPECT_LE(test::relative_error(weight, weight_ref), tol) << describe(d);

  const std::vector<T> dweight = test::cast_values<T>(random_values(N * k, seed + 2));
  std::vector<T> dscores = test::cast_values<T>(random_values(N * E, seed + 3)), dscores_ref = dscores;
  router_weights_backward<T>(dscores.data(), dweight.data(), scores.data(), index.data(), N, d);
  router_weights_backward_ref<T>(dscores_ref.data(), dweight.data(), scores.data(), index.data(), N, d);
  EXPECT_LE(test::relative_error(dscores, dscores_ref), 10 * tol) << describe(d);
}

const RouterScoring kSoftmax = RouterScoring::softmax, kSigmoid = RouterScoring::sigmoid;

TEST(MoeRouter, FusedMatchesReference) {
  struct Config {
    RouterDims dims;
    bool bias;
  };
  const Config configs[] = {
      {make_dims(kSoftmax, 16, 4, false), false},          {make_dims(kSoftmax, 16, 4, true), false},
      {make_dims(kSoftmax, 16, 1, true, 1, 1, 1.5), false}, {make_dims(kSoftmax, 16, 16, true), false},
      {make_dims(kSigmoid, 16, 4, true, 1, 1, 2.5), false}, {make_dims(kSigmoid, 16, 4, true, 1, 1, 2.5), true},
      {make_dims(kSigmoid, 16, 3, true, 4, 2, 2.5), true},  {make_dims(kSigmoid, 16, 3, false, 4, 2, 2.5), true},
      {make_dims(kSigmoid, 16, 8, true, 4, 2), true},       {make_dims(kSigmoid, 16, 1, true, 4, 2), true},
      {make_dims(kSigmoid, 16, 16, true, 4, 4), true},      {make_dims(kSigmoid, 12, 2, true, 3, 1), false},
      {make_dims(kSigmoid, 15, 1, false), true},
  };
  uint64_t seed = 10;
  for (const Config& c : configs)
    for (bool quantized : {false, true}) {
      check_fused_against_reference<double>(c.dims, c.bias, quantized, seed);
      check_fused_against_reference<float>(c.dims, c.bias, quantized, seed);
      seed += 10;
    }
}

// The reference comparison above is only meaningful if bias and group limits change decisions.
TEST(MoeRouter, BiasAndGroupLimitsChangeTheDecision) {
  const int64_t N = 37, E = 16;
  const RouterDims grouped = make_dims(kSigmoid, E, 3, true, 4, 2), plain = make_dims(kSigmoid, E, 3, true);
  const std::vector<double> scores = scores_of(make_logits(N * E, 5, false), N, grouped);
  const std::vector<double> bias = random_values(E, 6, 0.3);
  EXPECT_GT(rows_differing(select(scores, bias.data(), N, plain), select(scores, (const double*)nullptr, N, plain), 3),
            5);
  EXPECT_GT(rows_differing(select(scores, bias.data(), N, grouped), select(scores, bias.data(), N, plain), 3), 5);
}

// E = 8 in 4 groups {0,1} {2,3} {4,5} {6,7}; dyadic scores, so float and double agree exactly.
template <class T>
void check_group_limited_by_hand() {
  const RouterDims two_groups = make_dims(kSigmoid, 8, 2, true, 4, 2, 2.5);
  const RouterDims ungrouped = make_dims(kSigmoid, 8, 2, true, 1, 1, 2.5);
  // Group scores (top-2 sums) 0.96875, 1.0, 1.0625, 0.4375: groups 2 and 1 are kept although group 0
  // holds the largest score (a max rule would keep it). Inside them: 4 (0.625), then 2 and 3 tie at
  // 0.5 and the lower index wins. Without groups the choice would be {0, 4}.
  const std::vector<T> a = {0.9375, 0.03125, 0.5, 0.5, 0.625, 0.4375, 0.25, 0.1875};
  EXPECT_EQ(select(a, (const T*)nullptr, 1, two_groups), (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(select(a, (const T*)nullptr, 1, ungrouped), (std::vector<int32_t>{0, 4}));
  std::vector<T> w(2);
  const std::vector<int32_t> index_a = {4, 2};
  router_weights_forward<T>(w.data(), a.data(), index_a.data(), 1, two_groups);
  EXPECT_NEAR(w[0], 0.625 / 1.125 * 2.5, 1e-6);
  EXPECT_NEAR(w[1], 0.5 / 1.125 * 2.5, 1e-6);

  // Bias +0.5 on experts 6, 7: biased group 3 scores 0.75 + 0.6875 and wins, group 2 (1.0625) is
  // second; the biased top-2 inside them is {6, 7}; the weights use the unbiased 0.25 and 0.1875.
  const std::vector<T> bias = {0, 0, 0, 0, 0, 0, 0.5, 0.5};
  const std::vector<int32_t> index_b = select(a, bias.data(), 1, two_groups);
  EXPECT_EQ(index_b, (std::vector<int32_t>{6, 7}));
  router_weights_forward<T>(w.data(), a.data(), index_b.data(), 1, two_groups);
  EXPECT_NEAR(w[0], 0.25 / 0.4375 * 2.5, 1e-6);
  EXPECT_NEAR(w[1], 0.1875 / 0.4375 * 2.5, 1e-6);

  // One group kept; groups 0 and 1 tie at 0.75 and the lower index wins, so {0, 1}, not {0, 2}.
  const RouterDims one_group = make_dims(kSigmoid, 8, 2, false, 4, 1);
  const std::vector<T> c = {0.5, 0.25, 0.375, 0.375, 0.125, 0.0625, 0.125, 0.0625};
  EXPECT_EQ(select(c, (const T*)nullptr, 1, one_group), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(select(c, (const T*)nullptr, 1, make_dims(kSigmoid, 8, 2, false)), (std::vector<int32_t>{0, 2}));
}

TEST(MoeRouter, GroupLimitedSelectionHandComputed) {
  check_group_limited_by_hand<double>();
  check_group_limited_by_hand<float>();
}

TEST(MoeRouter, ScoresBackwardMatchesFiniteDifferences) {
  const int64_t N = 7, E = 9;
  for (RouterScoring scoring : {kSoftmax, kSigmoid}) {
    const RouterDims d = make_dims(scoring, E, 2, false);
    std::vector<double> logits = make_logits(N * E, 20, false);
    const std::vector<double> r = random_values(N * E, 21);
    auto loss = [&] { return test::weighted_sum(scores_of(logits, N, d), r); };
    const std::vector<double> scores = scores_of(logits, N, d);
    std::vector<double> dlogits(N * E, 123.0);  // written, not accumulated
    router_scores_backward<double>(dlogits.data(), r.data(), scores.data(), N, d);
    const double err = test::expect_gradients_match(loss, {{"logits", &logits, &dlogits}}, kGradTolerance);
    RecordProperty(scoring == kSoftmax ? "softmax_scores_err" : "sigmoid_scores_err", sci(err));
  }
}

TEST(MoeRouter, WeightsBackwardMatchesFiniteDifferences) {
  const int64_t N = 9, E = 10, k = 3;
  int config = 0;
  for (RouterScoring scoring : {kSoftmax, kSigmoid})
    for (bool norm : {false, true}) {
      const RouterDims d = make_dims(scoring, E, k, norm, 1, 1, scoring == kSoftmax ? 1.5 : 2.5);
      std::vector<double> scores = scores_of(make_logits(N * E, 30 + config, false), N, d);
      const std::vector<double> bias = random_values(E, 31, 0.2);
      const std::vector<int32_t> index = select(scores, bias.data(), N, d);  // a constant of the check
      const std::vector<double> r = random_values(N * k, 32 + config);
      auto loss = [&] {
        std::vector<double> w(N * k);
        router_weights_forward<double>(w.data(), scores.data(), index.data(), N, d);
        return test::weighted_sum(w, r);
      };
      const std::vector<double> prior = random_values(N * E, 33);
      std::vector<double> dscores = prior;
      router_weights_backward<double>(dscores.data(), r.data(), scores.data(), index.data(), N, d);
      for (size_t i = 0; i < dscores.size(); ++i) dscores[i] -= prior[i];
      const double err = test::expect_gradients_match(loss, {{"scores", &scores, &dscores}}, kGradTolerance);
      RecordProperty("weights_err_" + std::to_string(config++), sci(err));
    }
}

// mean_t lse(l_t)², evaluated naively (no max shift) around `offset`: lse(l) = offset + lse(l − offset).
double z_loss_formula(const std::vector<double>& logits, int64_t N, int64_t E, double offset) {
  double sum = 0.0;
  for (int64_t t = 0; t < N; ++t) {
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[t * E + e] - offset);
    const double lse = offset + std::log(s);
    sum += lse * lse;
  }
  return sum / static_cast<double>(N);
}

TEST(MoeRouter, ZLossMatchesFormulaAndFiniteDifferences) {
  const int64_t N = 11, E = 7;
  const double scale = 0.3;
  std::vector<double> logits = make_logits(N * E, 40, false);
  auto loss = [&] { return router_z_loss<double>(nullptr, logits.data(), N, E, scale); };
  EXPECT_NEAR(loss(), z_loss_formula(logits, N, E, 0.0), 1e-13);
  const std::vector<double> prior = random_values(N * E, 41);
  std::vector<double> dlogits = prior;
  EXPECT_EQ(router_z_loss<double>(dlogits.data(), logits.data(), N, E, scale), loss());
  // dlogits holds prior + scale · gradient; compare scale · gradient with the differences of scale · loss.
  for (size_t i = 0; i < dlogits.size(); ++i) dlogits[i] -= prior[i];
  auto scaled_loss = [&] { return scale * loss(); };
  const double err = test::expect_gradients_match(scaled_loss, {{"logits", &logits, &dlogits}}, kGradTolerance);
  RecordProperty("z_loss_err", sci(err));

  // Logits around 1000 (exp overflows without the max shift): value and gradient stay finite.
  std::vector<double> large = logits;
  for (double& v : large) v += 1000.0;
  std::vector<float> large_f = test::cast_values<float>(large), dlarge(N * E, 0.f);
  const double value = router_z_loss<float>(dlarge.data(), large_f.data(), N, E, 1.0);
  EXPECT_NEAR(value, z_loss_formula(std::vector<double>(large_f.begin(), large_f.end()), N, E, 1000.0), 1e-9 * value);
  for (float g : dlarge) EXPECT_TRUE(std::isfinite(g));
}

// DeepSeek-V3's sequence-wise loss written out as the header states it.
double sequence_aux_formula(const std::vector<double>& scores, const std::vector<int32_t>& index, int64_t batch,
                            int64_t seq, int64_t E, int64_t k) {
  double total = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> f(E, 0.0), P(E, 0.0);
    for (int64_t t = b * seq; t < (b + 1) * seq; ++t) {
      double row_sum = 0.0;
      for (int64_t j = 0; j < E; ++j) row_sum += scores[t * E + j];
      for (int64_t i = 0; i < E; ++i) {
        P[i] += scores[t * E + i] / row_sum / static_cast<double>(seq);
        if (std::find(index.begin() + t * k, index.begin() + (t + 1) * k, i) != index.begin() + (t + 1) * k)
          f[i] += static_cast<double>(E) / static_cast<double>(k * seq);
      }
    }
    for (int64_t i = 0; i < E; ++i) total += f[i] * P[i];
  }
  return total / static_cast<double>(batch);
}

TEST(MoeRouter, SequenceAuxLossMatchesFormulaAndFiniteDifferences) {
  const int64_t batch = 3, seq = 5, N = batch * seq, E = 8, k = 2;
  const double scale = 0.7;
  for (RouterScoring scoring : {kSigmoid, kSoftmax}) {
    const RouterDims d = make_dims(scoring, E, k, true, scoring == kSigmoid ? 4 : 1, scoring == kSigmoid ? 2 : 1);
    std::vector<double> scores = scores_of(make_logits(N * E, 50, false), N, d);
    const std::vector<int32_t> index = select(scores, (const double*)nullptr, N, d);  // constant
    auto loss = [&] { return sequence_aux_loss<double>(nullptr, scores.data(), index.data(), batch, seq, d, scale); };
    EXPECT_NEAR(loss(), sequence_aux_formula(scores, index, batch, seq, E, k), 1e-14);
    const std::vector<double> prior = random_values(N * E, 51);
    std::vector<double> dscores = prior;
    EXPECT_EQ(sequence_aux_loss<double>(dscores.data(), scores.data(), index.data(), batch, seq, d, scale), loss());
    for (size_t i = 0; i < dscores.size(); ++i) dscores[i] -= prior[i];
    auto scaled_loss = [&] { return scale * loss(); };
    const double err = test::expect_gradients_match(scaled_loss, {{"scores", &scores, &dscores}}, kGradTolerance);
    RecordProperty(scoring == kSigmoid ? "aux_sigmoid_err" : "aux_softmax_err", sci(err));
  }
}

// Sequences split over two holders (like context parallelism's chunks: positions [0, 3) and [8, 11)
// on one, [3, 8) on the other): each holder's value and gradient, with f summed over both, add up to
// the whole sequences' loss and equal their gradient rows.
TEST(MoeRouter, SequenceAuxLossOverSplitSequencesAddsUpToTheWholeOnes) {
  const int64_t batch = 2, seq = 11, N = batch * seq, E = 8, k = 2;
  const double scale = 0.7;
  const RouterDims d = make_dims(kSigmoid, E, k, true, 4, 2);
  const std::vector<double> scores = scores_of(make_logits(N * E, 52, false), N, d);
  const std::vector<int32_t> index = select(scores, (const double*)nullptr, N, d);
  std::vector<double> whole_dscores(N * E, 0.0);
  const double whole = sequence_aux_loss<double>(whole_dscores.data(), scores.data(), index.data(), batch, seq, d, scale);

  struct Part {
    std::vector<int64_t> positions;
    std::vector<double> scores = {}, dscores = {}, f = {};  // [batch, len, E] ×2, f [batch, E] of its own assignments
    std::vector<int32_t> index = {};                        // [batch, len, k]
  };
  Part parts[2] = {{{0, 1, 2, 8, 9, 10}}, {{3, 4, 5, 6, 7}}};
  for (Part& p : parts)
    for (int64_t b = 0; b < batch; ++b)
      for (const int64_t t : p.positions) {
        p.scores.insert(p.scores.end(), scores.begin() + (b * seq + t) * E, scores.begin() + (b * seq + t + 1) * E);
        p.index.insert(p.index.end(), index.begin() + (b * seq + t) * k, index.begin() + (b * seq + t + 1) * k);
      }
  const auto run = [&](Part& p, const std::function<void(double*, int64_t)>& sum, double* dscores) {
    const SplitSequences split{seq, sum};
    return sequence_aux_loss<double>(dscores, p.scores.data(), p.index.data(), batch, int64_t(p.positions.size()), d,
                                     scale, &split);
  };
  for (Part& p : parts)  // each holder's own assignment fractions
    run(p, [&](double* f, int64_t count) { p.f.assign(f, f + count); }, nullptr);
  double total = 0.0;
  for (int h = 0; h < 2; ++h) {
    Part& p = parts[h];
    const Part& other = parts[1 - h];
    p.dscores.assign(p.scores.size(), 0.0);
    total += run(
        p, [&](double* f, int64_t count) { for (int64_t i = 0; i < count; ++i) f[i] += other.f[i]; },
        p.dscores.data());
    const int64_t len = int64_t(p.positions.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < len; ++j)
        for (int64_t e = 0; e < E; ++e)
          EXPECT_NEAR(p.dscores[(b * len + j) * E + e], whole_dscores[(b * seq + p.positions[j]) * E + e], 1e-15)
              << "holder " << h << " row " << b << " position " << p.positions[j];
  }
  EXPECT_NEAR(total, whole, 1e-14);
}

TEST(MoeRouter, ExpertLoadCountsAssignmentsAndSumsScores) {
  const int64_t N = 301, E = 12, k = 3;  // several token blocks, the last one partial
  const RouterDims d = make_dims(kSigmoid, E, k, true, 3, 2);
  const std::vector<double> scores = scores_of(make_logits(N * E, 60, false), N, d);
  const std::vector<int32_t> index = select(scores, (const double*)nullptr, N, d);
  std::vector<int64_t> counts(E, -7);
  std::vector<double> sums(E, -7.0);
  expert_load<double>(counts.data(), sums.data(), scores.data(), index.data(), N, d);
  std::vector<int64_t> expected_counts(E, 0);
  std::vector<double> expected_sums(E, 0.0);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t i = 0; i < k; ++i) ++expected_counts[index[t * k + i]];
    for (int64_t e = 0; e < E; ++e) expected_sums[e] += scores[t * E + e];
  }
  EXPECT_EQ(counts, expected_counts);
  EXPECT_LE(test::relative_error(sums, expected_sums), 1e-14);
}

// Everything the router computes, for one input, in T; doubles returned by the losses appended.
template <class T>
struct RouterOutputs {
  std::vector<T> scores, weight, dlogits, dscores, dlogits_z;
  std::vector<int32_t> index;
  std::vector<int64_t> counts;
  std::vector<double> prob_sums, losses;
};

template <class T>
RouterOutputs<T> run_router(const RouterDims& d, int64_t batch, int64_t seq, uint64_t seed,
                            const std::vector<int32_t>* forced_index = nullptr) {
  const int64_t N = batch * seq, E = d.experts, k = d.top_k;
  const std::vector<T> logits = test::cast_values<T>(make_logits(N * E, seed, false));
  const std::vector<T> bias = test::cast_values<T>(random_values(E, seed + 1, 0.3));
  const std::vector<T> dweight = test::cast_values<T>(random_values(N * k, seed + 2));
  RouterOutputs<T> o;
  o.scores = scores_of(logits, N, d);
  o.index = forced_index != nullptr ? *forced_index : select(o.scores, bias.data(), N, d);
  o.weight.assign(N * k, T(0));
  router_weights_forward<T>(o.weight.data(), o.scores.data(), o.index.data(), N, d);
  o.dscores.assign(N * E, T(0));
  router_weights_backward<T>(o.dscores.data(), dweight.data(), o.scores.data(), o.index.data(), N, d);
  o.losses.push_back(
      sequence_aux_loss<T>(o.dscores.data(), o.scores.data(), o.index.data(), batch, seq, d, 0.5));
  o.dlogits.assign(N * E, T(0));
  router_scores_backward<T>(o.dlogits.data(), o.dscores.data(), o.scores.data(), N, d);
  o.dlogits_z.assign(N * E, T(0));
  o.losses.push_back(router_z_loss<T>(o.dlogits_z.data(), logits.data(), N, E, 0.1));
  o.counts.assign(E, 0);
  o.prob_sums.assign(E, 0.0);
  expert_load<T>(o.counts.data(), o.prob_sums.data(), o.scores.data(), o.index.data(), N, d);
  return o;
}

const RouterDims kPipelineConfigs[] = {make_dims(kSoftmax, 24, 4, true), make_dims(kSigmoid, 24, 6, true, 4, 2, 2.5)};

TEST(MoeRouter, FloatAgreesWithDouble) {
  for (const RouterDims& d : kPipelineConfigs) {
    const RouterOutputs<double> ref = run_router<double>(d, 3, 13, 70);
    // The float pass replays the double decision, so near-ties cannot make the comparison flaky;
    // the float decision itself is compared separately.
    const RouterOutputs<float> out = run_router<float>(d, 3, 13, 70, &ref.index);
    EXPECT_EQ(run_router<float>(d, 3, 13, 70).index, ref.index) << describe(d);
    double worst = 0.0;
    for (const auto& [a, b] : {std::pair{&out.scores, &ref.scores}, std::pair{&out.weight, &ref.weight},
                               std::pair{&out.dscores, &ref.dscores}, std::pair{&out.dlogits, &ref.dlogits},
                               std::pair{&out.dlogits_z, &ref.dlogits_z}})
      worst = std::max(worst, test::relative_error(*a, *b));
    worst = std::max(worst, test::relative_error(out.prob_sums, ref.prob_sums));
    worst = std::max(worst, test::relative_error(out.losses, ref.losses));
    EXPECT_LE(worst, 1e-5) << describe(d);
    EXPECT_EQ(out.counts, ref.counts);
    RecordProperty(d.scoring == kSoftmax ? "float_softmax_err" : "float_sigmoid_err", sci(worst));
  }
}

TEST(MoeRouter, ThreadCountDoesNotMatter) {
  for (const RouterDims& d : kPipelineConfigs) {
    RouterOutputs<float> results[2];
    for (int threads : {1, 2})
      test::with_threads(threads, [&] { results[threads - 1] = run_router<float>(d, 4, 75, 80); });
    const RouterOutputs<float>& a = results[0];
    const RouterOutputs<float>& b = results[1];
    EXPECT_EQ(a.scores, b.scores);
    EXPECT_EQ(a.index, b.index);
    EXPECT_EQ(a.weight, b.weight);
    EXPECT_EQ(a.dscores, b.dscores);
    EXPECT_EQ(a.dlogits, b.dlogits);
    EXPECT_EQ(a.dlogits_z, b.dlogits_z);
    EXPECT_EQ(a.counts, b.counts);
    EXPECT_EQ(a.prob_sums, b.prob_sums);  // exact comparison of doubles: bitwise equality
    EXPECT_EQ(a.losses, b.losses);
  }
}

TEST(MoeRouterDeathTest, BadDimsFailChecks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> scores(2 * 8, 0.5f);
  std::vector<int32_t> index(2 * 8);
  auto run = [&](const RouterDims& d) { router_select<float>(index.data(), scores.data(), nullptr, 2, d); };
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 0, true)), "top_k");
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 9, true)), "top_k");
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 2, true, 3, 1)), "not divisible by n_group");
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 2, true, 8, 1)), "at least 2 per group");
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 2, true, 4, 5)), "topk_group");
  EXPECT_DEATH(run(make_dims(kSigmoid, 8, 5, true, 4, 2)), "fewer than top_k");
  EXPECT_DEATH(run(make_dims(kSoftmax, 8, 2, true, 4, 2)), "sigmoid scoring only");
  std::vector<float> weight(2 * 2);
  index[3] = 8;
  const RouterDims d = make_dims(kSigmoid, 8, 2, true);
  EXPECT_DEATH(router_weights_forward<float>(weight.data(), scores.data(), index.data(), 2, d), "router index 8");
}

// A NaN score is selected first (ops/topk.h), with and without group masking, so it flows on.
TEST(MoeRouter, NanScoresAreSelectedFirst) {
  std::vector<float> scores(2 * 8, 0.5f);
  for (int e = 0; e < 8; ++e) scores[8 + e] = 0.1f * float(e);
  scores[8 + 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> index(2 * 2);
  router_select<float>(index.data(), scores.data(), nullptr, 2, make_dims(kSigmoid, 8, 2, true));
  EXPECT_EQ(index[2], 2);
  EXPECT_EQ(index[3], 7);
  router_select<float>(index.data(), scores.data(), nullptr, 2, make_dims(kSoftmax, 8, 2, true));
  EXPECT_EQ(index[2], 2);
}

}  // namespace
}  // namespace trillion
