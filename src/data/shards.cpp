// Token shards and splits: writing (one shard or shards with an index), validated reading through
// mmap, the `--data DIR` directory check. The layouts are in shards.h.
#include "data/shards.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

static_assert(std::endian::native == std::endian::little, "token shards are read and written as little-endian");

constexpr char kMagic[8] = {'T', 'R', 'L', 'N', 'T', 'O', 'K', '\0'};
constexpr uint32_t kVersion = 1, kMaskedVersion = 2;
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

uint64_t write_token_shard(const std::string& path, std::span<const int32_t> tokens, uint32_t vocab_size,
                           uint64_t tokenizer_hash, uint64_t text_bytes) {
  TRILLION_CHECK(vocab_size > 0 && vocab_size <= static_cast<uint32_t>(INT32_MAX), "vocab_size ", vocab_size);
  bool masked = false;
  for (const int32_t stored : tokens) {
    TRILLION_CHECK(static_cast<uint32_t>(token_id(stored)) < vocab_size, "token id ", token_id(stored));
    masked = masked || !is_target(stored);
  }
  const std::string_view token_bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
  ShardHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = masked ? kMaskedVersion : kVersion;
  header.vocab_size = vocab_size;
  header.tokenizer_hash = tokenizer_hash;
  header.token_count = tokens.size();
  header.text_bytes = text_bytes;
  header.checksum = token_checksum(token_bytes.data(), token_bytes.size());
  AtomicFileWriter file(path);
  file.write(std::string_view(reinterpret_cast<const char*>(&header), kHeaderBytes));
  file.write(token_bytes);
  file.commit();
  return header.checksum;
}

TokenShard read_token_shard(const std::string& path) {
  auto mapping = std::make_shared<const MappedFile>(path);
  const std::string_view contents = mapping->bytes();
  if (contents.size() < kHeaderBytes)
    fail(path, ": truncated file: header needs ", kHeaderBytes, " bytes, file has ", contents.size());
  ShardHeader header;
  std::memcpy(&header, contents.data(), kHeaderBytes);
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0)
    fail(path, ": bad magic: expected \"TRLNTOK\\0\" (a token shard written by `trillion tokenize`)");
  if (header.version != kVersion && header.version != kMaskedVersion)
    fail(path, ": unsupported version ", header.version, " (expected ", kVersion, " or ", kMaskedVersion, ")");
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
  // The payload starts 64 bytes into a page-aligned mapping: aligned for int32.
  shard.tokens = std::span<const int32_t>(reinterpret_cast<const int32_t*>(contents.data() + kHeaderBytes),
                                          header.token_count);
  const bool masked = header.version == kMaskedVersion;  // bit 31 is the mask only there
  for (size_t i = 0; i < shard.tokens.size(); ++i) {
    const uint32_t id = static_cast<uint32_t>(masked ? token_id(shard.tokens[i]) : shard.tokens[i]);
    if (id >= header.vocab_size)
      fail(path, ": token ", i, " has id ", id, " >= vocab_size ", header.vocab_size);
  }
  shard.mapping = std::move(mapping);
  return shard;
}

int64_t TokenSplit::token_count() const {
  int64_t count = 0;
  for (const TokenShard& shard : shards) count += static_cast<int64_t>(shard.tokens.size());
  return count;
}

TokenStreams TokenSplit::streams() const {
  TokenStreams streams;
  for (const TokenShard& shard : shards) streams.push_back(shard.tokens);
  return streams;
}

