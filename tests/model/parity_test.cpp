// Model parity against Hugging Face transformers 5.x: the fixtures in tests/fixtures/models/<name>/
// were written by tools/ref/write_model_fixture.py with the library's own modelling code in float64
// (its float32 sites patched), random weights, tokens [2, 7] with one ignored target, saved with
// save_pretrained (config.json and model.safetensors as transformers writes them; MoE fixtures also
// in the fused layout under fused/). Families: qwen3 (also tied), qwen3_next (dense and MoE with the
// gated shared expert and aux loss, every layer full attention; and the hybrid: Gated DeltaNet,
// full attention, MoE), qwen3_moe (aux loss), glm4_moe
// (sigmoid router, correction bias, groups, shared expert, a dense first layer, attention bias,
// partial RoPE). Model<double> loads the same weights and must reproduce the loss terms, every
// parameter gradient and the logits (through the decoding path, the only path that exposes logits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/relative_error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/cross_entropy.h"

namespace trillion {
namespace {

const std::string kFixtureRoot = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/models/";
constexpr int64_t kBatch = 2, kSeq = 7;

// Token ids are stored as F64 (the safetensors dtypes we read are floating point); exact there.
std::vector<int32_t> read_ids(const SafetensorsReader& fixture, const std::string& name) {
  std::vector<double> values(kBatch * kSeq);  // [batch, seq]
  fixture.read(name, {kBatch, kSeq}, values.data());
  std::vector<int32_t> ids(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(values[i], std::round(values[i])) << name << "[" << i << "] is not an integer";
    ids[i] = static_cast<int32_t>(values[i]);
  }
  return ids;
}

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = kFixtureRoot + GetParam();
    config_ = ModelConfig::load(dir_ + "/config.json");
    model_ = std::make_unique<Model<double>>(config_);
    model_->load_weights(dir_);
    fixture_ = std::make_unique<SafetensorsReader>(dir_ + "/fixture.safetensors");
    tokens_ = read_ids(*fixture_, "tokens");
    targets_ = read_ids(*fixture_, "targets");
  }

  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<Model<double>> model_;
  std::unique_ptr<SafetensorsReader> fixture_;
  std::vector<int32_t> tokens_, targets_;  // [batch, seq]
};

// Tolerances: what holds in float64 with transformers' float32 sites patched, about ten times the
// worst seen (printed by the tests: loss ≤ 3.4e-16, gradients ≤ 5.2e-15 with full attention and
// 2.0e-14 with Gated DeltaNet layers (chunked here, chunked differently there), logits ≤ 1.6e-15;
// what is left is summation order).
constexpr double kLossTolerance = 5e-15, kGradTolerance = 2e-13, kLogitTolerance = 2e-14;

double read_scalar(const SafetensorsReader& fixture, const std::string& name) {
  double value = 0.0;
  fixture.read(name, {}, &value);
  return value;
}

TEST_P(Parity, LossAndEveryGradientMatchTransformers) {
  const int64_t count = std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t != kIgnoreIndex; });
  ASSERT_EQ(count, kBatch * kSeq - 1) << "the fixture has one ignored target";
  model_->zero_grads();
  const LossScales scales{1.0 / static_cast<double>(count), 1.0};  // one micro-batch: the aux term as is
  const StepResult result = model_->forward_backward(tokens_.data(), targets_.data(), kBatch, kSeq, scales);
  ASSERT_EQ(result.lm.count, count);

  const double expected_loss = read_scalar(*fixture_, "loss"), loss = result.objective(scales);
  const double loss_error = std::abs(loss - expected_loss) / std::abs(expected_loss);
  EXPECT_LE(loss_error, kLossTolerance) << "loss " << loss << " vs transformers " << expected_loss;
  const double expected_lm = read_scalar(*fixture_, "lm_loss"), lm = result.lm.loss_sum * scales.lm;
  EXPECT_LE(std::abs(lm - expected_lm) / expected_lm, kLossTolerance) << "lm_loss " << lm << " vs " << expected_lm;
  if (fixture_->contains("aux_loss")) {
    ASSERT_EQ(result.aux.size(), 1u);
    const double expected_aux = read_scalar(*fixture_, "aux_loss");
    EXPECT_LE(std::abs(result.aux[0].value - expected_aux) / expected_aux, kLossTolerance)
        << "aux_loss " << result.aux[0].value << " vs " << expected_aux;
    EXPECT_EQ(result.aux[0].coef, config_.router_aux_loss_coef);
  } else {
    EXPECT_TRUE(result.aux.empty());
  }

  // Every trainable parameter has a reference gradient, and the fixture holds no others, except the
  // lightning indexer's (deepseek_v32): transformers runs it under no_grad and so do we (the LM loss
  // does not reach it; its own loss is off here), so its gradient is exactly zero.
  int64_t grad_tensors = 0, trainable = 0;
  for (const auto& [name, info] : fixture_->tensors()) grad_tensors += name.rfind("grad.", 0) == 0 ? 1 : 0;
  double worst = 0.0;
  std::string worst_name;
  for (const ParamSpec& spec : model_->table().entries()) {
    if (!spec.trainable()) continue;
    if (spec.name.find(".self_attn.indexer.") != std::string::npos) {
      EXPECT_FALSE(fixture_->contains("grad." + spec.name)) << spec.name;
      const double* grad = model_->grads() + spec.offset;
      EXPECT_TRUE(std::all_of(grad, grad + spec.numel(), [](double g) { return g == 0.0; })) << spec.name;
      continue;
    }
    ++trainable;
    std::vector<double> expected(spec.numel());  // shape of the parameter
    fixture_->read("grad." + spec.name, spec.shape, expected.data());
    const double error = relative_error(model_->grads() + spec.offset, expected.data(), spec.numel());
    EXPECT_LE(error, kGradTolerance) << "gradient of " << spec.name;
    if (error >= worst) worst = error, worst_name = spec.name;
  }
  EXPECT_EQ(grad_tensors, trainable);
  std::printf("%s: loss rel err %.2e, worst gradient rel err %.2e (%s)\n", GetParam().c_str(), loss_error, worst,
              worst_name.c_str());
}

