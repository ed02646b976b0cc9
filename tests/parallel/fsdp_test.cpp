// FSDP's units in one process (a group of one, no MPI), tied embeddings and not: the peak of
// gathered bytes is the analytic one of the model's unit order (a unit and the one it prefetches,
// plus unit 0 while it stays, when tied: untied, the embeddings and the LM head are units of their
// own, never gathered together), every unit's gradients are released after the step, and the shard gradients
// are the plain model's, bit for bit.
#include "parallel/fsdp.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "model/lora_config.h"
#include "model/model.h"
#include "model/test_configs.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

constexpr int64_t kBatch = 2, kSeq = 5;

struct Batch {
  std::vector<int32_t> tokens, targets;  // [kBatch, kSeq] each
};

Batch random_batch(int64_t vocab) {
  Batch b{std::vector<int32_t>(kBatch * kSeq), std::vector<int32_t>(kBatch * kSeq)};
  const CounterRng rng(5, "fsdp batch");
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    b.tokens[i] = static_cast<int32_t>(rng.bits(2 * i) % vocab);
    b.targets[i] = static_cast<int32_t>(rng.bits(2 * i + 1) % vocab);
  }
  return b;
}

ModelConfig config_of(bool tied) {
  return testing::tiny_config_with({{"tie_word_embeddings", tied}}, "tiny_qwen3_moe.json");
}

class FsdpUnits : public ::testing::TestWithParam<bool> {  // tied embeddings or not
 protected:
  void SetUp() override { omp_set_num_threads(1); }
};

TEST_P(FsdpUnits, OneRankGivesThePlainGradientsAndTheAnalyticPeak) {
  const ModelConfig config = config_of(GetParam());
  const Batch b = random_batch(config.vocab_size);
  Model<double> plain(config);
  plain.init_weights(1);
  plain.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, LossScales{});

  Model<double> model(config);
  model.init_weights(1);
  const ProcessGroup& world = ProcessGroup::world();
  ASSERT_EQ(world.size(), 1) << "run without mpirun";
  const ShardLayout layout(model.table(), 0, 1);
  Fsdp<double> fsdp(model, world, world, layout);
  model.set_unit_hooks(fsdp.hooks());
  model.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, LossScales{});

  const int64_t trainable = model.table().trainable_size();
  ASSERT_EQ(fsdp.shard_size(), trainable) << "one rank's shard is the flat layout";
  EXPECT_EQ(std::memcmp(fsdp.shard_grads(), plain.grads(), trainable * sizeof(double)), 0);
  EXPECT_TRUE(std::all_of(model.grads(), model.grads() + trainable, [](double x) { return x == 0.0; }))
      << "every unit's gradients reduce-scattered into the shard and released";

  // Bytes of each unit; the peak is a unit in use with the one it prefetches (the next in the
  // order), plus unit 0 throughout when tied.
  const UnitOrder order = unit_order(config);
  std::vector<int64_t> bytes(order.forward.size(), 0);
  for (const ShardLayout::Unit& piece : layout.units()) bytes[piece.table_unit] += piece.count * 8;
  int64_t peak = 0;
  for (const std::vector<int>* units : {&order.forward, &order.backward}) {
    for (size_t i = 0; i < units->size(); ++i) {
      const int unit = (*units)[i];
      const int64_t next = i + 1 < units->size() ? bytes[(*units)[i + 1]] : 0;
      const int64_t stays = GetParam() && unit != 0 ? bytes[0] : 0;
      peak = std::max(peak, bytes[unit] + next + stays);
    }
  }
  EXPECT_EQ(fsdp.counters().peak_gathered_bytes, peak);
  EXPECT_EQ(fsdp.counters().gathered_bytes, 0) << "one rank moves nothing";
}

INSTANTIATE_TEST_SUITE_P(TiedOrNot, FsdpUnits, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Tied" : "Untied"; });

// Under the bf16 precision, units gathered in bf16 runs (products-only tensors as bf16 into the
// registered copy, the rest as float) give the bits of float gathers whose products round each
// weight, in fewer gathered bytes, for every layer kind, tied embeddings too, and with LoRA on
// every linear weight, whose frozen shard holds those weights in bf16 alone. The float parameters
// of the products-only tensors are poisoned with NaN: a kernel that read one as values would show.
// Between the two steps the shard changes, so a stale rounding would show too.
class FsdpBf16Gathers : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { omp_set_num_threads(1); }
};

