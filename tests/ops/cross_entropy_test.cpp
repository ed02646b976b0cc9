// Fused LM head + cross-entropy: backward against finite differences (several tilings, ignored
// rows), forward and backward against the plain reference (float and double, large logits), float
// against double, thread-count independence, and an all-ignored batch. The forward-backward variant
// (gradients formed during the forward, optional z-loss): against the plain 3-gemm reference and the
// forward + backward pair, finite differences including the z-loss, bitwise thread independence and
// dw accumulation; under the bf16 precision, its dlogits copy against rounding at each gemm.
#include "ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/memory.h"
#include "ops/finite_diff.h"
#include "ops/gemm.h"
#include "ops/ref/cross_entropy_ref.h"

namespace trillion {
namespace {

using test::cast_values;
using test::random_values;
using test::relative_error;

std::vector<int32_t> random_targets(int64_t rows, int64_t vocab, uint64_t seed) {
  CounterRng rng(seed, "targets");
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = r % 5 == 3 ? kIgnoreIndex : static_cast<int32_t>(rng.bits(r) % static_cast<uint64_t>(vocab));
  targets[0] = static_cast<int32_t>(vocab - 1);  // a target in the last, partial tile
  return targets;
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 13, d = 5, vocab = 37;
  const std::vector<int32_t> targets = random_targets(rows, vocab, 1);
  // Several chunks and tiles with partial last ones; the second caps the tile count at 4.
  for (const CrossEntropyTiling tiling : {CrossEntropyTiling{4, 8, 32}, CrossEntropyTiling{6, 8, 4}}) {
    std::vector<double> h = random_values(rows * d, 2), w = random_values(vocab * d, 3);
    const double weight = 0.37;  // L = weight · loss_sum, so the backward's scale is the weight
    auto loss = [&] {
      std::vector<double> lse(rows);
      return weight * lm_head_cross_entropy_forward<double>(lse.data(), h.data(), w.data(), targets.data(), rows,
                                                            d, vocab, tiling)
                          .loss_sum;
    };
    std::vector<double> lse(rows);
    const CrossEntropyResult result =
        lm_head_cross_entropy_forward<double>(lse.data(), h.data(), w.data(), targets.data(), rows, d, vocab, tiling);
    EXPECT_EQ(result.count, rows - 2);  // rows 3 and 8 are ignored
    std::vector<double> dh(rows * d, 9.0);  // written (=): the prior value must vanish
    const std::vector<double> dw_prior = random_values(vocab * d, 4);
    std::vector<double> dw = dw_prior;
    lm_head_cross_entropy_backward<double>(dh.data(), dw.data(), h.data(), w.data(), targets.data(), lse.data(),
                                           weight, rows, d, vocab, tiling);
    for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw_prior[i];
    test::expect_gradients_match(loss, {{"h", &h, &dh}, {"w", &w, &dw}});
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dh[3 * d + j], 0.0) << "ignored row gets no gradient";
  }
}

// Runs the fused op and the reference on the same data; returns relative errors of loss, lse, dh, dw.
template <class T>
std::vector<double> fused_vs_reference(int64_t rows, int64_t d, int64_t vocab, double h_scale) {
  const std::vector<T> h = cast_values<T>(random_values(rows * d, 5, h_scale));
  const std::vector<T> w = cast_values<T>(random_values(vocab * d, 6));
  const std::vector<int32_t> targets = random_targets(rows, vocab, 7);
  std::vector<T> lse(rows), lse_ref(rows), dh(rows * d), dh_ref(rows * d), dw(vocab * d), dw_ref(vocab * d);
  const CrossEntropyResult fused =
      lm_head_cross_entropy_forward<T>(lse.data(), h.data(), w.data(), targets.data(), rows, d, vocab);
  const CrossEntropyResult ref =
      lm_head_cross_entropy_forward_ref<T>(lse_ref.data(), h.data(), w.data(), targets.data(), rows, d, vocab);
  EXPECT_EQ(fused.count, ref.count);
  const double scale = 1.0 / static_cast<double>(ref.count);
  lm_head_cross_entropy_backward<T>(dh.data(), dw.data(), h.data(), w.data(), targets.data(), lse.data(), scale, rows,
                                    d, vocab);
  lm_head_cross_entropy_backward_ref<T>(dh_ref.data(), dw_ref.data(), h.data(), w.data(), targets.data(),
                                        lse_ref.data(), scale, rows, d, vocab);
  for (T value : dw) EXPECT_TRUE(std::isfinite(static_cast<double>(value)));
  return {std::abs(fused.loss_sum - ref.loss_sum) / std::abs(ref.loss_sum), relative_error(lse, lse_ref),
          relative_error(dh, dh_ref), relative_error(dw, dw_ref)};
}

TEST(CrossEntropy, FusedMatchesReference) {
  // Default tiling: 2 row chunks and 3 vocabulary tiles, the last ones partial.
  for (double err : fused_vs_reference<double>(300, 24, 2500, 1.0)) EXPECT_LE(err, 1e-12);
  for (double err : fused_vs_reference<float>(300, 24, 2500, 1.0)) EXPECT_LE(err, 2e-5);
  // Large logits (|logit| up to ~hundreds): the online log-sum-exp must stay finite and exact.
  for (double err : fused_vs_reference<double>(70, 16, 1500, 30.0)) EXPECT_LE(err, 1e-12);
  for (double err : fused_vs_reference<float>(70, 16, 1500, 30.0)) EXPECT_LE(err, 2e-5);
}

TEST(CrossEntropy, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  const int64_t rows = 300, d = 24, vocab = 2500;
  const std::vector<double> h = random_values(rows * d, 8), w = random_values(vocab * d, 9);
  const std::vector<int32_t> targets = random_targets(rows, vocab, 10);
  std::vector<double> lse(rows), dh(rows * d), dw(vocab * d);
  const double loss = lm_head_cross_entropy_forward<double>(lse.data(), h.data(), w.data(), targets.data(), rows, d,
                                                            vocab)
                          .loss_sum;
  lm_head_cross_entropy_backward<double>(dh.data(), dw.data(), h.data(), w.data(), targets.data(), lse.data(), 0.01,
                                         rows, d, vocab);

  const std::vector<float> hf = cast_values<float>(h), wf = cast_values<float>(w);
  std::vector<float> lse_f[2], dh_f[2], dw_f[2];
  double loss_f[2];
  for (int threads : {1, 2}) {
    const int i = threads - 1;
    lse_f[i].assign(rows, 0.f), dh_f[i].assign(rows * d, 0.f), dw_f[i].assign(vocab * d, 0.f);
    test::with_threads(threads, [&] {
      loss_f[i] = lm_head_cross_entropy_forward<float>(lse_f[i].data(), hf.data(), wf.data(), targets.data(), rows,
                                                       d, vocab)
                      .loss_sum;
      lm_head_cross_entropy_backward<float>(dh_f[i].data(), dw_f[i].data(), hf.data(), wf.data(), targets.data(),
                                            lse_f[i].data(), 0.01, rows, d, vocab);
    });
  }
  EXPECT_EQ(loss_f[0], loss_f[1]);
  EXPECT_EQ(lse_f[0], lse_f[1]);
  EXPECT_EQ(dh_f[0], dh_f[1]);
  EXPECT_EQ(dw_f[0], dw_f[1]);
  EXPECT_LE(std::abs(loss_f[0] - loss) / loss, 1e-5);
  EXPECT_LE(relative_error(lse_f[0], lse), 1e-5);
  EXPECT_LE(relative_error(dh_f[0], dh), 1e-5);
  EXPECT_LE(relative_error(dw_f[0], dw), 1e-5);
}

// Relative errors of forward_backward against lm_head_cross_entropy_plain (loss, z-loss sum, lse, dh,
// dw) and, without z-loss, against the forward + backward pair (loss, lse, dh, dw). dw starts from
// the same random values everywhere, so the accumulation (+=) is compared too.
template <class T>
std::vector<double> forward_backward_errors(int64_t rows, int64_t d, int64_t vocab, double z_loss_coef,
                                            const CrossEntropyTiling& tiling) {
  const std::vector<T> h = cast_values<T>(random_values(rows * d, 21, 2.0));
  const std::vector<T> w = cast_values<T>(random_values(vocab * d, 22));
  const std::vector<T> dw_prior = cast_values<T>(random_values(vocab * d, 23));
  const std::vector<int32_t> targets = random_targets(rows, vocab, 24);
  const double scale = 0.013;
  std::vector<T> lse(rows), dh(rows * d, T(7)), dw = dw_prior;
  std::vector<T> lse_plain(rows), dh_plain(rows * d), dw_plain = dw_prior;
  const CrossEntropyResult fused = lm_head_cross_entropy_forward_backward<T>(
      dh.data(), dw.data(), lse.data(), h.data(), w.data(), targets.data(), scale, z_loss_coef, rows, d, vocab, tiling);
  const CrossEntropyResult plain =
      lm_head_cross_entropy_plain<T>(dh_plain.data(), dw_plain.data(), lse_plain.data(), h.data(), w.data(),
                                     targets.data(), scale, z_loss_coef, rows, d, vocab);
  EXPECT_EQ(fused.count, plain.count);
  EXPECT_GT(plain.z_loss_sum, 0.0);
  std::vector<double> errors = {std::abs(fused.loss_sum - plain.loss_sum) / std::abs(plain.loss_sum),
                                std::abs(fused.z_loss_sum - plain.z_loss_sum) / plain.z_loss_sum,
                                relative_error(lse, lse_plain), relative_error(dh, dh_plain),
                                relative_error(dw, dw_plain)};
  if (z_loss_coef == 0.0) {
    std::vector<T> lse_pair(rows), dh_pair(rows * d), dw_pair = dw_prior;
    const CrossEntropyResult pair = lm_head_cross_entropy_forward<T>(lse_pair.data(), h.data(), w.data(),
                                                                     targets.data(), rows, d, vocab, tiling);
    lm_head_cross_entropy_backward<T>(dh_pair.data(), dw_pair.data(), h.data(), w.data(), targets.data(),
                                      lse_pair.data(), scale, rows, d, vocab, tiling);
    EXPECT_EQ(fused.count, pair.count);
    errors.insert(errors.end(), {std::abs(fused.loss_sum - pair.loss_sum) / std::abs(pair.loss_sum),
                                 relative_error(lse, lse_pair), relative_error(dh, dh_pair),
                                 relative_error(dw, dw_pair)});
  }
  return errors;
}

TEST(CrossEntropy, ForwardBackwardMatchesPlainAndForwardBackwardPair) {
  // Default tiling (2 row chunks, 3 vocabulary tiles, partial last ones; d = 300 gives a partial dh
  // column block); small tiles; a chunk byte budget that cuts the row chunk to 3 rows.
  const CrossEntropyTiling small{4, 8, 32}, budget_double{256, 8, 4, 3 * 37 * 8}, budget_float{256, 8, 4, 3 * 37 * 4};
  for (double z : {0.0, 1e-2}) {
    for (double err : forward_backward_errors<double>(300, 300, 2500, z, {})) EXPECT_LE(err, 1e-10) << z;
    for (double err : forward_backward_errors<float>(300, 300, 2500, z, {})) EXPECT_LE(err, 1e-5) << z;
    for (double err : forward_backward_errors<double>(13, 5, 37, z, small)) EXPECT_LE(err, 1e-10) << z;
    for (double err : forward_backward_errors<float>(13, 5, 37, z, small)) EXPECT_LE(err, 1e-5) << z;
    for (double err : forward_backward_errors<double>(13, 5, 37, z, budget_double)) EXPECT_LE(err, 1e-10) << z;
    for (double err : forward_backward_errors<float>(13, 5, 37, z, budget_float)) EXPECT_LE(err, 1e-5) << z;
  }
  EXPECT_EQ(forward_backward_row_chunk(13, 37, 8, budget_double), 3);
  EXPECT_EQ(forward_backward_row_chunk(4096, 131072, 4), 64);
  EXPECT_EQ(forward_backward_row_chunk(10, 131072, 4), 10);
}

TEST(CrossEntropy, ForwardBackwardWithZLossMatchesFiniteDifferences) {
  const int64_t rows = 13, d = 5, vocab = 37;
  const std::vector<int32_t> targets = random_targets(rows, vocab, 25);
  const double scale = 0.37, z_loss_coef = 0.2;
  for (const CrossEntropyTiling tiling : {CrossEntropyTiling{4, 8, 32}, CrossEntropyTiling{256, 8, 4, 5 * vocab * 8}}) {
    std::vector<double> h = random_values(rows * d, 26), w = random_values(vocab * d, 27);
    auto objective = [&] {
      std::vector<double> dh(rows * d), dw(vocab * d);
      const CrossEntropyResult r = lm_head_cross_entropy_forward_backward<double>(
          dh.data(), dw.data(), nullptr, h.data(), w.data(), targets.data(), scale, z_loss_coef, rows, d, vocab,
          tiling);
      return scale * (r.loss_sum + z_loss_coef * r.z_loss_sum);
    };
    std::vector<double> dh(rows * d, 9.0), dw(vocab * d, 0.0);
    const CrossEntropyResult result = lm_head_cross_entropy_forward_backward<double>(
        dh.data(), dw.data(), nullptr, h.data(), w.data(), targets.data(), scale, z_loss_coef, rows, d, vocab, tiling);
    EXPECT_EQ(result.count, rows - 2);  // rows 3 and 8 are ignored
    test::expect_gradients_match(objective, {{"h", &h, &dh}, {"w", &w, &dw}});
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dh[8 * d + j], 0.0) << "ignored row gets no gradient";
  }
}

