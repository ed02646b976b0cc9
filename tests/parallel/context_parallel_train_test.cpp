// `trillion train --cp C` under mpirun (each sequence split over a context-parallel group of C ranks,
// parallel/context_parallel.h): cp 2 and 4, alone, beside two data shares and beside ep 2, with a
// sequence length no multiple of 2 · cp, give one rank's losses, validation losses and final
// weights in double to relative 1e-10 (attention with dense and MoE FFNs, Gated DeltaNet, KDA, MLA,
// sparse attention with its indexer, packed documents, LoRA with dropout on the attention
// projections, whose masks follow each token to the rank that holds it); each step's metrics report
// what every rank received from its group; and what cp does not run yet is refused before training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

struct TrainedRun {
  std::vector<nlohmann::json> metrics;
  fs::path out;
};

constexpr int kSteps = 4;

// kSteps steps of float64 training of `config` on `ranks` ranks with `flags`, evaluated every 2.
TrainedRun train(const fs::path& config, int ranks, const std::string& flags, const std::string& label) {
  const fs::path out = test_data().root / ("cp_train_" + label);
  fs::remove_all(out);
  const std::string args = "train --config " + config.string() + " --data " + test_data().data_dir.string() +
                           " --out " + out.string() + " --batch 4 --seq-len 13 --lr 1e-3 --warmup 2 --log-every 100" +
                           " --dtype float64 --eval-every 2 --eval-batches 2 --steps " + std::to_string(kSteps) +
                           kSmallMfuGemm + " " + flags;
  const CommandResult r =
      ranks == 1
          ? run_cli(args)
          : run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY + " " + args + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.output;
  return {r.status == 0 ? read_metrics(out) : std::vector<nlohmann::json>{}, out};
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// Every step's losses and validation losses, and the final weights, within 1e-10 of one rank's.
void expect_same_run(const TrainedRun& split, const TrainedRun& single, const std::string& where) {
  ASSERT_EQ(single.metrics.size(), size_t(kSteps)) << where;
  ASSERT_EQ(split.metrics.size(), size_t(kSteps)) << where;
  for (size_t i = 0; i < single.metrics.size(); ++i)
    for (const char* field : {"loss", "lm_loss", "val_loss"}) {
      if (!single.metrics[i].contains(field)) continue;
      EXPECT_LE(relative(split.metrics[i].at(field), single.metrics[i].at(field)), 1e-10)
          << where << ", step " << i + 1 << " " << field;
    }
  const std::string file = "checkpoint-00000" + std::to_string(kSteps) + "/model.safetensors";
  expect_same_tensors(split.out / file, single.out / file, 1e-10);
}

struct Layout {
  int ranks, cp;
};

TEST(ContextParallelTraining, AttentionModelsTrainAsOneRank) {
  const fs::path dense = test_data().config_path;
  const fs::path moe = config_with(
      "tiny_qwen3_moe", {{"output_router_logits", true}, {"router_aux_loss_coef", 0.3}, {"router_z_loss_coef", 0.01}});
  const TrainedRun dense_single = train(dense, 1, "", "dense_1");
  for (const Layout& l : {Layout{2, 2}, Layout{4, 2}, Layout{4, 4}}) {
    const std::string label = "dense_" + std::to_string(l.ranks) + "_cp" + std::to_string(l.cp);
    const TrainedRun split = train(dense, l.ranks, "--cp " + std::to_string(l.cp), label);
    expect_same_run(split, dense_single, label);
    // Every rank receives from its group at every step, forward and backward.
    for (const nlohmann::json& m : split.metrics) {
      ASSERT_TRUE(m.contains("context_parallel")) << label;
      EXPECT_EQ(m.at("context_parallel").at("cp"), l.cp);
      for (const char* field : {"rank_gathered_bytes", "rank_reduced_bytes"}) {
        const std::vector<int64_t> bytes = m.at("context_parallel").at(field);
        ASSERT_EQ(bytes.size(), size_t(l.ranks)) << label;
        for (const int64_t b : bytes) EXPECT_GT(b, 0) << label << " " << field;
      }
    }
  }
  EXPECT_FALSE(dense_single.metrics.back().contains("context_parallel"));
  // Packed documents crossing the ranks' chunks.
  expect_same_run(train(dense, 4, "--cp 2 --document-mask", "documents_4_cp2"),
                  train(dense, 1, "--document-mask", "documents_1"), "documents, cp 2");
  // MoE FFNs with the balance loss and the z-loss (weighted by each rank's tokens), beside expert
  // parallelism.
  const TrainedRun moe_single = train(moe, 1, "", "moe_1");
  expect_same_run(train(moe, 4, "--cp 2 --ep 2", "moe_4_cp2_ep2"), moe_single, "MoE, cp 2 beside ep 2");
}

// Gated DeltaNet beside gated full attention, KDA, KDA beside MLA, and DeepSeek-V3's MLA (RoPE, q
// LoRA): the convolution's halos and the delta rule's state passed across the ranks (at cp 4 chunks of
// 1 and 2 tokens, so a halo reaches over several), MLA's latents gathered.
TEST(ContextParallelTraining, LinearAttentionAndMlaModelsTrainAsOneRank) {
  for (const std::string name :
       {"tiny_qwen3_next_hybrid", "tiny_kimi_linear_kda", "tiny_kimi_linear", "tiny_deepseek_v3"}) {
    const fs::path config = config_with(name, nlohmann::json::object());
    const TrainedRun single = train(config, 1, "", name + "_1");
    expect_same_run(train(config, 2, "--cp 2", name + "_2_cp2"), single, name + ", cp 2");
    expect_same_run(train(config, 4, "--cp 4 --document-mask", name + "_4_cp4_documents"),
                    train(config, 1, "--document-mask", name + "_1_documents"), name + ", cp 4, documents");
  }
}

// Sparse attention with its lightning indexer: MLA's (DeepSeek-V3.2, and the Kimi-K3-like hybrid:
// KDA : sparse MLA = 3 : 1 beside grouped sigmoid-routed experts) and GQA's (Qwen3's attention with
// an indexer), in the indexer's dense stage and its sparse one, each with its loss: the indexer's
// keys gathered, each rank selecting over every earlier position, the loss per chunk with its key
// gradients summed onto their owners; at cp 4 also with packed documents crossing the chunks.
TEST(ContextParallelTraining, SparseAttentionModelsTrainAsOneRank) {
  for (const std::string name : {"tiny_deepseek_v32", "tiny_kimi_k3_like", "tiny_qwen3_sparse"}) {
    const fs::path config = config_with(name, nlohmann::json::object());
    for (const std::string mode : {"dense", "sparse"}) {
      const std::string indexer = "--indexer-loss-coef 0.5 --indexer-mode " + mode;
      const std::string label = name + "_" + mode;
      const TrainedRun single = train(config, 1, indexer, label + "_1");
      expect_same_run(train(config, 2, indexer + " --cp 2", label + "_2_cp2"), single, label + ", cp 2");
      expect_same_run(train(config, 4, indexer + " --cp 4", label + "_4_cp4"), single, label + ", cp 4");
      const std::string documents = indexer + " --document-mask";
      expect_same_run(train(config, 4, documents + " --cp 4", label + "_4_cp4_documents"),
                      train(config, 1, documents, label + "_1_documents"), label + ", cp 4, documents");
    }
  }
}

// LoRA's dropout masks are drawn per token of the step's whole batch (model/linear.h): a rank
// holding a sequence's chunks draws those tokens' masks.
TEST(ContextParallelTraining, LoraDropoutFollowsTheTokensOverTheSplit) {
  const fs::path adapter = test_data().root / "cp_lora_dropout.json";
  write_text(adapter, R"({"target_modules": ["q_proj", "v_proj", "o_proj"], "r": 2, "lora_dropout": 0.25})");
  const std::string flags = "--lora-config " + adapter.string();
  const TrainedRun single = train(test_data().config_path, 1, flags, "lora_1");
  expect_same_run(train(test_data().config_path, 4, flags + " --cp 4", "lora_4_cp4"), single, "LoRA, cp 4");
}

// A policy that re-runs mixers is refused before any step; a --cp that does not divide the ranks,
// and a sequence too short to split, name their flags.
TEST(ContextParallelTraining, WhatItDoesNotRunIsRefusedBeforeTraining) {
  const auto refused = [](const fs::path& config, int ranks, const std::string& flags) {
    const fs::path out = test_data().root / "cp_train_refused";
    fs::remove_all(out);
    const CommandResult r =
        run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY + " train --config " +
                  config.string() + " --data " + test_data().data_dir.string() + " --out " + out.string() +
                  " --batch 2 --steps 1" + kSmallMfuGemm + " " + flags + " 2>&1");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "nothing trained";
    return r.output;
  };
  std::string output = refused(test_data().config_path, 2, "--seq-len 16 --cp 2 --recompute full --policy-min-bytes 1");
  EXPECT_NE(output.find("--cp 2: the memory policy recompute full re-runs mixer sublayers"), std::string::npos)
      << output;
  output = refused(test_data().config_path, 2, "--seq-len 16 --cp 3");
  EXPECT_NE(output.find("--cp 3 must be ≥ 1 and divide the 2 ranks"), std::string::npos) << output;
  output = refused(test_data().config_path, 2, "--seq-len 3 --cp 2");
  EXPECT_NE(output.find("--seq-len 3 is too short for --cp 2"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion::train_test
