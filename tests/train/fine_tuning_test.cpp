// Fine-tuning data end to end: prompt/completion JSONL tokenizes with loss masks on exactly the
// completion tokens (each document's targets decode to its completion, the untargeted tokens to
// its prompt, and the printed total is the count), trains, and `trillion eval` counts exactly the
// completion tokens of the val split, with a loss equal to a masked loss computed separately from
// the re-encoded prompts and completions. ChatML conversations target every assistant turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "ops/cross_entropy.h"
#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

std::vector<std::pair<std::string, std::string>> prompt_completions(int count) {
  static const char* const kWords[] = {"apple", "river", "stone", "cloud", "seven", "green", "quiet", "north"};
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int i = 0; i < count; ++i) {
    std::string prompt = "Question " + std::to_string(i) + ":", completion;
    for (int w = 0; w < 6 + i % 5; ++w) prompt += std::string(" ") + kWords[(i * 3 + w) % 8];
    for (int w = 0; w < 4 + i % 3; ++w) completion += std::string(" ") + kWords[(i + w * 5) % 8];
    pairs.emplace_back(prompt + "\nAnswer:", completion);
  }
  return pairs;
}

TEST(FineTuning, PromptCompletionMasksTrainAndEvaluateOnlyTheCompletions) {
  const TestData& d = test_data();
  const fs::path root = d.root / "fine_tuning";
  fs::remove_all(root);
  fs::create_directories(root);
  const auto pairs = prompt_completions(60);
  std::string jsonl;
  std::map<std::string, std::string> completion_of;
  for (const auto& [prompt, completion] : pairs) {
    jsonl += nlohmann::json{{"prompt", prompt}, {"completion", completion}}.dump() + "\n";
    completion_of[prompt] = completion;
  }
  write_text(root / "ft.jsonl", jsonl);
  const fs::path data = root / "data";
  const CommandResult tokenized = run_cli("tokenize --input " + (root / "ft.jsonl").string() + " --out " +
                                          data.string() + " --vocab-size 300 --val-fraction 0.25");
  ASSERT_EQ(tokenized.status, 0) << tokenized.output;

  // Every document: its untargeted tokens decode to a prompt, its targets to that prompt's
  // completion and the eos.
  const DataDir dir = open_data_dir(data.string(), 0);
  const Tokenizer tokenizer(dir.tokenizer_path);
  int64_t val_targets = 0, train_targets = 0, documents = 0;
  std::vector<std::string> val_prompts;  // in the val split's order
  for (const TokenSplit* split : {&dir.train, &dir.val}) {
    std::vector<int32_t> prompt, completion;
    for (const TokenShard& shard : split->shards) {
      for (const int32_t stored : shard.tokens) {
        (is_target(stored) ? completion : prompt).push_back(token_id(stored));
        if (token_id(stored) != tokenizer.eos_id()) continue;
        ASSERT_TRUE(is_target(stored)) << "the eos after a completion is a target";
        ASSERT_EQ(completion.back(), tokenizer.eos_id());
        completion.pop_back();
        const std::string text = tokenizer.decode(prompt);
        ASSERT_EQ(completion_of.count(text), 1u) << text;
        // (SentencePiece decodes a leading "▁" as nothing: the completions begin with a space.)
        EXPECT_EQ(str_cat(" ", tokenizer.decode(completion)), completion_of[text]);
        (split == &dir.val ? val_targets : train_targets) += static_cast<int64_t>(completion.size()) + 1;
        if (split == &dir.val) val_prompts.push_back(text);
        ++documents;
        prompt.clear();
        completion.clear();
      }
    }
  }
  EXPECT_EQ(documents, 60);
  EXPECT_NE(tokenized.output.find("60 prompt/completion documents, 0 conversations (ChatML); loss targets: " +
                                  std::to_string(train_targets) + " of"),
            std::string::npos)
      << tokenized.output;

  const fs::path config = root / "tiny.json";
  write_config(config, dir.train.vocab_size);
  const fs::path run = root / "run";
  const CommandResult trained = run_cli("train --config " + config.string() + " --data " + data.string() + " --out " +
                                        run.string() + " --batch 2 --seq-len 32 --steps 6 --dtype float64" + kSmallMfuGemm);
  ASSERT_EQ(trained.status, 0) << trained.output;
  const CommandResult eval = run_cli("eval --checkpoint " + run.string() + " --data " + data.string());
  ASSERT_EQ(eval.status, 0) << eval.output;
  const size_t last_line = eval.output.rfind('\n', eval.output.find_last_not_of('\n'));
  const nlohmann::json result = nlohmann::json::parse(eval.output.substr(last_line + 1));  // the summary line
  EXPECT_EQ(result.at("tokens").get<int64_t>(), val_targets) << "exactly the completions' tokens and their eos";

  // The reference, from the JSONL alone: each val document's text re-encoded, its first tokens
  // those of the prompt alone (no piece crosses the boundary: the completions begin with a space)
  // and not targets, the rest and the eos targets; cut into the eval windows of the training
  // seq_len and scored by the checkpoint's model.
  std::vector<int32_t> stream;
  std::vector<bool> target;  // [stream] whether the token at each position is a loss target
  for (const std::string& prompt : val_prompts) {
    const std::vector<int32_t> p = tokenizer.encode(prompt), whole = tokenizer.encode(prompt + completion_of.at(prompt));
    ASSERT_TRUE(std::equal(p.begin(), p.end(), whole.begin())) << "the prompt's tokens begin the document's";
    stream.insert(stream.end(), whole.begin(), whole.end());
    stream.push_back(tokenizer.eos_id());
    target.insert(target.end(), p.size(), false);
    target.insert(target.end(), whole.size() - p.size() + 1, true);
  }
  std::vector<int32_t> stored_ids;
  for (const int32_t stored : dir.val.shards.at(0).tokens) stored_ids.push_back(token_id(stored));
  ASSERT_EQ(stored_ids, stream) << "the val split is the re-encoded documents";
  Model<double> model(ModelConfig::load(config.string()));
  model.load_weights(resolve_weights_dir(run.string()));
  const int64_t seq = 32, n = static_cast<int64_t>(stream.size());
  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t start = 0; start + 1 < n; start += seq) {
    std::vector<int32_t> inputs(seq, 0), targets(seq, kIgnoreIndex);  // [1, seq]
    for (int64_t t = 0; t < seq && start + t < n; ++t) {
      inputs[t] = stream[start + t];
      if (start + t + 1 < n && target[start + t + 1]) targets[t] = stream[start + t + 1];
    }
    const CrossEntropyResult part = model.forward_loss(inputs.data(), targets.data(), 1, seq).lm;
    loss_sum += part.loss_sum;
    count += part.count;
  }
  EXPECT_EQ(count, val_targets);
  EXPECT_NEAR(result.at("val_loss").get<double>(), loss_sum / double(count), 1e-12 * loss_sum / double(count));
}

