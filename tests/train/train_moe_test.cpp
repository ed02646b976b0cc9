// `trillion train` on a tiny MoE model (glm4_moe: sigmoid router with correction bias, groups,
// shared expert): metrics carry the routing statistics and loss terms, --moe-bias-rate moves the
// router bias after each step (it is a buffer: saved, never touched by AdamW), and a resumed MoE
// run equals an uninterrupted one bitwise.
#include <gtest/gtest.h>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

fs::path moe_config() {
  static const fs::path path = [] {
    nlohmann::json config =
        nlohmann::json::parse(read_file(std::string(TRILLION_SOURCE_DIR) + "/configs/models/tiny_glm4_moe.json"));
    config["vocab_size"] = test_data().vocab_size;
    const fs::path out = test_data().root / "tiny_glm4_moe.json";
    write_text(out, config.dump(2));
    return out;
  }();
  return path;
}

std::string moe_flags(const fs::path& out) {
  return "--config " + moe_config().string() + " --data " + test_data().data_dir.string() + " --out " + out.string() +
         " --batch 2 --seq-len 16 --lr 1e-2 --warmup 2 --log-every 10" + kSmallMfuGemm;
}

TEST(TrainMoe, MetricsCarryRoutingAndTheBiasMoves) {
  const fs::path out = test_data().root / "moe_bias";
  const CommandResult r = run_cli("train " + moe_flags(out) + " --steps 4 --moe-bias-rate 0.01");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<nlohmann::json> metrics = read_metrics(out);
  ASSERT_EQ(metrics.size(), 4u);
  for (const nlohmann::json& m : metrics) {
    ASSERT_EQ(m.at("moe_layers").size(), 2u) << m.dump();  // layers 1 and 2 (first_k_dense_replace 1)
    int64_t assigned = 0;
    for (int64_t c : m.at("moe_layers")[0].at("tokens_per_expert")) assigned += c;
    EXPECT_EQ(assigned, 2 * 16 * 2) << "every token's 2 experts counted";
    EXPECT_GE(m.at("expert_load_max_over_mean").get<double>(), 1.0);
    EXPECT_EQ(m.at("dropped_tokens"), 0);
    EXPECT_EQ(m.at("loss"), m.at("lm_loss"));  // glm4_moe has no aux loss in transformers
  }
  // After each step every layer's bias moves by 0.01 · sign(mean load − load) of that step's counts:
  // the saved biases are exactly that sum over the 4 steps (in float, as the trainer adds them).
  const SafetensorsReader weights((out / "checkpoint-000004" / "model.safetensors").string());
  for (int moe = 0; moe < 2; ++moe) {
    const int layer = metrics[0].at("moe_layers")[moe].at("layer");
    std::vector<float> expected(8, 0.0f), bias(8);
    for (const nlohmann::json& m : metrics) {
      const std::vector<int64_t> load = m.at("moe_layers")[moe].at("tokens_per_expert");
      double mean = 0.0;
      for (int64_t c : load) mean += double(c) / 8.0;
      for (int e = 0; e < 8; ++e) expected[e] += 0.01f * float((mean > load[e]) - (mean < load[e]));
    }
    weights.read("model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias", {8}, bias.data());
    EXPECT_EQ(bias, expected) << "layer " << layer;
    EXPECT_NE(bias, std::vector<float>(8, 0.0f)) << "layer " << layer;
  }
  const SafetensorsReader optimizer((out / "checkpoint-000004" / "optimizer.safetensors").string());
  EXPECT_FALSE(optimizer.contains("model.layers.1.mlp.gate.e_score_correction_bias.exp_avg"));
}

TEST(TrainMoe, ResumeIsBitwiseIdentical) {
  const fs::path straight = test_data().root / "moe_straight", interrupted = test_data().root / "moe_interrupted";
  const std::string flags = " --steps 6 --moe-bias-rate 0.001";
  ASSERT_EQ(run_cli("train " + moe_flags(straight) + flags).status, 0);
  ASSERT_EQ(run_cli("train " + moe_flags(interrupted) + flags + " --stop-after 3").status, 0);
  const CommandResult resumed = run_cli("train --resume " + interrupted.string() + kSmallMfuGemm);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const std::vector<nlohmann::json> a = read_metrics(straight), b = read_metrics(interrupted);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << i;
    EXPECT_EQ(a[i]["moe_layers"], b[i]["moe_layers"]) << i;
  }
  EXPECT_EQ(read_text(straight / "checkpoint-000006" / "model.safetensors"),
            read_text(interrupted / "checkpoint-000006" / "model.safetensors"));
}

