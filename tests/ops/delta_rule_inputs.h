// Random problems for the gated delta rule's tests (tests/ops/delta_rule*_test.cpp): q and k
// L2-normalized rows, decays in a range, β in (0.05, 0.95), optional initial states and segments;
// and one run of the recurrent or chunked form in float or double.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/delta_rule.h"
#include "ops/finite_diff.h"

namespace trillion::test {

// One problem in double; cu empty: one segment per batch row; s0 empty: null.
struct Inputs {
  DeltaRuleSizes sizes;
  std::vector<int32_t> cu;   // [N + 1]
  std::vector<double> q, k;  // [B, T, H, K]
  std::vector<double> v;     // [B, T, H, V]
  std::vector<double> g;     // [B, T, H] or [B, T, H, K]
  std::vector<double> beta;  // [B, T, H]
  std::vector<double> s0;    // [N, H, K, V]
  int64_t segments() const { return cu.empty() ? sizes.batch : sizes.num_segments; }
  int64_t state_numel() const { return segments() * sizes.heads * sizes.key_dim * sizes.value_dim; }
  int64_t tokens() const { return sizes.batch * sizes.seq_len * sizes.heads; }
  int64_t g_width() const { return sizes.decay == DeltaDecay::per_key_channel ? sizes.key_dim : 1; }
};

// Random vectors of `width` values per token-head, each scaled to L2 norm `norm`.
inline std::vector<double> random_unit_rows(int64_t rows, int64_t width, uint64_t seed, double norm) {
  std::vector<double> x = random_values(rows * width, seed);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < width; ++i) ss += x[r * width + i] * x[r * width + i];
    for (int64_t i = 0; i < width; ++i) x[r * width + i] *= norm / std::sqrt(ss);
  }
  return x;
}

// q, k L2-normalized (q also scaled by K^−½), g uniform in [g_lo, g_hi], beta in (0.05, 0.95).
inline Inputs make_inputs(const DeltaRuleSizes& sizes, uint64_t seed, double g_lo, double g_hi, bool with_s0,
                   std::vector<int32_t> cu = {}) {
  Inputs in;
  in.sizes = sizes;
  in.cu = std::move(cu);
  const int64_t rows = in.tokens(), K = sizes.key_dim, V = sizes.value_dim;
  in.q = random_unit_rows(rows, K, seed, 1.0 / std::sqrt(static_cast<double>(K)));
  in.k = random_unit_rows(rows, K, seed + 1, 1.0);
  in.v = random_values(rows * V, seed + 2);
  in.g = random_values(rows * in.g_width(), seed + 3);
  for (double& x : in.g) x = g_lo + (g_hi - g_lo) * 0.5 * (x + 1.0);
  in.beta = random_values(rows, seed + 4, 0.45);
  for (double& x : in.beta) x += 0.5;
  if (with_s0) in.s0 = random_values(in.state_numel(), seed + 5, 0.5);
  return in;
}

template <class T>
const T* or_null(const std::vector<T>& x) {
  return x.empty() ? nullptr : x.data();
}

// Outputs and gradients of one run of either form, in T, from the double inputs.
enum class Form { recurrent, chunk };

template <class T>
struct Outputs {
  std::vector<T> o, s_final;
};

template <class T>
Outputs<T> forward(Form form, const Inputs& in) {
  const std::vector<T> q = test::cast_values<T>(in.q), k = test::cast_values<T>(in.k), v = test::cast_values<T>(in.v);
  const std::vector<T> g = test::cast_values<T>(in.g), beta = test::cast_values<T>(in.beta);
  const std::vector<T> s0 = test::cast_values<T>(in.s0);
  Outputs<T> out{std::vector<T>(in.tokens() * in.sizes.value_dim), std::vector<T>(in.state_numel())};
  auto* fn = form == Form::chunk ? &delta_rule_chunk_forward<T> : &delta_rule_recurrent_forward<T>;
  fn(out.o.data(), out.s_final.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), or_null(s0),
     or_null(in.cu), in.sizes);
  return out;
}

template <class T>
struct Grads {
  std::vector<T> dq, dk, dv, dg, dbeta, ds0;
};

// Backward with d_o and ds_final (empty: null).
template <class T>
Grads<T> backward(Form form, const Inputs& in, const std::vector<double>& d_o_in,
                  const std::vector<double>& ds_final_in) {
  const std::vector<T> q = test::cast_values<T>(in.q), k = test::cast_values<T>(in.k), v = test::cast_values<T>(in.v);
  const std::vector<T> g = test::cast_values<T>(in.g), beta = test::cast_values<T>(in.beta);
  const std::vector<T> s0 = test::cast_values<T>(in.s0), d_o = test::cast_values<T>(d_o_in);
  const std::vector<T> ds_final = test::cast_values<T>(ds_final_in);
  const int64_t rows = in.tokens(), K = in.sizes.key_dim, V = in.sizes.value_dim;
  // Filled with NaN so that an element the kernel fails to write shows up.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Grads<T> d{std::vector<T>(rows * K, nan), std::vector<T>(rows * K, nan),
             std::vector<T>(rows * V, nan), std::vector<T>(rows * in.g_width(), nan),
             std::vector<T>(rows, nan),     std::vector<T>(in.state_numel(), nan)};
  auto* fn = form == Form::chunk ? &delta_rule_chunk_backward<T> : &delta_rule_recurrent_backward<T>;
  fn(d.dq.data(), d.dk.data(), d.dv.data(), d.dg.data(), d.dbeta.data(), d.ds0.data(), d_o.data(), or_null(ds_final),
     q.data(), k.data(), v.data(), g.data(), beta.data(), or_null(s0), or_null(in.cu), in.sizes);
  return d;
}

inline DeltaRuleSizes make_sizes(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, DeltaDecay decay) {
  DeltaRuleSizes s;
  s.batch = B, s.seq_len = T, s.heads = H, s.key_dim = K, s.value_dim = V, s.decay = decay;
  return s;
}

inline constexpr DeltaDecay kDecays[] = {DeltaDecay::per_head, DeltaDecay::per_key_channel};

// Runs `form` in float with 1 and with 2 threads: every output and gradient must be bitwise equal.
inline void expect_thread_count_independent(Form form, const Inputs& in, const std::vector<double>& d_o,
                                            const std::vector<double>& ds_final) {
  Outputs<float> f[2];
  Grads<float> b[2];
  for (int threads : {1, 2}) {
    test::with_threads(threads, [&] {
      f[threads - 1] = forward<float>(form, in);
      b[threads - 1] = backward<float>(form, in, d_o, ds_final);
    });
  }
  EXPECT_EQ(f[0].o, f[1].o);
  EXPECT_EQ(f[0].s_final, f[1].s_final);
  EXPECT_EQ(b[0].dq, b[1].dq);
  EXPECT_EQ(b[0].dk, b[1].dk);
  EXPECT_EQ(b[0].dv, b[1].dv);
  EXPECT_EQ(b[0].dg, b[1].dg);
  EXPECT_EQ(b[0].dbeta, b[1].dbeta);
  EXPECT_EQ(b[0].ds0, b[1].ds0);
}

}  // namespace trillion::test
