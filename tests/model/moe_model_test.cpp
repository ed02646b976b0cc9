// The MoE model end to end (tiny configs of each router kind): whole-model gradient checks with
// the routing replayed, the decision log, unit hooks, both checkpoint layouts, the router loss
// terms and statistics of a step, and aux-loss-free balancing of a skewed router.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/safetensors.h"
#include "model/gradient_check.h"
#include "model/model.h"
#include "ops/finite_diff.h"
#include "test_configs.h"
#include "test_support/scratch_dir.h"
#include "train/moe_balance.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  const CounterRng rng(seed, "moe_model_test.tokens");
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % vocab);
  return tokens;
}

// Every element of every trainable tensor; one thread (tiny sizes, many passes).
void expect_gradients_match(const ModelConfig& config) {
  GradientCheckOptions options;
  options.batch = 2;
  options.seq = 7;
  GradientCheckReport report;
  test::with_threads(1, [&] { report = check_model_gradients(config, options); });
  ASSERT_TRUE(report.full);
  int64_t trainable = 0;
  const Model<double> model(config);  // named: a temporary in the range would be gone before the loop
  for (const ParamSpec& spec : model.table().entries()) trainable += spec.trainable();
  EXPECT_EQ(static_cast<int64_t>(report.tensors.size()), trainable);
  for (const TensorCheck& t : report.tensors) {
    EXPECT_LE(t.rel_err, 1e-6) << t.name << " max_abs_err " << t.max_abs_err << " max_ref " << t.max_ref;
  }
}

TEST(MoeModel, GradientCheckQwen3MoeSoftmaxRouterWithAuxLoss) {
  expect_gradients_match(ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json")));
}

TEST(MoeModel, GradientCheckQwen3NextGatedSharedExpert) {
  expect_gradients_match(ModelConfig::load(testing::model_config_path("tiny_qwen3_next_moe.json")));
}

TEST(MoeModel, GradientCheckGlm4SigmoidGroupsSharedExpertAttentionBias) {
  expect_gradients_match(ModelConfig::load(testing::model_config_path("tiny_glm4_moe.json")));
}

// The other balance losses, the z-loss and dropping by capacity, each with its gradient checked.
TEST(MoeModel, GradientCheckBalanceVariantsAndCapacity) {
  const nlohmann::json variants[] = {
      {{"output_router_logits", true}, {"router_aux_loss_coef", 0.05}, {"router_aux_loss_type", "sequence"},
       {"router_z_loss_coef", 0.01}},
      {{"moe_capacity_factor", 0.5}},
  };
  for (const nlohmann::json& changes : variants) {
    SCOPED_TRACE(changes.dump());
    expect_gradients_match(testing::tiny_config_with(changes, "tiny_glm4_moe.json"));
  }
  expect_gradients_match(testing::tiny_config_with({{"router_aux_loss_type", "per_layer"}, {"router_z_loss_coef", 0.01},
                                                    {"moe_capacity_factor", 0.75}},
                                                   "tiny_qwen3_moe.json"));
  expect_gradients_match(testing::tiny_config_with({{"router_aux_loss_type", "sequence"}}, "tiny_qwen3_moe.json"));
}

// The step reports each MoE layer's routing and the aux term with transformers' pooled formula.
TEST(MoeModel, StepResultHasLossTermsAndPerLayerStatistics) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json"));
  Model<double> model(config);
  model.init_weights(3);
  const int64_t batch = 2, seq = 9, n = batch * seq;
  const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, 1);
  const StepResult result = model.forward_loss(tokens.data(), tokens.data(), batch, seq);
  ASSERT_EQ(result.moe.size(), 2u);  // layer 0 is dense (mlp_only_layers)
  EXPECT_EQ(result.moe[0].layer, 1);
  double pooled = 0.0;
  for (int64_t e = 0; e < config.num_experts; ++e) {
    double count = 0.0, prob = 0.0;
    for (const MoeLayerStats& s : result.moe) count += double(s.tokens_per_expert[e]), prob += s.prob_sums[e];
    pooled += (count / (2.0 * n)) * (prob / (2.0 * n));
  }
  int64_t assigned = 0;
  for (int64_t c : result.moe[1].tokens_per_expert) assigned += c;
  EXPECT_EQ(assigned, n * config.num_experts_per_tok);
  ASSERT_EQ(result.aux.size(), 1u);
  EXPECT_EQ(result.aux[0].name, "aux_loss");
  EXPECT_NEAR(result.aux[0].value, double(config.num_experts) * pooled, 1e-14);
  EXPECT_EQ(result.aux[0].coef, 0.01);
  const LossScales scales{1.0 / double(n), 0.5};
  EXPECT_NEAR(result.objective(scales), result.lm.loss_sum / double(n) + 0.5 * 0.01 * result.aux[0].value, 1e-15);
  // Without output_router_logits transformers adds no aux loss, and neither does the engine.
  Model<double> silent(testing::tiny_config_with({{"output_router_logits", false}}, "tiny_qwen3_moe.json"));
  silent.init_weights(3);
  EXPECT_TRUE(silent.forward_loss(tokens.data(), tokens.data(), batch, seq).aux.empty());
}

