// The linear layer with a LoRA pair (model/linear.h): the forward equals the layer with the merged
// weight W + scaling · B · A (double to rounding, float within float's, bf16 operands within
// bf16's bound), every gradient (x, W, bias, A, B) matches central differences in double at odd
// sizes and ranks 1 to past `in`, a frozen base or a frozen pair skips its gradients and leaves the
// others unchanged, and a pair with B = 0 changes no bit of the base layer's output; a dropout
// scope sets its pass for its lifetime only, nested or left by an exception.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "model/linear.h"
#include "ops/finite_diff.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

using test::cast_values;
using test::random_values;
using test::relative_error;

struct Sizes {
  int64_t rows, in, out, rank;
};

// The tensors of one adapted layer, in double.
struct Layer {
  Sizes s;
  double scaling;
  std::vector<double> x, w, bias, a, b;  // [rows, in] [out, in] [out] [rank, in] [out, rank]
  Layer(Sizes sizes, double scale, uint64_t seed)
      : s(sizes),
        scaling(scale),
        x(random_values(s.rows * s.in, seed)),
        w(random_values(s.out * s.in, seed + 1)),
        bias(random_values(s.out, seed + 2)),
        a(random_values(s.rank * s.in, seed + 3)),
        b(random_values(s.out * s.rank, seed + 4)) {}

  template <class T>
  static LinearWeights<T> weights(std::vector<T>& w, std::vector<T>& bias, std::vector<T>& a, std::vector<T>& b,
                                  int64_t rank, double scaling) {
    LinearWeights<T> weights;
    weights.weight = w.data();
    weights.bias = bias.data();
    weights.lora = {a.data(), b.data(), rank, scaling};
    return weights;
  }
  // W + scaling · B · A [out, in]
  std::vector<double> merged() const {
    std::vector<double> m = w;
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t i = 0; i < s.in; ++i)
        for (int64_t k = 0; k < s.rank; ++k) m[o * s.in + i] += scaling * b[o * s.rank + k] * a[k * s.in + i];
    return m;
  }
  std::vector<double> forward() {
    std::vector<double> y(s.rows * s.out);
    linear<double>(y.data(), x.data(), weights(w, bias, a, b, s.rank, scaling), s.rows, s.in, s.out, false);
    return y;
  }
  std::vector<double> merged_forward() {
    std::vector<double> m = merged(), y(s.rows * s.out);
    LinearWeights<double> plain;
    plain.weight = m.data();
    plain.bias = bias.data();
    linear<double>(y.data(), x.data(), plain, s.rows, s.in, s.out, false);
    return y;
  }
};

const Sizes kSizes[] = {{5, 7, 3, 2}, {1, 4, 6, 1}, {9, 5, 11, 8}, {4, 3, 2, 5}};

TEST(LoraLinear, ForwardEqualsTheMergedWeight) {
  for (const Sizes& s : kSizes) {
    Layer layer(s, 0.75, 100 + s.rank);
    EXPECT_LE(relative_error(layer.forward(), layer.merged_forward()), 1e-14) << "rank " << s.rank;
    // Accumulating onto y adds the same.
    std::vector<double> y = random_values(s.rows * s.out, 7), expected = layer.forward();
    for (size_t i = 0; i < y.size(); ++i) expected[i] += y[i];
    linear<double>(y.data(), layer.x.data(), Layer::weights(layer.w, layer.bias, layer.a, layer.b, s.rank, 0.75),
                   s.rows, s.in, s.out, true);
    EXPECT_LE(relative_error(y, expected), 1e-14);
  }
}

