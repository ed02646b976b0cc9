// The bf16 matmul precision (ops/gemm.h) on whole models against the same model in double, for each
// mixer kind (attention, Gated DeltaNet, KDA + MLA + MoE, MLA + lightning indexer + sigmoid MoE):
// - the loss within bf16's unit roundoff u = 2⁻⁸;
// - every gradient tensor within 2κ·u, where κ, the computation's condition (at least 16), is
//   measured by the float32 model: its worst gradient error in units of float's unit roundoff;
//   and the worst at least 1000× float32's (the operands were rounded: u / ε = 65536).
//   Relative errors of a backward pass grow as κ times the working precision's roundoff; the tiny
//   configs' large initialization (0.5) makes κ reach ~80 for KDA.
// Discrete choices are taken out: every expert is active and the indexer keeps every key, since a
// rounding that flips a top-k choice changes a gradient by O(1) in any precision. The weights' bf16
// copy follows changed weights into a generation and a forward. Saved operands kept in bf16 change
// no bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "memory/save_policies.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "test_configs.h"

namespace trillion {
namespace {

constexpr double kBf16Eps = 0x1.0p-8;   // bf16's unit roundoff: 8 significant bits
constexpr double kFloatEps = 0x1.0p-24;  // float's

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, const char* stream) {
  std::vector<int32_t> tokens(n);
  const CounterRng rng(4, stream);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % vocab);
  return tokens;
}

struct Errors {
  double loss = 0.0;                 // |L − L_double| / |L_double|
  double worst_gradient = 0.0;       // max over tensors of max|g − g_double| / max|g_double|
  std::string worst_tensor;
};

// One forward and backward of a float model at `precision` against the double model with the same
// weights.
Errors errors_against_double(const ModelConfig& config, MatmulPrecision precision) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Model<float> f(config);
  Model<double> d(config);
  f.init_weights(21);
  for (int64_t i = 0; i < f.table().total_size(); ++i) d.params()[i] = f.params()[i];
  const int64_t batch = 2, seq = 13, n = batch * seq;
  const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "tokens");
  const std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "targets");
  const LossScales scales{1.0 / double(n)};
  f.zero_grads();
  d.zero_grads();
  double loss_f = 0.0;
  {
    const MatmulPrecisionScope operands(precision);
    loss_f = f.forward_backward(tokens.data(), targets.data(), batch, seq, scales).lm.loss_sum;
  }
  const double loss_d = d.forward_backward(tokens.data(), targets.data(), batch, seq, scales).lm.loss_sum;
  omp_set_num_threads(saved_threads);
  Errors errors;
  errors.loss = std::abs(loss_f - loss_d) / std::abs(loss_d);
  for (const ParamSpec& s : d.table().entries()) {
    if (!s.trainable()) continue;
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < s.numel(); ++i) {
      max_diff = std::max(max_diff, std::abs(double(f.grads()[s.offset + i]) - d.grads()[s.offset + i]));
      max_ref = std::max(max_ref, std::abs(d.grads()[s.offset + i]));
    }
    const double err = max_diff / std::max(max_ref, 1e-30);
    if (err > errors.worst_gradient) {
      errors.worst_gradient = err;
      errors.worst_tensor = s.name;
    }
  }
  return errors;
}

TEST(MixedPrecision, Bf16OperandsStayWithinBf16RoundingOfDoubleForEveryMixerKind) {
  const std::vector<std::pair<const char*, nlohmann::json>> models = {
      {"tiny.json", nullptr},
      {"tiny_qwen3_next.json", nullptr},
      {"tiny_kimi_linear.json", {{"num_experts_per_token", 4}}},
      {"tiny_deepseek_v32.json", {{"num_experts_per_tok", 4}, {"topk_group", 2}, {"index_topk", 64}}},
  };
  for (const auto& [name, changes] : models) {
    const ModelConfig config = testing::tiny_config_with(changes, name);
    const Errors bf16 = errors_against_double(config, MatmulPrecision::bf16);
    const Errors fp32 = errors_against_double(config, MatmulPrecision::fp32);
    const double condition = std::max(16.0, fp32.worst_gradient / kFloatEps);
    SCOPED_TRACE(std::string(name) + ": float32's loss error " + std::to_string(fp32.loss) + ", worst gradient " +
                 std::to_string(fp32.worst_gradient) + " in " + fp32.worst_tensor);
    EXPECT_LE(bf16.loss, kBf16Eps);
    EXPECT_GE(bf16.worst_gradient, 1000.0 * fp32.worst_gradient) << "the operands were not rounded";
    EXPECT_LE(bf16.worst_gradient, 2.0 * condition * kBf16Eps) << bf16.worst_tensor << ", condition " << condition;
  }
}

