// Bad input to `trillion train` (and eval): non-zero exit with one "error: ..." line naming the
// file or field at fault.
#include <gtest/gtest.h>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

// Exit status 1 and exactly one line of output, "error: ...", containing every `expected` part.
void expect_one_line_error(const CommandResult& r, const std::vector<std::string>& expected) {
  EXPECT_EQ(r.status, 1) << r.output;
  ASSERT_FALSE(r.output.empty());
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "more than one line: " << r.output;
  for (const std::string& part : expected) EXPECT_NE(r.output.find(part), std::string::npos) << part << " in " << r.output;
}

TEST(TrainErrors, MissingDataDirectory) {
  const TestData& d = test_data();
  const fs::path missing = d.root / "no_such_data";
  const CommandResult r = run_cli("train --config " + d.config_path.string() + " --data " + missing.string() +
                                  " --out " + (d.root / "err_missing").string() + " --steps 2 --seq-len 16");
  expect_one_line_error(r, {missing.string()});
}

TEST(TrainErrors, ModelVocabDiffersFromDataVocab) {
  const TestData& d = test_data();
  const CommandResult r = run_cli("train --config " + d.small_vocab_config_path.string() + " --data " +
                                  d.data_dir.string() + " --out " + (d.root / "err_vocab").string() + " --steps 2 --seq-len 16");
  expect_one_line_error(r, {"vocab", "64"});
}

TEST(TrainErrors, ResumeWithDataOfAnotherTokenizer) {
  const TestData& d = test_data();
  const CommandResult r =
      run_cli("train --resume " + trained_run().string() + " --data " + d.other_data_dir.string());
  expect_one_line_error(r, {"trainer_state.json", "tokenizer_hash"});
}

TEST(TrainErrors, ResumeWithOtherDataOfTheSameTokenizer) {
  // A copy of the data directory whose train.bin holds other tokens (the first half only).
  const TestData& d = test_data();
  const fs::path other = d.root / "same_tokenizer_other_tokens";
  fs::remove_all(other);
  fs::copy(d.data_dir, other, fs::copy_options::recursive);
  const TokenShard train = read_token_shard((d.data_dir / "train.bin").string());
  const std::vector<int32_t> half(train.tokens.begin(), train.tokens.begin() + train.tokens.size() / 2);
  write_token_shard((other / "train.bin").string(), half, train.vocab_size, train.tokenizer_hash, train.text_bytes / 2);
  const CommandResult r = run_cli("train --resume " + trained_run().string() + " --data " + other.string());
  expect_one_line_error(r, {"trainer_state.json", "'train_checksum'", (other / "train.bin").string()});
}

TEST(TrainErrors, ResumeOfANonCheckpointDirectory) {
  const TestData& d = test_data();
  const CommandResult r = run_cli("train --resume " + d.data_dir.string());
  expect_one_line_error(r, {d.data_dir.string(), "trainer_state.json"});
}

TEST(TrainErrors, ResumeWithDifferentRunSettings) {
  const CommandResult batch = run_cli("train --resume " + trained_run().string() + " --batch 4");
  expect_one_line_error(batch, {"trainer_state.json", "'batch'", "--batch 4"});
  const CommandResult dtype = run_cli("train --resume " + trained_run().string() + " --dtype float64");
  expect_one_line_error(dtype, {"'dtype'", "float64"});
}

TEST(TrainErrors, ResumeWithAnotherModelConfig) {
  const TestData& d = test_data();
  const fs::path config = d.root / "wider.json";
  nlohmann::json json = nlohmann::json::parse(read_text(d.config_path));
  json["intermediate_size"] = 32;
  write_text(config, json.dump());
  const CommandResult r =
      run_cli("train --resume " + trained_run().string() + " --config " + config.string());
  expect_one_line_error(r, {config.string(), "intermediate_size", "config.json"});
}

TEST(TrainErrors, ResumeOfAFinishedRun) {
  const CommandResult r = run_cli("train --resume " + trained_run().string());
  expect_one_line_error(r, {"already finished", "--steps"});
}