TEST(CrossEntropy, ForwardBackwardIsBitwiseIndependentOfThreadsAndAccumulatesDw) {
  const int64_t rows = 150, d = 300, vocab = 2100;
  const std::vector<float> h = cast_values<float>(random_values(rows * d, 28));
  const std::vector<float> w = cast_values<float>(random_values(vocab * d, 29));
  const std::vector<float> dw_prior = cast_values<float>(random_values(vocab * d, 30));
  const std::vector<int32_t> targets = random_targets(rows, vocab, 31);
  const CrossEntropyTiling tiling{64, 256, 32};  // 3 row chunks, 9 vocabulary tiles, 2 dh column blocks
  std::vector<float> lse[3], dh[3], dw[3];
  CrossEntropyResult result[3];
  for (int threads : {1, 2, 3}) {
    const int i = threads - 1;
    lse[i].assign(rows, 0.f), dh[i].assign(rows * d, 0.f), dw[i] = dw_prior;
    test::with_threads(threads, [&] {
      result[i] = lm_head_cross_entropy_forward_backward<float>(dh[i].data(), dw[i].data(), lse[i].data(), h.data(),
                                                                w.data(), targets.data(), 0.01, 1e-3, rows, d, vocab,
                                                                tiling);
    });
  }
  for (int i : {1, 2}) {
    EXPECT_EQ(result[i].loss_sum, result[0].loss_sum);
    EXPECT_EQ(result[i].z_loss_sum, result[0].z_loss_sum);
    EXPECT_EQ(lse[i], lse[0]);
    EXPECT_EQ(dh[i], dh[0]);
    EXPECT_EQ(dw[i], dw[0]);
  }
  // dw += : the same call from zero, plus the prior, gives the same dw up to rounding.
  std::vector<float> dh_zero(rows * d), dw_zero(vocab * d, 0.f);
  lm_head_cross_entropy_forward_backward<float>(dh_zero.data(), dw_zero.data(), nullptr, h.data(), w.data(),
                                                targets.data(), 0.01, 1e-3, rows, d, vocab, tiling);
  EXPECT_EQ(dh_zero, dh[0]);
  for (size_t j = 0; j < dw_zero.size(); ++j) dw_zero[j] += dw_prior[j];
  EXPECT_LE(relative_error(dw[0], dw_zero), 1e-6);
}

