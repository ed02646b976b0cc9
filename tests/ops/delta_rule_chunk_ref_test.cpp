// The unfused chunked gated delta rule (ops/ref/delta_rule_chunk_ref.h) against the recurrent form:
// forward (o, s_final) and backward (all six gradients) in double, per-head and per-key-channel
// decay, T = 1, 65, 150,
// with and without s0 (ds_final given), and its documented CHECKs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/delta_rule.h"
#include "ops/delta_rule_inputs.h"
#include "ops/finite_diff.h"
#include "ops/ref/delta_rule_chunk_ref.h"

namespace trillion {
namespace {

using test::Inputs;
using test::make_inputs;
using test::or_null;
using test::random_values;

TEST(DeltaRuleChunkRef, MatchesRecurrentForwardAndBackward) {
  for (DeltaDecay decay : {DeltaDecay::per_head, DeltaDecay::per_key_channel})
  for (int64_t T : {1, 65, 150}) {
    for (bool with_s0 : {true, false}) {
      DeltaRuleSizes s;
      s.batch = 2, s.seq_len = T, s.heads = 2, s.key_dim = 8, s.value_dim = 6, s.decay = decay;
      const Inputs in = make_inputs(s, 300 + T, -1.0, -0.01, with_s0);
      const int64_t rows = in.tokens(), K = s.key_dim, V = s.value_dim;
      const std::vector<double> d_o = random_values(rows * V, 17 + T);
      const std::vector<double> ds_final = random_values(in.state_numel(), 18 + T);
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const int64_t G = decay == DeltaDecay::per_key_channel ? rows * K : rows;  // g's size
      const std::string what = std::string(decay == DeltaDecay::per_head ? "per_head" : "per_key_channel") +
                               " T=" + std::to_string(T) + " s0=" + std::to_string(with_s0);

      std::vector<double> o_ref(rows * V, nan), sf_ref(in.state_numel(), nan);
      std::vector<double> o_rec(rows * V), sf_rec(in.state_numel());
      delta_rule_chunk_ref_forward(o_ref.data(), sf_ref.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                   in.beta.data(), or_null(in.s0), nullptr, s);
      delta_rule_recurrent_forward(o_rec.data(), sf_rec.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                   in.beta.data(), or_null(in.s0), nullptr, s);
      EXPECT_LE(test::relative_error(o_ref, o_rec), 1e-10) << what << " o";
      EXPECT_LE(test::relative_error(sf_ref, sf_rec), 1e-10) << what << " s_final";

      std::vector<std::vector<double>> ref = {std::vector<double>(rows * K, nan), std::vector<double>(rows * K, nan),
                                              std::vector<double>(rows * V, nan), std::vector<double>(G, nan),
                                              std::vector<double>(rows, nan),
                                              std::vector<double>(in.state_numel(), nan)};
      std::vector<std::vector<double>> rec = {std::vector<double>(rows * K), std::vector<double>(rows * K),
                                              std::vector<double>(rows * V), std::vector<double>(G),
                                              std::vector<double>(rows), std::vector<double>(in.state_numel())};
      delta_rule_chunk_ref_backward(ref[0].data(), ref[1].data(), ref[2].data(), ref[3].data(), ref[4].data(),
                                    ref[5].data(), d_o.data(), ds_final.data(), in.q.data(), in.k.data(), in.v.data(),
                                    in.g.data(), in.beta.data(), or_null(in.s0), nullptr, s);
      delta_rule_recurrent_backward(rec[0].data(), rec[1].data(), rec[2].data(), rec[3].data(), rec[4].data(),
                                    rec[5].data(), d_o.data(), ds_final.data(), in.q.data(), in.k.data(), in.v.data(),
                                    in.g.data(), in.beta.data(), or_null(in.s0), nullptr, s);
      const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "ds0"};
      for (int n = 0; n < 6; ++n) {
        // A gradient that is zero in exact arithmetic (dg of a lone first token decays a zero
        // state) is compared absolutely: the chunked form leaves rounding residue of 1e-17 there.
        double largest = 0.0, diff = 0.0;
        for (size_t i = 0; i < rec[n].size(); ++i) {
          largest = std::max(largest, std::abs(rec[n][i]));
          diff = std::max(diff, std::abs(ref[n][i] - rec[n][i]));
        }
        if (largest < 1e-12) {
          EXPECT_LE(diff, 1e-14) << what << " " << names[n];
        } else {
          EXPECT_LE(test::relative_error(ref[n], rec[n]), 1e-10) << what << " " << names[n];
        }
      }
    }
  }
}

TEST(DeltaRuleChunkRef, RejectsUnsupportedOptions) {
  DeltaRuleSizes s;
  s.batch = 1, s.seq_len = 4, s.heads = 1, s.key_dim = 2, s.value_dim = 2, s.num_segments = 1;
  std::vector<double> x(16, 0.5), o(8);
  const int32_t cu[] = {0, 4};
  EXPECT_DEATH(delta_rule_chunk_ref_forward(o.data(), static_cast<double*>(nullptr), x.data(), x.data(), x.data(),
                                            x.data(), x.data(), static_cast<const double*>(nullptr), cu, s),
               "cu_seqlens must be null");
}

}  // namespace
}  // namespace trillion
