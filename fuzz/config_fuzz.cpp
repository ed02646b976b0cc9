// libFuzzer target: config.json (ModelConfig::load: JSON, every family's fields, aliases, layer
// kinds, RoPE and its scaling, MLA, linear attention, MoE placement) and the JSON it writes, which
// must read back as the same config.
#include <cstdint>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "config.json");
  trillion::ModelConfig config;
  try {
    config = trillion::ModelConfig::load(path);
  } catch (const trillion::Error&) {
    return 0;
  }
  // What it writes reads back as the same config, member by member; a refusal of its own JSON (an
  // uncaught Error) is a finding too.
  trillion::ModelConfig again = trillion::ModelConfig::from_json(config.to_json(), path);
  again.unread_fields = config.unread_fields;  // what the file had besides the model
  if (!(again == config)) __builtin_trap();
  return 0;
}
