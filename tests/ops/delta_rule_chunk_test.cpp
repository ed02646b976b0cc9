// The gated delta rule in chunked form (ops/delta_rule.h) against the recurrent form, both decay
// kinds: forward (o, s_final) and backward (all six gradients) in double over lengths around the
// chunk size, with and without s0 and ds_final; packed segments with boundaries inside chunks; float
// against double including strong per-channel decay (cumulative |g| > 100 inside a chunk); thread
// count independence (bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/delta_rule.h"
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


template <class T>
bool all_finite(const std::vector<T>& x) {
  return std::all_of(x.begin(), x.end(), [](T value) { return std::isfinite(value); });
}

// Every output and gradient of `got` against `want`; returns the worst relative error.
template <class A, class B>
double compare_all(const Outputs<A>& fa, const Grads<A>& ba, const Outputs<B>& fb, const Grads<B>& bb, double tol,
                   const char* what) {
  const std::pair<const std::vector<A>*, const std::vector<B>*> pairs[] = {
      {&fa.o, &fb.o},   {&fa.s_final, &fb.s_final}, {&ba.dq, &bb.dq},       {&ba.dk, &bb.dk},
      {&ba.dv, &bb.dv}, {&ba.dg, &bb.dg},           {&ba.dbeta, &bb.dbeta}, {&ba.ds0, &bb.ds0}};
  const char* names[] = {"o", "s_final", "dq", "dk", "dv", "dg", "dbeta", "ds0"};
  double worst = 0.0;
  for (size_t p = 0; p < std::size(pairs); ++p) {
    EXPECT_TRUE(all_finite(*pairs[p].first)) << what << " " << names[p];
    const double err = test::relative_error(*pairs[p].first, *pairs[p].second);
    EXPECT_LE(err, tol) << what << " " << names[p];
    worst = std::max(worst, err);
  }
  return worst;
}

void record_worst(double worst) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", worst);
  ::testing::Test::RecordProperty("worst_relative_error", text);
}

// Lengths around the chunk size; s0 and ds_final present or null.
TEST(DeltaRuleChunk, MatchesRecurrentForwardAndBackward) {
  double worst = 0.0;
  for (DeltaDecay decay : kDecays) {
    for (int64_t T : {1, 13, 64, 65, 150, 200}) {
      for (bool with_s0 : {true, false}) {
        for (bool with_ds_final : {true, false}) {
          const Inputs in = make_inputs(make_sizes(2, T, 2, 8, 6, decay), 100 + T, -1.0, -0.01, with_s0);
          const std::vector<double> d_o = random_values(in.tokens() * 6, 7 + T);
          const std::vector<double> ds_final =
              with_ds_final ? random_values(in.state_numel(), 8 + T) : std::vector<double>{};
          const Outputs<double> fc = forward<double>(Form::chunk, in), fr = forward<double>(Form::recurrent, in);
          const Grads<double> bc = backward<double>(Form::chunk, in, d_o, ds_final);
          const Grads<double> br = backward<double>(Form::recurrent, in, d_o, ds_final);
          const std::string what = "decay " + std::to_string(static_cast<int>(decay)) + " T=" + std::to_string(T) +
                                   " s0=" + std::to_string(with_s0) + " ds_final=" + std::to_string(with_ds_final);
          worst = std::max(worst, compare_all(fc, bc, fr, br, 1e-10, what.c_str()));
        }
      }
    }
  }
  record_worst(worst);
}

// Head dimensions of realistic shape (K = V = 32) over two and a half chunks.
TEST(DeltaRuleChunk, MatchesRecurrentWiderHeads) {
  double worst = 0.0;
  for (DeltaDecay decay : kDecays) {
    const Inputs in = make_inputs(make_sizes(1, 160, 2, 32, 32, decay), 201, -0.5, -0.01, true);
    const std::vector<double> d_o = random_values(in.tokens() * 32, 202);
    const std::vector<double> ds_final = random_values(in.state_numel(), 203);
    const Outputs<double> fc = forward<double>(Form::chunk, in), fr = forward<double>(Form::recurrent, in);
    const Grads<double> bc = backward<double>(Form::chunk, in, d_o, ds_final);
    const Grads<double> br = backward<double>(Form::recurrent, in, d_o, ds_final);
    worst = std::max(worst, compare_all(fc, bc, fr, br, 1e-10, "wide"));
  }
  record_worst(worst);
}

