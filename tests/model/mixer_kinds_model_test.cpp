// Models of the mixer kinds beyond plain attention, end to end: Qwen3-Next hybrids (Gated DeltaNet
// and gated full attention layers, MoE), Kimi-Linear with Kimi Delta Attention layers, multi-head
// latent attention (DeepSeek-V3 with YaRN RoPE; Kimi-Linear's NoPE MLA after a KDA layer), sparse
// attention, and the seed's hybrid of KDA and sparse MLA: the whole model against finite
// differences, and decoding (carried conv windows and recurrent states; MLA's latent cache and
// weight-absorbed attention) against the training forward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/gradient_check.h"
#include "model/model.h"
#include "ops/finite_diff.h"
#include "test_configs.h"

namespace trillion {
namespace {

// tiny_qwen3_next_hybrid.json: layers linear, full, linear; nk 2, nv 4 (two value heads per key
// head), dk 4, dv 3, conv 4; initializer_range 0.5 so that every tensor's gradient stands well
// above the finite differences' rounding floor (~1e-11 here; at 0.02 the delta rule's inner
// gradients are ~1e-8 at initialization and the check would measure noise).
// tiny_kimi_linear_kda.json: two KDA layers (2 heads of 4, conv 3), a dense then an MoE FFN
// (sigmoid router with correction bias, shared expert), initializer_range 0.5 likewise.
const char* const kHybrid = "tiny_qwen3_next_hybrid.json";
// tiny_deepseek_v3.json: MLA with q LoRA rank 8, kv rank 6, nope 4, rope 4 (interleaved), v 3, 3
// heads, attention biases, YaRN (factor 4 over 4 original positions: the ramp is not trivial,
// mscale 0.8 ≠ mscale_all_dim 1, so both the cos/sin factor and the softmax factor differ from 1).
// tiny_kimi_linear.json: a KDA layer then an MLA layer without RoPE, q_proj (no q LoRA), v 5 ≠ qk 6.
const char* const kKimi = "tiny_kimi_linear_kda.json";
const char* const kDeepseek = "tiny_deepseek_v3.json";
const char* const kKimiMla = "tiny_kimi_linear.json";
// tiny_deepseek_v32.json: two sparse MLA layers (indexer 2 heads of 6, top-3 of 7 keys), dense then MoE.
const char* const kSparse = "tiny_deepseek_v32.json";
// tiny_qwen3_sparse.json: a sparse GQA attention layer (indexer query from h: indexer.wq) then a full one.
const char* const kSparseGqa = "tiny_qwen3_sparse.json";
// tiny_kimi_k3_like.json: configs/models/kimi_k3_like.json's shape (docs/scale.md): three KDA
// layers, then NoPE MLA with q LoRA and the indexer (top-5), a dense FFN then MoE layers with
// sigmoid routing over 4 groups of 4 experts (2 groups, 2 experts chosen) and a shared expert.
const char* const kKimiK3 = "tiny_kimi_k3_like.json";

class MixerKindModel : public ::testing::TestWithParam<const char*> {};

TEST_P(MixerKindModel, GradientCheck) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(GetParam()));
  GradientCheckOptions options;
  options.batch = 2;
  options.seq = 7;
  GradientCheckReport report;
  test::with_threads(1, [&] { report = check_model_gradients(config, options); });
  ASSERT_TRUE(report.full);
  for (const TensorCheck& t : report.tensors)
    EXPECT_LE(t.rel_err, 1e-6) << t.name << " max_abs_err " << t.max_abs_err << " max_ref " << t.max_ref;
}

// The decode path (conv window and recurrent state carried across steps) gives the logits the
// training forward scores: Σ_t CE(decode logits_t, target_t) equals forward_loss, prefill equals
// token by token.
TEST_P(MixerKindModel, DecodingWithCarriedStateEqualsTheForward) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(GetParam()));
  Model<double> model(config);
  model.init_weights(3);
  const int64_t len = 11, V = config.vocab_size;
  const CounterRng rng(5, "linear_attention_model_test");
  std::vector<int32_t> tokens(len), targets(len);
  for (int64_t i = 0; i < len; ++i) {
    tokens[i] = static_cast<int32_t>(rng.bits(i) % V);
    targets[i] = static_cast<int32_t>(rng.bits(len + i) % V);
  }
  std::vector<double> logits(len * V), last(V);
  model.start_generation(len);
  for (int64_t t = 0; t < len; ++t) model.generate_step(tokens.data() + t, 1, logits.data() + t * V);
  double loss_sum = 0.0;
  for (int64_t t = 0; t < len; ++t) {
    double max_logit = logits[t * V];
    for (int64_t v = 0; v < V; ++v) max_logit = std::max(max_logit, logits[t * V + v]);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[t * V + v] - max_logit);
    loss_sum += max_logit + std::log(sum) - logits[t * V + targets[t]];
  }
  const StepResult forward = model.forward_loss(tokens.data(), targets.data(), 1, len);
  EXPECT_NEAR(loss_sum, forward.lm.loss_sum, 1e-11 * std::abs(loss_sum));
  model.start_generation(len);
  model.generate_step(tokens.data(), len, last.data());  // one prefill of the whole prompt
  std::vector<double> stepwise_last(logits.end() - V, logits.end());
  EXPECT_LE(test::relative_error(last, stepwise_last), 1e-12);
}

