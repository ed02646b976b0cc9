// ModelConfig: valid Qwen3 and Qwen3-Next configs, defaults, the full_attention_interval rule,
// aliases, the JSON round trip, the committed configs/models/*.json, and one test per error that
// checks the message names the source, the field and what was expected.
#include "model/config.h"

#include <gtest/gtest.h>

#include "io/test_files.h"

namespace trillion {
namespace {

using testing::error_message;
using testing::ScratchDir;
using testing::write_bytes;

const std::string kConfigDir = std::string(TRILLION_SOURCE_DIR) + "/configs/models/";
constexpr const char* kSource = "configs/x.json";

// A minimal valid dense Qwen3 config; tests edit it.
nlohmann::json base_config() {
  return {{"model_type", "qwen3"},       {"vocab_size", 100},      {"hidden_size", 32},
          {"num_hidden_layers", 3},      {"num_attention_heads", 4}, {"intermediate_size", 48}};
}

std::string config_error(const nlohmann::json& json) {
  return error_message([&] { ModelConfig::from_json(json, kSource); });
}

TEST(ModelConfig, Qwen3DefaultsAndDerivedFields) {
  const ModelConfig config = ModelConfig::from_json(base_config(), kSource);
  EXPECT_EQ(config.model_type, "qwen3");
  EXPECT_EQ(config.vocab_size, 100);
  EXPECT_EQ(config.head_dim, 8);              // hidden_size / num_attention_heads
  EXPECT_EQ(config.num_key_value_heads, 4);   // num_attention_heads
  EXPECT_EQ(config.max_position_embeddings, 4096);
  EXPECT_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_EQ(config.rope_theta, 10000.0);
  EXPECT_EQ(config.rotary_dim(), 8);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_FALSE(config.zero_centred_norms());
  EXPECT_FALSE(config.gated_attention());
  EXPECT_EQ(config.layer_types, std::vector<LayerType>(3, LayerType::full_attention));
  EXPECT_EQ(config.num_experts, 0);
}

TEST(ModelConfig, Qwen3NextWithFullAttentionInterval) {
  nlohmann::json json = base_config();
  json["model_type"] = "qwen3_next";
  json["num_hidden_layers"] = 8;
  json["full_attention_interval"] = 4;
  json["head_dim"] = 16;
  json["partial_rotary_factor"] = 0.25;
  json["num_key_value_heads"] = 2;
  json["linear_num_key_heads"] = 2;
  json["linear_num_value_heads"] = 4;
  json["linear_key_head_dim"] = 8;
  json["linear_value_head_dim"] = 8;
  json["num_experts"] = 8;
  json["num_experts_per_tok"] = 2;
  json["moe_intermediate_size"] = 16;
  json["shared_expert_intermediate_size"] = 24;
  json.erase("intermediate_size");  // not required for an MoE model
  json["architectures"] = {"Qwen3NextForCausalLM"};  // unknown fields are ignored
  json["sliding_window"] = nullptr;
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  const LayerType L = LayerType::linear_attention, F = LayerType::full_attention;
  EXPECT_EQ(config.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
  EXPECT_EQ(config.rotary_dim(), 4);
  EXPECT_TRUE(config.zero_centred_norms());
  EXPECT_TRUE(config.gated_attention());
  EXPECT_EQ(config.num_experts, 8);
  EXPECT_EQ(config.intermediate_size, 0);
  EXPECT_EQ(config.linear_conv_kernel_dim, 4);
  EXPECT_EQ(config.shared_expert_intermediate_size, 24);
}

TEST(ModelConfig, ExplicitLayerTypesAndDeepSeekAliases) {
  nlohmann::json json = base_config();
  json["model_type"] = "deepseek_v32";
  json["layer_types"] = {"sparse_attention", "full_attention", "sparse_attention"};
  json["index_n_heads"] = 4;
  json["index_head_dim"] = 16;
  json["index_topk"] = 64;
  json["n_routed_experts"] = 16;
  json["num_experts_per_tok"] = 4;
  json["moe_intermediate_size"] = 8;
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.layer_types[0], LayerType::sparse_attention);
  EXPECT_EQ(config.layer_types[1], LayerType::full_attention);
  EXPECT_EQ(config.num_experts, 16);
  EXPECT_EQ(config.index_topk, 64);
  EXPECT_EQ(config.intermediate_size, 48);
}

TEST(ModelConfig, JsonRoundTrip) {
  nlohmann::json json = base_config();
  json["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  for (const char* name : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                           "linear_value_head_dim"})
    json[name] = 4;
  json["tie_word_embeddings"] = true;
  json["rope_theta"] = 1e6;
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  const nlohmann::json written = config.to_json();
  EXPECT_EQ(written["layer_types"][1], "linear_attention");
  EXPECT_EQ(ModelConfig::from_json(written, "round trip").to_json(), written);
  EXPECT_EQ(written["rope_theta"], 1e6);
  EXPECT_EQ(written["tie_word_embeddings"], true);
}

TEST(ModelConfig, CommittedConfigsLoad) {
  const ModelConfig tiny = ModelConfig::load(kConfigDir + "tiny.json");
  EXPECT_EQ(tiny.model_type, "qwen3");
  EXPECT_EQ(tiny.vocab_size, 64);
  EXPECT_EQ(tiny.hidden_size, 16);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.head_dim, 4);
  EXPECT_EQ(tiny.intermediate_size, 24);

  const ModelConfig next = ModelConfig::load(kConfigDir + "tiny_qwen3_next.json");
  EXPECT_EQ(next.model_type, "qwen3_next");
  EXPECT_EQ(next.layer_types, std::vector<LayerType>(next.num_hidden_layers, LayerType::full_attention));
  EXPECT_EQ(next.partial_rotary_factor, 0.5);
  EXPECT_EQ(next.rotary_dim(), next.head_dim / 2);

  const ModelConfig demo = ModelConfig::load(kConfigDir + "demo.json");
  EXPECT_EQ(demo.vocab_size, 8192);
  EXPECT_EQ(demo.hidden_size, 256);
  EXPECT_EQ(demo.num_hidden_layers, 4);
  EXPECT_EQ(demo.num_attention_heads, 4);
  EXPECT_EQ(demo.num_key_value_heads, 2);
  EXPECT_EQ(demo.head_dim, 64);
  EXPECT_EQ(demo.intermediate_size, 768);
  EXPECT_TRUE(demo.tie_word_embeddings);
  EXPECT_EQ(demo.rope_theta, 10000.0);
  EXPECT_EQ(demo.max_position_embeddings, 1024);
}

TEST(ModelConfig, UnknownLayerTypeNamesIndexAndAllowedValues) {
  nlohmann::json json = base_config();
  json["layer_types"] = {"full_attention", "linear_attention", "mamba"};
  EXPECT_EQ(config_error(json),
            "configs/x.json: field \"layer_types\"[2]: unknown layer type \"mamba\"; expected one of "
            "full_attention, linear_attention, sparse_attention");
  json["layer_types"] = {"full_attention", 7, "full_attention"};
  EXPECT_NE(config_error(json).find("field \"layer_types\"[1]: unknown layer type 7"), std::string::npos);
  json["layer_types"] = {"full_attention"};
  EXPECT_EQ(config_error(json),
            "configs/x.json: field \"layer_types\": has 1 entries; expected 3 (num_hidden_layers)");
  json["layer_types"] = "full_attention";
  EXPECT_NE(config_error(json).find("field \"layer_types\": got \"full_attention\"; expected an array of strings"),
            std::string::npos);
}

TEST(ModelConfig, MissingRequiredFields) {
  for (const char* name : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"}) {
    nlohmann::json json = base_config();
    json.erase(name);
    EXPECT_EQ(config_error(json), str_cat("configs/x.json: field \"", name, "\": missing; expected a positive integer"));
  }
}

TEST(ModelConfig, WrongJsonTypes) {
  nlohmann::json json = base_config();
  json["hidden_size"] = "32";
  EXPECT_EQ(config_error(json), "configs/x.json: field \"hidden_size\": got \"32\"; expected an integer");
  json = base_config();
  json["num_attention_heads"] = 4.5;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"num_attention_heads\": got 4.5; expected an integer");
  json = base_config();
  json["tie_word_embeddings"] = 1;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"tie_word_embeddings\": got 1; expected true or false");
  json = base_config();
  json["rope_theta"] = "1e4";
  EXPECT_EQ(config_error(json), "configs/x.json: field \"rope_theta\": got \"1e4\"; expected a number");
  json = base_config();
  json["model_type"] = 3;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"model_type\": got 3; expected a string");
  EXPECT_EQ(config_error(nlohmann::json::array()), "configs/x.json: config is array; expected a JSON object");
}

