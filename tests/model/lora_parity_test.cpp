// PEFT parity of LoRA (tools/ref/write_lora_fixture.py: adapters the peft package made, with non-zero
// B and a perturbed saved module, on the transformers-made model fixtures; on qwen3_moe the routed
// experts' pairs in both of PEFT's layouts: fused (transformers 5) and per-expert (transformers 4)): the engine loads the
// base's weights and PEFT's adapter files and gives PEFT's loss and logits, to 1e-10 in double and
// 1e-6 in float; an adapter it saves reads back to the bit under PEFT's keys; a file that does not
// fit the adapter config is refused naming the file and the tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/relative_error.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "model/config.h"
#include "model/model.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;

const std::string kFixtureRoot = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/models/";
constexpr int64_t kBatch = 2, kSeq = 7;  // the base fixtures' tokens

// A parity fixture is "BASE" (its adapter in BASE/lora/) or "BASE/DIR" (another adapter of BASE).
std::string base_dir(const std::string& fixture) { return kFixtureRoot + fixture.substr(0, fixture.find('/')); }
std::string adapter_dir(const std::string& fixture) {
  return kFixtureRoot + (fixture.find('/') == std::string::npos ? fixture + "/lora" : fixture);
}

std::vector<int32_t> read_ids(const SafetensorsReader& fixture, const std::string& name) {
  std::vector<double> values(kBatch * kSeq);  // [batch, seq]
  fixture.read(name, {kBatch, kSeq}, values.data());
  return std::vector<int32_t>(values.begin(), values.end());
}

ModelConfig adapted_config(const std::string& base) {
  ModelConfig config = ModelConfig::load(base_dir(base) + "/config.json");
  config.lora = std::make_shared<const LoraConfig>(LoraConfig::load(adapter_dir(base) + "/adapter_config.json"));
  return config;
}

template <class T>
std::unique_ptr<Model<T>> adapted_model(const std::string& base) {
  auto model = std::make_unique<Model<T>>(adapted_config(base));
  model->load_weights(base_dir(base));
  model->load_adapter(adapter_dir(base));
  return model;
}

class LoraParity : public ::testing::TestWithParam<std::string> {};

// PEFT's lm_loss from the loss path, and its logits of every position from the decoding path
// (relative to the largest |logit|), within `loss_tolerance` and `logit_tolerance`.
template <class T>
void expect_peft_outputs(const std::string& base, double loss_tolerance, double logit_tolerance) {
  const SafetensorsReader tokens_file(base_dir(base) + "/fixture.safetensors");
  const SafetensorsReader peft(adapter_dir(base) + "/fixture.safetensors");
  const std::vector<int32_t> tokens = read_ids(tokens_file, "tokens"), targets = read_ids(tokens_file, "targets");
  const auto model = adapted_model<T>(base);
  const StepResult result = model->forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
  double expected_loss = 0.0;
  peft.read("lm_loss", {}, &expected_loss);
  const double loss = result.lm.loss_sum / double(result.lm.count);
  EXPECT_LE(std::abs(loss - expected_loss) / expected_loss, loss_tolerance) << "lm_loss " << loss << " vs PEFT " << expected_loss;

  const int64_t V = model->config().vocab_size;
  std::vector<double> expected(kBatch * kSeq * V);  // [batch, seq, vocab]
  peft.read("logits", {kBatch, kSeq, V}, expected.data());
  std::vector<T> logits(kBatch * kSeq * V);  // [batch, seq, vocab]
  for (int64_t b = 0; b < kBatch; ++b) {
    model->start_generation(kSeq);
    for (int64_t t = 0; t < kSeq; ++t)
      model->generate_step(tokens.data() + b * kSeq + t, 1, logits.data() + (b * kSeq + t) * V);
  }
  const std::vector<double> widened(logits.begin(), logits.end());
  EXPECT_LE(relative_error(widened.data(), expected.data(), kBatch * kSeq * V), logit_tolerance) << "logits";
}

