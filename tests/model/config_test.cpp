// ModelConfig: valid Qwen3 and Qwen3-Next configs, defaults, the full_attention_interval rule,
// aliases, the JSON round trip, the committed configs/models/*.json, and one test per error that
// checks the message names the source, the field and what was expected.
#include "model/config.h"
#include "model/family.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;
using test::ScratchDir;
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
  EXPECT_FALSE(family_of(config.model_type).zero_centred_norms);
  EXPECT_FALSE(family_of(config.model_type).gated_attention);
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
  EXPECT_TRUE(family_of(config.model_type).zero_centred_norms);
  EXPECT_TRUE(family_of(config.model_type).gated_attention);
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
  EXPECT_EQ(written["rope_parameters"]["rope_theta"], 1e6);
  EXPECT_EQ(written["tie_word_embeddings"], true);
}

// Every committed config, and the fuzzer's find (a kimi_linear config without KDA layers), reads
// back exactly what it writes: a checkpoint's config.json is this JSON, so a family whose written
// form did not read back could not be resumed (Kimi-Linear's could not, until it was written in
// its own linear_attn_config form).
TEST(ModelConfig, EveryCommittedConfigRoundTripsExactly) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigDir)) paths.push_back(entry.path().string());
  ASSERT_GE(paths.size(), 20u);
  nlohmann::json no_kda = nlohmann::json::parse(read_file(kConfigDir + "tiny_kimi_linear.json"));
  no_kda.erase("layer_types");
  for (const ModelConfig& config : [&] {
         std::vector<ModelConfig> configs;
         for (const std::string& path : paths) configs.push_back(ModelConfig::load(path));
         configs.push_back(ModelConfig::from_json(no_kda, "tiny_kimi_linear.json without layer_types"));
         return configs;
       }()) {
    const nlohmann::json written = config.to_json();
    EXPECT_EQ(ModelConfig::from_json(written, config.source + " (written)").to_json(), written) << config.source;
  }
  const nlohmann::json kimi = ModelConfig::load(kConfigDir + "tiny_kimi_linear.json").to_json();
  EXPECT_TRUE(kimi.contains("linear_attn_config")) << kimi.dump();
  EXPECT_FALSE(kimi.contains("linear_num_key_heads")) << kimi.dump();
}

// Kimi-Linear's linear_attn_config lists the KDA and the softmax layers; layer_types, when given
// too, names which softmax layers are sparse (the seed's hybrid) and must agree on the others.
TEST(ModelConfig, KimiLinearAttnConfigAndLayerTypesMustAgree) {
  nlohmann::json json = nlohmann::json::parse(read_file(kConfigDir + "tiny_kimi_k3_like.json"));
  json["linear_attn_config"] = {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}};
  EXPECT_EQ(ModelConfig::from_json(json, kSource).layer_types[3], LayerType::sparse_attention);
  json["linear_attn_config"] = {{"kda_layers", {1, 2, 4}}, {"full_attn_layers", {3}}};
  EXPECT_EQ(config_error(json), "configs/x.json: linear_attn_config: field \"full_attn_layers\": has layer 3, which "
                                "layer_types names linear_attention; expected the two to agree");
  json.erase("layer_types");  // without it the block alone sets the layers (softmax ones dense)
  EXPECT_EQ(ModelConfig::from_json(json, kSource).layer_types[2], LayerType::full_attention);
}