TEST(LoraLinear, FloatAndBf16OperandsAgreeWithDouble) {
  constexpr double kFloatEps = 0x1.0p-24, kBf16Eps = 0x1.0p-8;
  const Sizes s{13, 37, 19, 4};
  Layer layer(s, 2.0, 300);
  const std::vector<double> expected = layer.forward();
  // |x|·|W| + scaling · (|x|·|A|)·|B| + |bias| per element: the sums' magnitude.
  std::vector<double> magnitude(s.rows * s.out);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t o = 0; o < s.out; ++o) {
      double m = std::abs(layer.bias[o]);
      for (int64_t i = 0; i < s.in; ++i) m += std::abs(layer.x[r * s.in + i] * layer.w[o * s.in + i]);
      for (int64_t k = 0; k < s.rank; ++k) {
        double u = 0.0;
        for (int64_t i = 0; i < s.in; ++i) u += std::abs(layer.x[r * s.in + i] * layer.a[k * s.in + i]);
        m += layer.scaling * u * std::abs(layer.b[o * s.rank + k]);
      }
      magnitude[r * s.out + o] = m;
    }
  std::vector<float> x = cast_values<float>(layer.x), w = cast_values<float>(layer.w),
                     bias = cast_values<float>(layer.bias), a = cast_values<float>(layer.a),
                     b = cast_values<float>(layer.b);
  for (MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
    const MatmulPrecisionScope scope(precision);
    std::vector<float> y(s.rows * s.out);
    linear<float>(y.data(), x.data(), Layer::weights(w, bias, a, b, s.rank, layer.scaling), s.rows, s.in, s.out,
                  false);
    // Float: each sum of up to in + 2 terms, twice chained, γ = 2(in + rank + 4)ε; bf16 operands:
    // x, W, A and u = x·Aᵀ each rounded once (≤ 2 roundings per term of either chain, 2u + u² each),
    // then the float sums.
    const double gamma = 2.0 * double(s.in + s.rank + 4) * kFloatEps;
    const double bound = precision == MatmulPrecision::fp32 ? gamma : gamma + 3.0 * kBf16Eps;
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_LE(std::abs(double(y[i]) - expected[i]), bound * magnitude[i])
          << matmul_precision_name(precision) << " element " << i;
  }
}

TEST(LoraLinear, BackwardMatchesFiniteDifferences) {
  for (const Sizes& s : kSizes) {
    Layer layer(s, 1.5, 200 + s.rank);
    const std::vector<double> r = random_values(s.rows * s.out, 17);
    auto loss = [&] { return test::weighted_sum(layer.forward(), r); };
    // Every gradient accumulates onto a prior value (dx too, in accumulate mode): subtract it.
    const std::vector<double> dx_prior = random_values(s.rows * s.in, 18), dw_prior = random_values(s.out * s.in, 19),
                              db_prior = random_values(s.out, 20), da_prior = random_values(s.rank * s.in, 21),
                              dB_prior = random_values(s.out * s.rank, 22);
    std::vector<double> dx = dx_prior, dw = dw_prior, db = db_prior, da = da_prior, dB = dB_prior;
    linear_grad<double>(dx.data(), Layer::weights(dw, db, da, dB, 0, 0.0), r.data(), layer.x.data(),
                        Layer::weights(layer.w, layer.bias, layer.a, layer.b, s.rank, layer.scaling), s.rows, s.in,
                        s.out, true);
    for (const auto& pair : {std::make_pair(&dx, &dx_prior), std::make_pair(&dw, &dw_prior), std::make_pair(&db, &db_prior),
                       std::make_pair(&da, &da_prior), std::make_pair(&dB, &dB_prior)})
      for (size_t i = 0; i < pair.first->size(); ++i) (*pair.first)[i] -= (*pair.second)[i];
    test::expect_gradients_match(loss, {{"x", &layer.x, &dx}, {"weight", &layer.w, &dw}, {"bias", &layer.bias, &db},
                                        {"lora_A", &layer.a, &da}, {"lora_B", &layer.b, &dB}});

    // dx is the merged layer's: dy · (W + scaling · B · A).
    std::vector<double> merged = layer.merged(), dx_merged(s.rows * s.in);
    linear_backward<double>(dx_merged.data(), nullptr, r.data(), layer.x.data(), merged.data(), s.rows, s.in, s.out,
                            false);
    EXPECT_LE(relative_error(dx, dx_merged), 1e-13) << "rank " << s.rank;
  }
}

