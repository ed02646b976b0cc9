// SwiGLU and sigmoid gate: forward against the formula, backward against finite differences, float
// against double.
#include "ops/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;

TEST(SwiGlu, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 37;
  std::vector<double> gate = random_values(n, 1, 4.0), up = random_values(n, 2, 2.0);
  const std::vector<double> r = random_values(n, 3);
  std::vector<double> out(n);
  swiglu_forward<double>(out.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], gate[i] / (1.0 + std::exp(-gate[i])) * up[i], 1e-15);
  auto loss = [&] {
    std::vector<double> y(n);
    swiglu_forward<double>(y.data(), gate.data(), up.data(), n);
    return test::weighted_sum(y, r);
  };
  std::vector<double> dgate(n), dup(n);
  swiglu_backward<double>(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), n);
  test::expect_gradients_match(loss, {{"gate", &gate, &dgate}, {"up", &up, &dup}});
}

TEST(SigmoidGate, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 29;
  std::vector<double> x = random_values(n, 4, 2.0), gate = random_values(n, 5, 4.0);
  const std::vector<double> r = random_values(n, 6);
  std::vector<double> out(n);
  sigmoid_gate_forward<double>(out.data(), x.data(), gate.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], x[i] / (1.0 + std::exp(-gate[i])), 1e-15);
  auto loss = [&] {
    std::vector<double> y(n);
    sigmoid_gate_forward<double>(y.data(), x.data(), gate.data(), n);
    return test::weighted_sum(y, r);
  };
  std::vector<double> dx(n), dgate(n);
  sigmoid_gate_backward<double>(dx.data(), dgate.data(), r.data(), x.data(), gate.data(), n);
  test::expect_gradients_match(loss, {{"x", &x, &dx}, {"gate", &gate, &dgate}});
}

TEST(Activations, FloatAgreesWithDoubleAndSaturatesWithoutNaN) {
  const int64_t n = 41;
  std::vector<double> a = random_values(n, 7, 6.0), b = random_values(n, 8, 2.0), dout = random_values(n, 9);
  a[0] = -200.0;  // exp overflows in float: σ must saturate to 0, not NaN
  a[1] = 200.0;
  std::vector<double> out(n), da(n), db(n);
  std::vector<float> af = test::cast_values<float>(a), bf = test::cast_values<float>(b);
  std::vector<float> doutf = test::cast_values<float>(dout), outf(n), daf(n), dbf(n);
  swiglu_forward<double>(out.data(), a.data(), b.data(), n);
  swiglu_forward<float>(outf.data(), af.data(), bf.data(), n);
  EXPECT_LE(test::relative_error(outf, out), 1e-6);
  swiglu_backward<double>(da.data(), db.data(), dout.data(), a.data(), b.data(), n);
  swiglu_backward<float>(daf.data(), dbf.data(), doutf.data(), af.data(), bf.data(), n);
  EXPECT_LE(test::relative_error(daf, da), 1e-6);
  EXPECT_LE(test::relative_error(dbf, db), 1e-6);
  sigmoid_gate_backward<float>(daf.data(), dbf.data(), doutf.data(), bf.data(), af.data(), n);
  sigmoid_gate_backward<double>(da.data(), db.data(), dout.data(), b.data(), a.data(), n);
  EXPECT_LE(test::relative_error(daf, da), 1e-6);
  EXPECT_LE(test::relative_error(dbf, db), 1e-6);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(daf[i]) && std::isfinite(dbf[i]));
}

}  // namespace
}  // namespace trillion
