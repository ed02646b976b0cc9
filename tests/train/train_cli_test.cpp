// `trillion train` end to end on a tiny model: resume equals an uninterrupted run bitwise, thread
// count and gradient accumulation change losses only by rounding, checkpoint contents.
#include <gtest/gtest.h>

#include <cmath>

#include "io/safetensors.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

double max_relative_difference(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                               const char* field) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = a[i][field].get<double>(), y = b[i][field].get<double>();
    worst = std::max(worst, std::fabs(x - y) / std::max(std::fabs(y), 1e-30));
  }
  return worst;
}

TEST(TrainCli, ResumeEqualsUninterruptedRunBitwise) {
  const fs::path straight = trained_run();
  const fs::path interrupted = test_data().root / "interrupted";
  const CommandResult first = run_cli("train " + tiny_run_flags(interrupted) + " --steps 40 --stop-after 20 --eval-every 20");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(read_text(interrupted / "latest"), "checkpoint-000020\n");
  EXPECT_EQ(read_metrics(interrupted).size(), 20u);
  // Resume from the output directory with only the flags that do not define the run.
  const CommandResult second =
      run_cli("train --resume " + interrupted.string() + " --steps 40 --eval-every 20" + kSmallMfuGemm);
  // The same with two threads: resume is bitwise at any fixed thread count.
  const fs::path straight2 = test_data().root / "straight_2threads", interrupted2 = test_data().root / "interrupted_2threads";
  const std::string flags2 = " --steps 10 --eval-every 5";
  ASSERT_EQ(run_cli("train " + tiny_run_flags(straight2) + flags2, kTwoThreads).status, 0);
  ASSERT_EQ(run_cli("train " + tiny_run_flags(interrupted2) + flags2 + " --stop-after 5", kTwoThreads).status, 0);
  ASSERT_EQ(run_cli("train --resume " + interrupted2.string() + kSmallMfuGemm, kTwoThreads).status, 0);
  const std::vector<nlohmann::json> a2 = read_metrics(straight2), b2 = read_metrics(interrupted2);
  ASSERT_EQ(a2.size(), 10u);
  ASSERT_EQ(b2.size(), 10u);
  for (size_t i = 0; i < a2.size(); ++i) EXPECT_EQ(a2[i]["loss"].get<double>(), b2[i]["loss"].get<double>()) << i + 1;
  ASSERT_EQ(second.status, 0) << second.output;

  const std::vector<nlohmann::json> a = read_metrics(straight), b = read_metrics(interrupted);
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(b[i]["step"], static_cast<int64_t>(i + 1));
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["lr"].get<double>(), b[i]["lr"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]);
  }
  EXPECT_EQ(a[19]["val_loss"].get<double>(), b[19]["val_loss"].get<double>());
  EXPECT_EQ(a[39]["val_loss"].get<double>(), b[39]["val_loss"].get<double>());
  // The final weights and optimizer state are identical files.
  EXPECT_EQ(read_text(straight / "checkpoint-000040" / "model.safetensors"),
            read_text(interrupted / "checkpoint-000040" / "model.safetensors"));
  EXPECT_EQ(read_text(straight / "checkpoint-000040" / "optimizer.safetensors"),
            read_text(interrupted / "checkpoint-000040" / "optimizer.safetensors"));
  // The loss went down.
  EXPECT_LT(a[39]["loss"].get<double>(), a[0]["loss"].get<double>() - 0.5);
}

