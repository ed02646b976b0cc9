// `trillion train` under mpirun (FSDP over the world: the batch split, units gathered around their
// use, gradients reduce-scattered into each rank's shard; with --ep the routed experts split over
// expert-parallel groups, rows dispatched to their experts' ranks and combined back, in one chunk or
// pipelined over --ep-chunks): 2 and 4 ranks,
// with ep 1, 2 and 4, give the losses, routing loads and final weights of one rank, in double to
// relative 1e-10 over 20 steps, and count the bytes they move (FSDP: as the layout says; experts:
// as each rank's routing says), for MoE configs of both router kinds and every
// balance loss (pooled, per-layer, sequence-wise, z-loss, the aux-loss-free bias), a hybrid of Gated
// DeltaNet, full attention and MoE, Kimi Delta Attention with MLA, and DeepSeek-V3.2's sparse
// attention with the indexer loss; in float, and in bf16 with its gathers, the first 3 steps
// agree to 1e-4 with identical routing;
// a checkpoint resumes on another number of ranks as if uninterrupted. The learning rate is one at
// which the tiny models train smoothly: at 1e-2 the hybrid's gradient norm jumps past 100 and
// amplifies rounding-level differences to 1e-8 by step 20. Bad layouts are refused with the rank
// named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "parallel/expert_parallel.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

CommandResult train_on(int ranks, const std::string& flags) {
  if (ranks == 1) return run_cli("train " + flags);
  return run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY + " train " + flags + " 2>&1");
}

struct RunResult {
  std::vector<nlohmann::json> metrics;
  fs::path out;
};