TEST_P(LoraParity, PeftsAdapterGivesPeftsLossAndLogitsInDouble) {
  expect_peft_outputs<double>(GetParam(), 1e-10, 1e-10);
}

// Float: the loss within 1e-6; the logits within 32 ε (ε = 2⁻²³): the float base model alone is
// already 1.6e-6 off transformers' float64 logits on the Gated DeltaNet hybrid (0.3e-6 on the others).
TEST_P(LoraParity, PeftsAdapterGivesPeftsLossAndLogitsInFloat) {
  expect_peft_outputs<float>(GetParam(), 1e-6, 32 * 0x1.0p-23);
}

// save_adapter writes PEFT's files: the same keys, shapes and values as PEFT's (the routed experts'
// fused lora_B in its rank-major order included), values that read back to the bit, and a config
// that reads back as the same one.
TEST_P(LoraParity, ASavedAdapterHasPeftsKeysAndReadsBackToTheBit) {
  const auto model = adapted_model<double>(GetParam());
  const test::ScratchDir dir;
  model->save_adapter(dir.path());
  const SafetensorsReader saved(dir.path() + "/adapter_model.safetensors");
  const SafetensorsReader peft(adapter_dir(GetParam()) + "/adapter_model.safetensors");
  ASSERT_EQ(saved.tensors().size(), peft.tensors().size());
  for (const auto& [key, info] : peft.tensors()) {
    ASSERT_TRUE(saved.contains(key)) << key;
    EXPECT_EQ(saved.info(key).shape, info.shape) << key;
    EXPECT_EQ(saved.info(key).dtype, DType::F64) << key;
    int64_t n = 1;
    for (int64_t d : info.shape) n *= d;
    std::vector<double> ours(n), theirs(n);
    saved.read(key, info.shape, ours.data());
    peft.read(key, info.shape, theirs.data());
    EXPECT_EQ(ours, theirs) << key;
  }
  const LoraConfig back = LoraConfig::load(dir.path() + "/adapter_config.json");
  EXPECT_EQ(back.to_json(), model->config().lora->to_json());
  Model<double> reloaded(adapted_config(GetParam()));
  reloaded.load_weights(base_dir(GetParam()));
  reloaded.load_adapter(dir.path());
  EXPECT_EQ(0, std::memcmp(reloaded.params(), model->params(), model->table().total_size() * sizeof(double)));
}

// The adapter folded into the weights (what `trillion merge` writes) gives the adapted model's
// loss and logits: 1e-12 in double, 1e-6 in float.
template <class T>
void expect_merged_equals_adapted(const std::string& base, double tolerance) {
  const SafetensorsReader tokens_file(base_dir(base) + "/fixture.safetensors");
  const std::vector<int32_t> tokens = read_ids(tokens_file, "tokens"), targets = read_ids(tokens_file, "targets");
  const auto adapted = adapted_model<T>(base);
  Model<T> merged(ModelConfig::load(base_dir(base) + "/config.json"));
  adapted->merge_adapter_into(merged);
  const StepResult a = adapted->forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
  const StepResult m = merged.forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
  EXPECT_LE(std::abs(a.lm.loss_sum - m.lm.loss_sum) / std::abs(a.lm.loss_sum), tolerance) << "loss";
  const int64_t V = merged.config().vocab_size;
  std::vector<T> adapted_logits(kSeq * V), merged_logits(kSeq * V);  // [seq, vocab] of sequence 0
  adapted->start_generation(kSeq);
  merged.start_generation(kSeq);
  for (int64_t t = 0; t < kSeq; ++t) {
    adapted->generate_step(tokens.data() + t, 1, adapted_logits.data() + t * V);
    merged.generate_step(tokens.data() + t, 1, merged_logits.data() + t * V);
  }
  EXPECT_LE(relative_error(merged_logits.data(), adapted_logits.data(), kSeq * V), tolerance) << "logits";
}

