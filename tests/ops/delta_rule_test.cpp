// The gated delta rule in recurrent form (ops/delta_rule.h), both decay kinds: forward against a
// naive reference with explicit state matrices, backward against finite differences (short and
// across backward checkpoints), per-channel decay with equal channels against per-head decay,
// packed segments against separate runs, a run split in two carrying its state (forward and
// backward), float against double under strong decay, thread-count independence.
#include "ops/delta_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "ops/delta_rule_inputs.h"
#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::backward;
using test::forward;
using test::Form;
using test::Grads;
using test::Inputs;
using test::kDecays;
using test::make_inputs;
using test::make_sizes;
using test::or_null;
using test::Outputs;
using test::random_values;

// The definitions with explicit S[K][V] matrices, one segment per batch row.
Outputs<double> naive_forward(const Inputs& in) {
  const DeltaRuleSizes& s = in.sizes;
  const int64_t K = s.key_dim, V = s.value_dim, H = s.heads;
  Outputs<double> out{std::vector<double>(in.tokens() * V), std::vector<double>(in.state_numel())};
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> S(K, std::vector<double>(V, 0.0));
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) S[i][j] = in.s0.empty() ? 0.0 : in.s0[((b * H + h) * K + i) * V + j];
      for (int64_t t = 0; t < s.seq_len; ++t) {
        const int64_t tok = (b * s.seq_len + t) * H + h;
        for (int64_t i = 0; i < K; ++i) {
          const double gi = in.g_width() == 1 ? in.g[tok] : in.g[tok * K + i];
          for (int64_t j = 0; j < V; ++j) S[i][j] *= std::exp(gi);
        }
        std::vector<double> u(V);
        for (int64_t j = 0; j < V; ++j) {
          double stk = 0.0;
          for (int64_t i = 0; i < K; ++i) stk += S[i][j] * in.k[tok * K + i];
          u[j] = in.beta[tok] * (in.v[tok * V + j] - stk);
        }
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[i][j] += in.k[tok * K + i] * u[j];
        for (int64_t j = 0; j < V; ++j) {
          double o = 0.0;
          for (int64_t i = 0; i < K; ++i) o += S[i][j] * in.q[tok * K + i];
          out.o[tok * V + j] = o;
        }
      }
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) out.s_final[((b * H + h) * K + i) * V + j] = S[i][j];
    }
  }
  return out;
}


TEST(DeltaRule, ForwardMatchesNaiveReference) {
  for (DeltaDecay decay : kDecays) {
    for (bool with_s0 : {true, false}) {
      const Inputs in = make_inputs(make_sizes(2, 13, 2, 5, 3, decay), 11, -2.0, -0.01, with_s0);
      const Outputs<double> got = forward<double>(Form::recurrent, in), want = naive_forward(in);
      EXPECT_LE(test::relative_error(got.o, want.o), 1e-14);
      EXPECT_LE(test::relative_error(got.s_final, want.s_final), 1e-14);
    }
  }
}

// Loss Σ o ⊙ R + Σ s_final ⊙ R_S; every input's gradient against central differences.
void check_backward(const DeltaRuleSizes& sizes, uint64_t seed) {
  Inputs in = make_inputs(sizes, seed, -2.0, -0.01, true);
  const std::vector<double> r_o = random_values(in.tokens() * sizes.value_dim, seed + 10);
  const std::vector<double> r_s = random_values(in.state_numel(), seed + 11);
  auto loss = [&] {
    const Outputs<double> out = forward<double>(Form::recurrent, in);
    return test::weighted_sum(out.o, r_o) + test::weighted_sum(out.s_final, r_s);
  };
  const Grads<double> d = backward<double>(Form::recurrent, in, r_o, r_s);
  const double worst = test::expect_gradients_match(loss, {{"q", &in.q, &d.dq},
                                                           {"k", &in.k, &d.dk},
                                                           {"v", &in.v, &d.dv},
                                                           {"g", &in.g, &d.dg},
                                                           {"beta", &in.beta, &d.dbeta},
                                                           {"s0", &in.s0, &d.ds0}});
  char worst_text[32];
  std::snprintf(worst_text, sizeof(worst_text), "%.3g", worst);
  ::testing::Test::RecordProperty("worst_relative_error", worst_text);

  // A null ds_final is zeros.
  const Grads<double> null_final = backward<double>(Form::recurrent, in, r_o, {});
  const Grads<double> zero_final = backward<double>(Form::recurrent, in, r_o, std::vector<double>(in.state_numel(), 0.0));
  EXPECT_EQ(null_final.dq, zero_final.dq);
  EXPECT_EQ(null_final.dg, zero_final.dg);
  EXPECT_EQ(null_final.ds0, zero_final.ds0);
}

