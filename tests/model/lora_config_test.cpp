// PEFT's LoraConfig (model/lora_config.h): the matching rules of target_modules in both forms,
// exclude_modules, target_parameters and modules_to_save; rank_pattern and alpha_pattern with
// PEFT's first-match-in-file-order rule; scaling with and without rsLoRA; a written config reads
// back as the same one; and every field the engine does not implement is refused by name.
#include "model/lora_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using Json = nlohmann::ordered_json;
using testing::error_message;

const std::string kSource = "adapter_config.json";

LoraConfig parse(const std::string& text) { return LoraConfig::from_json(Json::parse(text), kSource); }
std::string parse_error(const std::string& text) {
  return error_message([&] { parse(text); });
}

TEST(LoraConfig, ListTargetsMatchAWholeNameOrADottedSuffix) {
  const LoraConfig c = parse(R"({"target_modules": ["q_proj", "mlp.down_proj", "model.layers.1.self_attn.o_proj"]})");
  EXPECT_TRUE(c.targets_module("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(c.targets_module("q_proj"));
  EXPECT_TRUE(c.targets_module("model.layers.4.mlp.down_proj"));
  EXPECT_TRUE(c.targets_module("model.layers.1.self_attn.o_proj"));
  EXPECT_FALSE(c.targets_module("model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(c.targets_module("model.layers.0.self_attn.kv_q_proj"));  // a suffix, not a ".q_proj" one
  EXPECT_FALSE(c.targets_module("model.layers.0.mlp.shared_expert.down_proj.x"));
  // The shared expert's down_proj ends with ".mlp.down_proj"? No: ".shared_expert.down_proj".
  EXPECT_FALSE(c.targets_module("model.layers.0.mlp.shared_expert.down_proj"));
  EXPECT_EQ(c.r, 8);
  EXPECT_EQ(c.lora_alpha, 8.0);
  EXPECT_EQ(c.scaling_of("q_proj"), 1.0);
}

TEST(LoraConfig, StringTargetsAreARegexOverTheWholeName) {
  const LoraConfig c = parse(R"({"target_modules": ".*layers\\.[02]\\.(self_attn|mlp)\\.(q|up)_proj"})");
  EXPECT_TRUE(c.targets_module("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(c.targets_module("model.layers.2.mlp.up_proj"));
  EXPECT_FALSE(c.targets_module("model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(c.targets_module("model.layers.0.self_attn.q_proj.lora"));  // fullmatch, not search
  EXPECT_FALSE(c.targets_module("model.layers.12.self_attn.q_proj"));
}

TEST(LoraConfig, AllLinearIsEveryLinearLayerButTheOutputLayer) {
  const LoraConfig c = parse(R"({"target_modules": "All-Linear", "modules_to_save": ["mlp.shared_expert"]})");
  EXPECT_TRUE(c.targets_module("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(c.targets_module("model.layers.7.mlp.down_proj"));
  EXPECT_FALSE(c.targets_module("lm_head"));
  // A module to save and the modules inside it carry no adapter.
  EXPECT_FALSE(c.targets_module("model.layers.7.mlp.shared_expert.down_proj"));
  EXPECT_TRUE(c.targets_module("model.layers.7.mlp.shared_expert_gate"));
}

TEST(LoraConfig, ExcludedModulesNeverMatch) {
  const LoraConfig names = parse(R"({"target_modules": ["down_proj"], "exclude_modules": ["shared_expert.down_proj"]})");
  EXPECT_TRUE(names.targets_module("model.layers.1.mlp.experts.3.down_proj"));
  EXPECT_FALSE(names.targets_module("model.layers.1.mlp.shared_expert.down_proj"));
  const LoraConfig pattern = parse(R"({"target_modules": ["q_proj"], "exclude_modules": ".*layers\\.0\\..*"})");
  EXPECT_FALSE(pattern.targets_module("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(pattern.targets_module("model.layers.10.self_attn.q_proj"));
}

TEST(LoraConfig, TargetParametersAndModulesToSave) {
  const LoraConfig c = parse(R"({"target_parameters": ["mlp.experts.gate_up_proj", "down_proj"],
                                 "modules_to_save": ["lm_head", "embed_tokens"]})");
  EXPECT_TRUE(c.targets_parameter("model.layers.3.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(c.targets_parameter("model.layers.3.mlp.experts.down_proj"));
  EXPECT_FALSE(c.targets_parameter("model.layers.3.mlp.experts.gate_proj"));
  EXPECT_FALSE(c.targets_module("model.layers.3.mlp.down_proj"));  // target_modules is empty
  EXPECT_TRUE(c.saves_module("lm_head"));
  EXPECT_TRUE(c.saves_module("model.embed_tokens"));
  EXPECT_FALSE(c.saves_module("model.norm"));
  // A module inside a saved one trains too; names match by suffix, dotted or not (PEFT's endswith).
  const LoraConfig parents = parse(R"({"target_modules": ["q_proj"], "modules_to_save": ["layers.0.mlp", "head"]})");
  EXPECT_TRUE(parents.saves_module("model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(parents.saves_module("model.layers.0.mlp"));
  EXPECT_FALSE(parents.saves_module("model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(parents.saves_module("lm_head"));
  EXPECT_FALSE(parents.targets_module("model.layers.0.mlp.q_proj"));  // inside a saved module: no adapter
}

// get_pattern_key: the first key of each map, in file order, for which the name matches
// (.*\.)?(KEY)$; ranks and alphas are looked up apart.
TEST(LoraConfig, PatternsTakeTheFirstMatchingKeyInFileOrder) {
  const LoraConfig c = parse(R"({"target_modules": ["q_proj", "v_proj", "o_proj"], "r": 8, "lora_alpha": 16,
    "rank_pattern": {"layers\\.1\\.self_attn\\.q_proj": 4, "q_proj": 2},
    "alpha_pattern": {"v_proj": 3, "layers\\.1\\.self_attn\\.q_proj": 99}})");
  EXPECT_EQ(c.rank_of("model.layers.1.self_attn.q_proj"), 4);
  EXPECT_EQ(c.alpha_of("model.layers.1.self_attn.q_proj"), 99.0);
  EXPECT_EQ(c.rank_of("model.layers.0.self_attn.q_proj"), 2);
  EXPECT_EQ(c.alpha_of("model.layers.0.self_attn.q_proj"), 16.0);  // no alpha key matches
  EXPECT_EQ(c.rank_of("model.layers.0.self_attn.v_proj"), 8);
  EXPECT_EQ(c.alpha_of("model.layers.0.self_attn.v_proj"), 3.0);
  EXPECT_EQ(c.scaling_of("model.layers.0.self_attn.v_proj"), 3.0 / 8.0);
  EXPECT_EQ(c.rank_of("model.layers.0.self_attn.o_proj"), 8);
  EXPECT_EQ(c.scaling_of("model.layers.0.self_attn.o_proj"), 2.0);
  // The same keys in the other order: "q_proj" now comes first and wins for layer 1 too.
  const LoraConfig swapped = parse(R"({"target_modules": ["q_proj"],
    "rank_pattern": {"q_proj": 2, "layers\\.1\\.self_attn\\.q_proj": 4}})");
  EXPECT_EQ(swapped.rank_of("model.layers.1.self_attn.q_proj"), 2);
  // A key matches a dotted suffix only: "proj" is not the end of a dotted part of "q_proj".
  const LoraConfig partial = parse(R"({"target_modules": ["q_proj"], "rank_pattern": {"proj": 2}})");
  EXPECT_EQ(partial.rank_of("model.layers.0.self_attn.q_proj"), 8);
}

TEST(LoraConfig, RsLoraScalesByTheRootOfTheRank) {
  const LoraConfig c = parse(R"({"target_modules": ["q_proj"], "r": 16, "lora_alpha": 32, "use_rslora": true,
                                 "rank_pattern": {"q_proj": 4}})");
  EXPECT_DOUBLE_EQ(c.scaling_of("model.layers.0.self_attn.q_proj"), 32.0 / 2.0);
  EXPECT_DOUBLE_EQ(c.scaling_of("model.layers.0.self_attn.k_proj"), 32.0 / 4.0);
}

TEST(LoraConfig, AWrittenConfigReadsBackAsTheSameOne) {
  test::ScratchDir dir;
  const LoraConfig c = parse(R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "base",
    "r": 4, "lora_alpha": 12.5, "use_rslora": true, "lora_dropout": 0.05,
    "target_modules": "model\\.layers\\.\\d+\\.self_attn\\.(q|v)_proj", "exclude_modules": ["layers.0.self_attn.q_proj"],
    "target_parameters": ["experts.down_proj"], "rank_pattern": {"v_proj": 2, "q_proj": 6},
    "alpha_pattern": {"q_proj": 1.5}, "modules_to_save": ["lm_head"], "bias": "none", "use_dora": false,
    "init_lora_weights": true, "layers_to_transform": null, "loftq_config": {}, "inference_mode": false,
    "revision": null})");
  const std::string path = dir.path() + "/adapter_config.json";
  c.save(path);
  const LoraConfig back = LoraConfig::load(path);
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.to_json().dump(), c.to_json().dump());  // the patterns' order too
  EXPECT_EQ(back.r, 4);
  EXPECT_EQ(back.lora_alpha, 12.5);
  EXPECT_TRUE(back.use_rslora);
  EXPECT_EQ(back.lora_dropout, 0.05);
  EXPECT_EQ(back.task_type, "CAUSAL_LM");
  EXPECT_EQ(back.base_model_name_or_path, "base");
  EXPECT_TRUE(back.targets_module("model.layers.3.self_attn.v_proj"));
  EXPECT_FALSE(back.targets_module("model.layers.0.self_attn.q_proj"));
  EXPECT_EQ(back.rank_of("model.layers.3.self_attn.q_proj"), 6);
  EXPECT_EQ(back.alpha_of("model.layers.3.self_attn.q_proj"), 1.5);
  EXPECT_TRUE(back.targets_parameter("model.layers.1.mlp.experts.down_proj"));
  EXPECT_TRUE(back.saves_module("lm_head"));
}

TEST(LoraConfig, WhatTheEngineDoesNotDoIsRefusedByName) {
  const std::string targets = R"("target_modules": ["q_proj"])";
  const auto refused = [&](const std::string& field) { return parse_error("{" + targets + ", " + field + "}"); };
  EXPECT_EQ(refused(R"("bias": "all")"), "adapter_config.json: field \"bias\": got \"all\"; expected \"none\" (the "
                                         "engine does not implement trained biases)");
  EXPECT_NE(refused(R"("use_dora": true)").find("field \"use_dora\": got true; expected false"), std::string::npos);
  EXPECT_NE(refused(R"("init_lora_weights": "pissa")").find("field \"init_lora_weights\""), std::string::npos);
  EXPECT_NE(refused(R"("init_lora_weights": false)").find("field \"init_lora_weights\""), std::string::npos);
  EXPECT_NE(refused(R"("fan_in_fan_out": true)").find("field \"fan_in_fan_out\""), std::string::npos);
  EXPECT_NE(refused(R"("layers_to_transform": [0, 1])").find("field \"layers_to_transform\""), std::string::npos);
  EXPECT_NE(refused(R"("loftq_config": {"loftq_bits": 4})").find("field \"loftq_config\""), std::string::npos);
  EXPECT_NE(refused(R"("trainable_token_indices": [3])").find("field \"trainable_token_indices\""), std::string::npos);
  EXPECT_NE(parse_error(R"({"peft_type": "IA3", "target_modules": ["q_proj"]})").find("field \"peft_type\""),
            std::string::npos);
  // Bad values of fields it does read.
  EXPECT_NE(refused(R"("r": 0)").find("field \"r\": got 0; expected a positive integer"), std::string::npos);
  EXPECT_NE(refused(R"("lora_dropout": 1.0)").find("field \"lora_dropout\""), std::string::npos);
  EXPECT_NE(refused(R"("rank_pattern": {"q_proj": -1})").find("field \"rank_pattern\": key \"q_proj\""),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"target_modules": "(q_proj"})").find("field \"target_modules\": pattern does not compile"),
            std::string::npos);
  EXPECT_NE(refused(R"("modules_to_save": ["lm_head", "l[m"])").find("field \"modules_to_save\"[1]: pattern does not "
                                                                    "compile"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"target_modules": [3]})").find("field \"target_modules\"[0]: got 3; expected a string"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"r": 4})").find("field \"target_modules\": and target_parameters are both empty"),
            std::string::npos);
  EXPECT_NE(parse_error(R"([1])").find("adapter config is array; expected a JSON object"), std::string::npos);
  // The values that mean "not used" are accepted.
  EXPECT_NO_THROW(parse("{" + targets + R"(, "bias": "none", "use_dora": false, "loftq_config": {},
                        "layers_to_transform": null, "layers_pattern": [], "megatron_config": null})"));
}

}  // namespace
}  // namespace trillion