TEST(ModelConfig, OutOfRangeValues) {
  nlohmann::json json = base_config();
  json["vocab_size"] = 0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"vocab_size\": got 0; expected a positive integer");
  json = base_config();
  json["head_dim"] = -8;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"head_dim\": got -8; expected a positive integer");
  json = base_config();
  json["rms_norm_eps"] = 0.0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"rms_norm_eps\": got 0; expected a positive number");
  json = base_config();
  json["partial_rotary_factor"] = 1.5;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"partial_rotary_factor\": got 1.5; expected a value in (0, 1]");
  json = base_config();
  json["partial_rotary_factor"] = 0.125;  // 0.125 · 8 = 1: odd
  EXPECT_NE(config_error(json).find("field \"partial_rotary_factor\": gives rotary dimension 1 of head_dim 8"),
            std::string::npos);
  json = base_config();
  json["full_attention_interval"] = 0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"full_attention_interval\": got 0; expected a positive integer");
  json = base_config();
  json["attention_bias"] = true;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"attention_bias\": true is not supported; expected false");
}

TEST(ModelConfig, HeadCountsMustDivide) {
  nlohmann::json json = base_config();
  json["num_key_value_heads"] = 3;
  EXPECT_EQ(config_error(json),
            "configs/x.json: field \"num_key_value_heads\": got 3; expected a divisor of num_attention_heads = 4");
  json = base_config();
  json["num_attention_heads"] = 5;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"head_dim\": missing and hidden_size 32 is not divisible by "
                                "num_attention_heads 5; expected head_dim to be given");
  json["head_dim"] = 8;
  EXPECT_EQ(ModelConfig::from_json(json, kSource).head_dim, 8);
}