// save_original_format=False writes the fused in-memory layout: it loads to the same parameters.
class FusedLayoutParity : public Parity {};

TEST_P(FusedLayoutParity, LoadsTheSameWeights) {
  Model<double> fused(ModelConfig::load(dir_ + "/fused/config.json"));
  fused.load_weights(dir_ + "/fused");
  EXPECT_EQ(0, std::memcmp(fused.params(), model_->params(), model_->table().total_size() * sizeof(double)));
  const SafetensorsReader file(dir_ + "/fused/model.safetensors");
  EXPECT_TRUE(file.contains("model.layers.1.mlp.experts.gate_up_proj"));
}

// Sparse attention layers select the keys transformers' indexer selects (as sets: transformers
// orders them by torch's top-k; the fixture holds them sorted, −1 for picks past the visible keys).
class SparseParity : public Parity {};

TEST_P(SparseParity, SelectsTheKeysTransformersSelects) {
  model_->forward_loss(tokens_.data(), targets_.data(), kBatch, kSeq);
  const int64_t topk = std::min<int64_t>(config_.index_topk, kSeq);
  int layers = 0;
  for (int layer = 0; layer < config_.num_hidden_layers; ++layer) {
    if (!fixture_->contains("indexer_topk." + std::to_string(layer))) continue;
    ++layers;
    std::vector<double> expected(kBatch * kSeq * topk);  // [batch, seq, topk]
    fixture_->read("indexer_topk." + std::to_string(layer), {kBatch, kSeq, topk}, expected.data());
    const std::vector<int32_t>& ours = model_->decisions().recorded(DecisionKind::selection, layer);
    ASSERT_EQ(int64_t(ours.size()), kBatch * kSeq * config_.index_topk);
    for (int64_t row = 0; row < kBatch * kSeq; ++row) {
      std::vector<int32_t> want, got;
      for (int64_t j = 0; j < topk; ++j)
        if (expected[row * topk + j] >= 0) want.push_back(int32_t(expected[row * topk + j]));
      for (int64_t j = 0; j < config_.index_topk; ++j)
        if (ours[row * config_.index_topk + j] >= 0) got.push_back(ours[row * config_.index_topk + j]);
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << "layer " << layer << " row " << row;
    }
  }
  EXPECT_EQ(layers, config_.num_hidden_layers);
}

TEST_P(Parity, DecodingLogitsMatchTransformers) {
  const int64_t V = config_.vocab_size;
  std::vector<double> expected(kBatch * kSeq * V);  // [batch, seq, vocab]
  fixture_->read("logits", {kBatch, kSeq, V}, expected.data());

  // Prefill of sequence 0 in one step: logits of its last position.
  std::vector<double> last(V);  // [vocab]
  model_->start_generation(kSeq);
  model_->generate_step(tokens_.data(), kSeq, last.data());
  const double prefill_error = relative_error(last.data(), expected.data() + (kSeq - 1) * V, V);
  EXPECT_LE(prefill_error, kLogitTolerance) << "prefill, last position";

  // Token by token through the KV cache: the logits of every position of both sequences.
  std::vector<double> logits(kBatch * kSeq * V);  // [batch, seq, vocab]
  for (int64_t b = 0; b < kBatch; ++b) {
    model_->start_generation(kSeq);
    for (int64_t t = 0; t < kSeq; ++t)
      model_->generate_step(tokens_.data() + b * kSeq + t, 1, logits.data() + (b * kSeq + t) * V);
  }
  const double decode_error = relative_error(logits.data(), expected.data(), kBatch * kSeq * V);
  EXPECT_LE(decode_error, kLogitTolerance) << "token by token";
  std::printf("%s: logits rel err %.2e (prefill), %.2e (token by token)\n", GetParam().c_str(), prefill_error,
              decode_error);
}

INSTANTIATE_TEST_SUITE_P(Models, Parity, ::testing::Values("tiny_qwen3", "tiny_qwen3_next", "tiny_qwen3_tied", "tiny_qwen3_moe",
                                                           "tiny_qwen3_next_moe", "tiny_glm4_moe",
                                                           "tiny_qwen3_next_hybrid", "tiny_kimi_linear_kda",
                                                           "tiny_deepseek_v3", "tiny_deepseek_v3_yarn", "tiny_kimi_linear",
                                                           "tiny_deepseek_v32"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(SparseModels, SparseParity, ::testing::Values("tiny_deepseek_v32"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(MoeModels, FusedLayoutParity,
                         ::testing::Values("tiny_qwen3_moe", "tiny_qwen3_next_moe", "tiny_glm4_moe",
                                           "tiny_qwen3_next_hybrid", "tiny_kimi_linear_kda", "tiny_deepseek_v3",
                                           "tiny_deepseek_v3_yarn", "tiny_kimi_linear", "tiny_deepseek_v32"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace trillion
