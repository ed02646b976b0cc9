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
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/relative_error.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "model/gradient_check.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "test_configs.h"
#include "test_support/scratch_dir.h"

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
  EXPECT_EQ(table.trainable_groups(), (std::vector<ParamGroup>{ParamGroup::lora, ParamGroup::expert_lora}));
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
  const ModelConfig moe = tiny_config("tiny_qwen3_moe.json");
  const auto refusal = [&](const std::string& adapter_json) {
    return error_message([&] { Model<float>(with_lora(moe, adapter_json)); });
  };
  EXPECT_NE(refusal(R"({"target_parameters": ["mlp.experts.gate_proj"]})")
                .find("field \"target_parameters\": matches no routed experts' weight"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"target_modules": ".*experts\\.[0-3]\\.gate_proj"})")
                .find("field \"target_modules\": matches 4 of the 6 routed experts' gate_proj in model.layers.1."),
            std::string::npos);
  EXPECT_NE(refusal(R"({"target_modules": ["up_proj"], "target_parameters": ["gate_up_proj"]})")
                .find("both adapt model.layers.1.mlp.experts.gate_up_proj"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"target_modules": ["down_proj"], "rank_pattern": {"experts.1.down_proj": 5}})")
                .find("give model.layers.1.mlp.experts.1.down_proj another rank or alpha"),
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

// One adapted layer: its pair in the adapted model, its weight in the merged one. A routed experts'
// pair holds one pair per expert and adapts rows row0 .. row0 + rows of each expert's weight.
struct AdaptedLayer {
  std::string module;
  const ParamSpec* a;       // [rank, in] or [E, rank, in]
  const ParamSpec* b;       // [rows, rank] or [E, rows, rank]
  const ParamSpec* weight;  // [rows, in] or [E, weight_rows, in], in the merged model's table
  int64_t experts, rank, in, rows, row0, weight_rows;
  double scaling;
};

std::vector<AdaptedLayer> adapted_layers(const Model<double>& adapted, const Model<double>& merged) {
  constexpr std::string_view kA = ".lora_A.weight";
  std::vector<AdaptedLayer> layers;
  for (const ParamSpec& a : adapted.table().entries()) {
    if (!a.name.ends_with(kA)) continue;
    const std::string module = a.name.substr(0, a.name.size() - kA.size());
    const ParamSpec& b = adapted.table().find(module + ".lora_B.weight");
    const double scaling = adapted.config().lora->scaling_of(module);
    if (a.shape.size() == 2) {
      const ParamSpec& weight = merged.table().find(module + ".weight");
      layers.push_back({module, &a, &b, &weight, 1, a.shape[0], a.shape[1], b.shape[0], 0, b.shape[0], scaling});
      continue;
    }
    // Routed experts: the fused weight's own pair, or a part's (gate and up share gate_up_proj;
    // Kimi's experts name them w1, w3 and w2).
    const std::string experts = module.substr(0, module.rfind('.')), part = module.substr(module.rfind('.') + 1);
    const bool up = part == "up_proj" || part == "w3";
    const bool on_gate_up = up || part == "gate_up_proj" || part == "gate_proj" || part == "w1";
    const ParamSpec& weight = merged.table().find(experts + (on_gate_up ? ".gate_up_proj" : ".down_proj"));
    const int64_t rows = b.shape[1], row0 = up ? rows : 0;
    layers.push_back({module, &a, &b, &weight, a.shape[0], a.shape[1], a.shape[2], rows, row0, weight.shape[1],
                      scaling});
  }
  return layers;
}

