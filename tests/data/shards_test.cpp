// Token shards: round trip, every corruption rejected with a message naming the file and field,
// and the data directory's consistency checks.
#include "data/shards.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::expect_error;
using test::ScratchDir;

const std::vector<int32_t> kTokens = {5, 0, 99, 17, 1, 42, 3, 1};

TEST(TokenShard, RoundTripsEveryField) {
  ScratchDir dir("shard_roundtrip");
  write_token_shard(dir.path("s.bin"), kTokens, 100, 0x1234abcd5678ef90ull, 777);
  EXPECT_EQ(std::filesystem::file_size(dir.path("s.bin")), 64 + 4 * kTokens.size());
  const TokenShard shard = read_token_shard(dir.path("s.bin"));
  EXPECT_EQ(shard.path, dir.path("s.bin"));
  EXPECT_EQ(shard.vocab_size, 100u);
  EXPECT_EQ(shard.tokenizer_hash, 0x1234abcd5678ef90ull);
  EXPECT_EQ(shard.text_bytes, 777u);
  EXPECT_EQ(std::vector<int32_t>(shard.tokens.begin(), shard.tokens.end()), kTokens);
  const std::string bytes = read_file(dir.path("s.bin"));
  EXPECT_EQ(bytes.substr(0, 8), std::string("TRLNTOK\0", 8));

  write_token_shard(dir.path("empty.bin"), {}, 100, 1, 0);
  EXPECT_TRUE(read_token_shard(dir.path("empty.bin")).tokens.empty());
}

// Writes kTokens as a good shard, applies `corrupt` to its bytes, and expects reading to fail
// with a message naming the file and containing `expected`.
void expect_corruption_rejected(const std::string& name, const std::function<void(std::string&)>& corrupt,
                                const std::string& expected) {
  ScratchDir dir("shard_" + name);
  const std::string path = dir.path("s.bin");
  write_token_shard(path, kTokens, 100, 7, 10);
  std::string bytes = read_file(path);
  corrupt(bytes);
  write_file_atomic(path, bytes);
  expect_error([&] { read_token_shard(path); }, {path, expected});
}

void put_u32(std::string& bytes, size_t offset, uint32_t value) { std::memcpy(bytes.data() + offset, &value, 4); }

TEST(TokenShard, RejectsEachCorruption) {
  expect_corruption_rejected("magic", [](std::string& b) { b[3] = 'X'; }, "bad magic");
  expect_corruption_rejected("version", [](std::string& b) { put_u32(b, 8, 3); }, "unsupported version 3 (expected 1 or 2)");
  expect_corruption_rejected("header", [](std::string& b) { b.resize(40); }, "truncated file: header needs 64 bytes");
  expect_corruption_rejected("tokens", [](std::string& b) { b.resize(b.size() - 6); }, "truncated file: token_count 8");
  expect_corruption_rejected("trailing", [](std::string& b) { b += "xy"; }, "trailing bytes");
  expect_corruption_rejected("checksum", [](std::string& b) { b[64 + 4 * 3] ^= 1; }, "checksum mismatch");
  // The checksum covers only the tokens, so a smaller vocab_size leaves id 99 out of range.
  expect_corruption_rejected("vocab", [](std::string& b) { put_u32(b, 12, 50); }, "token 2 has id 99 >= vocab_size 50");
  expect_corruption_rejected("reserved", [](std::string& b) { b[60] = 1; }, "reserved header bytes");
  expect_error([] { read_token_shard("/nonexistent/trillion/x.bin"); }, {"/nonexistent/trillion/x.bin"});
}

// Loss masks: a shard with untargeted tokens is version 2 and keeps bit 31 of their ids; in a
// version-1 shard that bit is an out-of-range id.
TEST(TokenShard, LossMasksRoundTripInVersionTwo) {
  ScratchDir dir("shard_masks");
  const std::vector<int32_t> stored = {5, static_cast<int32_t>(7 | kNotTargetBit), 9, 1};
  write_token_shard(dir.path("m.bin"), stored, 100, 3, 8);
  EXPECT_EQ(read_file(dir.path("m.bin"))[8], 2) << "version 2";
  const TokenShard shard = read_token_shard(dir.path("m.bin"));
  EXPECT_EQ(std::vector<int32_t>(shard.tokens.begin(), shard.tokens.end()), stored);
  EXPECT_EQ(token_id(shard.tokens[1]), 7);
  EXPECT_FALSE(is_target(shard.tokens[1]));
  EXPECT_TRUE(is_target(shard.tokens[2]));
  std::string bytes = read_file(dir.path("m.bin"));
  put_u32(bytes, 8, 1);
  write_file_atomic(dir.path("m.bin"), bytes);
  expect_error([&] { read_token_shard(dir.path("m.bin")); }, {"token 1 has id 2147483655 >= vocab_size 100"});
}