TEST(DeltaRule, PerHeadBackwardMatchesFiniteDifferences) {
  check_backward(make_sizes(2, 13, 2, 5, 3, DeltaDecay::per_head), 21);
}

TEST(DeltaRule, PerChannelBackwardMatchesFiniteDifferences) {
  check_backward(make_sizes(2, 13, 2, 5, 3, DeltaDecay::per_key_channel), 31);
}

// 150 tokens: three checkpoint chunks in backward, the last one partial.
TEST(DeltaRule, BackwardAcrossCheckpointsMatchesFiniteDifferences) {
  for (DeltaDecay decay : kDecays) check_backward(make_sizes(1, 150, 1, 4, 3, decay), 41);
}

TEST(DeltaRule, PerChannelWithEqualChannelsEqualsPerHead) {
  const Inputs scalar = make_inputs(make_sizes(2, 13, 2, 5, 3, DeltaDecay::per_head), 51, -2.0, -0.01, true);
  Inputs channel = scalar;
  channel.sizes.decay = DeltaDecay::per_key_channel;
  const int64_t K = scalar.sizes.key_dim;
  channel.g.resize(scalar.g.size() * K);
  for (size_t r = 0; r < scalar.g.size(); ++r) std::fill_n(channel.g.begin() + r * K, K, scalar.g[r]);

  const Outputs<double> fs = forward<double>(Form::recurrent, scalar), fc = forward<double>(Form::recurrent, channel);
  EXPECT_LE(test::relative_error(fc.o, fs.o), 1e-14);
  EXPECT_LE(test::relative_error(fc.s_final, fs.s_final), 1e-14);

  const std::vector<double> d_o = random_values(fs.o.size(), 52), ds_final = random_values(fs.s_final.size(), 53);
  const Grads<double> bs = backward<double>(Form::recurrent, scalar, d_o, ds_final), bc = backward<double>(Form::recurrent, channel, d_o, ds_final);
  EXPECT_LE(test::relative_error(bc.dq, bs.dq), 1e-14);
  EXPECT_LE(test::relative_error(bc.dk, bs.dk), 1e-14);
  EXPECT_LE(test::relative_error(bc.dv, bs.dv), 1e-14);
  EXPECT_LE(test::relative_error(bc.dbeta, bs.dbeta), 1e-14);
  EXPECT_LE(test::relative_error(bc.ds0, bs.ds0), 1e-14);
  // The per-head decay gradient is the sum of the per-channel ones.
  std::vector<double> dg_summed(bs.dg.size(), 0.0);
  for (size_t r = 0; r < dg_summed.size(); ++r)
    for (int64_t i = 0; i < K; ++i) dg_summed[r] += bc.dg[r * K + i];
  EXPECT_LE(test::relative_error(dg_summed, bs.dg), 1e-13);
}

// in's tokens [begin, end) of every per-token array (batch 1), state `state` of s0.
Inputs slice(const Inputs& in, int64_t begin, int64_t end, int64_t state) {
  const DeltaRuleSizes& s = in.sizes;
  const int64_t H = s.heads, K = s.key_dim, V = s.value_dim, G = in.g_width(), KV = K * V;
  auto cut = [&](const std::vector<double>& x, int64_t width) {
    return std::vector<double>(x.begin() + begin * H * width, x.begin() + end * H * width);
  };
  Inputs part;
  part.sizes = make_sizes(1, end - begin, H, K, V, s.decay);
  part.q = cut(in.q, K), part.k = cut(in.k, K), part.v = cut(in.v, V), part.g = cut(in.g, G);
  part.beta = cut(in.beta, 1);
  part.s0 = std::vector<double>(in.s0.begin() + state * H * KV, in.s0.begin() + (state + 1) * H * KV);
  return part;
}