TEST(ModelConfig, UnknownModelType) {
  nlohmann::json json = base_config();
  json["model_type"] = "llama";
  EXPECT_EQ(config_error(json), "configs/x.json: field \"model_type\": unknown model type \"llama\"; expected one of "
                                "qwen3, qwen3_next, qwen3_moe, deepseek_v32, kimi");
}

TEST(ModelConfig, LayerKindsAndExpertsNeedTheirFields) {
  nlohmann::json json = base_config();
  json["full_attention_interval"] = 2;  // layers 0 and 2 are linear_attention
  EXPECT_EQ(config_error(json), "configs/x.json: field \"linear_num_key_heads\": expected a positive integer "
                                "(the config has linear_attention layers)");
  json = base_config();
  json["layer_types"] = {"sparse_attention", "full_attention", "full_attention"};
  EXPECT_NE(config_error(json).find("field \"index_n_heads\": expected a positive integer"), std::string::npos);
  json = base_config();
  json["num_experts"] = 4;
  json["num_experts_per_tok"] = 5;
  json["moe_intermediate_size"] = 8;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"num_experts_per_tok\": got 5; expected 1 to num_experts = 4");
  json["num_experts_per_tok"] = 2;
  json["n_routed_experts"] = 8;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"n_routed_experts\": got 8; expected it to equal num_experts = 4");
  json.erase("n_routed_experts");
  json.erase("moe_intermediate_size");
  EXPECT_NE(config_error(json).find("field \"moe_intermediate_size\": expected a positive integer"), std::string::npos);
}

TEST(ModelConfig, LoadNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir.file("config.json");
  write_bytes(path, "{\"vocab_size\": 10,");
  EXPECT_EQ(error_message([&] { ModelConfig::load(path); }).rfind(path + ": not valid JSON", 0), 0u);
  nlohmann::json json = base_config();
  json["layer_types"] = {"full_attention", "full_attention", "mamba"};
  write_bytes(path, json.dump());
  EXPECT_EQ(error_message([&] { ModelConfig::load(path); }).rfind(path + ": field \"layer_types\"[2]", 0), 0u);
  EXPECT_EQ(error_message([&] { ModelConfig::load(dir.file("absent.json")); })
                .rfind(dir.file("absent.json") + ": cannot open for reading", 0),
            0u);
}

}  // namespace
}  // namespace trillion