// Segment boundaries inside chunks, an empty segment, a one-token segment, one over two chunks.
TEST(DeltaRuleChunk, PackedSegmentsMatchRecurrent) {
  const std::vector<int32_t> cu = {0, 13, 13, 83, 84, 91, 230};  // lengths 13, 0, 70, 1, 7, 139
  double worst = 0.0;
  for (DeltaDecay decay : kDecays) {
    for (bool with_s0 : {true, false}) {
      DeltaRuleSizes sizes = make_sizes(1, 230, 2, 5, 3, decay);
      sizes.num_segments = 6;
      const Inputs in = make_inputs(sizes, 301, -1.0, -0.01, with_s0, cu);
      const std::vector<double> d_o = random_values(in.tokens() * 3, 302);
      const std::vector<double> ds_final = random_values(in.state_numel(), 303);
      const Outputs<double> fc = forward<double>(Form::chunk, in), fr = forward<double>(Form::recurrent, in);
      const Grads<double> bc = backward<double>(Form::chunk, in, d_o, ds_final);
      const Grads<double> br = backward<double>(Form::recurrent, in, d_o, ds_final);
      worst = std::max(worst, compare_all(fc, bc, fr, br, 1e-10, "packed"));
    }
  }
  record_worst(worst);
}

// Moderate decay over 150 tokens, and strong decay g ∈ [−8, −3] (cumulative |g| > 100 inside a
// chunk) over 150 tokens: float chunked against double chunked, all finite.
TEST(DeltaRuleChunk, FloatAgreesWithDoubleIncludingStrongDecay) {
  struct Case {
    double g_lo, g_hi;
  };
  double worst = 0.0;
  for (const Case& c : {Case{-2.0, -0.01}, Case{-8.0, -3.0}}) {
    for (DeltaDecay decay : kDecays) {
      const Inputs in = make_inputs(make_sizes(2, 150, 2, 16, 8, decay), 401, c.g_lo, c.g_hi, true);
      const std::vector<double> d_o = random_values(in.tokens() * 8, 402);
      const std::vector<double> ds_final = random_values(in.state_numel(), 403);
      const Outputs<double> fd = forward<double>(Form::chunk, in);
      const Outputs<float> ff = forward<float>(Form::chunk, in);
      const Grads<double> bd = backward<double>(Form::chunk, in, d_o, ds_final);
      const Grads<float> bf = backward<float>(Form::chunk, in, d_o, ds_final);
      worst = std::max(worst, compare_all(ff, bf, fd, bd, 1e-4, c.g_hi <= -3.0 ? "strong" : "moderate"));
      // The double chunked form still agrees with the recurrent one under strong decay.
      const Outputs<double> fr = forward<double>(Form::recurrent, in);
      const Grads<double> br = backward<double>(Form::recurrent, in, d_o, ds_final);
      compare_all(fd, bd, fr, br, 1e-10, "double vs recurrent");
    }
  }
  record_worst(worst);
}

TEST(DeltaRuleChunk, ThreadCountDoesNotChangeResults) {
  for (DeltaDecay decay : kDecays) {
    const Inputs in = make_inputs(make_sizes(3, 100, 3, 6, 4, decay), 501, -2.0, -0.01, true);
    const std::vector<double> d_o = random_values(in.tokens() * 4, 502), ds_final = random_values(in.state_numel(), 503);
    test::expect_thread_count_independent(Form::chunk, in, d_o, ds_final);
  }
}

}  // namespace
}  // namespace trillion
