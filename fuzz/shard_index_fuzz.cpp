// libFuzzer target: a split's shard index (NAME.index.json: format, vocab, tokenizer hash, the
// shard list with names, token counts and checksums), next to one valid shard it may name.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "data/shards.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = (trillion::fuzz::scratch_dir() / "split").string();
    std::filesystem::create_directories(d);
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
    trillion::write_token_shard(d + "/train-00000.bin", tokens, 16, 0x1234, 40);
    return d;
  }();
  trillion::fuzz::write_input(data, size, "train.index.json", "split");
  try {
    const trillion::TokenSplit split = trillion::read_token_split(dir, "train");
    if (split.token_count() < 0) __builtin_trap();
  } catch (const trillion::Error&) {
  }
  return 0;
}
