// The shape-only memory plan against a real step: for every layer kind and every policy the budget
// tries, the planned fast-tier peak is an upper bound of MemoryStats' measured peak of a step
// (parameters, gradients, AdamW state, buffers, activations, workspaces) within 5 %, under the bf16
// precision too (with the parameters' bf16 copy); the budget
// takes the cheapest policy that fits or names the smallest budget; sizes parse as users write them.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/rng.h"
#include "memory/save_policies.h"
#include "model/model.h"
#include "ops/finite_diff.h"
#include "ops/gemm.h"
#include "model/test_configs.h"
#include "train/optimizer.h"

namespace trillion {
namespace {

// MemoryStats' fast-tier peak of one training step from nothing: model, optimizer, one forward_backward.
template <class T>
int64_t measured_peak(const ModelConfig& config, const StepMemoryShape& shape, const MemoryPolicy& policy) {
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  int64_t peak = 0;
  {
    Model<T> model(config);
    model.init_weights(2);
    if (model.sparse_layers() > 0) model.set_indexer_training(shape.indexer.mode, shape.indexer.coef);
    model.set_loss_gradients(shape.loss);
    Optimizer<T> optimizer(model.table());
    ActivationStore& store = model.activations();
    store.set_paged_min_bytes(shape.policy_min_bytes);
    if (policy.swap != "none") store.set_swap_directory(::testing::TempDir());
    apply_save_policies(store, policy.recompute, policy.swap);
    const int64_t n = shape.batch * shape.seq;
    const CounterRng rng(4, "memory_plan_test");
    std::vector<int32_t> tokens(n), targets(n);
    for (int64_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>(rng.bits(i) % config.vocab_size);
      targets[i] = static_cast<int32_t>(rng.bits(n + i) % config.vocab_size);
    }
    model.forward_backward(tokens.data(), targets.data(), shape.batch, shape.seq, LossScales{1.0 / double(n), 1.0});
    peak = MemoryStats::peak(Tier::fast) - before;
  }
  return peak;
}

class MemoryPlanTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MemoryPlanTest, PlannedPeakBoundsTheMeasuredOne) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(GetParam()));
  test::with_threads(2, [&] {
    for (LossGradients loss : {LossGradients::in_forward, LossGradients::recompute}) {
      StepMemoryShape shape;
      shape.batch = 4;
      shape.seq = 32;
      shape.indexer.mode = IndexerMode::sparse;
      shape.indexer.coef = 0.5;
      shape.loss = loss;
      shape.threads = 2;
      shape.policy_min_bytes = 1;  // the tiny models' tensors follow their policy
      for (const MemoryPolicy& policy : budget_candidates()) {
        const MemoryPlan plan = plan_memory(config, shape, policy);
        const int64_t measured = measured_peak<float>(config, shape, policy);
        EXPECT_GE(plan.peak_fast, measured) << GetParam() << " " << policy.name() << "\n" << plan.describe();
        // Within 5 %: each part of a layer counts its own pass's workspace (the forward's, the
        // backward's, a recompute's re-run). Under swap the plan counts the writer one layer
        // behind, its bound; how much sooner the writes end is up to the disk, so only the bound is
        // checked there.
        if (policy.swap == "none") {
          EXPECT_LE(plan.peak_fast, measured + measured / 20)
              << GetParam() << " " << policy.name() << " planned / measured " << double(plan.peak_fast) / measured
              << "\n" << plan.describe();
        }
      }
    }
    // The bf16 precision adds the parameters' bf16 copy (2 bytes each) and keeps the saved operands
    // of products in bf16.
    StepMemoryShape shape;
    shape.batch = 4;
    shape.seq = 32;
    shape.threads = 2;
    shape.policy_min_bytes = 1;
    const MemoryPlan fp32 = plan_memory(config, shape, MemoryPolicy{});
    shape.bf16_products = true;
    const MemoryPlan plan = plan_memory(config, shape, MemoryPolicy{});
    EXPECT_EQ(plan.parameters - fp32.parameters, 2 * count_parameters(config).storage);
    EXPECT_LT(plan.activations_saved, fp32.activations_saved) << GetParam();
    const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
    const int64_t measured = measured_peak<float>(config, shape, MemoryPolicy{});
    EXPECT_GE(plan.peak_fast, measured) << GetParam() << " bf16\n" << plan.describe();
    EXPECT_LE(plan.peak_fast, measured + measured / 20) << GetParam() << " bf16\n" << plan.describe();
  });
}

INSTANTIATE_TEST_SUITE_P(LayerKinds, MemoryPlanTest,
                         ::testing::Values("tiny.json", "tiny_qwen3_moe.json", "tiny_glm4_moe.json",
                                           "tiny_qwen3_next_hybrid.json", "tiny_kimi_linear.json",
                                           "tiny_deepseek_v3.json", "tiny_deepseek_v32.json", "tiny_qwen3_sparse.json"),
                         testing::config_test_name);

