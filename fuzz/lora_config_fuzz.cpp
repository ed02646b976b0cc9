// libFuzzer target: a PEFT adapter_config.json (LoraConfig::load: JSON, PEFT's fields, module lists
// and regular expressions, rank and alpha patterns, the refused variants) and the JSON it writes,
// which must read back as the same config; every accepted config's matching rules run on a few
// module names (its regular expressions compile, or the file was refused).
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/lora_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "adapter_config.json");
  trillion::LoraConfig config;
  try {
    config = trillion::LoraConfig::load(path);
  } catch (const trillion::Error&) {
    return 0;
  }
  for (const char* module : {"model.layers.0.self_attn.q_proj", "lm_head", "model.layers.12.mlp.experts.3.down_proj"}) {
    config.targets_module(module);
    config.targets_parameter(module);
    config.saves_module(module);
    if (config.rank_of(module) <= 0) __builtin_trap();
    config.scaling_of(module);
  }
  // What it writes reads back as the same config (a refusal of its own JSON is a finding too).
  const trillion::LoraConfig again = trillion::LoraConfig::from_json(config.to_json(), path);
  if (again.to_json() != config.to_json()) __builtin_trap();
  return 0;
}
