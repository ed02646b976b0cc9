// `trillion gradcheck` under mpirun: the distributed step's gradient (FSDP over the world, experts
// over ep groups, each rank its rows of the batch) equals one process's to relative 1e-12 in every
// tensor, and the finite-difference check passes too, for MoE configs of both router kinds, the
// Gated DeltaNet hybrid, Kimi Delta Attention with MLA and DeepSeek-V3.2's sparse attention with
// its indexer loss, over several (ranks, ep) layouts; and with context parallelism (--cp), each
// sequence split over its cp group, for every mixer kind it covers.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

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
                    Layout{"tiny", 4, 1, "--cp 4 --seq-len 13"},
                    Layout{"tiny", 4, 1, "--cp 2 --seq-len 17 --document-eos 3"}),
    [](const testing::TestParamInfo<Layout>& info) {
      const std::string& extra = info.param.extra;
      const size_t cp = extra.find("--cp ");
      return info.param.config + "_" + std::to_string(info.param.ranks) + "ranks_ep" + std::to_string(info.param.ep) +
             (extra.find("--lora") != std::string::npos ? "_lora" : "") +
             (cp != std::string::npos ? "_cp" + extra.substr(cp + 5, extra.find(' ', cp + 5) - cp - 5) : "") +
             (extra.find("--document-eos") != std::string::npos ? "_documents" : "");
    });

// A config of configs/models with `changes`, written to `dir` (mlp_only_layers dropped).
std::string config_variant(const test::ScratchDir& dir, const std::string& config, const nlohmann::json& changes) {
  nlohmann::json c = nlohmann::json::parse(read_text(fs::path(TRILLION_SOURCE_DIR) / "configs/models" / config));
  c.update(changes);
  c.erase("mlp_only_layers");
  const fs::path path = fs::path(dir.path()) / config;
  write_text(path, c.dump());
  return path.string();
}

// gradcheck --cp of each config under each (ranks, flags): one process's gradient to 1e-12 in every
// element, and the finite-difference check along random directions (every element is checked by the
// one-process gradient checks).
void expect_context_parallel_is_one_process(const std::vector<std::string>& configs,
                                            const std::vector<std::pair<int, std::string>>& layouts) {
  for (const std::string& config : configs)
    for (const auto& [ranks, flags] : layouts) {
      const CommandResult r = run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY +
                                        " gradcheck --max-elements 0 --config " + config + " " + flags + " 2>&1");
      ASSERT_EQ(r.status, 0) << r.output;
      const std::string json = r.output.substr(r.output.rfind('{'));
      const nlohmann::json summary = nlohmann::json::parse(json.substr(0, json.find('\n')));
      EXPECT_LE(summary.at("distributed_max_rel_err").get<double>(), 1e-12) << config << " " << flags;
      EXPECT_LE(summary.at("max_rel_err").get<double>(), summary.at("tolerance").get<double>()) << r.output;
    }
}

// Context parallelism through Gated DeltaNet (beside gated full attention), KDA and MLA layers: the
// convolution's halos and the delta rule's state passed across the ranks, the chunks' summaries formed
// again in the backward; MLA's latents and rotated keys gathered (DeepSeek-V3's with q LoRA, YaRN and
// interleaved RoPE; Kimi Linear's NoPE beside KDA). Their FFNs made dense; chunks of 1 to 3 tokens
// at cp 4, so a halo reaches over several chunks.
TEST(DistributedGradcheck, ContextParallelMixersAreOneProcesses) {
  const test::ScratchDir dir;
  expect_context_parallel_is_one_process(
      {config_variant(dir, "tiny_qwen3_next_hybrid.json", {{"num_experts", 0}}),
       config_variant(dir, "tiny_kimi_linear_kda.json", {{"mlp_layer_types", {"dense", "dense"}}}),
       config_variant(dir, "tiny_kimi_linear.json", {{"mlp_layer_types", {"dense", "dense"}}}),
       config_variant(dir, "tiny_deepseek_v3.json", {{"first_k_dense_replace", 2}})},
      {{2, "--batch 1 --cp 2 --seq-len 11"},
       {2, "--batch 2 --cp 2 --seq-len 9"},
       {4, "--batch 2 --cp 2 --seq-len 13"},
       {4, "--batch 1 --cp 4 --seq-len 9"},
       // Document masks: documents of a few tokens crossing the chunks, starting at some of them.
       {2, "--batch 2 --cp 2 --seq-len 15 --document-eos 5"},
       {4, "--batch 1 --cp 4 --seq-len 19 --document-eos 5"},
       {4, "--batch 1 --cp 4 --seq-len 9 --document-eos 5"}});  // chunks of 1 and 2 tokens
}

