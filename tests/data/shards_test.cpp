// Token shards: round trip, every corruption rejected with a message naming the file and field,
// the data directory's consistency checks, and the unigram baseline.
#include "data/shards.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data/data_test_util.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

using testing::expect_error;
using testing::TempDir;

const std::vector<int32_t> kTokens = {5, 0, 99, 17, 1, 42, 3, 1};

TEST(TokenShard, RoundTripsEveryField) {
  TempDir dir("shard_roundtrip");
  write_token_shard(dir.path("s.bin"), kTokens, 100, 0x1234abcd5678ef90ull, 777);
  EXPECT_EQ(std::filesystem::file_size(dir.path("s.bin")), 64 + 4 * kTokens.size());
  const TokenShard shard = read_token_shard(dir.path("s.bin"));
  EXPECT_EQ(shard.path, dir.path("s.bin"));
  EXPECT_EQ(shard.vocab_size, 100u);
  EXPECT_EQ(shard.tokenizer_hash, 0x1234abcd5678ef90ull);
  EXPECT_EQ(shard.text_bytes, 777u);
  EXPECT_EQ(shard.tokens, kTokens);
  const std::string bytes = read_file(dir.path("s.bin"));
  EXPECT_EQ(bytes.substr(0, 8), std::string("TRLNTOK\0", 8));

  write_token_shard(dir.path("empty.bin"), {}, 100, 1, 0);
  EXPECT_TRUE(read_token_shard(dir.path("empty.bin")).tokens.empty());
}

// Writes kTokens as a good shard, applies `corrupt` to its bytes, and expects reading to fail
// with a message naming the file and containing `expected`.
void expect_corruption_rejected(const std::string& name, const std::function<void(std::string&)>& corrupt,
                                const std::string& expected) {
  TempDir dir("shard_" + name);
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
  expect_corruption_rejected("version", [](std::string& b) { put_u32(b, 8, 2); }, "unsupported version 2 (expected 1)");
  expect_corruption_rejected("header", [](std::string& b) { b.resize(40); }, "truncated file: header needs 64 bytes");
  expect_corruption_rejected("tokens", [](std::string& b) { b.resize(b.size() - 6); }, "truncated file: token_count 8");
  expect_corruption_rejected("trailing", [](std::string& b) { b += "xy"; }, "trailing bytes");
  expect_corruption_rejected("checksum", [](std::string& b) { b[64 + 4 * 3] ^= 1; }, "checksum mismatch");
  // The checksum covers only the tokens, so a smaller vocab_size leaves id 99 out of range.
  expect_corruption_rejected("vocab", [](std::string& b) { put_u32(b, 12, 50); }, "token 2 has id 99 >= vocab_size 50");
  expect_corruption_rejected("reserved", [](std::string& b) { b[60] = 1; }, "reserved header bytes");
  expect_error([] { read_token_shard("/nonexistent/trillion/x.bin"); }, {"/nonexistent/trillion/x.bin"});
}

TEST(UnigramBaseline, IsAddOneSmoothedCrossEntropy) {
  // fit counts {0: 2, 1: 1, 2: 0}, vocab 3: p = (count + 1) / (3 + 3) = {1/2, 1/3, 1/6}.
  const double nats = unigram_baseline_nats({0, 0, 1}, {0, 2, 1}, 3);
  EXPECT_NEAR(nats, (std::log(2.0) + std::log(6.0) + std::log(3.0)) / 3.0, 1e-12);
  EXPECT_NEAR(unigram_baseline_nats({}, {4, 2}, 10), std::log(10.0), 1e-12) << "no fit tokens: uniform";
}

// A data directory written the way `trillion tokenize` does, with a small trained tokenizer.
class DataDirTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("datadir");
    train_tokenizer(testing::generated_documents(100, 9), 400, dir_->path("tokenizer.model"));
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    hash_ = tokenizer_file_hash(dir_->path("tokenizer.model"));
    write_token_shard(dir_->path("train.bin"), kTokens, 400, hash_, 100);
    write_token_shard(dir_->path("val.bin"), {3, 4, 1}, 400, hash_, 20);
  }
  static TempDir* dir_;
  uint64_t hash_ = 0;
};
TempDir* DataDirTest::dir_ = nullptr;

TEST_F(DataDirTest, OpensAConsistentDirectory) {
  const DataDir data = open_data_dir(dir_->str(), 400);
  EXPECT_EQ(data.tokenizer_path, dir_->path("tokenizer.model"));
  EXPECT_EQ(data.train.tokens, kTokens);
  EXPECT_EQ(data.val.tokens, (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(data.val.text_bytes, 20u);
  EXPECT_NO_THROW(open_data_dir(dir_->str(), 0)) << "expected_vocab 0 skips the model check";
}

TEST_F(DataDirTest, NamesTheMissingDirectoryOrFile) {
  expect_error([&] { open_data_dir(dir_->path("nope"), 400); }, {dir_->path("nope"), "data directory not found"});
  std::filesystem::remove(dir_->path("val.bin"));
  expect_error([&] { open_data_dir(dir_->str(), 400); }, {dir_->path("val.bin"), "missing"});
}

TEST_F(DataDirTest, RejectsTokenizerHashMismatch) {
  write_token_shard(dir_->path("val.bin"), {3, 4, 1}, 400, hash_ + 1, 20);
  expect_error([&] { open_data_dir(dir_->str(), 400); }, {dir_->path("val.bin"), "tokenizer_hash", "tokenizer.model", "expected"});
}

TEST_F(DataDirTest, RejectsVocabMismatchWithTokenizerAndModel) {
  write_token_shard(dir_->path("train.bin"), kTokens, 500, hash_, 100);
  expect_error([&] { open_data_dir(dir_->str(), 400); }, {dir_->path("train.bin"), "vocab_size 500", "expected 400"});
  write_token_shard(dir_->path("train.bin"), kTokens, 400, hash_, 100);
  expect_error([&] { open_data_dir(dir_->str(), 512); },
               {dir_->path("tokenizer.model"), "vocab_size 400", "model config", "expected 512"});
}

}  // namespace
}  // namespace trillion
