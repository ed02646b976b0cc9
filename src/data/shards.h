// Token shards: the binary files of a data directory's splits, written by `trillion tokenize` and
// read through mmap (io/mapped_file.h), never copied.
//
// A shard file (little-endian): a 64-byte header
//   magic "TRLNTOK\0" (8 bytes) | version u32 (1, or 2: loss masks) | vocab_size u32 | tokenizer_hash u64 |
//   token_count u64 | text_bytes u64 (UTF-8 bytes of the text encoded) | checksum u64 (FNV-1a 64 of
//   the token bytes) | 8 reserved zero bytes
// followed by token_count u32 token ids. Documents are separated by the tokenizer's eos id (each
// document is followed by one); a shard holds whole documents. In version 2 (written when some
// token is not a loss target, as fine-tuning prompts are), bit 31 of a stored id marks a token that
// is not a target: the sampler still feeds it as an input, and its target is the ignore index.
//
// A split (train or val) of a data directory is either one shard, NAME.bin, or, when it has more
// tokens than one shard may hold, shards NAME-00000.bin, NAME-00001.bin, … and an index
// NAME.index.json: {"format": "trillion-token-shards", "version": 1, "vocab_size",
// "tokenizer_hash", "tokens", "documents", "text_bytes", "shards": [{"file", "tokens",
// "documents", "checksum"}, …]}. Reading validates everything and names the file and field on
// error (trillion::Error).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace trillion {

inline constexpr uint32_t kNotTargetBit = 1u << 31;
inline int32_t token_id(int32_t stored) { return static_cast<int32_t>(static_cast<uint32_t>(stored) & ~kNotTargetBit); }
inline bool is_target(int32_t stored) { return (static_cast<uint32_t>(stored) & kNotTargetBit) == 0; }

struct TokenShard {
  std::string path;
  uint32_t vocab_size = 0;
  uint64_t tokenizer_hash = 0;
  uint64_t text_bytes = 0;
  uint64_t checksum = 0;  // the header's FNV-1a 64 of the token bytes (verified on reading)
  std::span<const int32_t> tokens;     // [token_count] stored ids (token_id, is_target) inside `mapping`
  std::shared_ptr<const MappedFile> mapping;
};

// Writes atomically (temp file, fsync, rename); returns the checksum it stored.
uint64_t write_token_shard(const std::string& path, std::span<const int32_t> tokens, uint32_t vocab_size,
                           uint64_t tokenizer_hash, uint64_t text_bytes);

TokenShard read_token_shard(const std::string& path);

// One split's token streams: each shard's tokens (windows never cross a shard's end).
using TokenStreams = std::vector<std::span<const int32_t>>;

struct TokenSplit {
  std::string path;  // NAME.bin, or NAME.index.json
  uint32_t vocab_size = 0;
  uint64_t tokenizer_hash = 0;
  uint64_t text_bytes = 0;
  uint64_t checksum = 0;  // one shard: its checksum; several: FNV-1a 64 of their checksums in order
  std::vector<TokenShard> shards;
  int64_t token_count() const;
  TokenStreams streams() const;
};

// Reads DIRECTORY/NAME.bin or DIRECTORY/NAME.index.json and its shards (both present: an error).
TokenSplit read_token_split(const std::string& directory, const std::string& name);

// Writes a split document by document, holding at most one shard's tokens (max_shard_tokens, or
// more by the last document's) in memory: NAME.bin when everything fits one shard, else the
// shards and the index. Files of the other layout, and shards past the new ones, from an earlier
// run are removed.
class TokenSplitWriter {
 public:
  TokenSplitWriter(std::string directory, std::string name, uint32_t vocab_size, uint64_t tokenizer_hash,
                   int64_t max_shard_tokens);
  // One document's tokens, its eos included, encoded from `text_bytes` bytes of text.
  void add_document(std::span<const int32_t> tokens, int64_t text_bytes);
  void finish();
  int64_t tokens() const { return tokens_; }
  int64_t targets() const { return targets_; }  // tokens that are loss targets
  int64_t documents() const { return documents_; }
  uint64_t text_bytes() const { return text_bytes_; }
  int shards() const { return static_cast<int>(written_.size()); }

 private:
  struct Written {
    std::string file;
    int64_t tokens = 0, documents = 0;
    uint64_t checksum = 0;
  };
  std::string shard_path(size_t index) const;
  void write_buffered_shard();
  void write_index() const;
  std::string directory_, name_;
  uint32_t vocab_size_;
  uint64_t tokenizer_hash_;
  int64_t max_shard_tokens_;
  std::vector<int32_t> buffer_;  // the shard being filled
  int64_t buffer_documents_ = 0;
  uint64_t buffer_text_bytes_ = 0;
  std::vector<Written> written_;
  int64_t tokens_ = 0, targets_ = 0, documents_ = 0;
  uint64_t text_bytes_ = 0;
};

// A `--data DIR` directory: DIR/tokenizer.model and the train and val splits, checked against each
// other (same tokenizer hash and vocab size) and, when expected_vocab > 0, against the model's
// vocab_size, which may be larger than the tokenizer's (padded vocabularies, as Qwen's). Throws trillion::Error naming the file and field on any mismatch or missing file.
struct DataDir {
  std::string directory;
  std::string tokenizer_path;
  TokenSplit train;
  TokenSplit val;
};
DataDir open_data_dir(const std::string& directory, int64_t expected_vocab);

}  // namespace trillion
