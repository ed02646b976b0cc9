// LoRA on a whole model (model/param_rows.h, model.cpp): the table gets one adapter pair per
// targeted linear layer in its layer's unit, the base frozen behind the trainable adapters, and
// modules_to_save trainable; with B = 0 the adapted model computes the base model's loss to the
// bit; with B ≠ 0 it equals the model whose weights are merged (W + scaling · B · A), and its
// adapters' gradients are that model's weight gradients projected through the pair:
// dB = scaling · dW · Aᵀ, dA = scaling · Bᵀ · dW; in double, for every layer kind; the gradient
// check passes with the adapters; targets that match nothing, or that the engine does not adapt,
// are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/relative_error.h"
#include "io/test_files.h"
#include "model/gradient_check.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "test_configs.h"

namespace trillion {
namespace {

using testing::error_message;
using testing::model_config_json;

ModelConfig with_lora(ModelConfig config, const std::string& adapter_json) {
  config.lora = std::make_shared<const LoraConfig>(
      LoraConfig::from_json(nlohmann::ordered_json::parse(adapter_json), "adapter_config.json"));
  return config;
}

ModelConfig tiny_config(const std::string& name) {
  return ModelConfig::from_json(model_config_json(name), name);
}

TEST(LoraModel, AdaptersJoinTheirLayersUnitAndTheBaseIsFrozen) {
  const ModelConfig base = tiny_config("tiny.json");
  const ModelConfig config = with_lora(base, R"({"target_modules": ["q_proj", "down_proj"], "r": 3,
    "rank_pattern": {"layers\\.1\\.mlp\\.down_proj": 5}, "modules_to_save": ["model.norm"]})");
  const Model<float> model(config);
  const ParamTable& table = model.table();
  const ParamSpec& weight = table.find("model.layers.1.self_attn.q_proj.weight");
  const ParamSpec& a = table.find("model.layers.1.self_attn.q_proj.lora_A.weight");
  const ParamSpec& b = table.find("model.layers.1.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, weight.shape[1]}));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{weight.shape[0], 3}));
  EXPECT_EQ(a.unit, weight.unit);
  EXPECT_EQ(a.group, ParamGroup::lora);
  EXPECT_EQ(table.find("model.layers.1.mlp.down_proj.lora_A.weight").shape[0], 5);
  EXPECT_EQ(table.find("model.layers.0.mlp.down_proj.lora_A.weight").shape[0], 3);
  EXPECT_FALSE(table.contains("model.layers.0.self_attn.k_proj.lora_A.weight"));
  // Frozen: the base; trainable: the adapters and the saved final norm, first in the layout.
  int64_t trainable = 0;
  for (const ParamSpec& spec : table.entries()) {
    const bool adapter = spec.group == ParamGroup::lora;
    EXPECT_EQ(spec.trainable(), adapter) << spec.name;
    EXPECT_EQ(spec.frozen, !adapter && spec.group != ParamGroup::buffer) << spec.name;
    if (adapter) {
      EXPECT_LT(spec.offset + spec.numel(), table.trainable_size() + 1) << spec.name;
      trainable += spec.numel();
    } else {
      EXPECT_GE(spec.offset, table.trainable_size()) << spec.name;
    }
  }
  EXPECT_TRUE(table.find("model.norm.weight").trainable());
  EXPECT_EQ(trainable, table.num_elements(ParamGroup::lora));
  EXPECT_EQ(table.layout_groups().front(), ParamGroup::lora);
  EXPECT_EQ(table.trainable_groups(), std::vector<ParamGroup>{ParamGroup::lora});
  // The base's tensors keep their values: initialization depends on (seed, name, index) only.
  Model<float> adapted(config), plain(base);
  adapted.init_weights(5);
  plain.init_weights(5);
  for (const ParamSpec& spec : plain.table().entries()) {
    const ParamSpec& same = adapted.table().find(spec.name);
    EXPECT_EQ(std::vector<float>(plain.params() + spec.offset, plain.params() + spec.offset + spec.numel()),
              std::vector<float>(adapted.params() + same.offset, adapted.params() + same.offset + same.numel()))
        << spec.name;
  }
  const ParamSpec& b_spec = adapted.table().find("model.layers.0.mlp.down_proj.lora_B.weight");
  for (int64_t i = 0; i < b_spec.numel(); ++i) ASSERT_EQ(adapted.params()[b_spec.offset + i], 0.0f);
  const ParamSpec& a_spec = adapted.table().find("model.layers.0.mlp.down_proj.lora_A.weight");
  const double bound = 1.0 / std::sqrt(double(a_spec.shape[1]));
  double largest = 0.0;
  for (int64_t i = 0; i < a_spec.numel(); ++i) largest = std::max(largest, std::abs(double(adapted.params()[a_spec.offset + i])));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.5 * bound);  // kaiming-uniform fills the range
}

TEST(LoraModel, WhatItCannotAdaptIsRefusedByName) {
  const ModelConfig base = tiny_config("tiny.json");
  EXPECT_NE(error_message([&] { Model<float>(with_lora(base, R"({"target_modules": ["qq_proj"]})")); })
                .find("field \"target_modules\": matches no linear layer"),
            std::string::npos);
  EXPECT_NE(error_message([&] { Model<float>(with_lora(base, R"({"target_modules": ["q_proj", "lm_head"]})")); })
                .find("matches lm_head"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              Model<float>(with_lora(tiny_config("tiny_qwen3_moe.json"),
                                     R"({"target_parameters": ["mlp.experts.gate_up_proj"]})"));
            }).find("field \"target_parameters\": routed experts' adapters are not built yet"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              Model<float>(with_lora(tiny_config("tiny_qwen3_moe.json"),
                                     R"({"target_modules": ["q_proj"], "modules_to_save": ["experts"]})"));
            }).find("a routed expert tensor"),
            std::string::npos);
}