// The adapted model against the model with merged weights, in double: the same objective, and the
// adapters' gradients the merged weights' projected through each pair; decoding too.
void expect_equals_merged_model(const ModelConfig& base, const ModelConfig& config, int64_t min_layers) {
  Model<double> adapted(config), merged(base);
  adapted.init_weights(11);
  merged.init_weights(11);
  draw_lora_b(adapted, 12);
  // merged W[e][row0 + o, i] += scaling · Σ_k B[e][o, k] · A[e][k, i] for every adapted layer.
  const std::vector<AdaptedLayer> layers = adapted_layers(adapted, merged);
  for (const AdaptedLayer& l : layers)
    for (int64_t e = 0; e < l.experts; ++e) {
      const double* A = adapted.params() + l.a->offset + e * l.rank * l.in;    // [rank, in]
      const double* B = adapted.params() + l.b->offset + e * l.rows * l.rank;  // [rows, rank]
      double* W = merged.params() + l.weight->offset + (e * l.weight_rows + l.row0) * l.in;  // [rows, in]
      for (int64_t o = 0; o < l.rows; ++o)
        for (int64_t i = 0; i < l.in; ++i)
          for (int64_t k = 0; k < l.rank; ++k) W[o * l.in + i] += l.scaling * B[o * l.rank + k] * A[k * l.in + i];
    }
  ASSERT_GE(int64_t(layers.size()), min_layers);
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
  for (const AdaptedLayer& l : layers) {
    std::vector<double> expected_dA(l.experts * l.rank * l.in), expected_dB(l.experts * l.rows * l.rank);
    for (int64_t e = 0; e < l.experts; ++e) {
      const double* A = adapted.params() + l.a->offset + e * l.rank * l.in;
      const double* B = adapted.params() + l.b->offset + e * l.rows * l.rank;
      const double* dW = merged.grads() + l.weight->offset + (e * l.weight_rows + l.row0) * l.in;  // [rows, in]
      double* dA = expected_dA.data() + e * l.rank * l.in;
      double* dB = expected_dB.data() + e * l.rows * l.rank;
      for (int64_t o = 0; o < l.rows; ++o)
        for (int64_t i = 0; i < l.in; ++i)
          for (int64_t k = 0; k < l.rank; ++k) {
            dA[k * l.in + i] += l.scaling * B[o * l.rank + k] * dW[o * l.in + i];
            dB[o * l.rank + k] += l.scaling * dW[o * l.in + i] * A[k * l.in + i];
          }
    }
    EXPECT_LE(relative_error(adapted.grads() + l.a->offset, expected_dA.data(), l.a->numel()), 1e-10)
        << l.module << ".lora_A";
    EXPECT_LE(relative_error(adapted.grads() + l.b->offset, expected_dB.data(), l.b->numel()), 1e-10)
        << l.module << ".lora_B";
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

// all-linear: every projection, shared experts and routed experts (their per-expert modules) included.
TEST_P(LoraModelKinds, EqualsTheMergedModelAndItsGradientsProjectThroughThePairs) {
  const ModelConfig base = tiny_config(GetParam());
  const ModelConfig config = with_lora(base, R"({"target_modules": "all-linear", "r": 3, "lora_alpha": 5,
                                                  "rank_pattern": {"o_proj": 2}})");
  for (const AdaptedLayer& l : adapted_layers(Model<double>(config), Model<double>(base)))
    EXPECT_EQ(l.scaling, l.module.ends_with("o_proj") ? 2.5 : 5.0 / 3.0) << l.module;
  expect_equals_merged_model(base, config, 4 * base.num_hidden_layers);  // every mixer's and FFN's projections
}

// PEFT's fused layout: target_parameters on the routed experts' stacked weights, one pair each.
TEST(LoraModel, RoutedExpertsFusedPairsEqualTheMergedModel) {
  for (const char* name : {"tiny_qwen3_moe.json", "tiny_deepseek_v3.json"}) {
    SCOPED_TRACE(name);
    const ModelConfig base = tiny_config(name);
    const ModelConfig config = with_lora(base, R"({"target_modules": ["o_proj"], "r": 3, "lora_alpha": 5,
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "rank_pattern": {".*\\.gate_up_proj": 4}, "alpha_pattern": {".*\\.gate_up_proj": 6}})");
    const Model<double> model(config);
    int64_t moe_layers = 0;
    for (int64_t layer = 0; layer < base.num_hidden_layers; ++layer) moe_layers += base.is_moe_layer(layer);
    int64_t fused = 0;
    for (const ParamSpec& spec : model.table().entries()) fused += spec.adapter && spec.shape.size() == 3;
    EXPECT_EQ(fused, 4 * moe_layers);
    expect_equals_merged_model(base, config, base.num_hidden_layers + 2 * moe_layers);
  }
}