// 30 conversations of two assistant turns each (a number, then a number and "done") in
// ROOT/chat.jsonl, tokenized into DATA with a tokenizer trained on them.
CommandResult tokenize_counting_chat(const fs::path& root, const fs::path& data) {
  std::string jsonl;
  for (int i = 0; i < 30; ++i) {
    const nlohmann::json messages = nlohmann::json::array(
        {{{"role", "system"}, {"content", "You count."}},
         {{"role", "user"}, {"content", "Start at " + std::to_string(i)}},
         {{"role", "assistant"}, {"content", std::to_string(i + 1)}},
         {{"role", "user"}, {"content", "Again"}},
         {{"role", "assistant"}, {"content", std::to_string(i + 2) + " done"}}});
    jsonl += nlohmann::json{{"messages", messages}}.dump() + "\n";
  }
  write_text(root / "chat.jsonl", jsonl);
  return run_cli("tokenize --input " + (root / "chat.jsonl").string() + " --out " + data.string() +
                 " --vocab-size 300 --val-fraction 0.2");
}

// Conversations: a tokenizer trained on them holds ChatML's markers as pieces, the targets decode
// to the assistant turns (content and end marker, every turn), and a tokenizer without the markers
// is refused by name.
TEST(FineTuning, ConversationsTargetEveryAssistantTurn) {
  const TestData& d = test_data();
  const fs::path root = d.root / "fine_tuning_chat";
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path data = root / "data";
  const CommandResult tokenized = tokenize_counting_chat(root, data);
  ASSERT_EQ(tokenized.status, 0) << tokenized.output;
  const DataDir dir = open_data_dir(data.string(), 0);
  const Tokenizer tokenizer(dir.tokenizer_path);
  ASSERT_TRUE(tokenizer.has_piece("<|im_start|>"));
  ASSERT_TRUE(tokenizer.has_piece("<|im_end|>"));
  std::vector<int32_t> targets, document;
  std::set<std::string> answers;
  for (int i = 0; i < 30; ++i) answers.insert(std::to_string(i + 1) + "<|im_end|>" + std::to_string(i + 2) + " done<|im_end|>");
  int checked = 0;
  for (const TokenShard& shard : dir.train.shards) {
    for (const int32_t stored : shard.tokens) {
      if (token_id(stored) == tokenizer.eos_id()) {
        EXPECT_FALSE(is_target(stored)) << "a conversation ends with a turn marker's newline, not a target";
        EXPECT_EQ(answers.count(tokenizer.decode(targets)), 1u) << tokenizer.decode(targets);
        targets.clear();
        ++checked;
        continue;
      }
      if (is_target(stored)) targets.push_back(token_id(stored));
    }
  }
  EXPECT_EQ(checked, 24);

  const CommandResult refused = run_cli("tokenize --input " + (root / "chat.jsonl").string() + " --out " +
                                        (root / "refused").string() + " --tokenizer " +
                                        (d.data_dir / "tokenizer.model").string());
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("has no piece <|im_start|>"), std::string::npos) << refused.output;

  // --chat-markers: a tokenizer trained on plain text holds the markers too, so the conversations
  // tokenize with it (a model pretrained on that text fine-tunes on them).
  std::string text;
  for (int i = 0; i < 30; ++i) text += "You count. Start at " + std::to_string(i) + ", again " + std::to_string(i + 2) + " done\n";
  write_text(root / "plain.txt", text);
  const fs::path plain = root / "plain";
  for (const bool markers : {false, true}) {
    const CommandResult r = run_cli("tokenize --input " + (root / "plain.txt").string() + " --out " + plain.string() +
                                    " --doc-per-line --vocab-size 300" + (markers ? " --chat-markers" : ""));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(Tokenizer((plain / "tokenizer.model").string()).has_piece("<|im_start|>"), markers);
  }
  const CommandResult chat = run_cli("tokenize --input " + (root / "chat.jsonl").string() + " --out " +
                                     (root / "chat_on_plain").string() + " --tokenizer " +
                                     (plain / "tokenizer.model").string());
  EXPECT_EQ(chat.status, 0) << chat.output;
}

