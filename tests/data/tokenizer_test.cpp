// The SentencePiece tokenizer: deterministic training, exact encode/decode round trips (byte
// fallback for unseen characters), eos and newline pieces, and the model hash.
#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "core/rng.h"
#include "data/data_test_util.h"
#include "io/atomic_file.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::expect_error;
using testing::generated_documents;
using test::ScratchDir;

constexpr int64_t kVocab = 400;

TEST(Tokenizer, TrainsAndRoundTripsExactly) {
  ScratchDir dir("tokenizer_roundtrip");
  const std::vector<std::string> documents = generated_documents(200, 1);
  train_tokenizer(documents, kVocab, dir.path("t.model"));
  const Tokenizer tokenizer(dir.path("t.model"));
  EXPECT_EQ(tokenizer.vocab_size(), kVocab);
  EXPECT_EQ(tokenizer.eos_id(), 1);

  int64_t tokens = 0, bytes = 0;
  for (const std::string& document : documents) {
    const std::vector<int32_t> ids = tokenizer.encode(document);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kVocab && id != tokenizer.eos_id() && id != 0) << id;
    ASSERT_EQ(tokenizer.decode(ids), document);
    tokens += static_cast<int64_t>(ids.size());
    bytes += static_cast<int64_t>(document.size());
  }
  EXPECT_LT(tokens * 2, bytes) << "BPE merges should compress the training text to under half a token per byte";

  // Characters never seen in training go through byte fallback: no unk, still exact.
  const std::string unseen = "Ωμέγα 🙂\ttab  two spaces\n\nblank line above";
  const std::vector<int32_t> ids = tokenizer.encode(unseen);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << "unk id in the encoding";
  EXPECT_EQ(tokenizer.decode(ids), unseen);

  // "\n" is one piece of its own.
  const std::vector<int32_t> newline_ids = tokenizer.encode("ka\nto");
  EXPECT_EQ(std::count_if(newline_ids.begin(), newline_ids.end(), [&](int32_t id) { return tokenizer.decode({id}) == "\n"; }), 1);
}

TEST(Tokenizer, TrainingIsDeterministicAndHashIsOfTheFile) {
  ScratchDir dir("tokenizer_hash");
  const std::vector<std::string> documents = generated_documents(120, 2);
  train_tokenizer(documents, kVocab, dir.path("a.model"));
  train_tokenizer(documents, kVocab, dir.path("b.model"));
  const std::string a = read_file(dir.path("a.model")), b = read_file(dir.path("b.model"));
  EXPECT_EQ(a, b);
  const Tokenizer tokenizer(dir.path("a.model"));
  EXPECT_EQ(tokenizer.hash(), hash_name(a));
  EXPECT_EQ(tokenizer.hash(), tokenizer_file_hash(dir.path("b.model")));

  train_tokenizer(generated_documents(120, 3), kVocab, dir.path("c.model"));
  EXPECT_NE(tokenizer_file_hash(dir.path("c.model")), tokenizer.hash()) << "another corpus, another model";
  EXPECT_FALSE(std::filesystem::exists(dir.path("a.model") + ".tmp." + std::to_string(::getpid())));
}

TEST(Tokenizer, BadModelsAndImpossibleVocabsAreErrors) {
  ScratchDir dir("tokenizer_errors");
  write_file_atomic(dir.path("not.model"), "this is not a protobuf");
  expect_error([&] { Tokenizer tokenizer(dir.path("not.model")); }, {dir.path("not.model"), "not a SentencePiece model"});
  expect_error([&] { Tokenizer tokenizer(dir.path("missing.model")); }, {dir.path("missing.model")});
  expect_error([&] { train_tokenizer(generated_documents(20, 4), 100000, dir.path("big.model")); },
               {dir.path("big.model"), "vocab_size 100000"});
  expect_error([&] { train_tokenizer(generated_documents(20, 4), 100, dir.path("small.model")); },
               {dir.path("small.model"), "vocab_size 100"});
  expect_error([&] { train_tokenizer({}, kVocab, dir.path("empty.model")); }, {dir.path("empty.model"), "no text"});
}

}  // namespace
}  // namespace trillion
