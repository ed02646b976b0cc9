// `trillion eval` and `trillion generate` on the tiny trained checkpoint of the fixture.
#include <gtest/gtest.h>

#include <cmath>

#include "data/baselines.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(EvalCli, ReportsLossPerplexityBitsPerByteAndBaseline) {
  const TestData& d = test_data();
  const CommandResult r = run_cli("eval --checkpoint " + trained_run().string() + " --data " + d.data_dir.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json s = last_json_line(r.output);
  const double loss = s["val_loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0);
  EXPECT_NEAR(s["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  EXPECT_EQ(s["seq_len"], 16);  // the checkpoint's training seq_len
  EXPECT_EQ(s["windows"], s["total_windows"]);
  // Bits per byte over the whole split: loss · targets / ln 2 / text bytes.
  const TokenShard val = read_token_shard((d.data_dir / "val.bin").string());
  EXPECT_EQ(s["tokens"].get<int64_t>(), static_cast<int64_t>(val.tokens.size()) - 1);
  const double expected_bpb = loss * s["tokens"].get<double>() / std::log(2.0) / static_cast<double>(val.text_bytes);
  EXPECT_NEAR(s["bits_per_byte"].get<double>(), expected_bpb, 1e-9 * expected_bpb);
  // 40 steps on this corpus beat the unigram model; the bigram baseline of the same split is the
  // train split's bigram model scored on it (data/baselines.h).
  EXPECT_LT(loss, s["unigram_baseline_nats"].get<double>());
  const DataDir data = open_data_dir(d.data_dir.string(), 0);
  const double bigram = BigramBaseline(data.train.streams(), d.vocab_size).cross_entropy(data.val.streams());
  EXPECT_EQ(s["bigram_baseline_nats"].get<double>(), bigram);
  EXPECT_LT(bigram, s["unigram_baseline_nats"].get<double>());
}

TEST(EvalCli, EqualsTheTrainersValidationLossOnTheSameWindows) {
  // The trainer evaluated after step 40 on the first --eval-batches 8 batches of --batch 2 windows of
  // 16 tokens; eval of checkpoint-000040 over the same windows, same thread count, gives the same bits.
  const CommandResult r = run_cli("eval --checkpoint " + (trained_run() / "checkpoint-000040").string() + " --data " +
                                  test_data().data_dir.string() + " --batch 2 --max-batches 8 --seq-len 16");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json s = last_json_line(r.output);
  const nlohmann::json last = read_metrics(trained_run()).back();
  ASSERT_EQ(last["step"], 40);
  EXPECT_EQ(s["tokens"], last["val_tokens"]);
  EXPECT_EQ(s["val_loss"].get<double>(), last["val_loss"].get<double>());
}

TEST(EvalCli, MaxBatchesTruncates) {
  const CommandResult r = run_cli("eval --checkpoint " + trained_run().string() + " --data " +
                                  test_data().data_dir.string() + " --batch 3 --max-batches 2 --seq-len 8");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json s = last_json_line(r.output);
  EXPECT_EQ(s["windows"], 6);
  EXPECT_EQ(s["tokens"], 48);
  EXPECT_GT(s["total_windows"].get<int64_t>(), 6);
  EXPECT_GT(s["bits_per_byte"].get<double>(), 0.0);
}

TEST(GenerateCli, GreedyIsDeterministicAndContinuesThePrompt) {
  const std::string args = "generate --checkpoint " + trained_run().string() +
                           " --prompt 'the cat' --max-new-tokens 12 --temperature 0";
  const CommandResult a = run_cli(args, "OMP_NUM_THREADS=1", true), b = run_cli(args, "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.output.rfind("the cat", 0), 0u) << a.output;
  EXPECT_GT(a.output.find('\n'), std::string("the cat").size()) << "nothing generated: " << a.output;
}

TEST(GenerateCli, SamplingIsReproducibleBySeed) {
  const std::string args = "generate --checkpoint " + (trained_run() / "checkpoint-000040").string() + " --data " +
                           test_data().data_dir.string() +
                           " --prompt 'a dog' --max-new-tokens 16 --temperature 1.0 --top-p 0.9 --seed ";
  const CommandResult a = run_cli(args + "5", "OMP_NUM_THREADS=1", true), b = run_cli(args + "5", "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_GT(a.output.size(), std::string("a dog\n").size());
  // Another seed draws other tokens (16 draws at temperature 1 all agreeing is vanishingly unlikely).
  const CommandResult c = run_cli(args + "6", "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(a.output, c.output);
}

TEST(GenerateCli, RejectsAnotherTokenizer) {
  const CommandResult r = run_cli("generate --checkpoint " + trained_run().string() + " --data " +
                                  test_data().other_data_dir.string() + " --prompt x --max-new-tokens 2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("tokenizer_hash"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trillion::train_test