RunResult run(const fs::path& config, int ranks, const std::string& dtype, int steps, const std::string& extra,
              const std::string& label = "dp") {
  const fs::path out = test_data().root / (label + "_" + config.stem().string() + "_" + dtype + "_" + std::to_string(ranks));
  fs::remove_all(out);
  const std::string flags = "--config " + config.string() + " --data " + test_data().data_dir.string() + " --out " +
                            out.string() + " --batch 4 --seq-len 16 --lr 1e-3 --warmup 2 --log-every 100 --dtype " +
                            dtype + " --steps " + std::to_string(steps) + kSmallMfuGemm + " " + extra;
  const CommandResult r = train_on(ranks, flags);
  EXPECT_EQ(r.status, 0) << r.output;
  return {r.status == 0 ? read_metrics(out) : std::vector<nlohmann::json>{}, out};
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// Every step's loss (and lm_loss) within `tolerance` of the single rank's, and the same expert loads.
void expect_same_run(const RunResult& single, const RunResult& parallel, int ranks, double tolerance) {
  ASSERT_EQ(parallel.metrics.size(), single.metrics.size()) << ranks << " ranks";
  for (size_t i = 0; i < single.metrics.size(); ++i) {
    const nlohmann::json &a = parallel.metrics[i], &b = single.metrics[i];
    for (const char* field : {"loss", "lm_loss"}) {
      EXPECT_LE(relative(a.at(field), b.at(field)), tolerance) << ranks << " ranks, step " << i + 1 << " " << field;
    }
    if (b.contains("moe_layers")) {
      ASSERT_EQ(a.at("moe_layers").size(), b.at("moe_layers").size());
      for (size_t l = 0; l < b.at("moe_layers").size(); ++l) {
        EXPECT_EQ(a.at("moe_layers")[l].at("tokens_per_expert"), b.at("moe_layers")[l].at("tokens_per_expert"))
            << ranks << " ranks, step " << i + 1 << ": routing over the whole batch";
      }
    }
  }
}

// The final weights of the runs.
void expect_same_weights(const RunResult& single, const RunResult& parallel, int steps, double tolerance) {
  const std::string file = "checkpoint-" + std::string(6 - std::to_string(steps).size(), '0') + std::to_string(steps) +
                           "/model.safetensors";
  expect_same_tensors(parallel.out / file, single.out / file, tolerance);
}

// The FSDP counters of every step: each gather and reduce-scatter moves the range's elements other
// than this rank's piece, so a step (each unit gathered for its forward and its backward, its
// gradients reduce-scattered once) moves 2 · (held − shard) and held − shard elements, where held is
// what the rank gathers: every trainable element with ep 1, its ep slice of the experts otherwise;
// the shard (parameters, gradients, two moments) is about a 1/ranks share of the trainable storage.
// With gradient accumulation every micro-batch gathers, and only the last reduce-scatters.
void expect_fsdp_counts(const RunResult& parallel, const fs::path& config, int ranks, int ep, int64_t element_bytes,
                        int micro_batches) {
  const CommandResult info = run_cli("info --json --config " + config.string(), "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(info.status, 0) << info.output;
  const nlohmann::json counts = nlohmann::json::parse(info.output);
  const int64_t trainable = counts.at("trainable_storage"), experts = counts.at("expert_parameters");
  for (const nlohmann::json& m : parallel.metrics) {
    const nlohmann::json& f = m.at("fsdp");
    const int64_t shard = f.at("shard_elements"), held = f.at("held_elements");
    EXPECT_EQ(f.at("ranks"), ranks);
    if (ep == 1) {
      EXPECT_EQ(held, trainable);
    } else {
      EXPECT_LE(held, trainable - experts + experts / ep) << "only its ep slice of the experts";
    }
    EXPECT_EQ(f.at("gathered_bytes"), micro_batches * 2 * (held - shard) * element_bytes) << m.dump();
    EXPECT_EQ(f.at("reduce_scattered_bytes"), (held - shard) * element_bytes) << m.dump();
    EXPECT_EQ(f.at("shard_state_bytes"), 4 * shard * element_bytes);
    EXPECT_NEAR(double(shard), double(trainable) / ranks, 64.0) << "rank 0's share, within padding and rounding";
    EXPECT_EQ(f.at("rank_peak_rss_bytes").size(), size_t(ranks));
    EXPECT_GT(f.at("peak_gathered_bytes").get<int64_t>(), 0);
    EXPECT_LE(f.at("peak_gathered_bytes").get<int64_t>(), held * element_bytes) << "at most what it holds";
  }
}

struct Case {
  std::string name;
  nlohmann::json changes;
  std::string extra;  // train flags
  int micro_batches = 1;
  int ep = 1;  // expert-parallel degree (runs on rank counts it divides)
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.name << " " << c.changes.dump() << " " << c.extra << " ep " << c.ep;
}

std::string ep_flag(const Case& c) { return c.ep > 1 ? " --ep " + std::to_string(c.ep) : ""; }

// The exchange's bytes from the routing alone: every rank reports its own loads per MoE layer
// (rank_tokens_per_expert: [layers][ranks][E], summing to the batch's tokens_per_expert); rank r
// sends the rows routed to experts of the other ep indices of its expert group, and receives the
// rows the group's other ranks route to its experts; each row crosses once forward and once
// backward, H doubles each way (dropless configs).
void expect_expert_counts(const RunResult& parallel, const Case& c, int ranks, int64_t hidden) {
  for (const nlohmann::json& m : parallel.metrics) {
    if (c.ep == 1) {
      EXPECT_FALSE(m.contains("expert_parallel"));
      continue;
    }
    ASSERT_EQ(m.at("dropped_tokens"), 0);
    const nlohmann::json& x = m.at("expert_parallel");
    EXPECT_EQ(x.at("ep"), c.ep);
    const nlohmann::json& loads = x.at("rank_tokens_per_expert");
    ASSERT_EQ(loads.size(), m.at("moe_layers").size());
    // The planner's function of the same loads (train/step_traffic.h predicts by it).
    const std::vector<ExchangeBytes> planned =
        exchange_bytes(loads.get<std::vector<std::vector<std::vector<double>>>>(), c.ep, hidden, 8);
    for (int r = 0; r < ranks; ++r) {
      int64_t out = 0, in = 0;  // rows
      for (size_t l = 0; l < loads.size(); ++l) {
        const int64_t E = static_cast<int64_t>(loads[l][r].size()), local = E / c.ep;
        for (int64_t e = 0; e < E; ++e) {
          if (e / local != r % c.ep) out += loads[l][r][e].get<int64_t>();
          for (int s = 0; s < ranks; ++s) {
            if (s != r && s / c.ep == r / c.ep && e / local == r % c.ep) in += loads[l][s][e].get<int64_t>();
          }
        }
      }
      // Each way, the rows twice (forward, backward) and one weight or dweight per row once.
      EXPECT_EQ(x.at("rank_dispatched_bytes")[r], out * (2 * hidden + 1) * 8) << "rank " << r << ": " << m.dump();
      EXPECT_EQ(x.at("rank_combined_bytes")[r], in * (2 * hidden + 1) * 8) << "rank " << r;
      EXPECT_EQ(planned[r].dispatched, x.at("rank_dispatched_bytes")[r].get<double>()) << "rank " << r;
      EXPECT_EQ(planned[r].combined, x.at("rank_combined_bytes")[r].get<double>()) << "rank " << r;
    }
    for (size_t l = 0; l < loads.size(); ++l) {
      const nlohmann::json& total = m.at("moe_layers")[l].at("tokens_per_expert");
      for (size_t e = 0; e < total.size(); ++e) {
        int64_t sum = 0;
        for (int r = 0; r < ranks; ++r) sum += loads[l][r][e].get<int64_t>();
        EXPECT_EQ(sum, total[e].get<int64_t>()) << "layer " << l << " expert " << e;
      }
    }
  }
}

class DataParallel : public testing::TestWithParam<Case> {};

TEST_P(DataParallel, DoubleRanksAgreeOverTwentySteps) {
  const Case& c = GetParam();
  const fs::path config = config_with(c.name, c.changes);
  const RunResult single = run(config, 1, "float64", 20, c.extra);
  for (const int ranks : {2, 4}) {
    if (ranks % c.ep != 0) continue;
    const RunResult parallel = run(config, ranks, "float64", 20, c.extra + ep_flag(c));
    expect_same_run(single, parallel, ranks, 1e-10);
    expect_same_weights(single, parallel, 20, 1e-9);
    expect_fsdp_counts(parallel, config, ranks, c.ep, 8, c.micro_batches);
    expect_expert_counts(parallel, c, ranks, nlohmann::json::parse(read_file(config.string())).at("hidden_size"));
  }
}

TEST_P(DataParallel, FloatRanksAgreeOverThreeStepsWithTheSameRouting) {
  const Case& c = GetParam();
  const fs::path config = config_with(c.name, c.changes);
  const int ranks = std::max(2, c.ep);
  const RunResult single = run(config, 1, "float32", 3, c.extra);
  const RunResult parallel = run(config, ranks, "float32", 3, c.extra + ep_flag(c));
  expect_same_run(single, parallel, ranks, 1e-4);
}

// Under the bf16 precision FSDP gathers the products' weights in bf16 (parallel/fsdp.h) and one
// rank reads its parameters' bf16 copy: the same roundings, so the ranks agree as in float.
TEST_P(DataParallel, Bf16RanksAgreeOverThreeStepsWithTheSameRouting) {
  const Case& c = GetParam();
  const fs::path config = config_with(c.name, c.changes);
  const int ranks = std::max(2, c.ep);
  const RunResult single = run(config, 1, "float32", 3, c.extra + " --precision bf16");
  const RunResult parallel = run(config, ranks, "float32", 3, c.extra + ep_flag(c) + " --precision bf16");
  expect_same_run(single, parallel, ranks, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    LayerAndRouterKinds, DataParallel,
    testing::Values(Case{"tiny_qwen3_moe", {{"router_z_loss_coef", 1e-3}}, ""},
                    Case{"tiny_qwen3_moe", {}, "--grad-accum 2", 2},
                    Case{"tiny_qwen3_moe", {{"router_aux_loss_type", "per_layer"}}, ""},
                    Case{"tiny_glm4_moe", {{"router_aux_loss_type", "sequence"}, {"router_aux_loss_coef", 0.01},
                                           {"output_router_logits", true}},
                         "--moe-bias-rate 0.01"},
                    Case{"tiny_qwen3_next_hybrid", {}, ""}, Case{"tiny_kimi_linear", {}, ""},
                    Case{"tiny_qwen3_moe", {{"router_z_loss_coef", 1e-3}}, "", 1, 2},
                    Case{"tiny_glm4_moe", {{"router_aux_loss_type", "sequence"}, {"router_aux_loss_coef", 0.01},
                                           {"output_router_logits", true}},
                         "--moe-bias-rate 0.01", 1, 4},
                    Case{"tiny_qwen3_next_hybrid", {}, "--ep-chunks 3", 1, 2}, Case{"tiny_kimi_linear", {}, "", 1, 4},
                    Case{"tiny_deepseek_v32", {}, "--indexer-mode dense --indexer-loss-coef 0.1", 1, 2},
                    Case{"tiny_deepseek_v32", {}, "--indexer-mode dense --indexer-loss-coef 0.1"}),
    [](const testing::TestParamInfo<Case>& info) {
      return info.param.name + (info.param.ep > 1 ? "_ep" + std::to_string(info.param.ep) : "") + "_" +
             std::to_string(info.index);
    });

// 8 steps of tiny_qwen3_moe in double, interrupted: 4 ranks with ep 2 to step 4, 2 ranks with ep 2
// resuming to step 6, one rank resuming to step 8; `checkpoints` flags the two parallel legs, `first`
// the first leg only (what a resumed run keeps from its checkpoint).
RunResult resharded_run(const fs::path& config, const std::string& name, const std::string& checkpoints,
                        const std::string& first = "") {
  const fs::path out = test_data().root / name;
  fs::remove_all(out);
  const std::string flags = "--config " + config.string() + " --data " + test_data().data_dir.string() + " --out " +
                            out.string() + " --batch 4 --seq-len 16 --lr 1e-3 --warmup 2 --log-every 100 " +
                            "--dtype float64 --steps 8" + kSmallMfuGemm;
  for (const auto& [ranks, more] : {std::pair{4, " --ep 2" + checkpoints + " --stop-after 4" + first},
                                    {2, " --ep 2" + checkpoints + " --resume " + out.string() + " --stop-after 6"},
                                    {1, " --resume " + out.string()}}) {
    const CommandResult r = train_on(ranks, flags + more);
    EXPECT_EQ(r.status, 0) << ranks << " ranks: " << r.output;
  }
  return {read_metrics(out), out};
}

// The checkpoint is the flat layout (rank 0 gathers the sharded parameters and moments, every ep
// slice's experts too), so any layout resumes it as one uninterrupted rank runs.
TEST(DataParallelResume, ACheckpointResumesOnOtherRankCounts) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const RunResult uninterrupted = run(config, 1, "float64", 8, "");
  const RunResult resharded = resharded_run(config, "dp_resharded", "");
  expect_same_run(uninterrupted, resharded, 4, 1e-10);
  expect_same_weights(uninterrupted, resharded, 8, 1e-9);
}

// Sharded checkpoints (each rank writes its shard, rank 0 the index) resume on other layouts too,
// and `trillion export` turns the sharded step-6 checkpoint into the uninterrupted run's weights.
TEST(DataParallelResume, ShardedCheckpointsResumeOnOtherLayoutsAndExport) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const RunResult uninterrupted = run(config, 1, "float64", 8, "--save-every 2");
  const RunResult resharded = resharded_run(config, "dp_sharded", " --sharded-checkpoints");
  const fs::path& out = resharded.out;
  for (const char* step : {"checkpoint-000004", "checkpoint-000006"}) {
    EXPECT_TRUE(fs::exists(out / step / "shards" / "index.json")) << step;
    EXPECT_TRUE(fs::exists(out / step / "shards" / "rank-00000-of-00004.safetensors") ||
                fs::exists(out / step / "shards" / "rank-00001-of-00002.safetensors"))
        << step;
    EXPECT_FALSE(fs::exists(out / step / "model.safetensors")) << step << ": nothing gathered";
  }
  expect_same_run(uninterrupted, resharded, 4, 1e-10);
  expect_same_weights(uninterrupted, resharded, 8, 1e-9);

  const fs::path exported = test_data().root / "dp_exported";
  fs::remove_all(exported);
  const CommandResult e = run_cli("export --checkpoint " + (out / "checkpoint-000006").string() + " --out " +
                                  exported.string());
  ASSERT_EQ(e.status, 0) << e.output;
  expect_same_tensors(exported / "model.safetensors", uninterrupted.out / "checkpoint-000006" / "model.safetensors",
                      1e-6);  // exported in float32
}

// LoRA over FSDP and expert parallelism: adapters on attention and on the routed experts (their
// pairs sliced over ep with the experts, run by the experts' owners inside the exchange), the base
// frozen. 4 ranks with ep 2 give one rank's losses, adapter and (unchanged) base over 20 steps in
// double; interrupted with sharded checkpoints and resumed on 2 ranks and on one, the same run.
const std::string kLoraFlags =
    " --lora-rank 2 --lora-targets q_proj,v_proj --lora-target-parameters gate_up_proj,down_proj";

TEST(DataParallelLora, FourRanksWithExpertParallelismEqualOneRank) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const RunResult single = run(config, 1, "float64", 20, kLoraFlags, "dp_lora");
  const RunResult parallel = run(config, 4, "float64", 20, kLoraFlags + " --ep 2", "dp_lora");
  expect_same_run(single, parallel, 4, 1e-10);
  const fs::path adapter = "checkpoint-000020/adapter/adapter_model.safetensors";
  expect_same_tensors(parallel.out / adapter, single.out / adapter, 1e-9);
  expect_same_weights(single, parallel, 20, 0.0);  // the frozen base, to the bit
  const std::vector<double> b = [&] {
    const SafetensorsReader file((single.out / adapter).string());
    const std::string key = "base_model.model.model.layers.2.mlp.experts.lora_B.weight";
    std::vector<double> values(file.info(key).shape[0] * file.info(key).shape[1]);
    file.read(key, file.info(key).shape, values.data());
    return values;
  }();
  EXPECT_TRUE(std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; })) << "the experts' B never trained";
}