// Float: 1e-6, the issue's bound; 32 ε (ε = 2⁻²³, 3.8e-6) on the per-expert fixture, whose adapter
// moves the logits by 137 % of their largest (its pairs are random at 0.3 on the experts' every
// module), so that its merged weights round far from the base's: 1.6e-6 there.
TEST_P(LoraParity, TheMergedModelGivesTheAdaptedLogits) {
  expect_merged_equals_adapted<double>(GetParam(), 1e-12);
  const bool moves_far = GetParam() == std::string("tiny_qwen3_moe/lora_per_expert");
  expect_merged_equals_adapted<float>(GetParam(), moves_far ? 32 * 0x1.0p-23 : 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity,
                         ::testing::Values("tiny_qwen3", "tiny_qwen3_next_hybrid", "tiny_deepseek_v3",
                                           "tiny_qwen3_moe", "tiny_qwen3_moe/lora_per_expert"));

// The loss on `base`'s tokens with the adapter in `dir` as its own adapter_config.json declares it.
double adapter_loss(const std::string& base, const std::string& dir) {
  ModelConfig config = ModelConfig::load(base_dir(base) + "/config.json");
  config.lora = std::make_shared<const LoraConfig>(LoraConfig::load(dir + "/adapter_config.json"));
  Model<double> model(config);
  model.load_weights(base_dir(base));
  model.load_adapter(dir);
  const SafetensorsReader tokens_file(base_dir(base) + "/fixture.safetensors");
  const std::vector<int32_t> tokens = read_ids(tokens_file, "tokens"), targets = read_ids(tokens_file, "targets");
  const StepResult result = model.forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
  return result.lm.loss_sum / double(result.lm.count);
}

std::vector<double> tensor_of(const SafetensorsReader& file, const std::string& key) {
  int64_t n = 1;
  for (int64_t d : file.info(key).shape) n *= d;
  std::vector<double> values(n);
  file.read(key, file.info(key).shape, values.data());
  return values;
}

// The loss of `model` on `base`'s tokens.
double loss_on_fixture_tokens(Model<double>& model, const std::string& base) {
  const SafetensorsReader tokens_file(base_dir(base) + "/fixture.safetensors");
  const std::vector<int32_t> tokens = read_ids(tokens_file, "tokens"), targets = read_ids(tokens_file, "targets");
  const StepResult result = model.forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
  return result.lm.loss_sum / double(result.lm.count);
}

// Every trainable value of `model` drawn in ±0.3, so that each pair moves the loss.
void draw_adapter(Model<double>& model) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (const ParamSpec& spec : model.table().entries())
    if (spec.trainable())
      for (int64_t i = 0; i < spec.numel(); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        model.params()[spec.offset + i] = 0.6 * (double(state >> 11) * 0x1.0p-53 - 0.5);
      }
}

// `to`'s frozen base = `from`'s, tensor by tensor (their adapters may differ in layout).
void copy_base(const Model<double>& from, Model<double>& to) {
  for (const ParamSpec& spec : to.table().entries())
    if (!spec.trainable())
      std::memcpy(to.params() + spec.offset, from.params() + from.table().find(spec.name).offset,
                  spec.numel() * sizeof(double));
}

