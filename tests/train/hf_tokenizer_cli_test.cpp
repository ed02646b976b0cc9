// A Hugging Face tokenizer.json end to end: `tokenize --tokenizer tokenizer.json` keeps it as the
// data directory's tokenizer (documents end with its end-of-text token, ChatML conversations use
// its special tokens), a model with a padded vocab (larger than the tokenizer's) trains on it, the
// checkpoint records it, and `generate` decodes with it.
#include <gtest/gtest.h>

#include <string>

#include "data/hf_tokenizer.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(HfTokenizerCli, TokenizesTrainsWithAPaddedVocabAndGenerates) {
  const TestData& d = test_data();
  const fs::path root = d.root / "hf_tokenizer";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string tokenizer_json = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen2/tokenizer.json";
  std::string chat;
  for (int i = 0; i < 40; ++i) {
    chat += nlohmann::json{{"messages", {{{"role", "user"}, {"content", "Count from " + std::to_string(i)}},
                                         {{"role", "assistant"}, {"content", std::to_string(i + 1) + " naïve café"}}}}}
                .dump() +
            "\n";
  }
  write_text(root / "chat.jsonl", chat);
  const fs::path data = root / "data";
  const CommandResult tokenized = run_cli("tokenize --input " + (root / "chat.jsonl").string() + " " +
                                          (d.root / "corpus.txt").string() + " --out " + data.string() +
                                          " --tokenizer " + tokenizer_json + " --val-fraction 0.1");
  ASSERT_EQ(tokenized.status, 0) << tokenized.output;
  ASSERT_TRUE(fs::exists(data / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(data / "tokenizer.model"));
  const DataDir dir = open_data_dir(data.string(), 0);
  const Tokenizer tokenizer(dir.tokenizer_path);
  EXPECT_EQ(tokenizer.eos_id(), *HfTokenizer(tokenizer_json).token_id("<|endoftext|>"));
  EXPECT_EQ(dir.train.vocab_size, 1181u);
  EXPECT_NE(tokenized.output.find("40 conversations (ChatML)"), std::string::npos) << tokenized.output;

  const fs::path config = root / "tiny_padded.json";
  write_config(config, 1280);  // Qwen-style padding past the tokenizer's 1181 ids
  const fs::path run = root / "run";
  const CommandResult trained = run_cli("train --config " + config.string() + " --data " + data.string() + " --out " +
                                        run.string() + " --batch 2 --seq-len 32 --steps 3" + kSmallMfuGemm);
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_EQ(read_text(run / "checkpoint-000003" / "tokenizer.json"), read_text(data / "tokenizer.json"));
  const CommandResult generated =
      run_cli("generate --checkpoint " + run.string() + " --prompt \"Count from\" --max-new-tokens 5 --seed 1");
  ASSERT_EQ(generated.status, 0) << generated.output;
  EXPECT_NE(generated.output.find("Count from"), std::string::npos) << generated.output;
}

}  // namespace
}  // namespace trillion::train_test