// Replay keeps the recorded routing even when the weights would route differently.
TEST(MoeModel, DecisionLogReplaysRouting) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_glm4_moe.json"));
  Model<double> model(config);
  model.init_weights(5);
  const int64_t batch = 1, seq = 12;
  const std::vector<int32_t> tokens = random_tokens(seq, config.vocab_size, 2);
  const StepResult recorded = model.forward_loss(tokens.data(), tokens.data(), batch, seq);
  const ParamSpec& router = model.table().find("model.layers.1.mlp.gate.weight");
  for (int64_t i = 0; i < router.numel(); ++i) model.params()[router.offset + i] *= -50.0;
  model.decisions().start_replay();
  const StepResult replayed = model.forward_loss(tokens.data(), tokens.data(), batch, seq);
  model.decisions().start_recording();
  const StepResult rerouted = model.forward_loss(tokens.data(), tokens.data(), batch, seq);
  EXPECT_EQ(replayed.moe[0].tokens_per_expert, recorded.moe[0].tokens_per_expert);
  EXPECT_NE(rerouted.moe[0].tokens_per_expert, recorded.moe[0].tokens_per_expert);
}

// Decoding is dropless: with a capacity limit the prefill of a prompt and its token-by-token
// decoding give the same logits (capacity would otherwise depend on how many tokens come at once).
TEST(MoeModel, DecodingIsDroplessUnderACapacityLimit) {
  Model<double> model(testing::tiny_config_with({{"moe_capacity_factor", 0.25}}, "tiny_qwen3_moe.json"));
  model.init_weights(6);
  const int64_t len = 9, V = model.config().vocab_size;
  const std::vector<int32_t> prompt = random_tokens(len, V, 4);
  std::vector<double> prefill(V), stepwise(V);
  model.start_generation(len);
  model.generate_step(prompt.data(), len, prefill.data());
  model.start_generation(len);
  for (int64_t t = 0; t < len; ++t) model.generate_step(prompt.data() + t, 1, stepwise.data());
  EXPECT_LE(test::relative_error(stepwise, prefill), 1e-13);
  // Training at the same capacity does drop (the limit is in force there).
  const StepResult result = model.forward_loss(prompt.data(), prompt.data(), 1, len);
  EXPECT_GT(result.moe.at(0).dropped, 0);
}

// Untied, the embeddings (unit 0) and the final norm with the LM head (unit 1 + L) are units of
// their own; tied, they are all unit 0, in use from the embedding to the head and back.
TEST(MoeModel, UnitHooksRunAroundEveryUnitInOrder) {
  for (const bool tied : {false, true}) {
    const ModelConfig config = testing::tiny_config_with({{"tie_word_embeddings", tied}}, "tiny_qwen3_moe.json");
    Model<float> model(config);
    model.init_weights(1);
    std::vector<std::string> calls;
    UnitHooks hooks;
    hooks.before_forward = [&](int unit) { calls.push_back(str_cat("f", unit)); };
    hooks.after_forward = [&](int unit) { calls.push_back(str_cat("F", unit)); };
    hooks.before_backward = [&](int unit) { calls.push_back(str_cat("b", unit)); };
    hooks.after_backward = [&](int unit) { calls.push_back(str_cat("B", unit)); };
    model.set_unit_hooks(hooks);
    const std::vector<int32_t> tokens = random_tokens(8, config.vocab_size, 3);
    model.forward_backward(tokens.data(), tokens.data(), 1, 8, LossScales{0.125});
    const std::vector<std::string> expected =
        tied ? std::vector<std::string>{"f0", "f1", "F1", "f2", "F2", "f3", "F3", "F0",
                                        "b0", "b3", "B3", "b2", "B2", "b1", "B1", "B0"}
             : std::vector<std::string>{"f0", "F0", "f1", "F1", "f2", "F2", "f3", "F3", "f4", "F4",
                                        "b4", "B4", "b3", "B3", "b2", "B2", "b1", "B1", "b0", "B0"};
    EXPECT_EQ(calls, expected) << (tied ? "tied" : "untied");
    const UnitOrder order = unit_order(config);  // the before-hooks' units
    std::vector<std::string> before;
    for (const int unit : order.forward) before.push_back(str_cat("f", unit));
    for (const int unit : order.backward) before.push_back(str_cat("b", unit));
    std::vector<std::string> called_before;
    for (const std::string& call : calls)
      if (call[0] == 'f' || call[0] == 'b') called_before.push_back(call);
    EXPECT_EQ(called_before, before) << "unit_order states the hooks' order";
  }
}

