// Finite-difference gradient checking for the op tests (plus small helpers they share: random
// values, relative error, running with a given OpenMP thread count or vector instruction set).
//
// Every op test builds a scalar loss L = Σ out ⊙ R with a fixed random R (so every output element
// matters with its own weight), runs the op's backward with dout = R, and compares each analytic
// gradient with central differences of L in double:
//   dL/dx_i ≈ (L(x + h e_i) − L(x − h e_i)) / 2h,  h = rel_step · max(1, |x_i|).
// Relative error per tensor as docs/architecture.md ("Relative error") defines it:
// max|a − b| / max(max|b|, 1e-30), with b the numerical gradient.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/vector_exp.h"

namespace trillion::test {

// n values uniform in [-scale, scale), a pure function of (seed, n).
inline std::vector<double> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  CounterRng rng(seed, "finite_diff");
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = scale * (2.0 * rng.uniform(i) - 1.0);
  return values;
}

template <class T>
std::vector<T> cast_values(const std::vector<double>& values) {
  return std::vector<T>(values.begin(), values.end());
}

// max|actual − expected| / max(max|expected|, 1e-30)
template <class A, class B>
double relative_error(const std::vector<A>& actual, const std::vector<B>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  return trillion::relative_error(actual.data(), expected.data(),
                                  static_cast<int64_t>(std::min(actual.size(), expected.size())));
}

// Σ out ⊙ weights
inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& weights) {
  EXPECT_EQ(out.size(), weights.size());
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += out[i] * weights[i];
  return sum;
}

// Central-difference gradient of loss() with respect to every element of x; x is restored.
inline std::vector<double> numerical_gradient(const std::function<double()>& loss, std::vector<double>& x,
                                              double rel_step = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    const double step = rel_step * std::max(1.0, std::abs(saved));
    x[i] = saved + step;
    const double plus = loss();
    x[i] = saved - step;
    const double minus = loss();
    x[i] = saved;
    grad[i] = (plus - minus) / (2.0 * step);
  }
  return grad;
}

// One differentiable input: its values (perturbed in place by the check) and its analytic gradient.
struct GradInput {
  std::string name;
  std::vector<double>* values;
  const std::vector<double>* analytic;
};

// Checks every input's analytic gradient against central differences of loss(); returns the largest
// relative error and reports each tensor that exceeds tolerance.
inline double expect_gradients_match(const std::function<double()>& loss, const std::vector<GradInput>& inputs,
                                     double tolerance = 1e-6) {
  double worst = 0.0;
  for (const GradInput& input : inputs) {
    const std::vector<double> numeric = numerical_gradient(loss, *input.values);
    const double err = relative_error(*input.analytic, numeric);
    double max_numeric = 0.0;
    for (double g : numeric) max_numeric = std::max(max_numeric, std::abs(g));
    EXPECT_GT(max_numeric, 0.0) << "gradient of " << input.name << " is identically zero: the check is vacuous";
    EXPECT_LE(err, tolerance) << "gradient of " << input.name;
    worst = std::max(worst, err);
  }
  return worst;
}

// Runs fn() with the OpenMP team size set to threads, then restores the previous setting.
template <class Fn>
void with_threads(int threads, const Fn& fn) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn();
  omp_set_num_threads(previous);
}

// product() (returning its result's elements) gives the same bits twice, and each of four calls
// inside a two-thread OpenMP region gives the one-thread call's bits (the GEMM libraries run nested
// work on the calling thread).
template <class Product>
void expect_same_bits_inside_regions(const Product& product, const std::string& what) {
  EXPECT_EQ(product(), product()) << what;
  decltype(product()) one_thread;
  with_threads(1, [&] { one_thread = product(); });
  std::vector<decltype(product())> per_thread(4);
  with_threads(2, [&] {
#pragma omp parallel for schedule(static, 1)
    for (int t = 0; t < 4; ++t) per_thread[t] = product();
  });
  for (const auto& result : per_thread) EXPECT_EQ(result, one_thread) << what;
}

// Returns fn() run with the vector kernels of `isa`, then restores the instruction set in use.
template <class Fn>
auto with_isa(VectorIsa isa, const Fn& fn) {
  struct Restore {
    VectorIsa previous;
    ~Restore() { set_vector_isa(previous); }
  } restore{vector_isa()};
  set_vector_isa(isa);
  return fn();
}

}  // namespace trillion::test