// The indexer's warm-up (dense attention, the indexer learning over every visible key) and the dense
// stage: the indexer's tensors against finite differences of its loss, the others of the LM loss.
TEST(SparseAttentionModel, GradientCheckInTheDenseStages) {
  for (const char* name : {kSparse, kSparseGqa, kKimiK3})
  for (IndexerMode mode : {IndexerMode::warmup, IndexerMode::dense}) {
    const ModelConfig config = ModelConfig::load(testing::model_config_path(name));
    GradientCheckOptions options;
    options.indexer_mode = mode;
    options.indexer_loss_coef = 0.7;
    GradientCheckReport report;
    test::with_threads(1, [&] { report = check_model_gradients(config, options); });
    ASSERT_TRUE(report.full);
    int indexer_tensors = 0;
    for (const TensorCheck& t : report.tensors) {
      EXPECT_LE(t.rel_err, 1e-6) << indexer_mode_name(mode) << " " << t.name;
      indexer_tensors += t.name.find(".self_attn.indexer.") != std::string::npos ? 1 : 0;
    }
    EXPECT_EQ(indexer_tensors, name == kSparse ? 10 : 5);  // 5 per sparse layer, each with a nonzero gradient
  }
}

// The indexer loss is reported per sparse layer, lowers what the indexer is trained on, and does
// not reach the model: with the loss off the model's gradients are the same, the indexer's zero.
TEST(SparseAttentionModel, IndexerLossTrainsOnlyTheIndexer) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(kSparse));
  Model<double> model(config);
  model.init_weights(4);
  const int64_t batch = 2, seq = 7, n = batch * seq;
  std::vector<int32_t> tokens(n), targets(n);
  const CounterRng rng(6, "sparse_attention_model_test");
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(rng.bits(i) % config.vocab_size);
    targets[i] = static_cast<int32_t>(rng.bits(n + i) % config.vocab_size);
  }
  const LossScales scales{1.0 / double(n), 1.0};
  const int64_t size = model.table().trainable_size();
  std::vector<double> with_loss(size), without(size);
  for (double coef : {1.0, 0.0}) {
    model.set_indexer_training(IndexerMode::sparse, coef);
    model.zero_grads();
    const StepResult r = model.forward_backward(tokens.data(), targets.data(), batch, seq, scales);
    std::copy(model.grads(), model.grads() + size, (coef > 0 ? with_loss : without).begin());
    if (coef > 0) {
      ASSERT_EQ(r.indexer.size(), 2u);
      for (const IndexerLayerStats& s : r.indexer) {
        EXPECT_GT(s.loss, 0.0);
        EXPECT_DOUBLE_EQ(s.selected_mass, 1.0);  // sparse mode: p lives on the selection
        EXPECT_DOUBLE_EQ(s.best_mass, 1.0);
      }
      ASSERT_EQ(r.aux.size(), 1u);
      EXPECT_EQ(r.aux[0].name, "indexer_loss");
      EXPECT_DOUBLE_EQ(r.aux[0].value, 0.5 * (r.indexer[0].loss + r.indexer[1].loss));
    } else {
      EXPECT_TRUE(r.indexer.empty());
    }
  }
  for (const ParamSpec& spec : model.table().entries()) {
    if (!spec.trainable()) continue;
    const bool indexer = spec.name.find(".self_attn.indexer.") != std::string::npos;
    for (int64_t i = 0; i < spec.numel(); ++i) {
      if (indexer) {
        ASSERT_EQ(without[spec.offset + i], 0.0) << spec.name;
      } else {
        ASSERT_EQ(with_loss[spec.offset + i], without[spec.offset + i]) << spec.name;
      }
    }
  }
  model.set_indexer_training(IndexerMode::warmup, 1.0);
  const StepResult warm = model.forward_backward(tokens.data(), targets.data(), batch, seq, scales);
  for (const IndexerLayerStats& s : warm.indexer) {
    EXPECT_LT(s.best_mass, 1.0);  // 3 of up to 7 keys
    EXPECT_LE(s.selected_mass, s.best_mass + 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MixerKindModel, ::testing::Values(kHybrid, kKimi, kDeepseek, kKimiMla, kSparse, kSparseGqa,
                                                                             kKimiK3),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           const std::string name = info.param;
                           return name == kHybrid ? "Qwen3NextHybrid"
                                  : name == kKimi ? "KimiLinearKda"
                                  : name == kDeepseek ? "DeepseekV3Yarn"
                                  : name == kKimiMla  ? "KimiLinearMla"
                                  : name == kSparse   ? "DeepseekV32Sparse"
                                  : name == kKimiK3   ? "KimiK3Like"
                                                      : "Qwen3SparseGqa";
                         });

}  // namespace
}  // namespace trillion
