// The `trillion` command line as a whole: every subcommand answers --help, unknown input is
// rejected, `info` and `plan` count the published models, and `bench gemm` runs at a tiny size with
// a checked result (its time is not checked).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(Cli, EverySubcommandHasHelp) {
  for (const char* name : {"tokenize", "train", "eval", "generate", "gradcheck", "bench", "bench gemm",
                           "bench attention", "bench moe", "bench linear-attention", "info"}) {
    const CommandResult r = run_cli(std::string(name) + " --help");
    EXPECT_EQ(r.status, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("Usage:"), std::string::npos) << name << ": " << r.output;
  }
  EXPECT_NE(run_cli("no-such-command").status, 0);
}

TEST(Cli, GradcheckOfAMissingConfigNamesTheFile) {
  const CommandResult r = run_cli("gradcheck --config /nonexistent/model.json");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model.json"), std::string::npos) << r.output;
}

// transformers' num_parameters() of its default Qwen3MoeConfig, Glm4MoeConfig and Qwen3NextConfig,
// built on the meta device by tools/ref/write_default_configs.py (tests/fixtures/param_counts*.json),
// equals the count of `trillion info`, which allocates nothing (103 B parameters would not fit here).
TEST(Info, CountsEqualTransformersForTheDefaultConfigs) {
  int64_t checked = 0;
  for (const char* file : {"param_counts.json", "param_counts_linear_attention.json", "param_counts_mla.json"}) {
    const nlohmann::json counts =
        nlohmann::json::parse(read_file(std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/" + file));
    for (const auto& [name, entry] : counts.items()) {
      const CommandResult r = run_cli(
          "info --json --config " + std::string(TRILLION_SOURCE_DIR) + "/" + entry.at("config").get<std::string>(),
          "OMP_NUM_THREADS=1", /*stdout_only=*/true);
      ASSERT_EQ(r.status, 0) << name << ": " << r.output;
      const nlohmann::json info = nlohmann::json::parse(r.output);
      EXPECT_EQ(info.at("total_parameters").get<int64_t>(), entry.at("num_parameters").get<int64_t>()) << name;
      const int64_t dense = info.at("dense_parameters"), expert = info.at("expert_parameters");
      EXPECT_EQ(dense + expert, info.at("total_parameters").get<int64_t>()) << name;
      EXPECT_LT(info.at("active_parameters").get<int64_t>(), info.at("total_parameters").get<int64_t>() / 8) << name;
      EXPECT_GT(info.at("active_parameters").get<int64_t>(), dense) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);  // Qwen3MoeConfig, Glm4MoeConfig, Qwen3NextConfig, DeepseekV3Config, DeepseekV32Config,
                          // KimiLinearConfig
}

// A layer kind that is not declared yet is not guessed at: linear attention outside its families is an error.
TEST(Info, RefusesToCountKindsNotBuilt) {
  fs::create_directories(test_root());
  const fs::path path = test_root() / "deepseek.json";
  write_text(path, R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "intermediate_size": 32, "linear_num_key_heads": 2,
                       "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
                       "layer_types": ["full_attention", "linear_attention"]})");
  const CommandResult r = run_cli("info --config " + path.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("deepseek.json: layer_types[1] = linear_attention: not built yet for qwen3"), std::string::npos) << r.output;
}

// The README's demo model, configs/models/k3_mini.json, is the seed's architecture at demo scale:
// Kimi Delta Attention 3 : 1 MLA with the lightning indexer, a first dense FFN then MoE layers of
// at least 64 routed experts of which at most 1/16 are active, a shared expert, and sigmoid routing
// over expert groups. info names its sparse layers and router; the dense and softmax demos differ.
TEST(Info, NamesTheDemoModelsSparseLayersAndRouter) {
  const auto info = [](const char* name) {
    const CommandResult r =
        run_cli("info --json --config " + (fs::path(TRILLION_SOURCE_DIR) / name).string(), "OMP_NUM_THREADS=1", true);
    EXPECT_EQ(r.status, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const nlohmann::json k3 = info("configs/models/k3_mini.json");
  EXPECT_EQ(k3.at("sparse_layers"), 1);
  EXPECT_EQ(k3.at("moe_layers"), 3);
  EXPECT_EQ(k3.at("router"), "sigmoid");
  const nlohmann::json c =
      nlohmann::json::parse(read_text(fs::path(TRILLION_SOURCE_DIR) / "configs/models/k3_mini.json"));
  EXPECT_EQ(c.at("layer_types"),
            nlohmann::json({"linear_attention", "linear_attention", "linear_attention", "sparse_attention"}));
  EXPECT_EQ(c.at("mlp_layer_types")[0], "dense");
  EXPECT_GE(c.at("num_experts").get<int64_t>(), 64);
  EXPECT_LE(16 * c.at("num_experts_per_token").get<int64_t>(), c.at("num_experts").get<int64_t>());
  EXPECT_GE(c.at("num_shared_experts").get<int64_t>(), 1);
  EXPECT_GT(c.at("num_expert_group").get<int64_t>(), 1);
  EXPECT_LE(4 * c.at("index_topk").get<int64_t>(), 256) << "well below the demo's windows of 256";
  EXPECT_EQ(c.at("vocab_size"), 8192);
  const nlohmann::json moe = info("configs/models/demo_moe.json"), dense = info("configs/models/demo.json");
  EXPECT_EQ(moe.at("router"), "softmax");
  EXPECT_EQ(moe.at("sparse_layers"), 0);
  EXPECT_EQ(dense.at("router"), "none");
}

// With train's LoRA flags, info counts the adapter's parameters without allocating anything: rank-r
// pairs on attention (r (in + out) per projection) and one pair per routed expert on its stacked
// gate_up [2I, D] and down [D, I]. At DeepSeek-V3's widths the same targets train under 2 % of the
// model; at the MoE demo's small experts, 5 %.
TEST(Info, CountsAnAdaptersTrainableParameters) {
  const std::string lora = " --lora-rank 8 --lora-targets q_proj,k_proj,v_proj,o_proj "
                           "--lora-target-parameters gate_up_proj,down_proj";
  const fs::path demo = fs::path(TRILLION_SOURCE_DIR) / "configs/models/demo_moe.json";
  const CommandResult r = run_cli("info --json --config " + demo.string() + lora, "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json info = nlohmann::json::parse(r.output);
  const nlohmann::json c = nlohmann::json::parse(read_text(demo));
  const int64_t D = c["hidden_size"], d = c["head_dim"], q = int64_t(c["num_attention_heads"]) * d,
                kv = int64_t(c["num_key_value_heads"]) * d, I = c["moe_intermediate_size"], E = c["num_experts"],
                L = c["num_hidden_layers"], rank = 8;
  const int64_t attention = rank * ((D + q) + 2 * (D + kv) + (q + D));
  const int64_t experts = E * rank * ((D + 2 * I) + (I + D));
  EXPECT_EQ(info.at("trainable_parameters").get<int64_t>(), L * (attention + experts));
  EXPECT_EQ(info.at("parameters_with_adapters").get<int64_t>(),
            info.at("total_parameters").get<int64_t>() + L * (attention + experts));
  const fs::path v3 = fs::path(TRILLION_SOURCE_DIR) / "configs/models/deepseek_v3_default.json";
  const CommandResult large = run_cli(
      "info --json --config " + v3.string() + " --lora-rank 8 --lora-targets q_a_proj,q_b_proj,kv_a_proj_with_mqa,"
      "kv_b_proj,o_proj --lora-target-parameters gate_up_proj,down_proj", "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(large.status, 0) << large.output;
  const nlohmann::json big = nlohmann::json::parse(large.output);
  EXPECT_LT(double(big.at("trainable_parameters").get<int64_t>()), 0.02 * double(big.at("parameters_with_adapters")));
  const CommandResult alone = run_cli("info --config " + demo.string() + " --lora-alpha 16");
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.output.find("expected --lora-rank R with them"), std::string::npos) << alone.output;
}

// The seed's model (docs/scale.md): ~2.8 T parameters within 5 %, of which the routed experts are
// every MoE layer's E · 3 · D · I, with 16 of 896 experts active, KDA in three of every four layers.
TEST(Info, CountsTheKimiK3LikeConfigAtTheSeedsSize) {
  const fs::path k3 = fs::path(TRILLION_SOURCE_DIR) / "configs/models/kimi_k3_like.json";
  const CommandResult r = run_cli("info --json --config " + k3.string(), "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json info = nlohmann::json::parse(r.output);
  const nlohmann::json c = nlohmann::json::parse(read_text(k3));
  const int64_t D = c["hidden_size"], I = c["moe_intermediate_size"], E = c["num_experts"];
  EXPECT_EQ(info.at("expert_parameters").get<int64_t>(), info.at("moe_layers").get<int64_t>() * E * 3 * D * I);
  EXPECT_NEAR(info.at("total_parameters").get<double>(), 2.8e12, 0.05 * 2.8e12);
  EXPECT_EQ(E, 896);
  EXPECT_EQ(c["num_experts_per_token"], 16);
  const std::vector<std::string> kinds = c["layer_types"];
  for (size_t i = 0; i < kinds.size(); ++i)
    EXPECT_EQ(kinds[i], i % 4 == 3 ? "sparse_attention" : "linear_attention") << "layer " << i;
  EXPECT_EQ(c["index_topk"], 2048);
}

// `trillion plan` counts what transformers counts for the default configs (the fixtures above),
// DeepSeek-V3, Qwen3-Next and Kimi K2 (configs/models/kimi_k2.json) at their published 671 B, 80 B
// and 1.03 T within 1 %, and gives every device of 64 (ep 8) its weights by hand arithmetic: the
// shards partition the trainable storage (each within a few elements per range of a 64th) and every
// device keeps the buffers whole, 4 bytes each.
int64_t planned_total_with_weights_by_hand(const std::string& config) {
  const CommandResult r =
      run_cli("plan --json --devices 64 --ep 8 --seq-len 64 --config " + config, "OMP_NUM_THREADS=1", true);
  EXPECT_EQ(r.status, 0) << config << ": " << r.output;
  if (r.status != 0) return 0;
  const nlohmann::json plan = nlohmann::json::parse(r.output);
  const nlohmann::json info =
      nlohmann::json::parse(run_cli("info --json --config " + config, "OMP_NUM_THREADS=1", true).output);
  const int64_t storage = info.at("trainable_storage"), buffers = info.at("buffer_elements");
  int64_t sum = 0;
  for (const nlohmann::json& device : plan.at("device_plans")) {
    const int64_t weights = device.at("parameters");
    sum += weights - 4 * buffers;
    EXPECT_NEAR(double(weights), 4.0 * (double(storage) / 64 + double(buffers)), 4.0 * 1024) << config;
  }
  EXPECT_EQ(sum, 4 * storage) << config << ": the shards partition the storage";
  return plan.at("total_parameters");
}

TEST(Plan, CountsPublishedModelsAndTheirWeightsPerDevice) {
  const std::map<std::string, double> published = {{"deepseek_v3_default", 671e9}, {"qwen3_next_default", 80e9}};
  int64_t checked = 0;
  for (const char* file : {"param_counts.json", "param_counts_linear_attention.json", "param_counts_mla.json"}) {
    const nlohmann::json counts =
        nlohmann::json::parse(read_file(std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/" + file));
    for (const auto& [name, entry] : counts.items()) {
      const int64_t total = planned_total_with_weights_by_hand(std::string(TRILLION_SOURCE_DIR) + "/" +
                                                               entry.at("config").get<std::string>());
      EXPECT_EQ(total, entry.at("num_parameters").get<int64_t>()) << name;
      if (published.count(name)) {
        EXPECT_NEAR(double(total), published.at(name), 0.01 * published.at(name)) << name;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
  const int64_t k2 = planned_total_with_weights_by_hand(std::string(TRILLION_SOURCE_DIR) + "/configs/models/kimi_k2.json");
  EXPECT_NEAR(double(k2), 1.03e12, 0.01 * 1.03e12) << "Kimi K2";
}

TEST(BenchGemm, TinyRunReportsACorrectProduct) {
  const CommandResult r = run_cli("bench gemm --json --size 48", "OMP_NUM_THREADS=1", /*stdout_only=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json summary = nlohmann::json::parse(r.output.substr(r.output.rfind("{\"backend\"")));
  EXPECT_EQ(summary.at("bench"), "gemm");
  EXPECT_EQ(summary.at("size"), 48);
  EXPECT_GT(summary.at("gflops").get<double>(), 0.0);
  EXPECT_GE(summary.at("runs").get<int>(), 10);
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-5);
  EXPECT_EQ(summary.at("backend"), "onednn");  // the default
  for (const char* backend : {"onednn", "openblas"}) {  // each float backend, checked as the one in use
    EXPECT_GT(summary.at("backends").at(backend).at("gflops").get<double>(), 0.0) << backend;
    EXPECT_LT(summary.at("backends").at(backend).at("max_rel_err").get<double>(), 1e-5) << backend;
  }
  EXPECT_GT(summary.at("onednn_over_openblas").get<double>(), 0.0);
  // bf16 operands, stored and rounded per product: within float accumulation of the rounded operands.
  for (const char* row : {"bf16", "bf16_rounding"}) {
    EXPECT_GT(summary.at(row).at("gflops").get<double>(), 0.0) << row;
    EXPECT_LT(summary.at(row).at("max_rel_err").get<double>(), 1e-5) << row;
    EXPECT_GT(summary.at(row).at("peak_fraction").get<double>(), 0.0) << row;
  }
  // The physical peaks, with their formulas.
  EXPECT_GT(summary.at("peak").at("fp32_gflops").get<double>(), 0.0);
  EXPECT_GE(summary.at("peak").at("bf16_gflops").get<double>(), summary.at("peak").at("fp32_gflops").get<double>());
  EXPECT_NE(summary.at("peak").at("fp32_formula").get<std::string>().find("GFLOP/s"), std::string::npos);
  EXPECT_GT(summary.at("peak_fraction").get<double>(), 0.0);
}

TEST(BenchGemm, TheGemmOptionChoosesTheBackendAndRefusesAnUnknownOne) {
  const CommandResult chosen = run_cli("bench gemm --json --size 16 --gemm openblas", "OMP_NUM_THREADS=1", true);
  ASSERT_EQ(chosen.status, 0) << chosen.output;
  EXPECT_EQ(nlohmann::json::parse(chosen.output.substr(chosen.output.rfind("{\"backend\""))).at("backend"), "openblas");
  const CommandResult from_environment = run_cli("bench gemm --json --size 16", "TRILLION_GEMM=openblas", true);
  ASSERT_EQ(from_environment.status, 0) << from_environment.output;
  EXPECT_NE(from_environment.output.find("\"backend\":\"openblas\""), std::string::npos) << from_environment.output;
  const CommandResult unknown = run_cli("bench gemm --size 16 --gemm mkl");
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.output.find("error: --gemm mkl: expected onednn or openblas"), std::string::npos) << unknown.output;
}

}  // namespace
}  // namespace trillion::train_test