TEST_P(FsdpBf16Gathers, GiveTheBitsOfFloatGathersInFewerBytes) {
  const MatmulPrecisionScope bf16_products(MatmulPrecision::bf16);
  for (const auto& [tied, lora] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (lora ? ", LoRA on every linear weight" : ""));
    ModelConfig config = testing::tiny_config_with({{"tie_word_embeddings", tied}}, GetParam());
    if (lora) config.lora = std::make_shared<const LoraConfig>(LoraConfig::from_flags(2, 4, "all-linear"));
    const Batch b = random_batch(config.vocab_size);
    struct Run {
      double loss = 0.0;
      std::vector<float> grads;  // [shard] after each step
      FsdpCounters counters;
      int64_t frozen_bytes = 0;
    };
    const auto run = [&](Operands gathers) {
      Model<float> model(config);
      model.init_weights(3);
      const ProcessGroup& world = ProcessGroup::world();
      const ShardLayout layout(model.table(), 0, 1);
      Fsdp<float> fsdp(model, world, world, layout, gathers);
      model.set_unit_hooks(fsdp.hooks());
      if (gathers == Operands::as_set) {
        for (const ParamSpec& spec : model.table().entries())
          if (spec.use == ParamUse::products)
            std::fill_n(model.params() + spec.offset, spec.numel(), std::numeric_limits<float>::quiet_NaN());
      }
      Run r;
      for (int step = 0; step < 2; ++step) {
        for (int64_t i = 0; step == 1 && i < fsdp.shard_size(); ++i) fsdp.shard_params()[i] *= 1.0f - 0.25f * (i % 3);
        r.loss += model.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, LossScales{}).lm.loss_sum;
        r.grads.insert(r.grads.end(), fsdp.shard_grads(), fsdp.shard_grads() + fsdp.shard_size());
      }
      r.counters = fsdp.counters();
      r.frozen_bytes = fsdp.frozen_shard_bytes();
      return r;
    };
    const Run floats = run(Operands::fp32), rounded = run(Operands::as_set);
    EXPECT_TRUE(std::isfinite(rounded.loss));
    EXPECT_EQ(rounded.loss, floats.loss);
    ASSERT_EQ(rounded.grads.size(), floats.grads.size());
    EXPECT_EQ(std::memcmp(rounded.grads.data(), floats.grads.data(), floats.grads.size() * sizeof(float)), 0);
    EXPECT_LT(rounded.counters.peak_gathered_bytes, floats.counters.peak_gathered_bytes);
    EXPECT_GE(2 * rounded.counters.peak_gathered_bytes, floats.counters.peak_gathered_bytes);
    // LoRA's frozen base: its linear weights held in bf16 alone.
    if (lora) {
      EXPECT_LT(rounded.frozen_bytes, floats.frozen_bytes);
      EXPECT_GE(2 * rounded.frozen_bytes, floats.frozen_bytes);
    } else {
      EXPECT_EQ(rounded.frozen_bytes, 0);
    }
  }
}

// bf16 gathers leave the float weights of products-only tensors unwritten, so a precision changed
// since the FSDP object was built stops the next gather (a broken invariant, not bad input).
TEST(FsdpBf16GathersGuard, APrecisionChangedSinceIsRefused) {
  const ModelConfig config = testing::tiny_config_with(nullptr, "tiny.json");
  const Batch b = random_batch(config.vocab_size);
  Model<float> model(config);
  model.init_weights(3);
  const ShardLayout layout(model.table(), 0, 1);
  std::optional<Fsdp<float>> fsdp;
  {
    const MatmulPrecisionScope bf16_products(MatmulPrecision::bf16);
    fsdp.emplace(model, ProcessGroup::world(), ProcessGroup::world(), layout);
  }
  model.set_unit_hooks(fsdp->hooks());
  EXPECT_DEATH(model.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, LossScales{}),
               "FSDP gathers in bf16 for the bf16 precision, which has changed since");
}

INSTANTIATE_TEST_SUITE_P(LayerKinds, FsdpBf16Gathers, ::testing::ValuesIn(testing::kLayerKindConfigs),
                         testing::config_test_name);

}  // namespace
}  // namespace trillion