// --expert-layout: a fused adapter on qwen3_moe with gate_up_proj's pair at rank r (PEFT's fused
// fixture's config at r 4, alpha 8, with o_proj's and v_proj's own patterns) written per-expert
// (each part's pair: the fused A and its part's rows of B) and back fused (the parts' ranks side by
// side, B block-diagonal, as PEFT converts) gives its loss each time; the per-expert config is one
// PEFT on transformers 5 reads alike (the index-less names, rank r and lora_alpha there) and drops
// the stale gate_up_proj patterns.
TEST(AdapterLayout, FusedAdapterWrittenPerExpertAndBackGivesItsLoss) {
  const std::string base = "tiny_qwen3_moe";
  ModelConfig config = adapted_config(base);
  LoraConfig lora = *config.lora;
  lora.rank_pattern.front() = {".*\\.gate_up_proj", 4};  // = r: stale once the experts are per-expert
  lora.alpha_pattern.front() = {".*\\.gate_up_proj", 8};
  config.lora = std::make_shared<const LoraConfig>(lora);
  Model<double> model(config);
  model.load_weights(base_dir(base));
  draw_adapter(model);
  const double loss = loss_on_fixture_tokens(model, base);

  const test::ScratchDir per_expert, fused_again;
  model.save_adapter(per_expert.path(), ExpertLayout::per_expert);
  const SafetensorsReader file(per_expert.path() + "/adapter_model.safetensors");
  const std::string expert = "base_model.model.model.layers.1.mlp.experts.5.";
  EXPECT_EQ(file.info(expert + "gate_proj.lora_A.weight").shape, (std::vector<int64_t>{4, 32}));  // [r, D]
  EXPECT_EQ(file.info(expert + "up_proj.lora_B.weight").shape, (std::vector<int64_t>{16, 4}));    // [I, r]
  EXPECT_EQ(tensor_of(file, expert + "gate_proj.lora_A.weight"), tensor_of(file, expert + "up_proj.lora_A.weight"));
  const LoraConfig written = LoraConfig::load(per_expert.path() + "/adapter_config.json");
  EXPECT_TRUE(written.target_parameters.empty());
  EXPECT_TRUE(written.targets_module("model.layers.1.mlp.experts.5.up_proj"));
  EXPECT_TRUE(written.targets_module("model.layers.1.mlp.experts.up_proj"));  // as PEFT on transformers 5 names it
  EXPECT_TRUE(written.targets_module("model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(written.targets_module("model.layers.0.mlp.up_proj"));  // the dense MLP stays as it was
  for (const auto& [key, rank] : written.rank_pattern) EXPECT_EQ(key.find("gate_up_proj"), std::string::npos) << key;
  for (const auto& [key, alpha] : written.alpha_pattern) EXPECT_EQ(key.find("gate_up_proj"), std::string::npos) << key;
  EXPECT_EQ(written.rank_of("model.layers.1.mlp.experts.gate_proj"), written.r);
  EXPECT_EQ(written.alpha_of("model.layers.1.mlp.experts.gate_proj"), written.lora_alpha);
  EXPECT_EQ(written.rank_of("model.layers.1.self_attn.o_proj"), 2);
  EXPECT_LE(std::abs(adapter_loss(base, per_expert.path()) - loss) / loss, 1e-12);

  ModelConfig per_expert_config = config;
  per_expert_config.lora = std::make_shared<const LoraConfig>(written);
  Model<double> per_expert_model(per_expert_config);
  per_expert_model.load_weights(base_dir(base));
  per_expert_model.load_adapter(per_expert.path());
  per_expert_model.save_adapter(fused_again.path(), ExpertLayout::fused);
  const SafetensorsReader fused(fused_again.path() + "/adapter_model.safetensors");
  const std::string experts = "base_model.model.model.layers.1.mlp.experts.";
  EXPECT_EQ(fused.info(experts + "base_layer.lora_A.weight").shape, (std::vector<int64_t>{8 * 8, 32}));  // [E·2r, D]
  EXPECT_EQ(fused.info(experts + "lora_A.weight").shape, (std::vector<int64_t>{8 * 4, 16}));           // [E·r, I]
  const LoraConfig fused_config = LoraConfig::load(fused_again.path() + "/adapter_config.json");
  EXPECT_EQ(fused_config.rank_of("model.layers.1.mlp.experts.gate_up_proj"), 8);
  EXPECT_EQ(fused_config.alpha_of("model.layers.1.mlp.experts.gate_up_proj"), 16.0);  // PEFT's 2 r, 2 lora_alpha
  EXPECT_FALSE(fused_config.targets_module("model.layers.1.mlp.experts.5.up_proj"));
  EXPECT_LE(std::abs(adapter_loss(base, fused_again.path()) - loss) / loss, 1e-12);
}

// PEFT's fused fixture has gate_up_proj's pair at rank 8 = 2 r: per expert, gate's and up's pairs
// would be rank 8, which PEFT on transformers 5 fuses at 2 r = 8 and then cannot load; refused
// before anything is written.
TEST(AdapterLayout, AFusedPairAtAnotherRankThanRIsRefusedPerExpert) {
  const auto model = adapted_model<double>("tiny_qwen3_moe");
  const test::ScratchDir dir;
  const std::string error = error_message([&] { model->save_adapter(dir.path(), ExpertLayout::per_expert); });
  EXPECT_NE(error.find("rewritten for --expert-layout per-expert: fields \"rank_pattern\""), std::string::npos) << error;
  EXPECT_NE(error.find("PEFT fuses gate and up at rank 2 r"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/adapter_model.safetensors"));
}

// A run that adapts the experts of some MoE layers only names those exactly in either layout:
// 3 layers, experts in 1 and 2, layer 1's adapted; the written configs adapt nothing of layer 2.
TEST(AdapterLayout, ExpertsOfSomeLayersAreNamedExactly) {
  const std::string base = "tiny_qwen3_moe";
  const test::ScratchDir three_layers, per_expert, fused_again;
  nlohmann::json json = nlohmann::json::parse(std::ifstream(base_dir(base) + "/config.json"));
  json["num_hidden_layers"] = 3;
  std::ofstream(three_layers.path() + "/config.json") << json.dump();
  ModelConfig config = ModelConfig::load(three_layers.path() + "/config.json");
  config.lora = std::make_shared<const LoraConfig>(
      LoraConfig::from_flags(4, 8, "q_proj", "model.layers.1.mlp.experts.gate_up_proj,model.layers.1.mlp.experts.down_proj"));
  Model<double> model(config);
  model.init_weights(7);
  draw_adapter(model);
  const double loss = loss_on_fixture_tokens(model, base);
  const auto loss_read_back = [&](const std::string& dir) {
    ModelConfig written = config;
    written.lora = std::make_shared<const LoraConfig>(LoraConfig::load(dir + "/adapter_config.json"));
    Model<double> reader(written);
    copy_base(model, reader);
    reader.load_adapter(dir);
    EXPECT_FALSE(written.lora->targets_module("model.layers.2.mlp.experts.0.gate_proj"));
    EXPECT_FALSE(written.lora->targets_module("model.layers.2.mlp.experts.gate_proj"));
    EXPECT_FALSE(written.lora->targets_parameter("model.layers.2.mlp.experts.gate_up_proj"));
    return loss_on_fixture_tokens(reader, base);
  };
  model.save_adapter(per_expert.path(), ExpertLayout::per_expert);
  EXPECT_LE(std::abs(loss_read_back(per_expert.path()) - loss) / loss, 1e-12);
  ModelConfig per_expert_config = config;
  per_expert_config.lora = std::make_shared<const LoraConfig>(LoraConfig::load(per_expert.path() + "/adapter_config.json"));
  Model<double> per_expert_model(per_expert_config);
  copy_base(model, per_expert_model);
  per_expert_model.load_adapter(per_expert.path());
  per_expert_model.save_adapter(fused_again.path(), ExpertLayout::fused);
  EXPECT_LE(std::abs(loss_read_back(fused_again.path()) - loss) / loss, 1e-12);
}

// Per-expert pairs named by a pattern that matches the routed experts only are written fused with
// no target_modules left (a pattern matching nothing would be refused when read).
TEST(AdapterLayout, AnExpertsOnlyPatternWrittenFusedLeavesNoTargetModules) {
  const std::string base = "tiny_qwen3_moe";
  ModelConfig config = ModelConfig::load(base_dir(base) + "/config.json");
  const auto json = nlohmann::ordered_json::parse(
      R"json({"r": 4, "lora_alpha": 8, "target_modules": ".*\\.experts\\.(\\d+\\.)?(gate_proj|up_proj|down_proj)"})json");
  config.lora = std::make_shared<const LoraConfig>(LoraConfig::from_json(json, "experts_only.json"));
  Model<double> model(config);
  model.load_weights(base_dir(base));
  draw_adapter(model);
  const double loss = loss_on_fixture_tokens(model, base);
  const test::ScratchDir fused;
  model.save_adapter(fused.path(), ExpertLayout::fused);
  const LoraConfig written = LoraConfig::load(fused.path() + "/adapter_config.json");
  EXPECT_TRUE(written.target_modules.empty());
  EXPECT_EQ(written.target_parameters, (std::vector<std::string>{"gate_up_proj", "down_proj"}));
  EXPECT_LE(std::abs(adapter_loss(base, fused.path()) - loss) / loss, 1e-12);
}

// A layout that cannot hold the adapter is refused naming the pair it would lose: PEFT's per-expert
// fixture adapts layer 0's dense MLP by the names that PEFT on transformers 5 reads as the routed
// experts' target_parameters.
TEST(AdapterLayout, WhatTheOtherLayoutCannotHoldIsRefused) {
  const auto model = adapted_model<double>("tiny_qwen3_moe/lora_per_expert");
  const test::ScratchDir dir;
  const std::string error = error_message([&] { model->save_adapter(dir.path(), ExpertLayout::fused); });
  EXPECT_NE(error.find("--expert-layout fused: the adapter in that layout"), std::string::npos) << error;
  EXPECT_NE(error.find("would not hold model.layers.0.mlp.gate_proj.lora_A.weight"), std::string::npos) << error;
}

// An adapter file that does not fit: a missing tensor, a wrong rank, a tensor of another adapter.
TEST(LoraParityErrors, AFileThatDoesNotFitTheConfigIsRefusedNamingTheTensor) {
  const auto model = adapted_model<double>("tiny_qwen3");
  const SafetensorsReader peft(kFixtureRoot + "tiny_qwen3/lora/adapter_model.safetensors");
  const std::string dropped = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  const auto write_variant = [&](const test::ScratchDir& dir, const std::string& changed, bool drop, bool extra) {
    SafetensorsWriter writer;
    std::vector<std::vector<double>> values;
    values.reserve(peft.tensors().size() + 1);
    for (const auto& [key, info] : peft.tensors()) {
      std::vector<int64_t> shape = info.shape;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      values.emplace_back(n);
      peft.read(key, shape, values.back().data());
      if (key == changed && drop) continue;
      if (key == changed) shape[0] += 1, values.back().resize(n + n / (shape[0] - 1));
      writer.add(key, DType::F64, shape, values.back().data());
    }
    values.emplace_back(4, 0.0);
    if (extra) writer.add("base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight", DType::F64, {2, 2},
                          values.back().data());
    writer.write(dir.path() + "/adapter_model.safetensors");
  };
  const test::ScratchDir missing, misshaped, unknown;
  write_variant(missing, dropped, /*drop=*/true, /*extra=*/false);
  write_variant(misshaped, dropped, /*drop=*/false, /*extra=*/false);
  write_variant(unknown, "", /*drop=*/false, /*extra=*/true);
  std::vector<double> before(model->params(), model->params() + model->table().total_size());
  const std::string missing_error = error_message([&] { model->load_adapter(missing.path()); });
  EXPECT_NE(missing_error.find("adapter_model.safetensors: tensor " + dropped + " is missing (expected shape [4, 16]"),
            std::string::npos) << missing_error;
  const std::string shape_error = error_message([&] { model->load_adapter(misshaped.path()); });
  EXPECT_NE(shape_error.find(dropped + " has shape [5, 16], expected [4, 16]"), std::string::npos) << shape_error;
  const std::string unknown_error = error_message([&] { model->load_adapter(unknown.path()); });
  EXPECT_NE(unknown_error.find("x_proj.lora_A.weight is not a trainable tensor of this adapter"), std::string::npos)
      << unknown_error;
  EXPECT_EQ(before, std::vector<double>(model->params(), model->params() + model->table().total_size()))
      << "a refused adapter changed the parameters";
}

}  // namespace
}  // namespace trillion