TEST(MemoryPlan, BudgetTakesTheCheapestPolicyThatFits) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json"));
  StepMemoryShape shape;
  shape.batch = 4;
  shape.seq = 32;
  shape.policy_min_bytes = 1;
  const MemoryPlan keep = plan_memory(config, shape, {});
  EXPECT_EQ(choose_policy(config, param_table_of(config), shape, keep.peak_fast).policy.name(), "keep-all");
  const MemoryPlan full = plan_memory(config, shape, {"full", "none"});
  ASSERT_LT(full.peak_fast, keep.peak_fast);
  const MemoryPlan chosen = choose_policy(config, param_table_of(config), shape, full.peak_fast);
  EXPECT_LE(chosen.peak_fast, full.peak_fast);
  // Nothing cheaper than the chosen candidate fits.
  for (const MemoryPolicy& policy : budget_candidates()) {
    if (policy.name() == chosen.policy.name()) break;
    EXPECT_GT(plan_memory(config, shape, policy).peak_fast, full.peak_fast) << policy.name();
  }
  int64_t smallest = keep.peak_fast;
  for (const MemoryPolicy& policy : budget_candidates()) smallest = std::min(smallest, plan_memory(config, shape, policy).peak_fast);
  try {
    choose_policy(config, param_table_of(config), shape, smallest - 1);
    ADD_FAILURE() << "a budget below every candidate's peak was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest peak is " + std::to_string(smallest) + " bytes"),
              std::string::npos)
        << e.what();
  }
}

// The saved activations by layer kind, for the seed's hybrid shape: one entry per kind in order of
// first use (a dense first layer, KDA with MoE, sparse MLA with MoE), every layer counted once;
// kept equals saved with nothing dropped or swapped, is less for every kind under full recompute,
// and in all under full swap (the last layer's swapped tensors stay resident); with ep the MoE
// kinds' saved bytes count the exchange's rows.
TEST(MemoryPlan, CountsTheActivationsOfEachLayerKind) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_kimi_k3_like.json"));
  StepMemoryShape shape;
  shape.batch = 2;
  shape.seq = 16;
  shape.policy_min_bytes = 1;
  for (const MemoryPolicy& policy : {MemoryPolicy{}, MemoryPolicy{"full", "none"}, MemoryPolicy{"none", "full"}}) {
    SCOPED_TRACE(policy.name());
    const MemoryPlan plan = plan_memory(config, shape, policy);
    std::vector<std::string> kinds;
    int layers = 0;
    int64_t saved = 0, kept = 0;
    for (const MemoryPlan::KindActivations& k : plan.activations_by_kind) {
      kinds.push_back(k.kind);
      layers += k.layers;
      saved += k.saved;
      kept += k.kept;
      if (policy.name() == "keep-all") { EXPECT_EQ(k.kept, k.saved) << k.kind; }
      if (policy.recompute == "full") { EXPECT_LT(k.kept, k.saved) << k.kind; }
      EXPECT_LE(k.kept, k.saved) << k.kind;
    }
    if (policy.swap == "full") { EXPECT_LT(kept, saved) << "the last layer's swapped tensors stay resident, no other"; }
    EXPECT_EQ(kinds, (std::vector<std::string>{"linear_attention + dense mlp", "linear_attention + moe",
                                               "sparse_attention + moe"}));
    EXPECT_EQ(layers, config.num_hidden_layers);
    EXPECT_GT(saved, 0);
    EXPECT_LT(saved, plan.activations_saved) << "the head saves too";
  }
  // With ep, the MoE layers' saved bytes include the exchange's rows; without, nothing is exchanged.
  for (const MemoryPlan::KindActivations& k : plan_memory(config, shape, {}).activations_by_kind)
    EXPECT_EQ(k.exchanged, 0) << k.kind;
  shape.ranks = 2;
  shape.ep = 2;
  for (const MemoryPlan::KindActivations& k : plan_memory(config, shape, {}).activations_by_kind) {
    if (k.kind.ends_with("moe")) {
      EXPECT_GT(k.exchanged, 0) << k.kind;
      EXPECT_LT(k.exchanged, k.saved) << k.kind;
    } else {
      EXPECT_EQ(k.exchanged, 0) << k.kind;
    }
  }
}

// The LM head's loss workspace, apart: its tiles of logits grow with the vocabulary.
TEST(MemoryPlan, GivesTheLossWorkspaceApart) {
  StepMemoryShape shape;
  shape.batch = 4;
  shape.seq = 32;
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json"));
  const int64_t small = plan_memory(config, shape, {}).loss_workspace;
  const int64_t large =
      plan_memory(testing::tiny_config_with({{"vocab_size", 8 * config.vocab_size}}, "tiny_qwen3_moe.json"), shape, {})
          .loss_workspace;
  EXPECT_GT(small, 0);
  EXPECT_GT(large, 2 * small);
}

TEST(MemoryPlan, ParsesSizes) {
  EXPECT_EQ(parse_bytes("300000", "--memory-budget"), 300000);
  EXPECT_EQ(parse_bytes("2G", "--memory-budget"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("512MiB", "--memory-budget"), int64_t{512} << 20);
  EXPECT_EQ(parse_bytes("1.5K", "--memory-budget"), 1536);
  EXPECT_EQ(parse_bytes("64KB", "--memory-budget"), 65536);
  for (const char* bad : {"", "G", "-1G", "2X", "1e30T", "0"})
    EXPECT_THROW(parse_bytes(bad, "--memory-budget"), Error) << bad;
}

}  // namespace
}  // namespace trillion