TEST(TrainCli, Float64ResumeIsBitwiseToo) {
  const fs::path straight = test_data().root / "f64_straight", interrupted = test_data().root / "f64_interrupted";
  const std::string flags = " --steps 6 --dtype float64";
  ASSERT_EQ(run_cli("train " + tiny_run_flags(straight) + flags).status, 0);
  ASSERT_EQ(run_cli("train " + tiny_run_flags(interrupted) + flags + " --stop-after 3").status, 0);
  const CommandResult r = run_cli("train --resume " + interrupted.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<nlohmann::json> a = read_metrics(straight), b = read_metrics(interrupted);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i + 1;
  const SafetensorsReader weights((straight / "checkpoint-000006" / "model.safetensors").string());
  EXPECT_EQ(weights.tensors().begin()->second.dtype, DType::F64);
}

TEST(TrainCli, ResumeDropsMetricsBeyondTheCheckpoint) {
  const fs::path out = test_data().root / "truncated_metrics";
  ASSERT_EQ(run_cli("train " + tiny_run_flags(out) + " --steps 12 --stop-after 6 --save-every 4").status, 0);
  // Interrupted after step 6 but resumed from checkpoint 4: steps 5 and 6 are written once more.
  const fs::path checkpoint = out / "checkpoint-000004";
  // A line cut short by the interruption is dropped as well.
  write_text(out / "metrics.jsonl", read_text(out / "metrics.jsonl") + "{\"step\": 7, \"lo");
  const CommandResult r = run_cli("train --resume " + checkpoint.string() + kSmallMfuGemm);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<nlohmann::json> records = read_metrics(out);
  ASSERT_EQ(records.size(), 12u);
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(records[i]["step"], static_cast<int64_t>(i + 1));
}

TEST(TrainCli, ResumeFromAnOlderCheckpointReplacesTheNewerOnes) {
  const fs::path out = test_data().root / "replaced_checkpoints";
  ASSERT_EQ(run_cli("train " + tiny_run_flags(out) + " --steps 8 --stop-after 6 --save-every 2").status, 0);
  ASSERT_EQ(read_text(out / "latest"), "checkpoint-000006\n");
  const std::string old_weights = read_text(out / "checkpoint-000006" / "model.safetensors");
  // Resumed from step 2 with a longer schedule: checkpoints 4 and 6 exist and are exchanged for new ones.
  const CommandResult r =
      run_cli("train --resume " + (out / "checkpoint-000002").string() + " --steps 20 --stop-after 6 --save-every 2" +
              kSmallMfuGemm);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_text(out / "latest"), "checkpoint-000006\n");
  for (const char* name : {"checkpoint-000004", "checkpoint-000006"}) {
    for (const char* file : {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json",
                             "tokenizer.model"}) {
      EXPECT_TRUE(fs::exists(out / name / file)) << name << "/" << file;
    }
    const nlohmann::json state = nlohmann::json::parse(read_text(out / name / "trainer_state.json"));
    EXPECT_EQ(state["steps"], 20) << name;
  }
  EXPECT_EQ(nlohmann::json::parse(read_text(out / "checkpoint-000006" / "trainer_state.json"))["step"], 6);
  EXPECT_NE(read_text(out / "checkpoint-000006" / "model.safetensors"), old_weights);
  for (const auto& entry : fs::directory_iterator(out)) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << "temporary left behind: " << entry.path();
  }
}

// What the engine guarantees across thread counts: its own kernels reduce in an order fixed by the
// sizes alone (bitwise equal at 1 and 2 threads), while OpenBLAS may split its GEMMs differently and
// round differently. So a run at another thread count agrees to float32 rounding, amplified by 5
// optimizer steps: 1e-5 relative on the loss, 1e-4 on the gradient norm (measured here: 0, bitwise
// equal: OpenBLAS does not split GEMMs this small across threads).
TEST(TrainCli, ThreadCountChangesLossesOnlyByRounding) {
  const fs::path one = test_data().root / "threads1", two = test_data().root / "threads2";
  const std::string flags = " --steps 5 --seed 11";
  const CommandResult r1 = run_cli("train " + tiny_run_flags(one) + flags, "OMP_NUM_THREADS=1");
  const CommandResult r2 = run_cli("train " + tiny_run_flags(two) + flags, kTwoThreads);
  ASSERT_EQ(r1.status, 0) << r1.output;
  ASSERT_EQ(r2.status, 0) << r2.output;
  const std::vector<nlohmann::json> a = read_metrics(one), b = read_metrics(two);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  EXPECT_LE(max_relative_difference(a, b, "loss"), 1e-5);
  EXPECT_LE(max_relative_difference(a, b, "grad_norm"), 1e-4);
}

TEST(TrainCli, GradientAccumulationMatchesOneLargerBatch) {
  const fs::path batched = test_data().root / "batch2", accumulated = test_data().root / "accum2";
  const TestData& d = test_data();
  const std::string common = " --config " + d.config_path.string() + " --data " + d.data_dir.string() +
                             " --seq-len 16 --steps 5 --lr 1e-2 --warmup 1" + kSmallMfuGemm;
  const CommandResult r1 = run_cli("train --out " + batched.string() + common + " --batch 2 --grad-accum 1");
  const CommandResult r2 = run_cli("train --out " + accumulated.string() + common + " --batch 1 --grad-accum 2");
  ASSERT_EQ(r1.status, 0) << r1.output;
  ASSERT_EQ(r2.status, 0) << r2.output;
  const std::vector<nlohmann::json> a = read_metrics(batched), b = read_metrics(accumulated);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  EXPECT_LE(max_relative_difference(a, b, "loss"), 1e-5);
  EXPECT_LE(max_relative_difference(a, b, "grad_norm"), 1e-4);
  EXPECT_EQ(a[4]["tokens"], b[4]["tokens"]);
}

