// LoRA's frozen base in bf16 only (Model::keep_frozen_base_in_bf16_only), for every layer kind: the
// model whose base's linear weights live in the bf16 copy alone (their float pages released and
// inaccessible, so a kernel still reading them would fault) trains to the same bits as the same
// model keeping its floats, since every product reads the copy in both; the tier's bytes fall by
// the released pages, which the plan's ranges give; its checkpoint holds the copy's values (BF16)
// and reloads into a model that decodes and trains to the same bits; decoding maps the pages back
// and the next forward releases them again.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/memory.h"
#include "core/rng.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "test_configs.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

constexpr int64_t kBatch = 2, kSeq = 9;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, const char* stream) {
  std::vector<int32_t> tokens(n);
  const CounterRng rng(5, stream);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % vocab);
  return tokens;
}

// The trainable elements (the adapter, first in the buffer) of `to` = those of `from`.
void copy_trainable(const Model<float>& from, Model<float>& to) {
  std::memcpy(to.params(), from.params(), from.table().trainable_size() * sizeof(float));
}

// One training step of `model` (forward, backward, p -= 0.05 · g on the trainable elements): its loss.
float train_step(Model<float>& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  model.zero_grads();
  const StepResult result = model.forward_backward(tokens.data(), targets.data(), kBatch, kSeq,
                                                   LossScales{1.0 / double(kBatch * kSeq)});
  for (int64_t i = 0; i < model.table().trainable_size(); ++i) model.params()[i] -= 0.05f * model.grads()[i];
  return static_cast<float>(result.lm.loss_sum);
}

std::vector<float> trainable_grads(const Model<float>& model) {
  const float* grads = const_cast<Model<float>&>(model).grads();
  return std::vector<float>(grads, grads + model.table().trainable_size());
}

class Bf16OnlyBase : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16OnlyBase, TrainsSavesAndDecodesToTheBitsOfTheBaseKeptInFloat) {
  // An untied LM head of 8192 × D: a page-mapped buffer, whose pages the base's weights fill.
  ModelConfig config = testing::tiny_config_with({{"vocab_size", 8192}, {"tie_word_embeddings", false}}, GetParam());
  config.lora = std::make_shared<const LoraConfig>(LoraConfig::from_flags(4, 8, "all-linear"));
  const MatmulPrecisionScope bf16_products(MatmulPrecision::bf16);
  Model<float> released(config), kept(config);
  released.init_weights(3);
  kept.init_weights(3);
  const CounterRng rng(6, "adapter");  // B drawn non-zero, so that every pair moves the loss
  for (int64_t i = 0; i < released.table().trainable_size(); ++i)
    released.params()[i] = 0.2f * static_cast<float>(rng.uniform(i) - 0.5);
  copy_trainable(released, kept);

  int64_t planned = 0;
  for (const auto& [begin, end] : bf16_only_base_ranges(released.table())) planned += (end - begin) * 4;
  const int64_t before = MemoryStats::current(Tier::fast);
  released.keep_frozen_base_in_bf16_only();
  EXPECT_GE(planned, released.table().find("lm_head.weight").numel() * 4 - 2 * page_bytes())
      << "the head's whole pages at least";
  EXPECT_EQ(released.released_base_bytes(), planned);
  EXPECT_EQ(MemoryStats::current(Tier::fast) - before, released.table().total_size() * 2 - planned)
      << "the bf16 copy made, the float pages released";

  const std::vector<int32_t> tokens = random_tokens(kBatch * kSeq, config.vocab_size, "tokens");
  const std::vector<int32_t> targets = random_tokens(kBatch * kSeq, config.vocab_size, "targets");
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(std::bit_cast<uint32_t>(train_step(released, tokens, targets)),
              std::bit_cast<uint32_t>(train_step(kept, tokens, targets))) << "step " << step;
    EXPECT_EQ(trainable_grads(released), trainable_grads(kept)) << "step " << step;
  }

  // The checkpoint holds the values every product read: the base's linear weights rounded to bf16.
  const test::ScratchDir dir;
  released.save_weights(dir.path());
  Model<float> reloaded(config);
  reloaded.load_weights(dir.path());
  copy_trainable(released, reloaded);
  for (const ParamSpec& spec : reloaded.table().entries()) {
    if (spec.adapter) continue;
    const bool rounded = spec.frozen && spec.use == ParamUse::products;
    for (int64_t i = 0; i < spec.numel(); ++i) {
      const float value = kept.params()[spec.offset + i];
      ASSERT_EQ(reloaded.params()[spec.offset + i], rounded ? round_to_bf16(value) : value) << spec.name << " " << i;
    }
  }

  // Decoding maps the pages back (MLA's absorbed decode reads kv_b_proj's floats): the reloaded
  // model's logits to the bit.
  std::vector<float> logits(config.vocab_size), reloaded_logits(config.vocab_size);  // [V]
  released.start_generation(kSeq);
  reloaded.start_generation(kSeq);
  EXPECT_EQ(released.released_base_bytes(), 0);
  for (int64_t t = 0; t < 3; ++t) {
    released.generate_step(tokens.data() + t, 1, logits.data());
    reloaded.generate_step(tokens.data() + t, 1, reloaded_logits.data());
    EXPECT_EQ(logits, reloaded_logits) << "token " << t;
  }
  // The next step releases them again and trains as the reloaded model.
  EXPECT_EQ(std::bit_cast<uint32_t>(train_step(released, tokens, targets)),
            std::bit_cast<uint32_t>(train_step(reloaded, tokens, targets)));
  EXPECT_EQ(trainable_grads(released), trainable_grads(reloaded));
  EXPECT_EQ(released.released_base_bytes(), planned);
}

INSTANTIATE_TEST_SUITE_P(LayerKinds, Bf16OnlyBase, ::testing::ValuesIn(testing::kLayerKindConfigs),
                         testing::config_test_name);

}  // namespace
}  // namespace trillion