TEST(DataParallelLora, ShardedCheckpointsResumeOnOtherLayouts) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const RunResult uninterrupted = run(config, 1, "float64", 8, kLoraFlags, "dp_lora_whole");
  const RunResult resharded = resharded_run(config, "dp_lora_sharded", " --sharded-checkpoints", kLoraFlags);
  EXPECT_TRUE(fs::exists(resharded.out / "checkpoint-000004" / "shards" / "index.json"));
  EXPECT_TRUE(fs::exists(resharded.out / "checkpoint-000004" / "adapter" / "adapter_model.safetensors"));
  expect_same_run(uninterrupted, resharded, 4, 1e-10);
  const fs::path adapter = "checkpoint-000008/adapter/adapter_model.safetensors";
  expect_same_tensors(resharded.out / adapter, uninterrupted.out / adapter, 1e-9);
}

// lora_dropout's masks are drawn per token of the step's whole batch (model/linear.h), so the
// ranks, each training its rows, drop what one rank drops: the same run to 1e-10.
TEST(DataParallelLora, DropoutMasksFollowTheTokensOverRanks) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const fs::path adapter = test_data().root / "dp_lora_dropout.json";
  write_text(adapter, R"({"target_modules": ["q_proj", "v_proj", "o_proj"], "r": 2, "lora_dropout": 0.25})");
  const std::string flags = " --lora-config " + adapter.string();
  const RunResult single = run(config, 1, "float64", 6, flags, "dp_lora_dropout");
  const RunResult parallel = run(config, 4, "float64", 6, flags + " --ep 2", "dp_lora_dropout");
  expect_same_run(single, parallel, 4, 1e-10);
  const RunResult undropped = run(config, 1, "float64", 6, " --lora-rank 2 --lora-targets q_proj,v_proj,o_proj",
                                  "dp_lora_undropped");
  EXPECT_NE(undropped.metrics.back().at("loss"), single.metrics.back().at("loss")) << "no input was dropped";
}