// A split written document by document with room for 10 tokens per shard: shards of whole
// documents and an index, read back as the same streams; a split that fits one shard is NAME.bin,
// and rewriting one layout removes the other's files.
TEST(TokenSplit, ShardsWholeDocumentsBehindAnIndexAndSwitchesLayouts) {
  ScratchDir dir("token_split");
  const std::vector<std::vector<int32_t>> documents = {{5, 6, 7, 1}, {8, 1}, {9, 9, 9, 9, 9, 1}, {2, 1}, {3, 3, 1}};
  TokenSplitWriter writer(dir.path(), "train", 20, 77, 10);
  for (const std::vector<int32_t>& d : documents) writer.add_document(d, 3);
  writer.finish();
  EXPECT_EQ(writer.shards(), 3);  // a shard ends where the next document would pass 10 tokens
  const TokenSplit split = read_token_split(dir.path(), "train");
  EXPECT_EQ(split.path, dir.path("train.index.json"));
  std::vector<size_t> sizes;
  for (const TokenShard& shard : split.shards) sizes.push_back(shard.tokens.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{6, 8, 3}));
  EXPECT_EQ(testing::all_tokens(split), (std::vector<int32_t>{5, 6, 7, 1, 8, 1, 9, 9, 9, 9, 9, 1, 2, 1, 3, 3, 1}));
  EXPECT_EQ(split.text_bytes, 15u);
  EXPECT_EQ(split.tokenizer_hash, 77u);
  const nlohmann::json index = nlohmann::json::parse(read_file(dir.path("train.index.json")));
  EXPECT_EQ(index.at("documents"), 5);
  EXPECT_EQ(index.at("shards").at(1).at("documents"), 2);

  // The index and its shards must agree.
  nlohmann::json wrong = index;
  wrong["shards"][1]["tokens"] = 7;
  write_file_atomic(dir.path("train.index.json"), wrong.dump());
  expect_error([&] { read_token_split(dir.path(), "train"); }, {dir.path("train-00001.bin"), "token_count does not match"});
  wrong = index;
  wrong.erase("tokens");
  write_file_atomic(dir.path("train.index.json"), wrong.dump());
  expect_error([&] { read_token_split(dir.path(), "train"); }, {dir.path("train.index.json"), "field 'tokens' is missing"});
  write_file_atomic(dir.path("train.index.json"), index.dump());
  write_token_shard(dir.path("train.bin"), kTokens, 100, 7, 10);
  expect_error([&] { read_token_split(dir.path(), "train"); }, {"both train.bin and train.index.json"});

  TokenSplitWriter single(dir.path(), "train", 20, 77, 100);
  for (const std::vector<int32_t>& d : documents) single.add_document(d, 3);
  single.finish();
  EXPECT_EQ(single.shards(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir.path("train.index.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.path("train-00000.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.path("train-00002.bin")));
  const TokenSplit one = read_token_split(dir.path(), "train");
  EXPECT_EQ(one.path, dir.path("train.bin"));
  EXPECT_EQ(testing::all_tokens(one), testing::all_tokens(split));
  EXPECT_EQ(one.checksum, one.shards.at(0).checksum);
}

// A data directory written the way `trillion tokenize` does, with a small trained tokenizer.
class DataDirTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("datadir");
    train_tokenizer(testing::generated_documents(100, 9), 400, dir_->path("tokenizer.model"));
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    hash_ = tokenizer_file_hash(dir_->path("tokenizer.model"));
    write_token_shard(dir_->path("train.bin"), kTokens, 400, hash_, 100);
    write_token_shard(dir_->path("val.bin"), std::vector<int32_t>{3, 4, 1}, 400, hash_, 20);
  }
  static ScratchDir* dir_;
  uint64_t hash_ = 0;
};
ScratchDir* DataDirTest::dir_ = nullptr;

TEST_F(DataDirTest, OpensAConsistentDirectory) {
  const DataDir data = open_data_dir(dir_->path(), 400);
  EXPECT_EQ(data.tokenizer_path, dir_->path("tokenizer.model"));
  EXPECT_EQ(testing::all_tokens(data.train), kTokens);
  EXPECT_EQ(testing::all_tokens(data.val), (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(data.val.text_bytes, 20u);
  EXPECT_NO_THROW(open_data_dir(dir_->path(), 0)) << "expected_vocab 0 skips the model check";
}

TEST_F(DataDirTest, NamesTheMissingDirectoryOrFile) {
  expect_error([&] { open_data_dir(dir_->path("nope"), 400); }, {dir_->path("nope"), "data directory not found"});
  std::filesystem::remove(dir_->path("val.bin"));
  expect_error([&] { open_data_dir(dir_->path(), 400); }, {dir_->path("val.bin"), "missing"});
}

TEST_F(DataDirTest, RejectsTokenizerHashMismatch) {
  write_token_shard(dir_->path("val.bin"), std::vector<int32_t>{3, 4, 1}, 400, hash_ + 1, 20);
  expect_error([&] { open_data_dir(dir_->path(), 400); }, {dir_->path("val.bin"), "tokenizer_hash", "tokenizer.model", "expected"});
}

TEST_F(DataDirTest, RejectsVocabMismatchWithTokenizerAndModel) {
  write_token_shard(dir_->path("train.bin"), kTokens, 500, hash_, 100);
  expect_error([&] { open_data_dir(dir_->path(), 400); }, {dir_->path("train.bin"), "vocab_size 500", "expected 400"});
  write_token_shard(dir_->path("train.bin"), kTokens, 400, hash_, 100);
  expect_error([&] { open_data_dir(dir_->path(), 300); },
               {dir_->path("tokenizer.model"), "vocab_size 400", "exceeds the model config", "expected at most 300"});
  EXPECT_NO_THROW(open_data_dir(dir_->path(), 512)) << "a padded model vocab";
}

}  // namespace
}  // namespace trillion
