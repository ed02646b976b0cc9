// The memory plan's shape-only sizes against the real store and the fast tier, for every layer
// kind that has landed, whole sequences and under context parallelism: each layer's saved tensors (tag by tag, bytes
// exactly: the mixer's and the FFN sublayer's), and its forward's and its backward's workspace estimates each an upper
// bound, not a loose one, of what that pass holds beyond the saved tensors (MemoryStats' peak in the unit: scratch
// arena and the kernels' own temporaries).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "model/decoder_layer.h"
#include "model/model.h"
#include "ops/finite_diff.h"
#include "parallel/context_parallel.h"
#include "test_configs.h"

namespace trillion {
namespace {

using SizeMap = std::map<std::string, int64_t>;  // tag name → bytes

SizeMap by_tag(const std::vector<SavedSize>& sizes) {
  SizeMap map;
  for (const SavedSize& s : sizes) {
    EXPECT_EQ(map.count(activation_tag_name(s.tag)), 0u) << activation_tag_name(s.tag) << " listed twice";
    map[activation_tag_name(s.tag)] = s.bytes;
  }
  return map;
}

std::string describe(const SizeMap& map) {
  std::string text;
  for (const auto& [tag, bytes] : map) text += tag + "=" + std::to_string(bytes) + " ";
  return text;
}

// bf16_operands: under the bf16 precision, with the store keeping products' saved operands in bf16.
// split: through context parallelism's exchange on a group of one rank (parallel/context_parallel.h),
// which holds both chunks of each sequence: every mixer's gathers, per-chunk kernels and state passing
// allocate as on each rank of a larger group, and the plan counts them with this rank's split.
template <class T>
void check_sizes(const std::string& config_name, IndexerMode mode, double indexer_coef, int64_t batch, int64_t seq,
                 bool bf16_operands = false, bool split = false) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(config_name));
  const MatmulPrecisionScope precision(bf16_operands ? MatmulPrecision::bf16 : MatmulPrecision::fp32);
  Model<T> model(config);
  model.init_weights(5);
  if (model.sparse_layers() > 0) model.set_indexer_training(mode, indexer_coef);
  std::optional<ContextParallel> context;
  std::optional<ContextSplitPlan> context_plan;
  if (split) {
    context.emplace(ProcessGroup::world(), seq);
    context_plan.emplace(context->split(), context->rank());
    model.set_context_exchange(&*context);
  }
  StepShape shape;
  shape.batch = batch;
  shape.seq = seq;
  shape.element_bytes = sizeof(T);
  shape.threads = num_threads();
  shape.indexer.mode = mode;
  shape.indexer.coef = model.sparse_layers() > 0 ? indexer_coef : 0.0;
  shape.bf16_operands = bf16_operands;
  if (split) shape.context = &*context_plan;
  const int layers = static_cast<int>(config.num_hidden_layers);
  std::vector<SizeMap> saved(layers);
  std::vector<int64_t> forward_peak(layers), backward_peak(layers);
  int64_t base = 0;  // the fast tier's bytes when the unit starts
  const auto start_unit = [&](int) {
    model.reset_workspace();
    base = MemoryStats::current(Tier::fast);
    MemoryStats::reset_peak(Tier::fast);
  };
  UnitHooks hooks;
  hooks.before_forward = start_unit;
  const auto is_layer = [&](int unit) { return unit >= 1 && unit <= layers; };  // not the embeddings or head
  hooks.after_forward = [&](int unit) {
    if (!is_layer(unit)) return;
    SizeMap& map = saved[unit - 1];
    int64_t saved_bytes = 0;  // as the store counts them: small entries rounded by its arena
    using Tag = ActivationTag;  // entries carry their real shapes: the ranks of the main tensors
    static const std::map<Tag, int> kRank = {
        {Tag::q_raw, 3},      {Tag::q, 3},        {Tag::k_raw, 3},        {Tag::k, 3},
        {Tag::v, 3},          {Tag::attn_out, 2}, {Tag::la_q_hat, 3},     {Tag::la_k_hat, 3},
        {Tag::la_conv_in, 2}, {Tag::mla_kv_a, 2}, {Tag::attn_indices, 2}, {Tag::ffn_norm_out, 2},
        {Tag::expert_gate_up, 2}};
    for (const ActivationStore::EntryInfo& e : model.activations().entries(unit - 1)) {
      map[activation_tag_name(e.tag)] = e.bytes;
      if (const auto it = kRank.find(e.tag); it != kRank.end()) {
        EXPECT_EQ(e.shape.rank(), it->second) << activation_tag_name(e.tag) << " layer " << unit - 1;
      }
      saved_bytes += ActivationStore::held_bytes(e.bytes, ActivationStore::kPagedMinBytes);
    }
    forward_peak[unit - 1] = MemoryStats::peak(Tier::fast) - base - saved_bytes;
  };
  hooks.before_backward = start_unit;
  hooks.after_backward = [&](int unit) {
    if (is_layer(unit)) backward_peak[unit - 1] = MemoryStats::peak(Tier::fast) - base;
  };
  model.set_unit_hooks(hooks);
  const int64_t n = batch * seq;
  const CounterRng rng(8, "memory_sizes_test");
  std::vector<int32_t> tokens(n), targets(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(rng.bits(i) % config.vocab_size);
    targets[i] = static_cast<int32_t>(rng.bits(n + i) % config.vocab_size);
  }
  model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / double(n), 1.0});
  for (int layer = 0; layer < layers; ++layer) {
    const DecoderLayerDims dims = DecoderLayerDims::from_config(config, layer);
    const std::string where = config_name + " layer " + std::to_string(layer) + " " + indexer_mode_name(mode) +
                              " batch " + std::to_string(batch) + " seq " + std::to_string(seq) +
                              (split ? " split" : "");
    const std::vector<SavedSize> sizes = dims.saved_sizes(shape);
    const SizeMap expected = by_tag(sizes);
    // The bf16 operands' float copies, which the plan counts beside the workspace, while their
    // part runs: the measured peaks hold those of one part at most.
    int64_t part_copies[2] = {};  // mixer, FFN
    for (const SavedSize& s : sizes) part_copies[tag_sublayer(s.tag) == TagSublayer::ffn] += s.float_copy;
    const int64_t float_copies = std::max(part_copies[0], part_copies[1]);
    EXPECT_EQ(expected, saved[layer]) << where << "\n  estimated: " << describe(expected)
                                      << "\n  saved:     " << describe(saved[layer]);
    const LayerWorkspace estimate = dims.workspace_bytes(shape);
    for (const auto& [pass, estimated, measured] :
         {std::tuple{"forward", estimate.forward(), forward_peak[layer] - float_copies},
          std::tuple{"backward", estimate.backward(), backward_peak[layer] - float_copies}}) {
      EXPECT_GE(estimated, measured) << where << " " << pass;
      EXPECT_LE(estimated, measured + measured / 4 + (int64_t{64} << 10)) << where << " " << pass;
    }
  }
}