// Recompute and swap change memory, never results: the same losses as keep-all, bitwise, with the
// store's work in each step's "memory" record.
TEST(TrainMoe, MemoryPoliciesKeepTheLosses) {
  const fs::path keep = test_data().root / "moe_keep", policies = test_data().root / "moe_policies";
  const std::string flags = " --steps 3 --policy-min-bytes 1";
  ASSERT_EQ(run_cli("train " + moe_flags(keep) + flags).status, 0);
  const CommandResult r =
      run_cli("train " + moe_flags(policies) + flags + " --recompute selective --swap attn_out,q,k,v,attn_norm_out");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<nlohmann::json> a = read_metrics(keep), b = read_metrics(policies);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << i;
    EXPECT_EQ(a[i]["memory"]["recompute_dropped_bytes"], 0);
    const nlohmann::json& m = b[i]["memory"];
    EXPECT_GT(m["recompute_dropped_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(m["recomputed_bytes"], m["recompute_dropped_bytes"]);
    EXPECT_GT(m["swapped_out_bytes"].get<int64_t>(), 0);
    EXPECT_LE(m["swap_read_bytes"].get<int64_t>(), m["swapped_out_bytes"].get<int64_t>());
    EXPECT_EQ(m["saved_bytes"], a[i]["memory"]["saved_bytes"]);
  }
  const CommandResult both = run_cli("train " + moe_flags(test_data().root / "moe_both") + " --steps 1 --recompute "
                                     "selective --swap selective");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("a tensor is either recomputed or swapped"), std::string::npos) << both.output;
  const CommandResult unknown = run_cli("train " + moe_flags(test_data().root / "moe_unknown") + " --steps 1 --swap qq");
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.output.find("unknown activation tag \"qq\""), std::string::npos) << unknown.output;
}

// --dry-run prints the plan without training; --memory-budget picks the cheapest policy that fits
// (here the budget of full recompute: something cheaper may fit too) and the run's fast-tier peak
// stays under it; a budget nothing meets is refused before training, naming the smallest.
TEST(TrainMoe, MemoryBudgetAndDryRun) {
  const std::string step = " --config " + moe_config().string() + " --data " + test_data().data_dir.string() +
                           " --batch 2 --seq-len 16 --policy-min-bytes 1";
  const CommandResult dry = run_cli("train" + step + " --dry-run", "OMP_NUM_THREADS=1", /*stdout_only=*/true);
  ASSERT_EQ(dry.status, 0) << dry.output;
  const nlohmann::json plan = nlohmann::json::parse(dry.output);
  EXPECT_EQ(plan["policy"]["name"], "keep-all");
  const int64_t keep_peak = plan["fast"]["peak"];
  EXPECT_EQ(keep_peak, plan["fast"]["parameters"].get<int64_t>() + plan["fast"]["gradients"].get<int64_t>() +
                           plan["fast"]["optimizer_state"].get<int64_t>() + plan["fast"]["model_buffers"].get<int64_t>() +
                           plan["fast"]["activations_at_peak"].get<int64_t>() +
                           plan["fast"]["workspace_at_peak"].get<int64_t>());
  ASSERT_EQ(plan["candidates"].size(), 6u);
  int64_t full_peak = 0, smallest = keep_peak;
  for (const nlohmann::json& c : plan["candidates"]) {
    if (c["policy"] == "recompute full") full_peak = c["peak_fast"];
    smallest = std::min(smallest, c["peak_fast"].get<int64_t>());
  }
  ASSERT_GT(full_peak, 0);
  ASSERT_LT(full_peak, keep_peak);

  const fs::path out = test_data().root / "moe_budget";
  const CommandResult r = run_cli("train " + moe_flags(out) + " --steps 2 --policy-min-bytes 1 --memory-budget " +
                                  std::to_string(full_peak));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("memory plan ("), std::string::npos) << r.output;
  for (const nlohmann::json& m : read_metrics(out)) {
    EXPECT_NE(m["memory"]["policy"], "keep-all");
    EXPECT_EQ(m["memory"]["budget_bytes"], full_peak);
    EXPECT_LE(m["memory"]["planned_peak_bytes"].get<int64_t>(), full_peak);
    EXPECT_LE(m["peak_bytes"].get<int64_t>(), full_peak) << "the step stayed under the budget: " << m.dump();
  }
  const CommandResult tight = run_cli("train " + moe_flags(test_data().root / "moe_tight") +
                                      " --steps 1 --policy-min-bytes 1 --memory-budget " + std::to_string(smallest - 1));
  EXPECT_NE(tight.status, 0);
  EXPECT_NE(tight.output.find("no policy fits; the smallest peak is " + std::to_string(smallest) + " bytes"),
            std::string::npos)
      << tight.output;
  EXPECT_FALSE(fs::exists(test_data().root / "moe_tight" / "metrics.jsonl"));
}

}  // namespace
}  // namespace trillion::train_test