class MoeWeightsFiles : public ::testing::Test {
 protected:
  const test::ScratchDir scratch_{"moe_weights"};
  const fs::path dir_{scratch_.path()};
};

// Written with per-expert keys (save_pretrained's default); read back from them and from the fused
// layout (save_original_format=False); the correction bias buffer travels with the weights.
TEST_F(MoeWeightsFiles, PerExpertAndFusedLayoutsLoad) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_glm4_moe.json"));
  Model<float> a(config), b(config), c(config);
  a.init_weights(1);
  for (auto& [layer, bias] : a.correction_biases())
    for (int64_t e = 0; e < config.num_experts; ++e) bias[e] = 0.01f * float(e - layer);
  const std::string per_expert = (dir_ / "per_expert").string();
  a.save_weights(per_expert);
  const SafetensorsReader file(per_expert + "/model.safetensors");
  EXPECT_EQ(file.info("model.layers.2.mlp.experts.7.up_proj.weight").shape,
            (std::vector<int64_t>{config.moe_intermediate_size, config.hidden_size}));
  EXPECT_TRUE(file.contains("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(file.contains("model.layers.1.mlp.experts.gate_up_proj"));
  b.init_weights(2);
  b.load_weights(per_expert);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.table().total_size() * sizeof(float)));

  // The fused layout: every non-expert tensor as stored, the experts as [E, 2I, H] and [E, H, I].
  SafetensorsWriter fused;
  for (const ParamSpec& spec : a.table().entries())
    fused.add(spec.name, DType::F32, spec.shape, a.params() + spec.offset);
  fs::create_directories(dir_ / "fused");
  fused.write((dir_ / "fused" / "model.safetensors").string());
  c.init_weights(3);
  c.load_weights((dir_ / "fused").string());
  EXPECT_EQ(0, std::memcmp(a.params(), c.params(), a.table().total_size() * sizeof(float)));
  // gate_up[e] = cat(gate_proj[e], up_proj[e]): expert 3's up_proj is rows I..2I of its slice.
  const ParamSpec& gate_up = a.table().find("model.layers.1.mlp.experts.gate_up_proj");
  const int64_t I = config.moe_intermediate_size, H = config.hidden_size;
  std::vector<float> up(I * H);
  file.read("model.layers.1.mlp.experts.3.up_proj.weight", {I, H}, up.data());
  EXPECT_EQ(0, std::memcmp(up.data(), a.params() + gate_up.offset + 3 * 2 * I * H + I * H, I * H * sizeof(float)));
}

// Aux-loss-free balancing: router weights frozen at a skewed start, only the correction bias moves
// (the trainer's after-step hook, rate 1e-3), and the load evens out.
TEST(MoeModel, AuxLossFreeBiasBalancesASkewedRouter) {
  const ModelConfig config =
      testing::tiny_config_with({{"n_group", 1}, {"topk_group", 1}, {"num_hidden_layers", 2}}, "tiny_glm4_moe.json");
  Model<float> model(config);
  model.init_weights(4);
  // A shared direction in every embedding, and experts 0 and 1 aligned with it: they win for all tokens.
  const int64_t D = config.hidden_size, E = config.num_experts;
  const ParamSpec& embed = model.table().find("model.embed_tokens.weight");
  for (int64_t i = 0; i < embed.numel(); ++i) model.params()[embed.offset + i] += 0.05f;
  const ParamSpec& router = model.table().find("model.layers.1.mlp.gate.weight");
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t c = 0; c < D; ++c) model.params()[router.offset + e * D + c] += 0.04f;
  const std::vector<std::pair<int, float*>> biases = model.correction_biases();
  ASSERT_EQ(biases.size(), 1u);
  const int64_t batch = 4, seq = 16;
  const auto window_load = [&](int first_step, int steps, bool update) {
    std::vector<int64_t> total(E, 0);
    for (int step = first_step; step < first_step + steps; ++step) {
      const std::vector<int32_t> tokens = random_tokens(batch * seq, config.vocab_size, 100 + step);
      StepStats stats;
      stats.add(model.forward_loss(tokens.data(), tokens.data(), batch, seq));
      const std::vector<int64_t>& load = stats.layers().at(0).tokens_per_expert;
      for (int64_t e = 0; e < E; ++e) total[e] += load[e];
      if (update) aux_free_bias_update(biases[0].second, load, 1e-3);
    }
    MoeLayerStats summary;
    summary.tokens_per_expert = total;
    return summary;
  };
  const MoeLayerStats start = window_load(0, 13, /*update=*/false);
  EXPECT_GE(start.max_over_mean(), 3.0) << "the start is not skewed enough to test balancing";
  window_load(0, 600, /*update=*/true);
  const MoeLayerStats end = window_load(600, 26, /*update=*/true);  // 26 · 64 · 2 / 8 = 416 per expert
  EXPECT_LT(end.max_over_mean(), 1.3);
}

}  // namespace
}  // namespace trillion
