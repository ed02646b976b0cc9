// The model: whole-model gradient check in double (Qwen3, Qwen3-Next, tied head), float against
// double, KV-cache generation against the training path and rejected layer kinds. The check itself
// and `trillion gradcheck` are tested in gradient_check_test.cpp.
#include "model/model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/rng.h"
#include "model/gradient_check.h"
#include "ops/finite_diff.h"
#include "test_configs.h"

namespace trillion {
namespace {

// Tiny models are faster on one thread than on an oversubscribed team.
class SingleThread {
 public:
  SingleThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, const char* stream) {
  std::vector<int32_t> tokens(n);
  const CounterRng rng(3, stream);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % vocab);
  return tokens;
}

void expect_gradients_match(const ModelConfig& config, int64_t batch, int64_t seq) {
  SingleThread single;
  GradientCheckOptions options;
  options.batch = batch;
  options.seq = seq;
  const GradientCheckReport report = check_model_gradients(config, options);
  ASSERT_TRUE(report.full);
  EXPECT_EQ(report.tensors.size(), Model<double>(config).table().entries().size());
  for (const TensorCheck& t : report.tensors) {
    EXPECT_LE(t.rel_err, 1e-6) << t.name << " max_abs_err " << t.max_abs_err << " max_ref " << t.max_ref;
    EXPECT_GT(t.max_ref, 1e-8) << t.name << ": the check needs a gradient that is not zero";
  }
}

TEST(Model, GradientCheckQwen3) {
  expect_gradients_match(ModelConfig::load(testing::model_config_path("tiny.json")), 2, 7);
}

TEST(Model, GradientCheckQwen3NextGatedZeroCentredPartialRope) {
  expect_gradients_match(ModelConfig::load(testing::model_config_path("tiny_qwen3_next.json")), 2, 5);
}

TEST(Model, GradientCheckTiedEmbeddingsOneKvHeadThreeLayers) {
  expect_gradients_match(testing::tiny_config_with({{"tie_word_embeddings", true},
                                                    {"num_key_value_heads", 1},
                                                    {"num_hidden_layers", 3},
                                                    {"vocab_size", 37}}),
                         1, 9);
}

TEST(Model, FloatMatchesDouble) {
  for (const char* name : {"tiny.json", "tiny_qwen3_next.json"}) {
    const ModelConfig config = ModelConfig::load(testing::model_config_path(name));
    Model<float> f(config);
    Model<double> d(config);
    f.init_weights(11);
    for (int64_t i = 0; i < f.table().total_size(); ++i) d.params()[i] = f.params()[i];
    const int64_t batch = 3, seq = 11, n = batch * seq;
    const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "tokens");
    std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "targets");
    targets[4] = kIgnoreIndex;
    f.zero_grads();
    d.zero_grads();
    const CrossEntropyResult rf = f.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / (n - 1)}).lm;
    const CrossEntropyResult rd = d.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / (n - 1)}).lm;
    EXPECT_EQ(rf.count, n - 1);
    EXPECT_NEAR(rf.loss_sum, rd.loss_sum, 1e-5 * rd.loss_sum) << name;
    for (const ParamSpec& s : d.table().entries()) {
      double max_diff = 0, max_ref = 0;
      for (int64_t i = 0; i < s.numel(); ++i) {
        max_diff = std::max(max_diff, std::abs(double(f.grads()[s.offset + i]) - d.grads()[s.offset + i]));
        max_ref = std::max(max_ref, std::abs(d.grads()[s.offset + i]));
      }
      EXPECT_LE(max_diff / max_ref, 2e-5) << name << " " << s.name;
    }
  }
}