template <class X>
std::vector<X> cut_rows(const std::vector<X>& x, int64_t begin, int64_t end, int64_t row_width) {
  return std::vector<X>(x.begin() + begin * row_width, x.begin() + end * row_width);
}

TEST(DeltaRule, PackedSegmentsEqualSeparateRuns) {
  const std::vector<int32_t> cu = {0, 13, 13, 83, 84, 91};  // lengths 13, 0, 70, 1, 7
  for (DeltaDecay decay : kDecays) {
    DeltaRuleSizes sizes = make_sizes(1, 91, 2, 5, 3, decay);
    sizes.num_segments = 5;
    const Inputs packed = make_inputs(sizes, 61, -2.0, -0.01, true, cu);
    const int64_t H = 2, K = 5, V = 3, KV = K * V, G = packed.g_width();
    const Outputs<double> fp = forward<double>(Form::recurrent, packed);
    const std::vector<double> d_o = random_values(fp.o.size(), 62), ds_final = random_values(fp.s_final.size(), 63);
    const Grads<double> bp = backward<double>(Form::recurrent, packed, d_o, ds_final);
    for (int64_t n = 0; n < sizes.num_segments; ++n) {
      const Inputs part = slice(packed, cu[n], cu[n + 1], n);
      const Outputs<double> f = forward<double>(Form::recurrent, part);
      const Grads<double> b = backward<double>(Form::recurrent, part, cut_rows(d_o, cu[n] * H, cu[n + 1] * H, V),
                                               cut_rows(ds_final, n * H, (n + 1) * H, KV));
      EXPECT_EQ(f.o, cut_rows(fp.o, cu[n] * H, cu[n + 1] * H, V)) << "segment " << n;
      EXPECT_EQ(f.s_final, cut_rows(fp.s_final, n * H, (n + 1) * H, KV)) << "segment " << n;
      EXPECT_EQ(b.dq, cut_rows(bp.dq, cu[n] * H, cu[n + 1] * H, K)) << "segment " << n;
      EXPECT_EQ(b.dk, cut_rows(bp.dk, cu[n] * H, cu[n + 1] * H, K)) << "segment " << n;
      EXPECT_EQ(b.dv, cut_rows(bp.dv, cu[n] * H, cu[n + 1] * H, V)) << "segment " << n;
      EXPECT_EQ(b.dg, cut_rows(bp.dg, cu[n] * H, cu[n + 1] * H, G)) << "segment " << n;
      EXPECT_EQ(b.dbeta, cut_rows(bp.dbeta, cu[n] * H, cu[n + 1] * H, 1)) << "segment " << n;
      EXPECT_EQ(b.ds0, cut_rows(bp.ds0, n * H, (n + 1) * H, KV)) << "segment " << n;
    }
  }
}