TEST(DataParallelErrors, ABatchTheRanksCannotSplitIsRefusedOnEveryRank) {
  const fs::path out = test_data().root / "dp_bad_batch";
  const TestData& d = test_data();
  const CommandResult r = train_on(2, "--config " + d.config_path.string() + " --data " + d.data_dir.string() +
                                          " --out " + out.string() + " --steps 1 --batch 3 --seq-len 16");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--batch 3 must be divisible by the 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank "), std::string::npos) << "the error names its rank: " << r.output;
}

TEST(DataParallelErrors, ExpertParallelDegreesAreValidated) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());  // 6 experts
  const std::string flags = "--config " + config.string() + " --data " + test_data().data_dir.string() +
                            " --steps 1 --batch 4 --seq-len 16 --out " + (test_data().root / "dp_bad_ep").string();
  const CommandResult not_dividing = train_on(2, flags + " --ep 3");
  EXPECT_NE(not_dividing.status, 0);
  EXPECT_NE(not_dividing.output.find("--ep 3 must be ≥ 1 and divide the 2 ranks"), std::string::npos)
      << not_dividing.output;
  const CommandResult uneven = train_on(4, flags + " --ep 4");
  EXPECT_NE(uneven.status, 0);
  EXPECT_NE(uneven.output.find("the model's 6 routed experts must split evenly over 4 ranks"), std::string::npos)
      << uneven.output;
}

