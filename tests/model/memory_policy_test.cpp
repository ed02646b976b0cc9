// Memory policies against keep-all, for every layer kind that has landed: recompute (selective,
// full, single tags, and the routed experts' activations that their fused backward rebuilds with no
// re-run) and swap (to a file, buffered and O_DIRECT) give bitwise the same losses and gradients, in
// float and in double, and do what they say (bytes dropped and refilled or rebuilt, written and read
// back, every fast-tier byte returned at the end of the step).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "memory/save_policies.h"
#include "model/model.h"
#include "ops/finite_diff.h"
#include "test_configs.h"

namespace trillion {
namespace {

struct PolicyCase {
  std::string recompute, swap;
  bool buffered = false;     // swap I/O through the page cache instead of O_DIRECT
  bool synchronous = false;  // every swapped tensor is read back (none reused in place)
};

template <class T>
struct StepOutput {
  StepResult result;
  std::vector<T> grads;
  StoreCounters counters;
};

// Two micro-batches of one step (gradients accumulate), with the indexer's loss on where the
// model has sparse layers, under the given policies.
template <class T>
StepOutput<T> train_step(const ModelConfig& config, const PolicyCase& policy, const std::string& swap_dir) {
  Model<T> model(config);
  model.init_weights(11);
  if (model.sparse_layers() > 0) model.set_indexer_training(IndexerMode::sparse, 0.5);
  ActivationStore& store = model.activations();
  store.set_paged_min_bytes(1);  // tiny models' tensors follow their policy too
  if (!policy.swap.empty()) store.set_swap_directory(swap_dir, policy.buffered);
  store.set_swap_synchronous(policy.synchronous);
  apply_save_policies(store, policy.recompute.empty() ? "none" : policy.recompute,
                      policy.swap.empty() ? "none" : policy.swap);
  const int64_t batch = 2, seq = 9, n = batch * seq;
  const CounterRng rng(12, "memory_policy_test");
  std::vector<int32_t> tokens(2 * n), targets(2 * n);
  for (int64_t i = 0; i < 2 * n; ++i) {
    tokens[i] = static_cast<int32_t>(rng.bits(i) % config.vocab_size);
    targets[i] = i % 7 == 3 ? kIgnoreIndex : static_cast<int32_t>(rng.bits(2 * n + i) % config.vocab_size);
  }
  const LossScales scales{1.0 / double(2 * n), 0.5};
  model.zero_grads();
  StepOutput<T> out;
  int64_t fast_after_first = 0;  // the model's own buffers grow to their size in the first pass
  for (int micro = 0; micro < 2; ++micro) {
    out.result = model.forward_backward(tokens.data() + micro * n, targets.data() + micro * n, batch, seq, scales);
    EXPECT_EQ(store.bytes_in_use(), 0);
    EXPECT_EQ(MemoryStats::current(Tier::slow), 0);
    if (micro == 0) fast_after_first = MemoryStats::current(Tier::fast);
  }
  EXPECT_EQ(MemoryStats::current(Tier::fast), fast_after_first) << "every saved byte was returned";
  out.grads.assign(model.grads(), model.grads() + model.table().trainable_size());
  out.counters = store.counters();
  return out;
}

template <class T>
void expect_bitwise_equal(const StepOutput<T>& a, const StepOutput<T>& b, const std::string& what) {
  EXPECT_EQ(a.result.lm.loss_sum, b.result.lm.loss_sum) << what;
  ASSERT_EQ(a.result.aux.size(), b.result.aux.size()) << what;
  for (size_t i = 0; i < a.result.aux.size(); ++i) EXPECT_EQ(a.result.aux[i].value, b.result.aux[i].value) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) differing += a.grads[i] != b.grads[i] ? 1 : 0;
  EXPECT_EQ(differing, 0) << what << ": gradients differ in " << differing << " of " << a.grads.size();
}

class MemoryPolicy : public ::testing::TestWithParam<const char*> {};

template <class T>
void check_policies(const ModelConfig& config, const std::string& name) {
  const std::string dir = ::testing::TempDir();
  const StepOutput<T> keep = train_step<T>(config, {}, dir);
  EXPECT_EQ(keep.counters.dropped_bytes + keep.counters.swapped_out_bytes, 0);
  const std::vector<PolicyCase> cases = {
      {"full", ""},
      {"selective", ""},
      {"", "full"},
      {"", "full", /*buffered=*/false, /*synchronous=*/true},
      {"", "full", /*buffered=*/true, /*synchronous=*/true},
      {"selective", "attn_out,q,k,v,la_core,mla_latent,attn_input", false, true},
      {"attn_norm_out,mlp_act,expert_act,router_index,attn_indices", ""},
      {"expert_gate_up,expert_act", ""},  // rebuilt in the experts' backward: nothing re-run
  };
  for (const PolicyCase& c : cases) {
    const std::string what = name + " recompute " + c.recompute + " swap " + c.swap + (c.buffered ? " buffered" : "") +
                             (c.synchronous ? " synchronous" : "");
    const StepOutput<T> run = train_step<T>(config, c, dir);
    expect_bitwise_equal(keep, run, what);
    const bool rebuilt_only = c.recompute == "expert_gate_up,expert_act";
    EXPECT_EQ(run.counters.recomputed_bytes, rebuilt_only ? 0 : run.counters.dropped_bytes) << what;
    if (rebuilt_only) {
      EXPECT_EQ(run.counters.dropped_bytes > 0, config.num_experts > 0) << what;
    }
    EXPECT_EQ(run.counters.read_back_bytes + run.counters.swap_reused_bytes, run.counters.swapped_out_bytes) << what;
    if (c.synchronous) {
      EXPECT_EQ(run.counters.read_back_bytes, run.counters.swapped_out_bytes) << what;
    }
    if (c.recompute == "full" || c.recompute == "selective") {
      EXPECT_GT(run.counters.dropped_bytes, 0) << what;
    }
    if (!c.swap.empty()) {
      EXPECT_GT(run.counters.swapped_out_bytes, 0) << what;
    }
  }
}

TEST_P(MemoryPolicy, RecomputeAndSwapAreBitwiseKeepAll) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(GetParam()));
  test::with_threads(2, [&] {
    check_policies<float>(config, GetParam());
    check_policies<double>(config, GetParam());
  });
}

INSTANTIATE_TEST_SUITE_P(LayerKinds, MemoryPolicy, ::testing::ValuesIn(testing::kLayerKindConfigs),
                         testing::config_test_name);

}  // namespace
}  // namespace trillion