// LoRA's own case: the base frozen (no weight or bias gradient), the pair trained; and the pair
// frozen too (an adapter loaded for evaluation): dx alone. Each gives the bits of the full backward
// for what it computes.
TEST(LoraLinear, FrozenTensorsSkipTheirGradientsOnly) {
  const Sizes s{6, 9, 5, 3};
  Layer layer(s, 0.5, 400);
  const std::vector<double> r = random_values(s.rows * s.out, 23);
  const LinearWeights<double> weights = Layer::weights(layer.w, layer.bias, layer.a, layer.b, s.rank, layer.scaling);
  std::vector<double> dx(s.rows * s.in), dw(s.out * s.in), db(s.out), da(s.rank * s.in), dB(s.out * s.rank);
  linear_grad<double>(dx.data(), Layer::weights(dw, db, da, dB, 0, 0.0), r.data(), layer.x.data(), weights, s.rows,
                      s.in, s.out, false);

  std::vector<double> dx_frozen_base(s.rows * s.in, 5.0), da_frozen_base(s.rank * s.in), dB_frozen_base(s.out * s.rank);
  LinearWeights<double> adapter_grads;
  adapter_grads.lora = {da_frozen_base.data(), dB_frozen_base.data(), 0, 0.0};
  linear_grad<double>(dx_frozen_base.data(), adapter_grads, r.data(), layer.x.data(), weights, s.rows, s.in, s.out,
                      false);
  EXPECT_EQ(dx_frozen_base, dx);
  EXPECT_EQ(da_frozen_base, da);
  EXPECT_EQ(dB_frozen_base, dB);

  std::vector<double> dx_all_frozen(s.rows * s.in, 5.0);
  linear_grad<double>(dx_all_frozen.data(), LinearWeights<double>{}, r.data(), layer.x.data(), weights, s.rows, s.in,
                      s.out, false);
  EXPECT_EQ(dx_all_frozen, dx);
}

// PEFT's initialization, B = 0: the adapted layer's output is the base layer's to the bit, in
// float under both precisions (the adapter's term adds exact zeros).
TEST(LoraLinear, ZeroBLeavesTheBaseOutputBitwise) {
  const Sizes s{7, 33, 10, 4};
  Layer layer(s, 2.0, 500);
  std::vector<float> x = cast_values<float>(layer.x), w = cast_values<float>(layer.w),
                     bias = cast_values<float>(layer.bias), a = cast_values<float>(layer.a), b(s.out * s.rank, 0.0f);
  for (MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
    const MatmulPrecisionScope scope(precision);
    LinearWeights<float> base;
    base.weight = w.data();
    base.bias = bias.data();
    std::vector<float> y_base(s.rows * s.out), y_adapted(s.rows * s.out);
    linear<float>(y_base.data(), x.data(), base, s.rows, s.in, s.out, false);
    linear<float>(y_adapted.data(), x.data(), Layer::weights(w, bias, a, b, s.rank, 2.0), s.rows, s.in, s.out, false);
    EXPECT_EQ(0, std::memcmp(y_base.data(), y_adapted.data(), y_base.size() * sizeof(float)))
        << matmul_precision_name(precision);
  }
}

// LoraDropoutScope: the pair's input is masked only while a scope with a pass is alive; an inner
// scope without one turns it off and, ended, gives the outer pass back (its very masks); a scope
// left by an exception restores the state before it.
TEST(LoraLinear, DropoutScopesSetTheirPassForTheirLifetimeOnly) {
  const Sizes s{6, 9, 5, 3};
  Layer layer(s, 0.5, 40);
  const auto forward = [&] {
    LinearWeights<double> weights = Layer::weights(layer.w, layer.bias, layer.a, layer.b, s.rank, 0.5);
    weights.lora.dropout = 0.5;
    weights.lora.stream = 77;
    std::vector<double> y(s.rows * s.out);  // [rows, out]
    linear<double>(y.data(), layer.x.data(), weights, s.rows, s.in, s.out, false);
    return y;
  };
  const std::vector<double> undropped = forward();
  EXPECT_LE(relative_error(undropped, layer.merged_forward()), 1e-14) << "no pass: no mask";
  const LoraDropoutPass pass{.seed = 3, .step = 1};
  {
    const LoraDropoutScope outer(&pass);
    const std::vector<double> dropped = forward();
    EXPECT_GT(relative_error(dropped, undropped), 1e-3) << "the pass masks the adapter's input";
    {
      const LoraDropoutScope inner(nullptr);
      EXPECT_EQ(forward(), undropped) << "an inner scope without a pass";
    }
    EXPECT_EQ(forward(), dropped) << "the outer pass again, with its masks";
  }
  EXPECT_EQ(forward(), undropped) << "after the scope";
  try {
    const LoraDropoutScope thrown(&pass);
    throw std::runtime_error("a failure inside the pass");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(forward(), undropped) << "after a scope left by an exception";
}

}  // namespace
}  // namespace trillion