// Reading what to_json wrote gives the same ModelConfig, member by member: for every family's
// defaults (a minimal config of each model_type) and every committed config.
TEST(ModelConfig, WrittenConfigReadsBackAsTheSameConfig) {
  std::vector<ModelConfig> configs;
  for (const std::string& type : model_types()) {
    nlohmann::json json = base_config();
    json["model_type"] = type;
    json["index_n_heads"] = 2;  // deepseek_v32's layers are sparse unless layer_types says otherwise
    json["index_head_dim"] = 8;
    configs.push_back(ModelConfig::from_json(json, str_cat(type, " with its family's defaults")));
  }
  ASSERT_EQ(configs.size(), 7u);
  for (const auto& entry : std::filesystem::directory_iterator(kConfigDir))
    configs.push_back(ModelConfig::load(entry.path().string()));
  for (const ModelConfig& config : configs) {
    ModelConfig read_back = ModelConfig::from_json(config.to_json(), config.source);
    read_back.unread_fields = config.unread_fields;  // what the file had besides the model
    EXPECT_TRUE(read_back == config) << config.source << ": wrote " << config.to_json().dump() << ", read back "
                                     << read_back.to_json().dump();
  }
  // The check can fail: a member the writer left out reads back as its default.
  ModelConfig changed = configs.back();
  changed.initializer_range *= 2.0;
  EXPECT_FALSE(changed == configs.back());
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
  json["full_attention_interval"] = 0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"full_attention_interval\": got 0; expected a positive integer");
}

// Absurd sizes are refused with the field named, at once (no million-layer table is built).
TEST(ModelConfig, AbsurdSizesAreRefusedByField) {
  nlohmann::json json = base_config();
  json["num_hidden_layers"] = 100000000;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"num_hidden_layers\": got 100000000; expected at most 16384");
  json = base_config();
  json["hidden_size"] = int64_t(1) << 40;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"hidden_size\": got 1099511627776; expected at most 2147483647");
  json = base_config();
  json["intermediate_size"] = uint64_t(1) << 63;
  EXPECT_EQ(config_error(json),
            "configs/x.json: field \"intermediate_size\": got 9223372036854775808; expected at most 2147483647");
}

TEST(ModelConfig, HeadCountsMustDivide) {
  nlohmann::json json = base_config();
  json["num_key_value_heads"] = 3;
  EXPECT_EQ(config_error(json),
            "configs/x.json: field \"num_key_value_heads\": got 3; expected a divisor of num_attention_heads = 4");
  json = base_config();
  json["num_attention_heads"] = 5;  // transformers' default: hidden_size // heads, rounded down
  EXPECT_EQ(ModelConfig::from_json(json, kSource).head_dim, 6);
  json["head_dim"] = 8;
  EXPECT_EQ(ModelConfig::from_json(json, kSource).head_dim, 8);
  json["num_attention_heads"] = 64;
  json.erase("head_dim");
  EXPECT_EQ(config_error(json), "configs/x.json: field \"head_dim\": missing and hidden_size 32 < "
                                "num_attention_heads 64; expected head_dim to be given");
}

// transformers 5.x writes RoPE settings into `rope_parameters` (no top-level rope_theta): they are
// read, agree with the older top-level fields when both are given, and only the default RoPE builds.
TEST(ModelConfig, RopeParametersAsTransformers5WritesThem) {
  nlohmann::json json = base_config();
  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}, {"partial_rotary_factor", 0.5}};
  ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.rope_theta, 5000.0);
  EXPECT_EQ(config.rotary_dim(), 4);
  EXPECT_TRUE(config.unread_fields.empty());
  json["rope_theta"] = 5000.0;  // the same value twice is fine
  EXPECT_EQ(ModelConfig::from_json(json, kSource).rope_theta, 5000.0);
  json["rope_theta"] = 10000.0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"rope_theta\": got 10000 but rope_parameters.rope_theta = "
                                "5000; expected one value (or only one of them)");
  json.erase("rope_theta");
  json["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};  // two dicts disagreeing
  EXPECT_EQ(config_error(json), "configs/x.json: field \"rope_scaling.rope_theta\": got 20000 but "
                                "rope_parameters.rope_theta = 5000; expected one value (or only one of them)");
  json.erase("rope_scaling");
  json["rope_parameters"]["factor"] = 4.0;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"rope_parameters\": has \"factor\", which rope_type \"default\" "
                                "does not take; expected only rope_type, rope_theta, partial_rotary_factor");
  // Family defaults when absent: qwen3_next rotates a quarter of each head, glm4_moe half.
  json = base_config();
  json["model_type"] = "qwen3_next";
  json["head_dim"] = 16;
  EXPECT_EQ(ModelConfig::from_json(json, kSource).rotary_dim(), 4);
  json["model_type"] = "glm4_moe";
  EXPECT_EQ(ModelConfig::from_json(json, kSource).rotary_dim(), 8);
}