// Under expert parallelism the exchanged rows are saved tensors like every other: swap moves them,
// recompute keeps them, so a re-run MoE sublayer does not exchange again (each rank sends the bytes
// keep-all sends). With every saved tensor under the policy (--policy-min-bytes 1), recompute and
// swap give keep-all's losses to the bit.
TEST(DataParallelPolicies, RecomputeAndSwapUnderExpertParallelismEqualKeepAllBitwise) {
  const fs::path config = config_with("tiny_qwen3_moe", nlohmann::json::object());
  const RunResult keep = run(config, 2, "float32", 3, "--ep 2");
  for (const auto& [policy, counter] : {std::pair{"--recompute full", "recomputed_bytes"},
                                        std::pair{"--swap full", "swapped_out_bytes"}}) {
    const RunResult other = run(config, 2, "float32", 3, std::string("--ep 2 --policy-min-bytes 1 ") + policy);
    ASSERT_EQ(other.metrics.size(), keep.metrics.size()) << policy;
    for (size_t i = 0; i < keep.metrics.size(); ++i) {
      for (const char* field : {"loss", "lm_loss"}) {
        EXPECT_EQ(other.metrics[i].at(field).get<double>(), keep.metrics[i].at(field).get<double>())
            << policy << ", step " << i + 1 << " " << field;
      }
      EXPECT_GT(other.metrics[i].at("memory").at(counter).get<int64_t>(), 0) << policy << ": the policy acted";
      for (const char* sent : {"rank_dispatched_bytes", "rank_combined_bytes"})
        EXPECT_EQ(other.metrics[i].at("expert_parallel").at(sent), keep.metrics[i].at("expert_parallel").at(sent))
            << policy << ", step " << i + 1 << " " << sent << ": exchanged once per forward and backward";
    }
  }
}

}  // namespace
}  // namespace trillion::train_test