namespace {

std::string index_path_of(const std::string& directory, const std::string& name) {
  return (std::filesystem::path(directory) / (name + ".index.json")).string();
}

std::string single_path_of(const std::string& directory, const std::string& name) {
  return (std::filesystem::path(directory) / (name + ".bin")).string();
}

uint64_t combined_checksum(const std::vector<uint64_t>& checksums) {
  return hash_name(std::string_view(reinterpret_cast<const char*>(checksums.data()), checksums.size() * 8));
}

TokenSplit read_indexed_split(const std::string& directory, const std::string& index_path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    fail(index_path, ": not valid JSON (", e.what(), ")");
  }
  const auto field = [&](const nlohmann::json& object, const char* name) -> const nlohmann::json& {
    if (!object.is_object() || !object.contains(name)) fail(index_path, ": field '", name, "' is missing");
    return object.at(name);
  };
  if (field(index, "format") != "trillion-token-shards" || field(index, "version") != 1)
    fail(index_path, ": fields 'format' / 'version' are not \"trillion-token-shards\" / 1");
  // A non-negative integer up to `most` (a float or a negative number is refused, not converted).
  const auto count = [&](const nlohmann::json& object, const char* name, uint64_t most) {
    const nlohmann::json& value = field(object, name);
    if (!value.is_number_unsigned() || value.get<uint64_t>() > most)
      fail(index_path, ": field '", name, "' is ", value.dump(), "; expected an integer in [0, ", most, "]");
    return value.get<uint64_t>();
  };
  constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();
  TokenSplit split;
  split.path = index_path;
  try {
    split.vocab_size = static_cast<uint32_t>(count(index, "vocab_size", uint64_t(INT32_MAX)));
    split.tokenizer_hash = count(index, "tokenizer_hash", kAny);
    split.text_bytes = count(index, "text_bytes", kAny);
    std::vector<uint64_t> checksums;
    int64_t tokens = 0;
    for (const nlohmann::json& entry : field(index, "shards")) {
      const std::string file = field(entry, "file").get<std::string>();
      if (file.find('/') != std::string::npos) fail(index_path, ": shard file \"", file, "\" is not a plain name");
      TokenShard shard = read_token_shard((std::filesystem::path(directory) / file).string());
      const auto expect = [&](bool same, const char* what) {
        if (!same) fail(shard.path, ": ", what, " does not match ", index_path, " (", entry.dump(), ")");
      };
      expect(shard.tokens.size() == count(entry, "tokens", kAny), "token_count");
      expect(shard.checksum == count(entry, "checksum", kAny), "checksum");
      expect(shard.vocab_size == split.vocab_size, "vocab_size");
      expect(shard.tokenizer_hash == split.tokenizer_hash, "tokenizer_hash");
      checksums.push_back(shard.checksum);
      tokens += static_cast<int64_t>(shard.tokens.size());
      split.shards.push_back(std::move(shard));
    }
    if (split.shards.empty()) fail(index_path, ": field 'shards' is empty");
    if (uint64_t(tokens) != count(index, "tokens", uint64_t(INT64_MAX)))
      fail(index_path, ": field 'tokens' is ", field(index, "tokens").dump(), ", the shards hold ", tokens);
    split.checksum = combined_checksum(checksums);
  } catch (const nlohmann::json::exception& e) {
    fail(index_path, ": a field has the wrong type (", e.what(), ")");
  }
  return split;
}

}  // namespace

TokenSplit read_token_split(const std::string& directory, const std::string& name) {
  const std::string single = single_path_of(directory, name), index = index_path_of(directory, name);
  const bool has_single = std::filesystem::is_regular_file(single), has_index = std::filesystem::is_regular_file(index);
  if (has_single && has_index) fail(directory, ": holds both ", name, ".bin and ", name, ".index.json (expected one)");
  if (has_index) return read_indexed_split(directory, index);
  if (!has_single) fail(single, ": missing (a data directory holds tokenizer.model and the train and val splits)");
  TokenSplit split;
  split.shards.push_back(read_token_shard(single));
  const TokenShard& shard = split.shards.front();
  split.path = single;
  split.vocab_size = shard.vocab_size;
  split.tokenizer_hash = shard.tokenizer_hash;
  split.text_bytes = shard.text_bytes;
  split.checksum = shard.checksum;
  return split;
}

TokenSplitWriter::TokenSplitWriter(std::string directory, std::string name, uint32_t vocab_size,
                                   uint64_t tokenizer_hash, int64_t max_shard_tokens)
    : directory_(std::move(directory)),
      name_(std::move(name)),
      vocab_size_(vocab_size),
      tokenizer_hash_(tokenizer_hash),
      max_shard_tokens_(max_shard_tokens) {
  TRILLION_CHECK(max_shard_tokens > 0, "max_shard_tokens ", max_shard_tokens);
}

