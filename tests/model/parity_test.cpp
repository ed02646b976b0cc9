// Model parity against Hugging Face transformers: the fixtures in tests/fixtures/models/<name>/ were
// written by tools/ref/write_model_fixture.py (Qwen3ForCausalLM / Qwen3NextForCausalLM in float64,
// random weights, tokens [2, 7] with one ignored target; tiny_qwen3_tied is tiny.json with tied
// embeddings). Model<double> loads the same weights and
// must reproduce the loss, every parameter gradient and the logits (through the KV-cache decoding
// path, the only path that exposes logits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

TEST_P(Parity, LossAndEveryGradientMatchTransformers) {
  const int64_t count = std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t != kIgnoreIndex; });
  ASSERT_EQ(count, kBatch * kSeq - 1) << "the fixture has one ignored target";
  model_->zero_grads();
  const CrossEntropyResult result =
      model_->forward_backward(tokens_.data(), targets_.data(), kBatch, kSeq, 1.0 / static_cast<double>(count));
  ASSERT_EQ(result.count, count);

  double expected_loss = 0.0;
  fixture_->read("loss", {}, &expected_loss);
  const double loss = result.loss_sum / static_cast<double>(result.count);
  EXPECT_LE(std::abs(loss - expected_loss) / std::abs(expected_loss), 1e-10)
      << "loss " << loss << " vs transformers " << expected_loss;

  // Every parameter has a reference gradient, and the fixture holds no others.
  int64_t grad_tensors = 0;
  for (const auto& [name, info] : fixture_->tensors()) grad_tensors += name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(grad_tensors, static_cast<int64_t>(model_->table().entries().size()));
  for (const ParamSpec& spec : model_->table().entries()) {
    std::vector<double> expected(spec.numel());  // shape of the parameter
    fixture_->read("grad." + spec.name, spec.shape, expected.data());
    const double error = relative_error(model_->grads() + spec.offset, expected.data(), spec.numel());
    EXPECT_LE(error, 1e-9) << "gradient of " << spec.name;
  }
}

TEST_P(Parity, DecodingLogitsMatchTransformers) {
  const int64_t V = config_.vocab_size;
  std::vector<double> expected(kBatch * kSeq * V);  // [batch, seq, vocab]
  fixture_->read("logits", {kBatch, kSeq, V}, expected.data());

  // Prefill of sequence 0 in one step: logits of its last position.
  std::vector<double> last(V);  // [vocab]
  model_->start_generation(kSeq);
  model_->generate_step(tokens_.data(), kSeq, last.data());
  EXPECT_LE(relative_error(last.data(), expected.data() + (kSeq - 1) * V, V), 1e-10) << "prefill, last position";

  // Token by token through the KV cache: the logits of every position of both sequences.
  std::vector<double> logits(kBatch * kSeq * V);  // [batch, seq, vocab]
  for (int64_t b = 0; b < kBatch; ++b) {
    model_->start_generation(kSeq);
    for (int64_t t = 0; t < kSeq; ++t)
      model_->generate_step(tokens_.data() + b * kSeq + t, 1, logits.data() + (b * kSeq + t) * V);
  }
  EXPECT_LE(relative_error(logits.data(), expected.data(), kBatch * kSeq * V), 1e-10) << "token by token";
}

INSTANTIATE_TEST_SUITE_P(Models, Parity, ::testing::Values("tiny_qwen3", "tiny_qwen3_next", "tiny_qwen3_tied"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace trillion