// Each family's MoE placement rule and attribute-map names; fields not read are listed.
TEST(ModelConfig, MoePlacementRulesAliasesAndUnreadFields) {
  nlohmann::json json = base_config();
  json["model_type"] = "qwen3_moe";
  json["num_hidden_layers"] = 4;
  json["num_local_experts"] = 8;  // transformers' name for num_experts in qwen3_moe config files
  json["num_experts_per_tok"] = 2;
  json["moe_intermediate_size"] = 16;
  json["decoder_sparse_step"] = 2;
  json["mlp_only_layers"] = {3};
  json["some_future_field"] = 1;
  ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.num_experts, 8);
  EXPECT_FALSE(config.norm_topk_prob);  // qwen3_moe's default
  EXPECT_EQ(config.mlp_layer_types, (std::vector<FfnType>{FfnType::dense, FfnType::sparse, FfnType::dense,
                                                           FfnType::dense}));
  EXPECT_EQ(config.unread_fields, std::vector<std::string>{"some_future_field"});

  json = base_config();
  json["model_type"] = "glm4_moe";
  json["n_routed_experts"] = 8;
  json["num_experts_per_tok"] = 2;
  json["moe_intermediate_size"] = 16;
  json["first_k_dense_replace"] = 2;
  json["num_expert_group"] = 4;  // Kimi's name for n_group
  json["topk_group"] = 2;
  json["moe_renormalize"] = false;  // Kimi's name for norm_topk_prob
  config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.mlp_layer_types, (std::vector<FfnType>{FfnType::dense, FfnType::dense, FfnType::sparse}));
  EXPECT_EQ(config.n_group, 4);
  EXPECT_FALSE(config.norm_topk_prob);
  json["n_group"] = 2;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"num_expert_group\": got 4; expected it to equal n_group = 2");
  json.erase("n_group");
  json["topk_group"] = 5;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"topk_group\": got 5; expected at most 4 groups holding at "
                                "least num_experts_per_tok = 2 experts");
  json["topk_group"] = 2;
  json["mlp_layer_types"] = {"dense", "sparse", "sparse"};
  json["num_experts_per_token"] = 2;  // Kimi's name, agreeing
  EXPECT_EQ(ModelConfig::from_json(json, kSource).mlp_layer_types[1], FfnType::sparse);
  json["mlp_layer_types"] = {"dense", "moe", "sparse"};
  EXPECT_EQ(config_error(json), "configs/x.json: field \"mlp_layer_types\"[1]: got \"moe\"; expected \"dense\" or "
                                "\"sparse\"");
}

// Kimi-Linear's checkpoint form: linear_attn_config's 1-indexed layer lists set layer_types, its
// head count and dim the delta-attention sizes; model_max_length is max_position_embeddings.
TEST(ModelConfig, KimiLinearAttnConfigAndAttributeNames) {
  nlohmann::json json = base_config();
  json["model_type"] = "kimi_linear";
  json["num_hidden_layers"] = 4;
  json["model_max_length"] = 512;
  json["num_experts"] = 8;  // Kimi's stored name for num_local_experts
  json["num_experts_per_token"] = 2;
  json["moe_intermediate_size"] = 16;
  json["linear_attn_config"] = {{"full_attn_layers", {2, 4}}, {"kda_layers", {1, 3}}, {"head_dim", 8},
                                {"num_heads", 2}, {"short_conv_kernel_size", 4}, {"future", 1}};
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.layer_types, (std::vector<LayerType>{LayerType::linear_attention, LayerType::full_attention,
                                                         LayerType::linear_attention, LayerType::full_attention}));
  EXPECT_EQ(config.linear_num_value_heads, 2);
  EXPECT_EQ(config.linear_key_head_dim, 8);
  EXPECT_EQ(config.max_position_embeddings, 512);
  EXPECT_EQ(config.num_experts_per_tok, 2);
  EXPECT_EQ(config.unread_fields, std::vector<std::string>{"linear_attn_config.future"});
  json["linear_attn_config"]["kda_layers"] = {1, 2, 3};
  EXPECT_EQ(config_error(json), "configs/x.json: linear_attn_config: field \"kda_layers\": layer 2 is named 2 times in "
                                "full_attn_layers and kda_layers; expected each layer exactly once");
}

