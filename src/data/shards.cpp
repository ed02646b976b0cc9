// Token shards (train.bin / val.bin): writing, validated reading, the `--data DIR` directory
// check, and the unigram baseline. The byte layout is in shards.h.
#include "data/shards.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

static_assert(std::endian::native == std::endian::little, "token shards are read and written as little-endian");

constexpr char kMagic[8] = {'T', 'R', 'L', 'N', 'T', 'O', 'K', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;

// The 64-byte header, field by field at its byte offset.
struct ShardHeader {
  char magic[8];            // offset 0
  uint32_t version;         // offset 8
  uint32_t vocab_size;      // offset 12
  uint64_t tokenizer_hash;  // offset 16
  uint64_t token_count;     // offset 24
  uint64_t text_bytes;      // offset 32
  uint64_t checksum;        // offset 40
  uint64_t reserved;        // offset 48
  uint64_t reserved_tail;   // offset 56
};
static_assert(sizeof(ShardHeader) == kHeaderBytes);

// FNV-1a 64 of the token bytes as stored (u32 little-endian each).
uint64_t token_checksum(const char* bytes, size_t count) { return hash_name(std::string_view(bytes, count)); }

std::string hex(uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, uint32_t vocab_size,
                       uint64_t tokenizer_hash, uint64_t text_bytes) {
  TRILLION_CHECK(vocab_size > 0 && vocab_size <= static_cast<uint32_t>(INT32_MAX), "vocab_size ", vocab_size);
  for (int32_t id : tokens) TRILLION_CHECK(id >= 0 && static_cast<uint32_t>(id) < vocab_size, "token id ", id);
  const size_t token_bytes = tokens.size() * sizeof(int32_t);
  std::string contents(kHeaderBytes + token_bytes, '\0');
  std::memcpy(contents.data() + kHeaderBytes, tokens.data(), token_bytes);

  ShardHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.vocab_size = vocab_size;
  header.tokenizer_hash = tokenizer_hash;
  header.token_count = tokens.size();
  header.text_bytes = text_bytes;
  header.checksum = token_checksum(contents.data() + kHeaderBytes, token_bytes);
  std::memcpy(contents.data(), &header, kHeaderBytes);
  write_file_atomic(path, contents);
}

TokenShard read_token_shard(const std::string& path) {
  const std::string contents = read_file(path);
  if (contents.size() < kHeaderBytes)
    fail(path, ": truncated file: header needs ", kHeaderBytes, " bytes, file has ", contents.size());
  ShardHeader header;
  std::memcpy(&header, contents.data(), kHeaderBytes);
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0)
    fail(path, ": bad magic: expected \"TRLNTOK\\0\" (a token shard written by `trillion tokenize`)");
  if (header.version != kVersion)
    fail(path, ": unsupported version ", header.version, " (expected ", kVersion, ")");
  if (header.vocab_size == 0 || header.vocab_size > static_cast<uint32_t>(INT32_MAX))
    fail(path, ": vocab_size ", header.vocab_size, " out of range (expected 1..", INT32_MAX, ")");
  if (header.reserved != 0 || header.reserved_tail != 0)
    fail(path, ": reserved header bytes 48..63 are not zero (expected zero)");
  const uint64_t payload = contents.size() - kHeaderBytes;
  if (header.token_count > payload / sizeof(uint32_t) || payload != header.token_count * sizeof(uint32_t)) {
    fail(path, ": ", payload < header.token_count * sizeof(uint32_t) ? "truncated file" : "trailing bytes",
         ": token_count ", header.token_count, " needs ", kHeaderBytes + header.token_count * sizeof(uint32_t),
         " bytes, file has ", contents.size());
  }
  const uint64_t checksum = token_checksum(contents.data() + kHeaderBytes, payload);
  if (checksum != header.checksum)
    fail(path, ": checksum mismatch: header says ", hex(header.checksum), ", tokens hash to ", hex(checksum));

  TokenShard shard;
  shard.path = path;
  shard.vocab_size = header.vocab_size;
  shard.tokenizer_hash = header.tokenizer_hash;
  shard.text_bytes = header.text_bytes;
  shard.checksum = header.checksum;
  shard.tokens.resize(header.token_count);
  std::memcpy(shard.tokens.data(), contents.data() + kHeaderBytes, payload);
  for (size_t i = 0; i < shard.tokens.size(); ++i) {
    const uint32_t id = static_cast<uint32_t>(shard.tokens[i]);
    if (id >= header.vocab_size)
      fail(path, ": token ", i, " has id ", id, " >= vocab_size ", header.vocab_size);
  }
  return shard;
}

DataDir open_data_dir(const std::string& directory, int64_t expected_vocab) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(directory))
    fail(directory, ": data directory not found (expected tokenizer.model, train.bin and val.bin from `trillion tokenize`)");
  DataDir data;
  data.directory = directory;
  data.tokenizer_path = (fs::path(directory) / "tokenizer.model").string();
  const std::string train_path = (fs::path(directory) / "train.bin").string();
  const std::string val_path = (fs::path(directory) / "val.bin").string();
  for (const std::string& path : {data.tokenizer_path, train_path, val_path}) {
    if (!fs::is_regular_file(path)) fail(path, ": missing (a data directory holds tokenizer.model, train.bin and val.bin)");
  }
  const Tokenizer tokenizer(data.tokenizer_path);
  data.train = read_token_shard(train_path);
  data.val = read_token_shard(val_path);
  for (const TokenShard* shard : {&data.train, &data.val}) {
    if (shard->tokenizer_hash != tokenizer.hash())
      fail(shard->path, ": tokenizer_hash ", hex(shard->tokenizer_hash), " does not match ", data.tokenizer_path,
           " (expected ", hex(tokenizer.hash()), ")");
    if (shard->vocab_size != tokenizer.vocab_size())
      fail(shard->path, ": vocab_size ", shard->vocab_size, " does not match ", data.tokenizer_path, " (expected ",
           tokenizer.vocab_size(), ")");
  }
  if (expected_vocab > 0 && tokenizer.vocab_size() != expected_vocab)
    fail(data.tokenizer_path, ": vocab_size ", tokenizer.vocab_size(), " does not match the model config's vocab_size (expected ",
         expected_vocab, ")");
  return data;
}

double unigram_baseline_nats(const std::vector<int32_t>& fit_tokens, const std::vector<int32_t>& eval_tokens,
                             int64_t vocab_size) {
  TRILLION_CHECK(vocab_size > 0 && !eval_tokens.empty(), "vocab_size ", vocab_size, ", eval tokens ", eval_tokens.size());
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
  for (int32_t id : fit_tokens) {
    TRILLION_CHECK(id >= 0 && id < vocab_size, "fit token id ", id);
    ++counts[static_cast<size_t>(id)];
  }
  const double log_total = std::log(static_cast<double>(fit_tokens.size()) + static_cast<double>(vocab_size));
  double nats = 0.0;
  for (int32_t id : eval_tokens) {
    TRILLION_CHECK(id >= 0 && id < vocab_size, "eval token id ", id);
    nats += log_total - std::log(static_cast<double>(counts[static_cast<size_t>(id)] + 1));
  }
  return nats / static_cast<double>(eval_tokens.size());
}

}  // namespace trillion