// A model fine-tuned on conversations answers a user turn and `generate` stops at the end of the
// answer's turn (<|im_end|>, the tokenizer's piece), printing none of it or what would follow.
TEST(FineTuning, GenerationStopsAtTheEndOfAnAssistantTurn) {
  const fs::path root = test_data().root / "fine_tuning_chat_generate";
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path data = root / "data";
  const CommandResult tokenized = tokenize_counting_chat(root, data);
  ASSERT_EQ(tokenized.status, 0) << tokenized.output;
  const fs::path config = root / "tiny.json";
  write_config(config, 300);
  const fs::path run = root / "run";
  const CommandResult trained = run_cli("train --config " + config.string() + " --data " + data.string() + " --out " +
                                        run.string() + " --batch 4 --seq-len 32 --steps 60 --lr 1e-2" + kSmallMfuGemm);
  ASSERT_EQ(trained.status, 0) << trained.output;
  const std::string prompt = "<|im_start|>user\nStart at 3<|im_end|>\n<|im_start|>assistant\n";
  for (const int seed : {1, 2, 3}) {
    const CommandResult r = run_cli("generate --checkpoint " + run.string() + " --prompt '" + prompt +  // newlines quoted
                                    "' --max-new-tokens 20 --seed " + std::to_string(seed));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("stopped at <|im_end|>"), std::string::npos) << "seed " << seed << ": " << r.output;
    const size_t answer = r.output.find(prompt);
    ASSERT_NE(answer, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("<|im_end|>", answer + prompt.size()), std::string::npos) << "seed " << seed << ": " << r.output;
  }
}

}  // namespace
}  // namespace trillion::train_test
