// libFuzzer target: the safetensors reader (header length, JSON header, dtypes, shapes, offsets)
// and the reads of every tensor it accepts, into float and double.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "fuzz_input.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "model.safetensors");
  try {
    const trillion::SafetensorsReader reader(path);
    for (const auto& [name, info] : reader.tensors()) {
      int64_t count = 1;
      for (int64_t d : info.shape) count *= d;
      if (count > (int64_t(1) << 20)) continue;  // the accepted offsets bound it by the file's size
      std::vector<float> f(static_cast<size_t>(count));
      std::vector<double> d(static_cast<size_t>(count));
      reader.read(name, info.shape, f.data());
      reader.read(name, info.shape, d.data());
    }
  } catch (const trillion::Error&) {
  }
  return 0;
}