TEST(TrainCli, CheckpointContents) {
  const fs::path out = trained_run();
  for (const char* name : {"checkpoint-000010", "checkpoint-000020", "checkpoint-000030", "checkpoint-000040"}) {
    for (const char* file : {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json",
                             "tokenizer.model"}) {
      EXPECT_TRUE(fs::exists(out / name / file)) << name << "/" << file;
    }
  }
  EXPECT_EQ(read_text(out / "latest"), "checkpoint-000040\n");
  for (const auto& entry : fs::directory_iterator(out)) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << "temporary left behind: " << entry.path();
  }
  const nlohmann::json state = nlohmann::json::parse(read_text(out / "checkpoint-000020" / "trainer_state.json"));
  EXPECT_EQ(state["step"], 20);
  EXPECT_EQ(state["steps"], 40);
  EXPECT_EQ(state["dtype"], "float32");
  EXPECT_EQ(state["batch"], 2);
  EXPECT_EQ(state["seq_len"], 16);
  EXPECT_EQ(state["grad_accum"], 1);
  EXPECT_EQ(state["sampler_position"], 40);  // 20 steps × 2 windows
  EXPECT_EQ(state["tokens_seen"], 20 * 2 * 16);
  EXPECT_EQ(state["lr_schedule"]["warmup"], 4);
  EXPECT_EQ(state["lr_schedule"]["peak_lr"], 1e-2);
  const TokenShard shard = read_token_shard((test_data().data_dir / "train.bin").string());
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(shard.tokenizer_hash));
  EXPECT_EQ(state["tokenizer_hash"], hash);
  const nlohmann::json config = nlohmann::json::parse(read_text(out / "checkpoint-000020" / "config.json"));
  EXPECT_EQ(config["vocab_size"], test_data().vocab_size);
  // Every weight has both moments, same shape.
  const SafetensorsReader weights((out / "checkpoint-000020" / "model.safetensors").string());
  const SafetensorsReader optimizer((out / "checkpoint-000020" / "optimizer.safetensors").string());
  EXPECT_EQ(optimizer.tensors().size(), 2 * weights.tensors().size());
  for (const auto& [name, info] : weights.tensors()) {
    ASSERT_TRUE(optimizer.contains(name + ".exp_avg")) << name;
    ASSERT_TRUE(optimizer.contains(name + ".exp_avg_sq")) << name;
    EXPECT_EQ(optimizer.info(name + ".exp_avg").shape, info.shape) << name;
  }
  // metrics.jsonl: one object per step with the contract's fields.
  const std::vector<nlohmann::json> records = read_metrics(out);
  ASSERT_EQ(records.size(), 40u);
  for (const char* field : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes", "peak_rss_bytes",
                            "tokens", "elapsed_s"}) {
    EXPECT_TRUE(records[7].contains(field)) << field;
  }
  EXPECT_GT(records[7]["peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(records[7]["peak_rss_bytes"].get<int64_t>(), records[7]["peak_bytes"].get<int64_t>());
  EXPECT_TRUE(records[19].contains("val_loss"));
  EXPECT_FALSE(records[18].contains("val_loss"));
  // float32: MFU against the sgemm ceiling (a 128³ one here, --mfu-gemm-size), a positive fraction.
  ASSERT_TRUE(records[7].contains("mfu"));
  EXPECT_GT(records[7]["mfu"].get<double>(), 0.0);
  // ...and against the physical peak, which no product passes: a smaller positive fraction.
  ASSERT_TRUE(records[7].contains("mfu_peak"));
  EXPECT_GT(records[7]["mfu_peak"].get<double>(), 0.0);
  EXPECT_LT(records[7]["mfu_peak"].get<double>(), 1.0);
}

TEST(TrainCli, InitStartsANewRunFromTrainedWeights) {
  const fs::path out = test_data().root / "finetune";
  const fs::path fresh = test_data().root / "fresh";
  const TestData& d = test_data();
  const std::string flags = " --data " + d.data_dir.string() + " --batch 2 --seq-len 16 --steps 3 --warmup 2" + kSmallMfuGemm;
  const CommandResult r = run_cli("train --init " + trained_run().string() + " --out " + out.string() + flags);
  ASSERT_EQ(r.status, 0) << r.output;
  const CommandResult f = run_cli("train --config " + d.config_path.string() + " --out " + fresh.string() + flags);
  ASSERT_EQ(f.status, 0) << f.output;
  const std::vector<nlohmann::json> tuned = read_metrics(out), scratch = read_metrics(fresh);
  ASSERT_EQ(tuned.size(), 3u);
  ASSERT_EQ(scratch.size(), 3u);
  // A new run: step 1 with the new schedule, but starting from the trained weights.
  EXPECT_EQ(tuned[0]["step"], 1);
  EXPECT_EQ(tuned[0]["lr"].get<double>(), scratch[0]["lr"].get<double>());
  EXPECT_LT(tuned[0]["loss"].get<double>(), scratch[0]["loss"].get<double>() - 0.5);
  const nlohmann::json state = nlohmann::json::parse(read_text(out / "checkpoint-000003" / "trainer_state.json"));
  EXPECT_EQ(state["step"], 3);
  EXPECT_EQ(state["sampler_position"], 6);
}

}  // namespace
}  // namespace trillion::train_test
