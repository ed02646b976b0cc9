// libFuzzer target: trainer_state.json (TrainerState::load: step, settings, schedule, optimizer,
// data position and mixture positions, hashes) and the JSON it writes back.
#include <cstdint>

#include "core/error.h"
#include "fuzz_input.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "trainer_state.json");
  try {
    const trillion::TrainerState state = trillion::TrainerState::load(path);
    if (state.to_json().dump().empty()) __builtin_trap();
  } catch (const trillion::Error&) {
  }
  return 0;
}