// Fields a config leaves out take transformers' Config defaults of the family (not 0: that would
// be a silently different model); what the engine writes uses the family's own field names, so it
// reads back (and loads in transformers) as the same model.
TEST(ModelConfig, MoeFamilyDefaultsAndFamilyFieldNamesOnWrite) {
  nlohmann::json json = base_config();
  json["model_type"] = "qwen3_moe";
  ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.num_experts, 128);
  EXPECT_EQ(config.num_experts_per_tok, 8);
  EXPECT_EQ(config.moe_intermediate_size, 768);
  EXPECT_EQ(config.router_aux_loss_coef, 0.001);
  nlohmann::json written = config.to_json();
  EXPECT_EQ(written.at("num_local_experts"), 128);
  EXPECT_EQ(written.at("mlp_only_layers"), nlohmann::json::array());
  EXPECT_FALSE(written.contains("num_experts"));
  EXPECT_EQ(ModelConfig::from_json(written, "round trip").to_json(), written);

  json = base_config();
  json["model_type"] = "glm4_moe";
  config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.num_experts, 128);
  EXPECT_EQ(config.n_shared_experts, 1);
  EXPECT_EQ(config.mlp_layer_types[0], FfnType::dense);
  written = config.to_json();
  EXPECT_EQ(written.at("n_routed_experts"), 128);
  EXPECT_EQ(written.at("first_k_dense_replace"), 1);
  EXPECT_EQ(ModelConfig::from_json(written, "round trip").to_json(), written);

  // transformers' Qwen aux loss takes P as probabilities: not a sigmoid router's scores.
  json["output_router_logits"] = true;
  json["router_aux_loss_coef"] = 0.01;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"router_aux_loss_type\": \"pooled\" with a sigmoid router "
                                "(glm4_moe): not built; expected \"sequence\" (or router_aux_loss_coef 0)");
  json["router_aux_loss_type"] = "sequence";
  EXPECT_EQ(ModelConfig::from_json(json, kSource).router_aux_loss_type, AuxLossType::sequence);
}

// DeepSeek's MLA fields, q_lora_rank null (one q_proj), YaRN from rope_parameters with the numbers
// transformers derives (docs/architecture.md, "Float32 traps of transformers": factor 4,
// mscale = mscale_all_dim = 1 on qk_head_dim 12 gives the softmax scale 0.374260670390 and a cos/sin
// factor 1), and the round trip.
TEST(ModelConfig, MlaFieldsAndYarn) {
  nlohmann::json json = {{"model_type", "deepseek_v3"}, {"vocab_size", 100}, {"hidden_size", 32},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"intermediate_size", 48},
                         {"q_lora_rank", nullptr}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8},
                         {"qk_rope_head_dim", 4}, {"v_head_dim", 8}, {"qk_head_dim", 12}, {"rope_interleave", false},
                         {"max_position_embeddings", 64}, {"first_k_dense_replace", 2}};
  json["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0},
                             {"original_max_position_embeddings", 16}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.q_lora_rank, 0);
  EXPECT_EQ(config.qk_head_dim(), 12);
  EXPECT_FALSE(config.rope_interleave);
  EXPECT_NEAR(std::pow(12.0, -0.5) * config.yarn_softmax_factor(), 0.374260670390, 1e-12);
  const RopeSpec rope = config.rope_spec(4, false);
  EXPECT_EQ(rope.attention_factor, 1.0);
  EXPECT_EQ(rope.yarn.factor, 4.0);
  EXPECT_EQ(rope.yarn.original_max_positions, 16.0);
  EXPECT_NEAR(rope_inv_freq(rope)[1], 0.0025, 1e-15);  // transformers' float64 inv_freq [1, 0.0025]
  const ModelConfig again = ModelConfig::from_json(config.to_json(), kSource);
  EXPECT_EQ(again.to_json(), config.to_json());
  EXPECT_TRUE(again.to_json()["q_lora_rank"].is_null());
  // Absent MLA fields take DeepseekV3Config's defaults; mscale ≠ mscale_all_dim changes the cos/sin factor.
  json.erase("q_lora_rank");
  json.erase("qk_head_dim");
  json["rope_parameters"]["mscale"] = 0.5;
  const ModelConfig defaults = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(defaults.q_lora_rank, 1536);
  EXPECT_NEAR(defaults.rope_spec(4, true).attention_factor, (0.05 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1),
              1e-15);
  json["qk_head_dim"] = 10;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"qk_head_dim\": got 10; expected qk_nope_head_dim + "
                                "qk_rope_head_dim = 12");
  json.erase("qk_head_dim");
  json["num_key_value_heads"] = 2;
  EXPECT_EQ(config_error(json), "configs/x.json: field \"num_key_value_heads\": got 2; expected num_attention_heads "
                                "= 4 (multi-head latent attention)");
  json.erase("num_key_value_heads");
  json["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(config_error(json), "configs/x.json: rope_parameters: field \"original_max_position_embeddings\": "
                                "missing; expected a positive number (rope_type \"yarn\")");
}

