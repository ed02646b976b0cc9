// Optimizer over a parameter table: weight decay only where the table says, buffers untouched,
// global grad norm over trainable tensors only, moments after one step, checkpoint round trip.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

ParamTable make_table() {
  ParamTable table;
  ParamSpec weight{"model.layers.0.mlp.up_proj.weight", {3, 5}};
  ParamSpec norm{"model.layers.0.input_layernorm.weight", {7}};
  norm.weight_decay = false;
  ParamSpec bias{"model.layers.0.mlp.gate.e_score_correction_bias", {4}};
  bias.group = ParamGroup::buffer;
  bias.weight_decay = false;
  table.add(weight);
  table.add(norm);
  table.add(bias);
  table.finalize(8);
  return table;
}

std::vector<double> random_values(int64_t n, uint64_t stream) {
  const CounterRng rng(3, stream);
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = rng.normal(i);
  return values;
}

TEST(Optimizer, DecayOnlyWhereTheTableSaysAndBuffersStayPut) {
  const ParamTable table = make_table();
  Optimizer<double> optimizer(table);
  std::vector<double> params = random_values(table.total_size(), 1);
  const std::vector<double> before = params;
  const std::vector<double> grads(table.total_size(), 0.0);
  AdamWHyper hyper;
  hyper.lr = 0.1;
  hyper.weight_decay = 0.5;
  optimizer.step(params.data(), grads.data(), 1, hyper);
  for (const ParamSpec& spec : table.entries()) {
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) {
      const double expected = spec.name.find("up_proj") != std::string::npos ? before[i] * (1.0 - 0.05) : before[i];
      EXPECT_NEAR(params[i], expected, 1e-15) << spec.name << " element " << i - spec.offset;
    }
  }
}

TEST(Optimizer, MomentsAfterOneStep) {
  const ParamTable table = make_table();
  Optimizer<double> optimizer(table);
  std::vector<double> params(table.total_size(), 0.0);
  const std::vector<double> grads = random_values(table.total_size(), 2);
  AdamWHyper hyper;
  optimizer.step(params.data(), grads.data(), 1, hyper);
  const ParamSpec& norm = table.find("model.layers.0.input_layernorm.weight");
  for (int64_t i = norm.offset; i < norm.offset + norm.numel(); ++i) {
    EXPECT_NEAR(optimizer.exp_avg()[i], (1 - hyper.beta1) * grads[i], 1e-15);
    EXPECT_NEAR(optimizer.exp_avg_sq()[i], (1 - hyper.beta2) * grads[i] * grads[i], 1e-15);
    // Bias-corrected first step: −lr · g / (|g| + eps).
    EXPECT_NEAR(params[i], -hyper.lr * grads[i] / (std::fabs(grads[i]) + hyper.eps), 1e-12);
  }
  const ParamSpec& buffer = table.find("model.layers.0.mlp.gate.e_score_correction_bias");
  // Moments exist only for the trainable prefix of the layout; the buffer lies after it.
  EXPECT_GE(buffer.offset, table.trainable_size());
  EXPECT_LT(table.trainable_size(), table.total_size());
}

TEST(Optimizer, GlobalNormAndClippingSkipBuffers) {
  const ParamTable table = make_table();
  Optimizer<double> optimizer(table);
  std::vector<double> grads = random_values(table.total_size(), 4);
  double expected = 0.0;
  for (const ParamSpec& spec : table.entries()) {
    if (spec.group == ParamGroup::buffer) continue;
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) expected += grads[i] * grads[i];
  }
  EXPECT_NEAR(optimizer.global_grad_norm(grads.data()), std::sqrt(expected), 1e-12);
  // Clipping to half the norm inside the update equals a plain step on halved gradients; the
  // gradients themselves are left as they are, and the buffer is not updated.
  const std::vector<double> params0 = random_values(table.total_size(), 6);
  std::vector<double> clipped = params0, plain = params0, halved = grads;
  for (double& g : halved) g *= 0.5 / (1.0 + 1e-6 / std::sqrt(expected));  // clip_factor's form
  const std::vector<double> before = grads;
  EXPECT_NEAR(optimizer.clip_and_step(clipped.data(), grads.data(), 1, AdamWHyper{}, 0.5 * std::sqrt(expected)),
              std::sqrt(expected), 1e-12);
  EXPECT_EQ(grads, before);
  Optimizer<double> reference(table);
  reference.step(plain.data(), halved.data(), 1, AdamWHyper{});
  for (int64_t i = 0; i < table.trainable_size(); ++i) ASSERT_NEAR(clipped[i], plain[i], 1e-14) << i;
  const ParamSpec& buffer = table.find("model.layers.0.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(clipped[buffer.offset], params0[buffer.offset]);
}

TEST(Optimizer, CheckpointRoundTripIsBitwise) {
  const ParamTable table = make_table();
  Optimizer<float> optimizer(table);
  std::vector<float> params(table.total_size(), 0.5f), grads(table.total_size());
  const std::vector<double> g = random_values(table.total_size(), 5);
  for (size_t i = 0; i < g.size(); ++i) grads[i] = static_cast<float>(g[i]);
  optimizer.step(params.data(), grads.data(), 1, AdamWHyper{});
  optimizer.step(params.data(), grads.data(), 2, AdamWHyper{});
  const test::ScratchDir dir("optimizer_roundtrip");
  const std::string path = dir.path("optimizer_roundtrip.safetensors");
  optimizer.save(path);
  const SafetensorsReader reader(path);
  EXPECT_TRUE(reader.contains("model.layers.0.mlp.up_proj.weight.exp_avg"));
  EXPECT_TRUE(reader.contains("model.layers.0.input_layernorm.weight.exp_avg_sq"));
  EXPECT_FALSE(reader.contains("model.layers.0.mlp.gate.e_score_correction_bias.exp_avg"));
  EXPECT_EQ(reader.info("model.layers.0.mlp.up_proj.weight.exp_avg").dtype, DType::F32);
  Optimizer<float> restored(table);
  restored.load(path);
  for (int64_t i = 0; i < table.trainable_size(); ++i) {
    ASSERT_EQ(restored.exp_avg()[i], optimizer.exp_avg()[i]) << i;
    ASSERT_EQ(restored.exp_avg_sq()[i], optimizer.exp_avg_sq()[i]) << i;
  }
  // A table with a tensor the file lacks: an error naming the tensor.
  ParamTable larger = make_table();
  ParamTable other;
  for (const ParamSpec& spec : larger.entries()) other.add(spec);
  other.add(ParamSpec{"lm_head.weight", {2, 2}});
  other.finalize(8);
  Optimizer<float> mismatched(other);
  try {
    mismatched.load(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight.exp_avg"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trillion