// Under the bf16 precision the gradient gemms read dlogits from its bf16 copy: the bits of rounding
// it at each gemm, at any thread count, and the temporaries forward_backward_workspace_bytes says.
TEST(CrossEntropy, ForwardBackwardsBf16DlogitsCopyGivesTheSameBitsInTheWorkspaceItCounts) {
  const MatmulPrecisionScope bf16_products(MatmulPrecision::bf16);
  const int64_t rows = 150, d = 300, vocab = 2100;
  const std::vector<float> h = cast_values<float>(random_values(rows * d, 32));
  const std::vector<float> w = cast_values<float>(random_values(vocab * d, 33));
  const std::vector<int32_t> targets = random_targets(rows, vocab, 34);
  // 3 row chunks, 9 vocabulary tiles, 2 dh column blocks; a byte budget that cuts the chunk to 7 rows.
  for (CrossEntropyTiling tiling : {CrossEntropyTiling{64, 256, 32}, CrossEntropyTiling{256, 256, 32, 7 * vocab * 4}}) {
    struct Out {
      CrossEntropyResult result;
      std::vector<float> lse, dh, dw;
      int64_t workspace = 0;
    };
    const auto run = [&](bool copy, int threads) {
      tiling.bf16_dlogits = copy;
      Out o{{}, std::vector<float>(rows), std::vector<float>(rows * d), std::vector<float>(vocab * d, 0.f)};
      test::with_threads(threads, [&] {
        const int64_t before = MemoryStats::current(Tier::fast);
        MemoryStats::reset_peak(Tier::fast);
        o.result = lm_head_cross_entropy_forward_backward<float>(o.dh.data(), o.dw.data(), o.lse.data(), h.data(),
                                                                 w.data(), targets.data(), 0.01, 1e-3, rows, d, vocab,
                                                                 tiling);
        o.workspace = MemoryStats::peak(Tier::fast) - before;
      });
      return o;
    };
    const Out rounding = run(false, 2);
    for (const int threads : {1, 2, 3}) {
      const Out copied = run(true, threads);
      EXPECT_EQ(copied.result.loss_sum, rounding.result.loss_sum);
      EXPECT_EQ(copied.lse, rounding.lse);
      EXPECT_EQ(copied.dh, rounding.dh) << threads << " threads";
      EXPECT_EQ(copied.dw, rounding.dw) << threads << " threads";
      EXPECT_EQ(copied.workspace, forward_backward_workspace_bytes(rows, vocab, 4, true, tiling));
    }
    EXPECT_EQ(rounding.workspace, forward_backward_workspace_bytes(rows, vocab, 4, false, tiling));
    tiling.bf16_dlogits = false;
    EXPECT_EQ(rounding.workspace, forward_backward_workspace_bytes(rows, vocab, 4, true, tiling));
  }
}