// The LM loss's two ways of forming its gradients (in the forward, the default; recomputed in the
// backward) give the same loss and gradients, tied head included; only recompute keeps no dh.
TEST(Model, LossGradientsInForwardEqualRecomputed) {
  for (const char* name : {"tiny.json", "tiny_deepseek_v32.json"}) {
    const ModelConfig config = ModelConfig::load(testing::model_config_path(name));
    Model<double> model(config);
    model.init_weights(5);
    const int64_t batch = 2, seq = 9, n = batch * seq, size = model.table().trainable_size();
    const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "tokens");
    std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "targets");
    targets[3] = kIgnoreIndex;
    std::vector<double> grads[2];
    double loss[2];
    int i = 0;
    for (LossGradients mode : {LossGradients::in_forward, LossGradients::recompute}) {
      model.set_loss_gradients(mode);
      model.zero_grads();
      loss[i] = model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / (n - 1)}).lm.loss_sum;
      grads[i++].assign(model.grads(), model.grads() + size);
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-13 * loss[1]) << name;
    EXPECT_LE(test::relative_error(grads[0], grads[1]), 1e-12) << name;
  }
}

// Two different micro-batches (halves of one batch), each scaled by 1 / (tokens of the whole
// batch), accumulate to the gradient of one forward_backward over the whole batch.
TEST(Model, GradientsAccumulateAcrossMicroBatches) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny.json"));
  Model<double> model(config);
  model.init_weights(2);
  const int64_t batch = 4, seq = 6, n = batch * seq, half = n / 2, size = model.table().total_size();
  const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "t");    // [batch, seq]
  const std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "u");   // [batch, seq]
  const double scale = 1.0 / double(n);
  model.zero_grads();
  const CrossEntropyResult whole = model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{scale}).lm;
  const std::vector<double> whole_grads(model.grads(), model.grads() + size);

  model.zero_grads();
  const CrossEntropyResult first =
      model.forward_backward(tokens.data(), targets.data(), batch / 2, seq, LossScales{scale}).lm;
  const std::vector<double> first_grads(model.grads(), model.grads() + size);
  const CrossEntropyResult second =
      model.forward_backward(tokens.data() + half, targets.data() + half, batch / 2, seq, LossScales{scale}).lm;
  EXPECT_EQ(first.count + second.count, whole.count);
  EXPECT_NEAR(first.loss_sum + second.loss_sum, whole.loss_sum, 1e-12 * whole.loss_sum);
  double max_diff = 0.0, max_ref = 0.0, halves_differ = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    max_diff = std::max(max_diff, std::abs(model.grads()[i] - whole_grads[i]));
    max_ref = std::max(max_ref, std::abs(whole_grads[i]));
    // The second half's own gradient is not the first's, so a wrong combination would show.
    halves_differ = std::max(halves_differ, std::abs((model.grads()[i] - first_grads[i]) - first_grads[i]));
  }
  EXPECT_GT(max_ref, 1e-3);
  EXPECT_LE(max_diff, 1e-13 * max_ref);
  EXPECT_GT(halves_differ, 1e-3 * max_ref);
}

TEST(Model, ActivationBytesAreCountedAndFreedEachStep) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_next.json"));
  Model<float> model(config);
  model.init_weights(2);
  const std::vector<int32_t> tokens = random_tokens(40, config.vocab_size, "t");
  model.forward_backward(tokens.data(), tokens.data(), 4, 10, LossScales{0.025});  // grows the step buffers once
  const int64_t between_steps = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  model.forward_backward(tokens.data(), tokens.data(), 4, 10, LossScales{0.025});
  EXPECT_EQ(MemoryStats::current(Tier::fast), between_steps);
  // At least the saved q, k, v, attention output and MLP activations of every layer were counted.
  const int64_t n = 40, qw = config.num_attention_heads * config.head_dim;
  const int64_t kvw = config.num_key_value_heads * config.head_dim;
  const int64_t saved_floats = config.num_hidden_layers * n * (3 * qw + 3 * kvw + 3 * config.intermediate_size);
  EXPECT_GE(MemoryStats::peak(Tier::fast) - between_steps, saved_floats * int64_t(sizeof(float)));
}

