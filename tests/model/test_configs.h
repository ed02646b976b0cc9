// Small model configs for the model tests: the committed tiny configs and variants of them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "model/config.h"

namespace trillion::testing {

inline std::string model_config_path(const std::string& name) {
  return std::string(TRILLION_SOURCE_DIR) + "/configs/models/" + name;
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
