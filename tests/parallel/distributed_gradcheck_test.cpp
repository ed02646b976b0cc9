// `trillion gradcheck` under mpirun: the distributed step's gradient (FSDP over the world, experts
// over ep groups, each rank its rows of the batch) equals one process's to relative 1e-12 in every
// tensor, and the finite-difference check passes too, for MoE configs of both router kinds, the
// Gated DeltaNet hybrid, Kimi Delta Attention with MLA and DeepSeek-V3.2's sparse attention with
// its indexer loss, over several (ranks, ep) layouts.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

struct Layout {
  std::string config;
  int ranks = 2, ep = 1;
  std::string extra;
};

void PrintTo(const Layout& l, std::ostream* out) { *out << l.config << " on " << l.ranks << " ranks, ep " << l.ep; }

class DistributedGradcheck : public testing::TestWithParam<Layout> {};

TEST_P(DistributedGradcheck, TheShardedGradientIsOneProcesss) {
  const Layout& l = GetParam();
  // gradcheck's defaults: every element, against finite differences at its default tolerance too;
  // --batch = ranks: one sequence per data share (with --cp, a share's sequence split over its cp ranks).
  const CommandResult r = run_shell(
      "OMP_NUM_THREADS=1 " + mpirun_launcher(l.ranks) + " " + TRILLION_BINARY + " gradcheck --config " +
      TRILLION_SOURCE_DIR + "/configs/models/" + l.config + ".json --batch " + std::to_string(l.ranks) + " --ep " + std::to_string(l.ep) +
      " " + l.extra + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string json = r.output.substr(r.output.rfind('{'));
  const nlohmann::json summary = nlohmann::json::parse(json.substr(0, json.find('\n')));
  EXPECT_LE(summary.at("distributed_max_rel_err").get<double>(), 1e-12) << r.output;
  EXPECT_GT(summary.at("checked").get<int64_t>(), 0);
  EXPECT_LE(summary.at("max_rel_err").get<double>(), summary.at("tolerance").get<double>()) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistributedGradcheck,
    testing::Values(Layout{"tiny_qwen3_moe", 2, 1, ""}, Layout{"tiny_qwen3_moe", 4, 2, ""},
                    Layout{"tiny_glm4_moe", 4, 4, ""}, Layout{"tiny_qwen3_next_hybrid", 2, 2, ""},
                    Layout{"tiny_kimi_linear", 4, 2, ""},
                    Layout{"tiny_deepseek_v32", 2, 2, "--indexer-mode dense --indexer-loss-coef 0.5"},
                    Layout{"tiny_qwen3_moe", 4, 2,
                           "--lora-rank 2 --lora-targets q_proj,v_proj --lora-target-parameters gate_up_proj,down_proj"},
                    // Context parallelism: each sequence split over cp ranks (lengths no multiple of 2 · cp),
                    // alone and beside two data shares.
                    Layout{"tiny", 2, 1, "--cp 2 --seq-len 11"}, Layout{"tiny", 4, 1, "--cp 2 --seq-len 11"},
                    Layout{"tiny", 4, 1, "--cp 4 --seq-len 13"}),
    [](const testing::TestParamInfo<Layout>& info) {
      const std::string& extra = info.param.extra;
      const size_t cp = extra.find("--cp ");
      return info.param.config + "_" + std::to_string(info.param.ranks) + "ranks_ep" + std::to_string(info.param.ep) +
             (extra.find("--lora") != std::string::npos ? "_lora" : "") +
             (cp != std::string::npos ? "_cp" + extra.substr(cp + 5, extra.find(' ', cp + 5) - cp - 5) : "");
    });

// Context parallelism through Gated DeltaNet (beside gated full attention) and KDA layers: the
// convolution's halos and the delta rule's state passed across the ranks, the chunks' summaries formed
// again in the backward. Their FFNs made dense (MoE under cp comes later); chunks of 1 to 3 tokens
// at cp 4, so a halo reaches over several chunks.
TEST(DistributedGradcheck, ContextParallelLinearAttentionIsOneProcesses) {
  const test::ScratchDir dir;
  const auto dense = [&](const std::string& config, const nlohmann::json& changes) {
    nlohmann::json c = nlohmann::json::parse(read_text(fs::path(TRILLION_SOURCE_DIR) / "configs/models" / config));
    c.update(changes);
    c.erase("mlp_only_layers");
    const fs::path path = fs::path(dir.path()) / config;
    write_text(path, c.dump());
    return path.string();
  };
  const std::string configs[] = {dense("tiny_qwen3_next_hybrid.json", {{"num_experts", 0}}),
                                 dense("tiny_kimi_linear_kda.json", {{"mlp_layer_types", {"dense", "dense"}}})};
  for (const std::string& config : configs)
    for (const auto& [ranks, flags] : {std::pair<int, std::string>{2, "--batch 1 --cp 2 --seq-len 11"},
                                       {2, "--batch 2 --cp 2 --seq-len 9"},
                                       {4, "--batch 2 --cp 2 --seq-len 13"},
                                       {4, "--batch 1 --cp 4 --seq-len 9"}}) {
      const CommandResult r = run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY +
                                        " gradcheck --config " + config + " " + flags + " 2>&1");
      ASSERT_EQ(r.status, 0) << r.output;
      const std::string json = r.output.substr(r.output.rfind('{'));
      const nlohmann::json summary = nlohmann::json::parse(json.substr(0, json.find('\n')));
      EXPECT_LE(summary.at("distributed_max_rel_err").get<double>(), 1e-12) << config << " " << flags;
      EXPECT_LE(summary.at("max_rel_err").get<double>(), summary.at("tolerance").get<double>()) << r.output;
    }
}

// Context parallelism refuses, naming the flag and the layer, what it does not cover yet.
TEST(DistributedGradcheck, ContextParallelismNamesTheLayersItDoesNotCoverYet) {
  for (const auto& [config, message] : {std::pair<std::string, std::string>{"tiny_qwen3_moe", "is an MoE layer"},
                                        {"tiny_deepseek_v32", "is sparse_attention"},
                                        {"tiny_deepseek_v3", "is MLA"}}) {
    const CommandResult r =
        run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(2) + " " + TRILLION_BINARY + " gradcheck --config " +
                  TRILLION_SOURCE_DIR + "/configs/models/" + config + ".json --batch 1 --cp 2 2>&1");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("--cp 2: layer "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  const CommandResult r = run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(2) + " " + TRILLION_BINARY +
                                    " gradcheck --config " + TRILLION_SOURCE_DIR +
                                    "/configs/models/tiny.json --batch 1 --cp 3 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--cp 3 must be ≥ 1 and divide the 2 ranks"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trillion::train_test