// Step 0 of a LoRA run is the base model: B = 0 adds exact zeros, under both precisions' products.
TEST(LoraModel, WithZeroBTheLossIsTheBaseModelsToTheBit) {
  for (const char* name : {"tiny.json", "tiny_kimi_linear.json"}) {
    for (MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
      const MatmulPrecisionScope scope(precision);
      const ModelConfig base = tiny_config(name);
      Model<float> plain(base), adapted(with_lora(base, R"({"target_modules": "all-linear", "r": 4})"));
      plain.init_weights(3);
      adapted.init_weights(3);
      GradientCheckOptions options;
      const GradientCheckBatch batch = gradient_check_batch(base, options);
      const StepResult a = plain.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq);
      const StepResult b = adapted.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq);
      EXPECT_EQ(a.lm.loss_sum, b.lm.loss_sum) << name << " " << matmul_precision_name(precision);
      EXPECT_GT(a.lm.count, 0);
    }
  }
}

class LoraModelKinds : public ::testing::TestWithParam<const char*> {};

// One adapted layer: its pair in the adapted model, its weight in the merged one.
struct AdaptedLayer {
  std::string module;
  const ParamSpec* a;       // [rank, in]
  const ParamSpec* b;       // [out, rank]
  const ParamSpec* weight;  // [out, in], in the merged model's table
  int64_t rank, in, out;
  double scaling;
};

std::vector<AdaptedLayer> adapted_layers(const Model<double>& adapted, const Model<double>& merged) {
  constexpr std::string_view kA = ".lora_A.weight";
  std::vector<AdaptedLayer> layers;
  for (const ParamSpec& a : adapted.table().entries()) {
    if (!a.name.ends_with(kA)) continue;
    const std::string module = a.name.substr(0, a.name.size() - kA.size());
    const ParamSpec& b = adapted.table().find(module + ".lora_B.weight");
    layers.push_back({module, &a, &b, &merged.table().find(module + ".weight"), a.shape[0], a.shape[1], b.shape[0],
                      adapted.config().lora->scaling_of(module)});
  }
  return layers;
}