TEST(CrossEntropy, AllIgnoredRowsGiveZeroLossAndGradient) {
  const int64_t rows = 9, d = 4, vocab = 50;
  const std::vector<double> h = random_values(rows * d, 11), w = random_values(vocab * d, 12);
  const std::vector<int32_t> targets(rows, kIgnoreIndex);
  std::vector<double> lse(rows), dh(rows * d, 1.0), dw(vocab * d, 2.0);
  const CrossEntropyResult result =
      lm_head_cross_entropy_forward<double>(lse.data(), h.data(), w.data(), targets.data(), rows, d, vocab);
  EXPECT_EQ(result.count, 0);
  EXPECT_EQ(result.loss_sum, 0.0);
  for (double value : lse) EXPECT_TRUE(std::isfinite(value));  // saved for ignored rows too
  lm_head_cross_entropy_backward<double>(dh.data(), dw.data(), h.data(), w.data(), targets.data(), lse.data(), 1.0,
                                         rows, d, vocab);
  EXPECT_EQ(dh, std::vector<double>(rows * d, 0.0));
  EXPECT_EQ(dw, std::vector<double>(vocab * d, 2.0));
  std::fill(dh.begin(), dh.end(), 1.0);
  const CrossEntropyResult fused = lm_head_cross_entropy_forward_backward<double>(
      dh.data(), dw.data(), nullptr, h.data(), w.data(), targets.data(), 1.0, 0.5, rows, d, vocab);
  EXPECT_EQ(fused.count, 0);
  EXPECT_EQ(fused.loss_sum, 0.0);
  EXPECT_EQ(fused.z_loss_sum, 0.0);
  EXPECT_EQ(dh, std::vector<double>(rows * d, 0.0));
  EXPECT_EQ(dw, std::vector<double>(vocab * d, 2.0));
}

}  // namespace
}  // namespace trillion