// The weights' bf16 copy (model/model_impl.h) follows the weights: after they change, a generation
// and a forward read the new values, with the bits of a model that only ever held them.
TEST(MixedPrecision, TheWeightsCopyFollowsTheWeights) {
  const ModelConfig config = testing::tiny_config_with(nullptr, "tiny.json");
  const int64_t seq = 9, vocab = config.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(seq, vocab, "tokens");
  const std::vector<int32_t> targets = random_tokens(seq, vocab, "targets");
  const MatmulPrecisionScope operands(MatmulPrecision::bf16);
  Model<float> changed(config), fresh(config);
  changed.init_weights(21);
  fresh.init_weights(22);
  const int64_t size = changed.table().total_size();
  const std::vector<float> first(changed.params(), changed.params() + size);  // [size]: seed 21's weights
  const auto loss = [&](Model<float>& model) {
    return model.forward_loss(tokens.data(), targets.data(), 1, seq).lm.loss_sum;
  };
  const auto last_logits = [&](Model<float>& model) {
    std::vector<float> logits(vocab);  // [vocab]
    model.start_generation(seq);
    model.generate_step(tokens.data(), seq, logits.data());
    return logits;
  };
  const double first_loss = loss(changed);  // copies seed 21's weights
  std::copy(fresh.params(), fresh.params() + size, changed.params());
  EXPECT_EQ(last_logits(changed), last_logits(fresh)) << "the generation read the copy of the weights before";
  std::copy(first.begin(), first.end(), changed.params());  // back to seed 21's, the copy holds seed 22's
  EXPECT_EQ(loss(changed), first_loss) << "the forward read the copy of the weights before";
  EXPECT_NE(loss(changed), loss(fresh));
}

// Keeping the saved operands of products as their bf16 rounding (ActivationStore::set_bf16_operands)
// changes no bit of the loss or of any gradient, for every mixer kind (attention, and MLA attending
// sparsely through the indexer, whose q, k and v are operands of the row products) and the dense
// and MoE FFNs:
// under keep-all, full recompute (the re-run refills them), and full swap, with the loss's gradients
// formed in the forward or recomputed in the backward (which reads the final norm's output). The
// saved bytes shrink.
TEST(MixedPrecision, SavedOperandsInBf16GiveTheSameBitsInFewerBytes) {
  const MatmulPrecisionScope operands(MatmulPrecision::bf16);
  struct Run {
    double loss = 0.0;
    std::vector<float> grads;
    int64_t saved_bytes = 0;
    std::vector<ParamSpec> tensors;  // the trainable ones
    // The first trainable gradient element that differs from `other`'s, named, or "".
    std::string first_difference(const Run& other) const {
      for (const ParamSpec& spec : tensors)
        for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i)
          if (std::bit_cast<uint32_t>(grads[i]) != std::bit_cast<uint32_t>(other.grads[i]))
            return spec.name + " element " + std::to_string(i - spec.offset) + ": " + std::to_string(grads[i]) +
                   " vs " + std::to_string(other.grads[i]);
      return "";
    }
  };
  for (const char* name : {"tiny.json", "tiny_qwen3_next_hybrid.json", "tiny_kimi_linear.json",
                           "tiny_deepseek_v3.json", "tiny_deepseek_v32.json", "tiny_glm4_moe.json"}) {
    const ModelConfig config = testing::tiny_config_with(nullptr, name);
    const int64_t batch = 2, seq = 11, n = batch * seq;
    const std::vector<int32_t> tokens = random_tokens(n, config.vocab_size, "tokens");
    const std::vector<int32_t> targets = random_tokens(n, config.vocab_size, "targets");
    const auto run = [&](bool bf16, const std::string& recompute, const std::string& swap, LossGradients loss) {
      Model<float> model(config);
      model.init_weights(21);
      model.set_loss_gradients(loss);
      ActivationStore& store = model.activations();
      store.set_paged_min_bytes(1);  // the tiny tensors follow their policy
      store.set_bf16_operands(bf16);
      if (swap != "none") {
        store.set_swap_directory(::testing::TempDir(), /*buffered=*/true);
        store.set_swap_synchronous(true);  // every swapped tensor is read back
      }
      apply_save_policies(store, recompute, swap);
      model.zero_grads();
      Run r;
      r.loss = model.forward_backward(tokens.data(), targets.data(), batch, seq, LossScales{1.0 / double(n)})
                   .lm.loss_sum;
      int64_t end = 0;  // of the trainable tensors' gradients
      for (const ParamSpec& spec : model.table().entries()) {
        if (!spec.trainable()) continue;
        r.tensors.push_back(spec);
        end = std::max(end, spec.offset + spec.numel());
      }
      r.grads.assign(model.grads(), model.grads() + end);
      r.saved_bytes = store.counters().saved_bytes;
      return r;
    };
    for (const LossGradients loss : {LossGradients::in_forward, LossGradients::recompute}) {
      const Run floats = run(false, "none", "none", loss);
      for (const auto& [recompute, swap] : {std::pair{"none", "none"}, {"full", "none"}, {"none", "full"}}) {
        SCOPED_TRACE(std::string(name) + " recompute " + recompute + " swap " + swap +
                     (loss == LossGradients::recompute ? ", loss gradients recomputed" : ""));
        const Run rounded = run(true, recompute, swap, loss);
        EXPECT_EQ(rounded.loss, floats.loss);
        EXPECT_EQ(rounded.first_difference(floats), "");
        EXPECT_LT(rounded.saved_bytes, floats.saved_bytes);
      }
    }
  }
}

}  // namespace
}  // namespace trillion