// Evaluation saves no activations: forward_loss's peak fast-tier bytes are a small fraction of
// forward_backward's (which keeps every layer's), and its loss is bitwise the training loss.
TEST(Model, ForwardLossNeedsOneSublayerOfMemory) {
  SingleThread single;
  const ModelConfig config = testing::tiny_config_with({{"num_hidden_layers", 6}});
  Model<float> model(config);
  model.init_weights(4);
  const int64_t batch = 4, seq = 16, n = batch * seq;
  const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "t");   // [batch, seq]
  const std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "u");  // [batch, seq]
  model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / n});  // grows the step buffers once
  const int64_t between_steps = MemoryStats::current(Tier::fast);

  MemoryStats::reset_peak(Tier::fast);
  const CrossEntropyResult eval = model.forward_loss(tokens.data(), targets.data(), batch, seq).lm;
  const int64_t eval_peak = MemoryStats::peak(Tier::fast) - between_steps;
  EXPECT_EQ(MemoryStats::current(Tier::fast), between_steps);
  MemoryStats::reset_peak(Tier::fast);
  const CrossEntropyResult train = model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / n}).lm;
  const int64_t train_peak = MemoryStats::peak(Tier::fast) - between_steps;
  EXPECT_EQ(MemoryStats::current(Tier::fast), between_steps);

  EXPECT_GT(eval_peak, 0);
  EXPECT_LT(eval_peak * 4, train_peak) << "forward_loss " << eval_peak << " bytes, forward_backward " << train_peak;
  EXPECT_EQ(eval.count, train.count);
  EXPECT_EQ(std::memcmp(&eval.loss_sum, &train.loss_sum, sizeof(double)), 0) << eval.loss_sum << " " << train.loss_sum;
}

TEST(Model, GradientsDoNotDependOnThreadCount) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny.json"));
  const std::vector<int32_t> tokens = random_tokens(2 * 33, config.vocab_size, "t");
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (const int threads : {1, 2, 3}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Model<float> model(config);
    model.init_weights(8);
    model.zero_grads();
    losses.push_back(model.forward_backward(tokens.data(), tokens.data(), 2, 33, LossScales{1.0 / 66}).lm.loss_sum);
    grads.emplace_back(model.grads(), model.grads() + model.table().total_size());
    omp_set_num_threads(saved);
  }
  for (size_t i = 1; i < grads.size(); ++i) {
    EXPECT_EQ(losses[i], losses[0]);
    EXPECT_EQ(0, std::memcmp(grads[i].data(), grads[0].data(), grads[0].size() * sizeof(float))) << i;
  }
}

// Logits of the last token from the KV cache, fed whole, step by step or in chunks, all agree,
// and agree with the training path: with only the last target counted, forward_loss gives
// lse − logit[target] of the same logits.
template <class T>
void check_generation(const ModelConfig& config, double tolerance) {
  Model<T> model(config);
  model.init_weights(9);
  for (int64_t i = 0; i < model.table().total_size(); ++i) model.params()[i] *= T(20);  // peaky logits
  const int64_t len = 10, V = config.vocab_size;
  const std::vector<int32_t> prompt = random_tokens(len, V, "prompt");
  std::vector<T> whole(V), stepwise(V), chunked(V);
  model.start_generation(len);
  model.generate_step(prompt.data(), len, whole.data());
  model.start_generation(len + 2);
  for (int64_t i = 0; i < len; ++i) model.generate_step(prompt.data() + i, 1, stepwise.data());
  model.start_generation(len);
  model.generate_step(prompt.data(), 3, chunked.data());
  model.generate_step(prompt.data() + 3, 6, chunked.data());
  model.generate_step(prompt.data() + 9, 1, chunked.data());
  double max_logit = 0;
  for (int64_t v = 0; v < V; ++v) max_logit = std::max(max_logit, std::abs(double(whole[v])));
  EXPECT_GT(max_logit, 0.1);
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(stepwise[v], whole[v], tolerance * max_logit) << v;
    EXPECT_NEAR(chunked[v], whole[v], tolerance * max_logit) << v;
  }
  double lse = 0;
  for (int64_t v = 0; v < V; ++v) lse += std::exp(double(whole[v]) - max_logit);
  lse = max_logit + std::log(lse);
  std::vector<int32_t> targets(len, kIgnoreIndex);
  for (int32_t target : {0, 5, static_cast<int32_t>(V - 1)}) {
    targets[len - 1] = target;
    const CrossEntropyResult r = model.forward_loss(prompt.data(), targets.data(), 1, len).lm;
    EXPECT_EQ(r.count, 1);
    EXPECT_NEAR(r.loss_sum, lse - whole[target], tolerance * max_logit) << target;
  }
  EXPECT_THROW(model.generate_step(prompt.data(), 1, whole.data()), Error);  // cache full
}

