// Hugging Face tokenizer.json: on a multilingual test text of 3000 lines (digits, whitespace runs,
// emoji, CJK, accents, special tokens in and between words), the encoding equals the `tokenizers`
// library's, token for token, for byte-level BPE tokenizers trained with the Qwen2/Qwen3 and the
// DeepSeek-V3 pipelines (tools/ref/write_tokenizer_fixtures.py), and decoding round-trips; so do 300
// lines around added tokens of every flag (lstrip, rstrip, single_word, normalized, not special);
// parts of the format that are not supported are refused by file and field.
#include "data/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "io/atomic_file.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

const std::string kFixtures = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/tokenizers";

// The pipeline's own test text when it has one, else the shared one.
std::vector<std::string> test_lines(const std::string& dir) {
  const std::string own = dir + "/test_text.txt";
  const std::string text = read_file(std::filesystem::exists(own) ? own : kFixtures + "/test_text.txt");
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\0', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

class HfTokenizerParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTokenizerParity, EncodesAsTheTokenizersLibraryAndDecodesBack) {
  const std::string dir = kFixtures + "/" + GetParam();
  const HfTokenizer tokenizer(dir + "/tokenizer.json");
  const std::vector<std::string> lines = test_lines(dir);
  const bool flags = std::string(GetParam()) == "qwen2_flags";
  ASSERT_EQ(lines.size(), flags ? 300u : 3000u);
  const std::string expected = read_file(dir + "/expected.jsonl");
  size_t at = 0, mismatches = 0, special = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t end = expected.find('\n', at);
    const std::vector<int32_t> ids = nlohmann::json::parse(expected.substr(at, end - at)).at("ids");
    at = end + 1;
    const std::vector<int32_t> got = tokenizer.encode(lines[i]);
    if (got != ids && mismatches++ < 5) {
      ADD_FAILURE() << "line " << i << ": \"" << lines[i] << "\" got " << ::testing::PrintToString(got) << " want "
                    << ::testing::PrintToString(ids);
    }
    // lstrip / rstrip tokens swallow whitespace that no decoding brings back.
    if (!flags) {
      EXPECT_EQ(tokenizer.decode(got), lines[i]) << "line " << i;
    }
    for (const int32_t id : got) special += id >= tokenizer.vocab_size() - 5 ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(special, 100u) << "the text exercises the added tokens";
}

INSTANTIATE_TEST_SUITE_P(Pipelines, HfTokenizerParity, ::testing::Values("qwen2", "deepseek_v3", "qwen2_flags"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST(HfTokenizer, AddedTokensAndLookups) {
  const HfTokenizer tokenizer(kFixtures + "/qwen2/tokenizer.json");
  const std::optional<int32_t> start = tokenizer.token_id("<|im_start|>");
  ASSERT_TRUE(start.has_value());
  const std::vector<int32_t> ids = tokenizer.encode("a<|im_start|>b");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], *start);
  EXPECT_FALSE(tokenizer.token_id("<|not a token|>").has_value());
  testing::expect_error([&] { tokenizer.decode({static_cast<int32_t>(tokenizer.vocab_size())}); },
                        {"tokenizer.json", "cannot decode token id"});
}

TEST(HfTokenizer, UnsupportedPartsAreRefusedByFileAndField) {
  test::ScratchDir dir("hf_tokenizer_bad");
  const nlohmann::json good = nlohmann::json::parse(read_file(kFixtures + "/qwen2/tokenizer.json"));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& change, const std::string& message) {
    nlohmann::json bad = good;
    change(bad);
    write_file_atomic(dir.path("t.json"), bad.dump());
    testing::expect_error([&] { HfTokenizer tokenizer(dir.path("t.json")); }, {dir.path("t.json"), message});
  };
  refused([](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer type \"NFKC\" is not supported");
  refused([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "model: type \"WordPiece\" is not supported");
  refused([](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback true is not supported");
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
          "pattern does not compile");
  refused([](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder type \"WordPiece\" is not supported");
  refused([](nlohmann::json& j) { j.erase("model"); }, "field 'model' is missing");
}

}  // namespace
}  // namespace trillion