// [0, T) with s0 equals [0, t) then [t, T) from the first's final state; backward chains through
// ds0 of the second part as ds_final of the first.
TEST(DeltaRule, SplitRunCarriesStateForwardAndBackward) {
  for (DeltaDecay decay : kDecays) {
    const int64_t T = 150, split = 77, H = 2, K = 5, V = 3, G = decay == DeltaDecay::per_key_channel ? K : 1;
    const Inputs whole = make_inputs(make_sizes(1, T, H, K, V, decay), 71, -2.0, -0.01, true);
    const Outputs<double> fw = forward<double>(Form::recurrent, whole);
    const std::vector<double> d_o = random_values(fw.o.size(), 72), ds_final = random_values(fw.s_final.size(), 73);
    const Grads<double> bw = backward<double>(Form::recurrent, whole, d_o, ds_final);

    const Inputs first = slice(whole, 0, split, 0);
    const Outputs<double> f1 = forward<double>(Form::recurrent, first);
    Inputs second = slice(whole, split, T, 0);
    second.s0 = f1.s_final;
    const Outputs<double> f2 = forward<double>(Form::recurrent, second);
    EXPECT_LE(test::relative_error(f2.s_final, fw.s_final), 1e-14);
    EXPECT_LE(test::relative_error(f1.o, cut_rows(fw.o, 0, split * H, V)), 1e-14);
    EXPECT_LE(test::relative_error(f2.o, cut_rows(fw.o, split * H, T * H, V)), 1e-14);

    const Grads<double> b2 = backward<double>(Form::recurrent, second, cut_rows(d_o, split * H, T * H, V), ds_final);
    const Grads<double> b1 = backward<double>(Form::recurrent, first, cut_rows(d_o, 0, split * H, V), b2.ds0);
    EXPECT_LE(test::relative_error(b1.ds0, bw.ds0), 1e-13);
    EXPECT_LE(test::relative_error(b1.dq, cut_rows(bw.dq, 0, split * H, K)), 1e-13);
    EXPECT_LE(test::relative_error(b2.dk, cut_rows(bw.dk, split * H, T * H, K)), 1e-13);
    EXPECT_LE(test::relative_error(b1.dg, cut_rows(bw.dg, 0, split * H, G)), 1e-13);
    EXPECT_LE(test::relative_error(b2.dbeta, cut_rows(bw.dbeta, split * H, T * H, 1)), 1e-13);
  }
}

template <class T>
bool all_finite(const std::vector<T>& x) {
  return std::all_of(x.begin(), x.end(), [](T value) { return std::isfinite(value); });
}

// Moderate decay over 150 tokens, and strong decay (cumulative |g| ≥ 120) over 40.
TEST(DeltaRule, FloatAgreesWithDoubleIncludingStrongDecay) {
  struct Case {
    int64_t T;
    double g_lo, g_hi;
  };
  for (const Case& c : {Case{150, -2.0, -0.01}, Case{40, -8.0, -3.0}}) {
    for (DeltaDecay decay : kDecays) {
      const Inputs in = make_inputs(make_sizes(2, c.T, 2, 5, 3, decay), 81, c.g_lo, c.g_hi, true);
      const Outputs<double> fd = forward<double>(Form::recurrent, in);
      const Outputs<float> ff = forward<float>(Form::recurrent, in);
      const std::vector<double> d_o = random_values(fd.o.size(), 82), ds_final = random_values(fd.s_final.size(), 83);
      const Grads<double> bd = backward<double>(Form::recurrent, in, d_o, ds_final);
      const Grads<float> bf = backward<float>(Form::recurrent, in, d_o, ds_final);
      const std::vector<std::pair<const std::vector<float>*, const std::vector<double>*>> pairs = {
          {&ff.o, &fd.o},   {&ff.s_final, &fd.s_final}, {&bf.dq, &bd.dq},       {&bf.dk, &bd.dk},
          {&bf.dv, &bd.dv}, {&bf.dg, &bd.dg},           {&bf.dbeta, &bd.dbeta}, {&bf.ds0, &bd.ds0}};
      if (c.g_hi <= -3.0) {  // strong decay: s0 no longer reaches the final state
        Inputs no_s0 = in;
        no_s0.s0.clear();
        EXPECT_LE(test::relative_error(forward<double>(Form::recurrent, no_s0).s_final, fd.s_final), 1e-30);
      }
      for (size_t p = 0; p < pairs.size(); ++p) {
        EXPECT_TRUE(all_finite(*pairs[p].first)) << "tensor " << p << " T=" << c.T;
        EXPECT_LE(test::relative_error(*pairs[p].first, *pairs[p].second), 1e-4) << "tensor " << p << " T=" << c.T;
      }
    }
  }
}

TEST(DeltaRule, ThreadCountDoesNotChangeResults) {
  for (DeltaDecay decay : kDecays) {
    const Inputs in = make_inputs(make_sizes(3, 100, 3, 6, 4, decay), 91, -2.0, -0.01, true);
    const std::vector<double> d_o = random_values(in.tokens() * 4, 92), ds_final = random_values(in.state_numel(), 93);
    test::expect_thread_count_independent(Form::recurrent, in, d_o, ds_final);
  }
}

}  // namespace
}  // namespace trillion