// MoE layers under context parallelism, alone and beside expert parallelism: the routing statistics
// summed over the ranks; the z-loss weighted by each rank's tokens (which differ: no length is a
// multiple of 2 · cp); the sequence-wise balance loss seeing each sequence whole through its cp
// group's sums. Kimi Linear (KDA, MLA, sigmoid routing), DeepSeek-V3 (grouped sigmoid routing) and
// Qwen3-MoE (softmax, the pooled loss).
TEST(DistributedGradcheck, ContextParallelMoeIsOneProcesses) {
  const test::ScratchDir dir;
  const nlohmann::json sequence_loss = {{"output_router_logits", true},
                                        {"router_aux_loss_coef", 0.3},
                                        {"router_aux_loss_type", "sequence"},
                                        {"router_z_loss_coef", 0.01}};
  expect_context_parallel_is_one_process(
      {config_variant(dir, "tiny_kimi_linear.json", sequence_loss),
       config_variant(dir, "tiny_deepseek_v3.json", sequence_loss),
       config_variant(dir, "tiny_qwen3_moe.json",
                      {{"output_router_logits", true}, {"router_aux_loss_coef", 0.3}, {"router_z_loss_coef", 0.01}})},
      {{2, "--batch 1 --cp 2 --seq-len 11"},
       {2, "--batch 2 --cp 2 --seq-len 11"},
       {4, "--batch 2 --cp 2 --seq-len 9"},
       {4, "--batch 2 --ep 2 --cp 2 --seq-len 13"},
       {4, "--batch 1 --cp 4 --seq-len 9"},
       {4, "--batch 2 --ep 2 --cp 2 --seq-len 15 --document-eos 5"}});
}

// Sparse MLA layers and sparse GQA layers (an indexer on plain attention) under context parallelism:
// the indexer's keys gathered, each rank selecting over every earlier position of its sequences,
// attention over the selected rows of the gathered latents (or keys and values),
// the indexer's loss per chunk with its key gradients summed onto their owners; in the indexer's
// dense (warm-up) and sparse stages, beside MoE and expert parallelism. DeepSeek-V3.2, and the
// Kimi-K3-like hybrid (KDA : sparse MLA = 3 : 1, 16 grouped sigmoid-routed experts and a shared one).
TEST(DistributedGradcheck, ContextParallelSparseAttentionIsOneProcesses) {
  const test::ScratchDir dir;
  const nlohmann::json sequence_loss = {
      {"output_router_logits", true}, {"router_aux_loss_coef", 0.3}, {"router_aux_loss_type", "sequence"}};
  const std::vector<std::string> configs = {config_variant(dir, "tiny_deepseek_v32.json", sequence_loss),
                                            config_variant(dir, "tiny_kimi_k3_like.json", sequence_loss)};
  const std::string gqa = std::string(TRILLION_SOURCE_DIR) + "/configs/models/tiny_qwen3_sparse.json";  // no experts
  for (const std::string mode : {"dense", "sparse"}) {
    const std::string indexer = " --indexer-loss-coef 0.5 --indexer-mode " + mode;
    const std::vector<std::pair<int, std::string>> layouts = {
        {2, "--batch 1 --cp 2 --seq-len 11" + indexer},
        {2, "--batch 2 --cp 2 --seq-len 11" + indexer},
        {4, "--batch 1 --cp 4 --seq-len 17" + indexer},
        // Documents crossing the chunks.
        {2, "--batch 2 --cp 2 --seq-len 15 --document-eos 5" + indexer},
        {4, "--batch 1 --cp 4 --seq-len 19 --document-eos 5" + indexer}};
    expect_context_parallel_is_one_process(configs, layouts);
    expect_context_parallel_is_one_process({gqa}, layouts);
    expect_context_parallel_is_one_process(configs, {{4, "--batch 2 --ep 2 --cp 2 --seq-len 13" + indexer}});
  }
}

// LoRA with dropout on every linear layer under context parallelism: each token's masks are drawn
// whichever rank holds it, in MLA's absorbed rows too (kv_b_proj's adapter part, formed by each
// token's owner), dense and sparse (the Kimi-K3-like hybrid: the rows its top-k selects, with
// documents crossing the chunks).
TEST(DistributedGradcheck, ContextParallelLoraDropoutIsOneProcesss) {
  const test::ScratchDir dir;
  const fs::path adapter = fs::path(dir.path()) / "adapter_config.json";
  write_text(adapter, R"({"target_modules": "all-linear", "r": 2, "lora_dropout": 0.25})");
  const std::string lora = " --lora-config " + adapter.string();
  expect_context_parallel_is_one_process(
      {std::string(TRILLION_SOURCE_DIR) + "/configs/models/tiny.json",
       config_variant(dir, "tiny_deepseek_v3.json", {{"first_k_dense_replace", 2}})},
      {{2, "--batch 1 --cp 2 --seq-len 11" + lora}, {4, "--batch 2 --cp 2 --seq-len 9" + lora}});
  const std::string indexer = " --indexer-loss-coef 0.5 --indexer-mode sparse";
  expect_context_parallel_is_one_process({std::string(TRILLION_SOURCE_DIR) + "/configs/models/tiny_kimi_k3_like.json"},
                                         {{4, "--batch 1 --cp 4 --seq-len 19 --document-eos 5" + lora + indexer}});
}

// Context parallelism refuses a cp that does not divide the ranks, naming the flag.
TEST(DistributedGradcheck, ContextParallelismNamesWhatItRefuses) {
  const std::string gradcheck = "OMP_NUM_THREADS=1 " + mpirun_launcher(2) + " " + TRILLION_BINARY +
                                " gradcheck --batch 1 --config " + TRILLION_SOURCE_DIR + "/configs/models/";
  const CommandResult r = run_shell(gradcheck + "tiny.json --cp 3 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--cp 3 must be ≥ 1 and divide the 2 ranks"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trillion::train_test
