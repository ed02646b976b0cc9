// Small model configs for the model tests: the committed tiny configs and variants of them.
#pragma once

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "model/config.h"

namespace trillion::testing {

inline std::string model_config_path(const std::string& name) {
  return std::string(TRILLION_SOURCE_DIR) + "/configs/models/" + name;
}

// One committed tiny config per layer kind that has landed (dense, MoE with softmax and sigmoid
// routers, Gated DeltaNet hybrids, KDA, MLA with and without RoPE, the indexer on MLA and on GQA),
// and the test-name suffix of a config file ("tiny_qwen3_moe" of "tiny_qwen3_moe.json").
inline const char* const kLayerKindConfigs[] = {
    "tiny.json",           "tiny_qwen3_moe.json",    "tiny_glm4_moe.json",        "tiny_qwen3_next_hybrid.json",
    "tiny_qwen3_next_moe.json", "tiny_kimi_linear_kda.json", "tiny_kimi_linear.json", "tiny_deepseek_v3.json",
    "tiny_deepseek_v32.json", "tiny_qwen3_sparse.json"};
inline std::string config_test_name(const ::testing::TestParamInfo<const char*>& info) {
  const std::string name = info.param;
  return name.substr(0, name.find('.'));
}

inline nlohmann::json model_config_json(const std::string& name) {
  return nlohmann::json::parse(read_file(model_config_path(name)));
}

// tiny.json with `changes` merged in (e.g. {"tie_word_embeddings": true}).
inline ModelConfig tiny_config_with(const nlohmann::json& changes, const std::string& base = "tiny.json") {
  nlohmann::json json = model_config_json(base);
  if (!changes.is_null()) json.merge_patch(changes);  // a null patch would replace the whole config
  return ModelConfig::from_json(json, base + " (test variant)");
}

}  // namespace trillion::testing