// deepseek_v32 names its sparse layers indexed_attention, and every layer is one when layer_types is absent.
TEST(ModelConfig, DeepseekV32IndexedAttentionLayers) {
  nlohmann::json json = {{"model_type", "deepseek_v32"}, {"vocab_size", 100}, {"hidden_size", 32},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"intermediate_size", 48},
                         {"index_n_heads", 2}, {"index_head_dim", 8}, {"index_topk", 4}};
  const ModelConfig config = ModelConfig::from_json(json, kSource);
  EXPECT_EQ(config.layer_types, std::vector<LayerType>(2, LayerType::sparse_attention));
  EXPECT_TRUE(config.rope_interleave);
  EXPECT_EQ(config.to_json()["layer_types"][0], "indexed_attention");
  EXPECT_FALSE(config.to_json().contains("rope_interleave"));  // always interleaved: not a v32 field
  json["rope_interleave"] = false;  // ignored, as transformers ignores it, and read (no unread warning)
  EXPECT_TRUE(ModelConfig::from_json(json, kSource).rope_interleave);
  EXPECT_TRUE(ModelConfig::from_json(json, kSource).unread_fields.empty());
  json.erase("rope_interleave");
  json["layer_types"] = {"indexed_attention", "sparse_attention"};
  EXPECT_EQ(ModelConfig::from_json(json, kSource).layer_types, config.layer_types);
}

TEST(ModelConfig, UnknownModelType) {
  nlohmann::json json = base_config();
  json["model_type"] = "llama";
  EXPECT_EQ(config_error(json), "configs/x.json: field \"model_type\": unknown model type \"llama\"; expected one of "
                                "qwen3, qwen3_moe, qwen3_next, glm4_moe, deepseek_v3, deepseek_v32, kimi_linear");
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
  const std::string path = dir.path("config.json");
  write_bytes(path, "{\"vocab_size\": 10,");
  EXPECT_EQ(error_message([&] { ModelConfig::load(path); }).rfind(path + ": not valid JSON", 0), 0u);
  nlohmann::json json = base_config();
  json["layer_types"] = {"full_attention", "full_attention", "mamba"};
  write_bytes(path, json.dump());
  EXPECT_EQ(error_message([&] { ModelConfig::load(path); }).rfind(path + ": field \"layer_types\"[2]", 0), 0u);
  EXPECT_EQ(error_message([&] { ModelConfig::load(dir.path("absent.json")); })
                .rfind(dir.path("absent.json") + ": cannot open for reading", 0),
            0u);
}

}  // namespace
}  // namespace trillion
