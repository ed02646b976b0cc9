// libFuzzer target: config.json (ModelConfig::load: JSON, every family's fields, aliases, layer
// kinds, RoPE and its scaling, MLA, linear attention, MoE placement) and the JSON it writes back.
#include <cstdint>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "config.json");
  try {
    const trillion::ModelConfig config = trillion::ModelConfig::load(path);
    const trillion::ModelConfig again = trillion::ModelConfig::from_json(config.to_json(), path);
    if (again.to_json() != config.to_json()) __builtin_trap();  // the round trip must be exact
  } catch (const trillion::Error&) {
  }
  return 0;
}
