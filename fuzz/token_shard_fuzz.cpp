// libFuzzer target: a token shard (header, version, vocab size, counts, checksum) read through
// mmap, every token touched.
#include <cstdint>

#include "core/error.h"
#include "data/shards.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trillion::fuzz::write_input(data, size, "train.bin");
  try {
    const trillion::TokenShard shard = trillion::read_token_shard(path);
    uint64_t sum = 0;
    for (int32_t token : shard.tokens) sum += static_cast<uint32_t>(token);
    if (sum == 1) return 0;  // keeps the loop
  } catch (const trillion::Error&) {
  }
  return 0;
}