class MemorySizes : public ::testing::TestWithParam<const char*> {};

TEST_P(MemorySizes, MatchTheStoreAndTheScratchArena) {
  test::with_threads(2, [&] {
    for (const auto& [batch, seq] : std::vector<std::pair<int64_t, int64_t>>{{2, 9}, {1, 33}}) {
      check_sizes<float>(GetParam(), IndexerMode::sparse, 0.5, batch, seq);
      check_sizes<double>(GetParam(), IndexerMode::sparse, 0.0, batch, seq);
      check_sizes<float>(GetParam(), IndexerMode::warmup, 1.0, batch, seq);
      check_sizes<float>(GetParam(), IndexerMode::dense, 0.5, batch, seq);
      check_sizes<float>(GetParam(), IndexerMode::sparse, 0.5, batch, seq, /*bf16_operands=*/true);
      check_sizes<float>(GetParam(), IndexerMode::dense, 0.5, batch, seq, /*bf16_operands=*/true);
      check_sizes<float>(GetParam(), IndexerMode::sparse, 0.5, batch, seq, false, /*split=*/true);
      check_sizes<double>(GetParam(), IndexerMode::sparse, 0.0, batch, seq, false, /*split=*/true);
      check_sizes<float>(GetParam(), IndexerMode::dense, 0.5, batch, seq, /*bf16_operands=*/true, /*split=*/true);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(LayerKinds, MemorySizes, ::testing::ValuesIn(testing::kLayerKindConfigs),
                         testing::config_test_name);

}  // namespace
}  // namespace trillion