TEST(Model, KvCacheGenerationMatchesFullForward) {
  for (const char* name : {"tiny.json", "tiny_qwen3_next.json"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = ModelConfig::load(testing::model_config_path(name));
    check_generation<double>(config, 1e-12);
    check_generation<float>(config, 1e-5);
  }
}

TEST(Model, RejectsLayerKindsNotBuiltYet) {
  // Linear attention is built for qwen3_next (Gated DeltaNet), not yet for another family.
  const ModelConfig qwen3 = testing::tiny_config_with(
      {{"layer_types", {"full_attention", "linear_attention"}}, {"linear_num_key_heads", 2},
       {"linear_num_value_heads", 2}, {"linear_key_head_dim", 4}, {"linear_value_head_dim", 4}});
  try {
    Model<float> model(qwen3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types[1] = linear_attention: not built yet for qwen3"),
              std::string::npos)
        << e.what();
  }
}

// Architectures the config can describe but the engine does not build: one error naming the file
// and the field, never a silent Qwen3 stand-in.
TEST(Model, RejectsArchitecturesNotBuiltYet) {
  const auto error = [](const nlohmann::json& changes) -> std::string {
    try {
      Model<float> model(testing::tiny_config_with(changes));
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string file = "tiny.json (test variant): ";
  EXPECT_EQ(error({{"hidden_act", "gelu"}}), file + "field \"hidden_act\": \"gelu\": not built yet; expected \"silu\"");
  EXPECT_EQ(error({{"rope_scaling", {{"type", "dynamic"}, {"factor", 4.0}}}}),
            file + "field \"rope_scaling\": rope_type \"dynamic\": not built yet; expected \"default\" or \"yarn\"");
  EXPECT_EQ(error({{"rope_parameters", {{"rope_type", "longrope"}, {"factor", 4.0}}}}),
            file + "field \"rope_parameters\": rope_type \"longrope\": not built yet; expected \"default\" or \"yarn\"");
  // An odd rotary dimension parses (transformers' default GLM-4.5 config has one) but is not built.
  EXPECT_EQ(error({{"partial_rotary_factor", 0.25}}),
            file + "field \"partial_rotary_factor\": gives rotary dimension 1 of head_dim 4: not built; expected "
                   "partial_rotary_factor · head_dim to be a positive even number");
  EXPECT_EQ(error({{"use_sliding_window", true}}),
            file + "field \"use_sliding_window\": true: not built yet; expected false");
  // What Hugging Face Qwen3 configs say is accepted: silu, no scaling, no sliding window.
  EXPECT_EQ(error({{"hidden_act", "silu"}, {"rope_scaling", nullptr}, {"use_sliding_window", false},
                   {"sliding_window", 4096}}),
            "no error");
}

TEST(Model, RejectsBadTokens) {
  Model<float> model(ModelConfig::load(testing::model_config_path("tiny.json")));
  const std::vector<int32_t> tokens = {1, 2, 64}, targets = {1, 2, 3};
  EXPECT_THROW(model.forward_loss(tokens.data(), targets.data(), 1, 3), Error);
  const std::vector<int32_t> good = {1, 2, 3}, bad_targets = {1, -5, 3};
  EXPECT_THROW(model.forward_loss(good.data(), bad_targets.data(), 1, 3), Error);
}

TEST(Model, TrainingFlopsPerToken) {
  const ModelConfig c = ModelConfig::load(testing::model_config_path("tiny.json"));
  Model<float> model(c);
  const double D = 16, I = 24, V = 64, L = 2, q = 16, kv = 8;
  const double matmul = L * (D * q + 2 * D * kv + q * D + 3 * D * I) + V * D;
  EXPECT_DOUBLE_EQ(model.training_flops_per_token(32), 6 * matmul + L * 12 * 16 * 4 * 4);
}

}  // namespace
}  // namespace trillion
