// Token shards: the binary files `train.bin` and `val.bin` that `trillion tokenize` writes.
//
// Layout (little-endian): a 64-byte header
//   magic "TRLNTOK\0" (8 bytes) | version u32 (=1) | vocab_size u32 | tokenizer_hash u64 |
//   token_count u64 | text_bytes u64 (UTF-8 bytes of the text encoded) | checksum u64 (FNV-1a 64 of
//   the token bytes) | 8 reserved zero bytes
// followed by token_count u32 token ids. Documents are separated by the tokenizer's eos id.
// Reading validates everything and names the file and field on error (trillion::Error).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trillion {

struct TokenShard {
  std::string path;
  uint32_t vocab_size = 0;
  uint64_t tokenizer_hash = 0;
  uint64_t text_bytes = 0;
  uint64_t checksum = 0;  // the header's FNV-1a 64 of the token bytes (verified on reading)
  std::vector<int32_t> tokens;
};

// Writes atomically (temp file, fsync, rename).
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, uint32_t vocab_size,
                       uint64_t tokenizer_hash, uint64_t text_bytes);

TokenShard read_token_shard(const std::string& path);

// A `--data DIR` directory: DIR/tokenizer.model, DIR/train.bin, DIR/val.bin, checked against each
// other (same tokenizer hash and vocab size) and, when expected_vocab > 0, against the model's
// vocab_size. Throws trillion::Error naming the file and field on any mismatch or missing file.
struct DataDir {
  std::string directory;
  std::string tokenizer_path;
  TokenShard train;
  TokenShard val;
};
DataDir open_data_dir(const std::string& directory, int64_t expected_vocab);

// Cross-entropy (nats/token) of `eval_tokens` under the add-one-smoothed unigram distribution of
// `fit_tokens`: the baseline a language model must beat.
double unigram_baseline_nats(const std::vector<int32_t>& fit_tokens, const std::vector<int32_t>& eval_tokens,
                             int64_t vocab_size);

}  // namespace trillion
