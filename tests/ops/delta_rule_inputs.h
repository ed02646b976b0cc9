// Random problems for the gated delta rule's tests (tests/ops/delta_rule*_test.cpp): q and k
// L2-normalized rows, decays in a range, β in (0.05, 0.95), optional initial states and segments.
#pragma once

#include <cmath>
#include <cstdint>
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

}  // namespace trillion::test