std::string TokenSplitWriter::shard_path(size_t index) const {
  char file[32];
  std::snprintf(file, sizeof(file), "-%05zu.bin", index);
  return (std::filesystem::path(directory_) / (name_ + file)).string();
}

void TokenSplitWriter::add_document(std::span<const int32_t> tokens, int64_t text_bytes) {
  if (!buffer_.empty() && static_cast<int64_t>(buffer_.size() + tokens.size()) > max_shard_tokens_) {
    write_buffered_shard();
  }
  buffer_.insert(buffer_.end(), tokens.begin(), tokens.end());
  ++buffer_documents_;
  buffer_text_bytes_ += static_cast<uint64_t>(text_bytes);
  tokens_ += static_cast<int64_t>(tokens.size());
  targets_ += std::count_if(tokens.begin(), tokens.end(), is_target);
  ++documents_;
  text_bytes_ += static_cast<uint64_t>(text_bytes);
}

void TokenSplitWriter::write_buffered_shard() {
  if (written_.empty()) remove_file_if_present(single_path_of(directory_, name_));  // the other layout's file
  const std::string path = shard_path(written_.size());
  const uint64_t checksum = write_token_shard(path, buffer_, vocab_size_, tokenizer_hash_, buffer_text_bytes_);
  written_.push_back({std::filesystem::path(path).filename().string(), static_cast<int64_t>(buffer_.size()),
                      buffer_documents_, checksum});
  buffer_.clear();
  buffer_documents_ = 0;
  buffer_text_bytes_ = 0;
}

void TokenSplitWriter::finish() {
  if (written_.empty()) {  // everything fits one shard: NAME.bin
    remove_file_if_present(index_path_of(directory_, name_));
    write_token_shard(single_path_of(directory_, name_), buffer_, vocab_size_, tokenizer_hash_, buffer_text_bytes_);
  } else {
    if (!buffer_.empty()) write_buffered_shard();
    write_index();
  }
  for (size_t k = written_.size(); std::filesystem::exists(shard_path(k)); ++k) remove_file_if_present(shard_path(k));
}

void TokenSplitWriter::write_index() const {
  nlohmann::json shards = nlohmann::json::array();
  for (const Written& w : written_) {
    shards.push_back({{"file", w.file}, {"tokens", w.tokens}, {"documents", w.documents}, {"checksum", w.checksum}});
  }
  const nlohmann::json index = {{"format", "trillion-token-shards"}, {"version", 1},
                                {"vocab_size", vocab_size_},         {"tokenizer_hash", tokenizer_hash_},
                                {"tokens", tokens_},                 {"documents", documents_},
                                {"text_bytes", text_bytes_},         {"shards", shards}};
  write_file_atomic(index_path_of(directory_, name_), index.dump(1) + "\n");
}

DataDir open_data_dir(const std::string& directory, int64_t expected_vocab) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(directory))
    fail(directory, ": data directory not found (expected tokenizer.model and the train and val splits from `trillion tokenize`)");
  DataDir data;
  data.directory = directory;
  data.tokenizer_path = tokenizer_file_in(directory);
  if (!fs::is_regular_file(data.tokenizer_path))
    fail(data.tokenizer_path, ": missing (a data directory holds tokenizer.model or tokenizer.json and the train and val splits)");
  const Tokenizer tokenizer(data.tokenizer_path);
  data.train = read_token_split(directory, "train");
  data.val = read_token_split(directory, "val");
  for (const TokenSplit* split : {&data.train, &data.val}) {
    if (split->tokenizer_hash != tokenizer.hash())
      fail(split->path, ": tokenizer_hash ", hex(split->tokenizer_hash), " does not match ", data.tokenizer_path,
           " (expected ", hex(tokenizer.hash()), ")");
    if (split->vocab_size != tokenizer.vocab_size())
      fail(split->path, ": vocab_size ", split->vocab_size, " does not match ", data.tokenizer_path, " (expected ",
           tokenizer.vocab_size(), ")");
  }
  if (expected_vocab > 0 && tokenizer.vocab_size() > expected_vocab)  // a larger model vocab is padding
    fail(data.tokenizer_path, ": vocab_size ", tokenizer.vocab_size(), " exceeds the model config's vocab_size (expected at most ",
         expected_vocab, ")");
  return data;
}

}  // namespace trillion