TEST(TrainErrors, NewRunIntoAnExistingRunDirectory) {
  const CommandResult r = run_cli("train " + tiny_run_flags(trained_run()) + " --steps 2");
  expect_one_line_error(r, {"latest", "--resume"});
}

TEST(TrainErrors, EvalWithDataOfAnotherTokenizer) {
  const CommandResult r = run_cli("eval --checkpoint " + trained_run().string() + " --data " +
                                  test_data().other_data_dir.string());
  expect_one_line_error(r, {"tokenizer_hash"});
}

TEST(TrainErrors, ConfigWithUnknownLayerType) {
  const TestData& d = test_data();
  const fs::path config = d.root / "bad_layer_types.json";
  nlohmann::json json = nlohmann::json::parse(read_text(d.config_path));
  json["layer_types"] = {"full_attention", "mamba"};
  write_text(config, json.dump());
  const CommandResult r = run_cli("train --config " + config.string() + " --data " + d.data_dir.string() +
                                  " --out " + (d.root / "err_layer_types").string() + " --steps 2 --seq-len 16");
  expect_one_line_error(r, {config.string(), "layer_types", "mamba", "full_attention"});
}

TEST(TrainErrors, ConfigWithALayerKindNotBuiltYet) {
  const TestData& d = test_data();
  const fs::path config = d.root / "linear_layer.json";
  nlohmann::json json = nlohmann::json::parse(read_text(d.config_path));
  json["layer_types"] = {"full_attention", "linear_attention"};
  json["linear_num_key_heads"] = 2;
  json["linear_num_value_heads"] = 2;
  json["linear_key_head_dim"] = 4;
  json["linear_value_head_dim"] = 4;
  write_text(config, json.dump());
  const CommandResult r = run_cli("train --config " + config.string() + " --data " + d.data_dir.string() +
                                  " --out " + (d.root / "err_linear").string() + " --steps 2 --seq-len 16");
  expect_one_line_error(r, {"linear_attention", "not built yet"});
}

// A copy of the trained run whose checkpoint-000020/trainer_state.json has `field` set to `value`.
fs::path run_with_edited_state(const std::string& name, const char* field, const nlohmann::json& value) {
  const fs::path copy = test_data().root / name;
  fs::remove_all(copy);
  fs::create_directories(copy);
  fs::copy(trained_run() / "checkpoint-000020", copy / "checkpoint-000020", fs::copy_options::recursive);
  write_text(copy / "latest", "checkpoint-000020\n");
  const fs::path state_path = copy / "checkpoint-000020" / "trainer_state.json";
  nlohmann::json state = nlohmann::json::parse(read_text(state_path));
  state[field] = value;
  write_text(state_path, state.dump(2));
  return copy;
}

TEST(TrainErrors, ResumeWithANegativeSamplerPosition) {
  const fs::path run = run_with_edited_state("negative_position", "sampler_position", -3);
  const CommandResult r = run_cli("train --resume " + run.string());
  expect_one_line_error(r, {"trainer_state.json", "'sampler_position'", ">= 0", "-3"});
  const fs::path tokens = run_with_edited_state("negative_tokens", "tokens_seen", -640);
  expect_one_line_error(run_cli("train --resume " + tokens.string()), {"trainer_state.json", "'tokens_seen'", "-640"});
}

TEST(TrainErrors, OutputDirectoryUnderARegularFile) {
  // create_directories throws std::filesystem_error: main turns it into one "error: ..." line too.
  const TestData& d = test_data();
  const fs::path out = d.root / "corpus.txt" / "run";
  const CommandResult r = run_cli("train " + tiny_run_flags(out) + " --steps 2");
  expect_one_line_error(r, {out.string()});
}

TEST(TrainErrors, EvalOfATruncatedCheckpoint) {
  const fs::path copy = test_data().root / "truncated_checkpoint";
  fs::remove_all(copy);
  fs::copy(trained_run() / "checkpoint-000040", copy, fs::copy_options::recursive);
  const fs::path weights = copy / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) - 100);
  const CommandResult r = run_cli("eval --checkpoint " + copy.string() + " --data " + test_data().data_dir.string());
  expect_one_line_error(r, {weights.string(), "truncated"});
}

}  // namespace
}  // namespace trillion::train_test