// The adapted model against the model with merged weights, in double: the same objective, and the
// adapters' gradients the merged weights' projected through each pair.
TEST_P(LoraModelKinds, EqualsTheMergedModelAndItsGradientsProjectThroughThePairs) {
  const ModelConfig base = tiny_config(GetParam());
  const ModelConfig config = with_lora(base, R"({"target_modules": "all-linear", "r": 3, "lora_alpha": 5,
                                                  "rank_pattern": {"o_proj": 2}})");
  Model<double> adapted(config), merged(base);
  adapted.init_weights(11);
  merged.init_weights(11);
  draw_lora_b(adapted, 12);
  // merged W = W + scaling · B · A for every adapted layer.
  const std::vector<AdaptedLayer> layers = adapted_layers(adapted, merged);
  for (const auto& [module, a_spec, b_spec, w_spec, rank, in, out, scaling] : layers) {
    EXPECT_EQ(scaling, module.ends_with("o_proj") ? 2.5 : 5.0 / 3.0);
    const double* A = adapted.params() + a_spec->offset;  // [rank, in]
    const double* B = adapted.params() + b_spec->offset;  // [out, rank]
    double* W = merged.params() + w_spec->offset;          // [out, in]
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t k = 0; k < rank; ++k) W[o * in + i] += scaling * B[o * rank + k] * A[k * in + i];
  }
  ASSERT_GE(int64_t(layers.size()), 4 * base.num_hidden_layers);  // every mixer's and FFN's projections
  GradientCheckOptions options;
  const GradientCheckBatch batch = gradient_check_batch(base, options);
  for (Model<double>* model : {&adapted, &merged}) {
    if (model->sparse_layers() > 0) model->set_indexer_training(IndexerMode::sparse, 1.0);
    model->zero_grads();
  }
  const double adapted_objective = adapted.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch,
                                                            options.seq, batch.scales).objective(batch.scales);
  const double merged_objective = merged.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch,
                                                          options.seq, batch.scales).objective(batch.scales);
  EXPECT_NEAR(adapted_objective, merged_objective, 1e-12 * std::abs(merged_objective));
  for (const auto& [module, a_spec, b_spec, w_spec, rank, in, out, scaling] : layers) {
    const double* A = adapted.params() + a_spec->offset;
    const double* B = adapted.params() + b_spec->offset;
    const double* dW = merged.grads() + w_spec->offset;  // [out, in]
    const double* dA = adapted.grads() + a_spec->offset;
    const double* dB = adapted.grads() + b_spec->offset;
    std::vector<double> expected_dA(rank * in), expected_dB(out * rank);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t k = 0; k < rank; ++k) {
          expected_dA[k * in + i] += scaling * B[o * rank + k] * dW[o * in + i];
          expected_dB[o * rank + k] += scaling * dW[o * in + i] * A[k * in + i];
        }
    EXPECT_LE(relative_error(dA, expected_dA.data(), rank * in), 1e-10) << module << ".lora_A";
    EXPECT_LE(relative_error(dB, expected_dB.data(), out * rank), 1e-10) << module << ".lora_B";
  }
  // Decoding reads some weights other than through the linear layer (MLA's absorbed kv_b_proj).
  std::vector<double> adapted_logits(base.vocab_size), merged_logits(base.vocab_size);
  for (Model<double>* model : {&adapted, &merged}) model->start_generation(options.seq);
  for (int64_t t = 0; t < options.seq; ++t) {
    adapted.generate_step(batch.tokens.data() + t, 1, adapted_logits.data());
    merged.generate_step(batch.tokens.data() + t, 1, merged_logits.data());
    ASSERT_LE(relative_error(adapted_logits.data(), merged_logits.data(), base.vocab_size), 1e-12) << "token " << t;
  }
}

// The whole-model gradient check with adapters on every linear layer (B drawn non-zero by the
// check itself): only the adapters are compared, and they pass.
TEST_P(LoraModelKinds, GradientCheckPasses) {
  const ModelConfig config = with_lora(tiny_config(GetParam()), R"({"target_modules": "all-linear", "r": 2})");
  GradientCheckOptions options;
  options.max_full_elements = 0;  // random directions: every tensor, quickly
  const GradientCheckReport report = check_model_gradients(config, options);
  EXPECT_TRUE(report.passed(options.tolerance)) << report.worst_tensor << " " << report.max_rel_err;
  for (const TensorCheck& check : report.tensors)
    EXPECT_NE(check.name.find(".lora_"), std::string::npos) << check.name << " is frozen and has no gradient";
  EXPECT_GT(report.tensors.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, LoraModelKinds,
                         ::testing::Values("tiny.json", "tiny_qwen3_next_hybrid.json", "tiny_qwen3_next_moe.json",
                                           "tiny_kimi_linear.json", "tiny_deepseek_v32.json"),
                         testing::config_test_name);

}  // namespace
}  // namespace trillion