// PEFT's per-expert layout (target_modules on the experts' modules, as for transformers 4's expert
// lists): the adapter file holds one pair per expert module under its own key, reads back to the
// bit, and the merged model (the up_proj pair folded into the second half of gate_up_proj) gives the
// adapted loss.
TEST(LoraModel, RoutedExpertsPerExpertPairsSaveUnderTheirModulesAndMerge) {
  const ModelConfig base = tiny_config("tiny_qwen3_moe.json");
  const ModelConfig config = with_lora(base, R"({"target_modules": ["up_proj", "down_proj", "q_proj"], "r": 3,
      "rank_pattern": {"up_proj": 2}, "lora_alpha": 4})");
  Model<double> adapted(config), merged(base);
  adapted.init_weights(21);
  draw_lora_b(adapted, 22);
  const test::ScratchDir dir;
  adapted.save_adapter(dir.path());
  const SafetensorsReader file(dir.path() + "/adapter_model.safetensors");
  const int64_t D = base.hidden_size, I = base.moe_intermediate_size, E = base.num_experts;
  EXPECT_EQ(file.info("base_model.model.model.layers.1.mlp.experts.5.up_proj.lora_A.weight").shape,
            (std::vector<int64_t>{2, D}));
  EXPECT_EQ(file.info("base_model.model.model.layers.1.mlp.experts.5.up_proj.lora_B.weight").shape,
            (std::vector<int64_t>{I, 2}));
  EXPECT_EQ(file.info("base_model.model.model.layers.1.mlp.experts.0.down_proj.lora_A.weight").shape,
            (std::vector<int64_t>{3, I}));
  EXPECT_FALSE(file.contains("base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight"));
  // Layers 1 and 2: up and down of each expert; every layer's q_proj; layer 0's dense up and down.
  EXPECT_EQ(int64_t(file.tensors().size()), 2 * 4 * E + 2 * base.num_hidden_layers + 4);
  // Expert 5's up pair is the slice of the stacked tensor after experts 0..4.
  const ParamSpec& up_b = adapted.table().find("model.layers.1.mlp.experts.up_proj.lora_B.weight");
  std::vector<double> expert5(I * 2);
  file.read("base_model.model.model.layers.1.mlp.experts.5.up_proj.lora_B.weight", {I, 2}, expert5.data());
  EXPECT_EQ(expert5, std::vector<double>(adapted.params() + up_b.offset + 5 * I * 2,
                                         adapted.params() + up_b.offset + 6 * I * 2));
  Model<double> reloaded(config);
  reloaded.init_weights(21);
  reloaded.load_adapter(dir.path());
  EXPECT_EQ(0, std::memcmp(reloaded.params(), adapted.params(), adapted.table().total_size() * sizeof(double)));

  adapted.merge_adapter_into(merged);
  GradientCheckOptions options;
  const GradientCheckBatch batch = gradient_check_batch(base, options);
  const StepResult a = adapted.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq);
  const StepResult m = merged.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq);
  EXPECT_NEAR(a.lm.loss_sum, m.lm.loss_sum, 1e-12 * std::abs(m.lm.loss_sum));
  Model<double> plain(base);
  plain.init_weights(21);
  EXPECT_GT(std::abs(plain.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq)
                         .lm.loss_sum - a.lm.loss_sum),
            1e-6 * std::abs(a.lm.loss_sum));  // the adapter changes the loss
}

// lora_dropout (model/linear.h): while a pass is set the adapters read x ⊙ m / (1 − p), the same
// masks in every pass with the same (seed, step, first token) and others for another step; without
// a pass (evaluation) the loss is the dropout-free one; the gradient check passes through the masks.
TEST(LoraModel, DropoutMasksTheAdaptersInputsOnlyInItsPasses) {
  const ModelConfig base = tiny_config("tiny.json");
  const ModelConfig config = with_lora(base, R"({"target_modules": "all-linear", "r": 3, "lora_dropout": 0.3})");
  const ModelConfig without = with_lora(base, R"({"target_modules": "all-linear", "r": 3})");
  Model<double> dropping(config), plain(without);
  for (Model<double>* model : {&dropping, &plain}) {
    model->init_weights(7);
    draw_lora_b(*model, 8);
  }
  GradientCheckOptions options;
  const GradientCheckBatch batch = gradient_check_batch(base, options);
  const auto loss = [&](Model<double>& model) {
    return model.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq).lm.loss_sum;
  };
  const double eval = loss(dropping);
  EXPECT_EQ(eval, loss(plain));
  dropping.set_lora_dropout(LoraDropoutPass{.seed = 1, .step = 5});
  const double step5 = loss(dropping);
  EXPECT_NE(step5, eval);
  EXPECT_EQ(loss(dropping), step5);
  dropping.set_lora_dropout(LoraDropoutPass{.seed = 1, .step = 6});
  EXPECT_NE(loss(dropping), step5);
  dropping.set_lora_dropout(std::nullopt);
  EXPECT_EQ(loss(dropping), eval);

  GradientCheckOptions check;
  check.max_full_elements = 0;
  const GradientCheckReport report = check_model_gradients(config, check);
  EXPECT_TRUE(report.passed(check.tolerance)) << report.worst_tensor << " " << report.max_rel_err;
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
