// The whole-model gradient check (model/gradient_check.h) and `trillion gradcheck`: the finite
// differences' noise floor and kink measure on functions of one variable, the two correct models
// that a check without them failed (Qwen3-Next with 512 tiny experts, DeepSeek-V3.2's indexer at
// sequence 37), wrong gradients that must still fail, vacuous checks, and the command's output.
#include "model/gradient_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "ops/finite_diff.h"
#include "test_configs.h"
#include "test_support/command.h"

namespace trillion {
namespace {

constexpr double kTolerance = 1e-6;  // GradientCheckOptions' default

// A slope jump J at s·h, s anywhere in (−2, 2), moves the central difference by at most half the
// kink measure, and the bound is reached next to θ; a smooth function's measure is h²·|f‴|.
TEST(FiniteDifference, AKinkAnywhereInTheStepMovesItByAtMostHalfTheKinkMeasure) {
  const double h = 1e-3, slope = 0.3, jump = 0.7;
  double tightest = 0.0;  // max over s of |numeric − f′(0)| / K
  for (int i = -39; i <= 39; ++i) {
    if (i == 0) continue;
    const double s = i / 20.0;  // kink at s·h, on the stencil's points too (s = ±1, ±2)
    const auto f = [&](double x) { return slope * x + jump * std::max(0.0, x - s * h); };
    const FiniteDifference d = finite_difference(f, f(0.0), h);
    const double derivative = slope + (s < 0 ? jump : 0.0);
    EXPECT_LE(std::abs(d.numeric - derivative), 0.5 * d.kink_measure + 1e-12) << "s " << s;
    EXPECT_GT(d.kink_measure, 0.0) << "s " << s;  // every kink in the span shows
    tightest = std::max(tightest, std::abs(d.numeric - derivative) / d.kink_measure);
  }
  EXPECT_GT(tightest, 0.45);  // a kink at ±h/20 moves it by nearly K/2

  const double a = 3.0;
  const auto smooth = [&](double x) { return std::exp(a * x); };
  const FiniteDifference d = finite_difference(smooth, 1.0, h);
  EXPECT_NEAR(d.numeric, a, 1e-9);
  EXPECT_NEAR(d.kink_measure, h * h * a * a * a, 0.01 * h * h * a * a * a);
  EXPECT_DOUBLE_EQ(d.noise_floor, 1.5 * 16 * std::numeric_limits<double>::epsilon() / h);
}

// One variable, three samples: x ↦ 0.3x + 0.7·max(0, x − s·h) for a kink at s·h. A kink at 1.5h
// leaves the span at h/2 and compares; one at h/100 stays inside down to h/8 and is skipped; a
// wrong analytic value at a kink-free point fails however large K is.
TEST(TensorComparison, HalvesTheStepForSuspectedKinksAndSkipsOnlyThoseItCannotResolve) {
  const double h = 1e-3, slope = 0.3, jump = 0.7;
  const std::vector<double> kink_at = {1.5, 0.01, 1.5};  // in units of h, per sample
  const TensorComparison::Redo redo = [&](int64_t sample, double step) {
    const auto f = [&](double x) { return slope * x + jump * std::max(0.0, x - kink_at[sample] * h); };
    return finite_difference(f, 0.0, step);
  };
  TensorComparison resolved("resolved");
  resolved.add(slope, h, redo(0, h));
  resolved.add(slope, h, redo(1, h));
  const TensorCheck r = resolved.finish(kTolerance, redo);
  EXPECT_EQ(r.refined, 2);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_EQ(r.checked, 1);
  EXPECT_LE(r.rel_err, kTolerance);

  TensorComparison wrong("wrong");
  wrong.add(slope * 1.001, h, redo(2, h));  // the kink at 1.5h is real, the analytic value wrong
  const TensorCheck w = wrong.finish(kTolerance, redo);
  EXPECT_EQ(w.refined, 1);
  EXPECT_EQ(w.skipped, 0);
  EXPECT_GT(w.rel_err, 1e-4);

  TensorComparison not_finite("not finite");
  not_finite.add(std::nan(""), h, redo(0, h));
  EXPECT_TRUE(std::isnan(not_finite.finish(kTolerance, redo).rel_err));
}

// transformers' Qwen3-Next default of 512 experts (top 10) at tiny widths: the gradients are 1e-6
// to 1e-5, so the finite differences' rounding (ε·|L|/h ≈ 1e-11) is above 1e-6 of them.
ModelConfig qwen3_next_with_512_experts() {
  return testing::tiny_config_with({{"num_experts", 512},
                                    {"num_experts_per_tok", 10},
                                    {"moe_intermediate_size", 4},
                                    {"shared_expert_intermediate_size", 8},
                                    {"initializer_range", 0.02},
                                    {"mlp_only_layers", nlohmann::json::array()}},
                                   "tiny_qwen3_next_hybrid.json");
}

// DeepSeek-V3.2 (MLA + indexer + MoE with groups) at sequence 37, top-8 of up to 37 keys: the
// indexer's ReLU scores put kinks inside the step of some directions.
ModelConfig deepseek_v32_at_sequence_37() {
  return testing::tiny_config_with({{"hidden_size", 24},
                                    {"initializer_range", 0.5},
                                    {"index_topk", 8},
                                    {"n_routed_experts", 16},
                                    {"num_experts_per_tok", 4},
                                    {"n_group", 4},
                                    {"topk_group", 2}},
                                   "tiny_deepseek_v32.json");
}

GradientCheckOptions directions_at_sequence(int64_t seq) {
  GradientCheckOptions options;
  options.seq = seq;
  options.max_full_elements = 0;
  options.directions = 8;
  return options;
}

GradientCheckReport check_with(const ModelConfig& config, const GradientCheckOptions& options) {
  GradientCheckReport report;
  test::with_threads(1, [&] { report = check_model_gradients(config, options); });
  return report;
}

TEST(GradientCheck, Qwen3NextWith512ExpertsPassesWithinTheNoiseFloor) {
  const GradientCheckReport report = check_with(qwen3_next_with_512_experts(), directions_at_sequence(7));
  EXPECT_TRUE(report.passed(kTolerance)) << report.worst_tensor << " " << report.max_rel_err;
  int below_floor_only = 0;  // tensors whose raw error is over tolerance but within the floor
  for (const TensorCheck& t : report.tensors) {
    EXPECT_FALSE(t.vacuous()) << t.name;
    EXPECT_EQ(t.checked, 8) << t.name;
    if (t.max_abs_err > kTolerance * t.max_ref) {
      ++below_floor_only;
      EXPECT_LE(t.max_abs_err, t.noise_floor) << t.name;
    }
  }
  EXPECT_GT(below_floor_only, 0) << "the case needs gradients small enough to meet the floor";
}

// The kinks make some directions' first differences miss by more than the tolerance; at a halved
// step they leave the span and those directions compare within it.
TEST(GradientCheck, DeepSeekV32IndexerKinksAreRefinedAndCounted) {
  const GradientCheckReport report = check_with(deepseek_v32_at_sequence_37(), directions_at_sequence(37));
  EXPECT_TRUE(report.passed(kTolerance)) << report.worst_tensor << " " << report.max_rel_err;
  EXPECT_GT(report.refined, 0);
  EXPECT_LE(report.skipped, report.refined);
  EXPECT_LT(report.refined, report.checked / 20);
  for (const TensorCheck& t : report.tensors) {
    EXPECT_EQ(t.checked + t.skipped, 8) << t.name;
    EXPECT_GT(t.checked, t.skipped) << t.name;
  }
}

// The check's second half with a gradient that is wrong in one tensor by `factor`: that tensor
// fails, every other passes.
void expect_only_the_wrong_tensor_fails(const ModelConfig& config, const GradientCheckOptions& options,
                                        const std::string& wrong, double factor) {
  test::with_threads(1, [&] {
    const GradientCheckBatch batch = gradient_check_batch(config, options);
    Model<double> model(config);
    compute_analytic_gradient(model, batch, options);
    const ParamSpec& spec = model.table().find(wrong);
    std::vector<double> gradient(model.grads(), model.grads() + model.table().trainable_size());  // [trainable]
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) gradient[i] *= factor;
    const GradientCheckReport report = check_gradients_numerically(model, batch, gradient.data(), options);
    EXPECT_FALSE(report.passed(options.tolerance));
    EXPECT_EQ(report.worst_tensor, wrong);
    for (const TensorCheck& t : report.tensors) {
      if (t.name == wrong)
        EXPECT_GT(t.rel_err, 0.5 * (factor - 1)) << t.name;
      else
        EXPECT_LE(t.rel_err, options.tolerance) << t.name;
    }
  });
}

TEST(GradientCheck, AWrongGradientStillFails) {
  expect_only_the_wrong_tensor_fails(qwen3_next_with_512_experts(), directions_at_sequence(7),
                                     "model.layers.1.mlp.experts.gate_up_proj", 1.01);
  // The tensor whose kinks are skipped: a wrong gradient there is not one of them, down to 1e-4.
  expect_only_the_wrong_tensor_fails(deepseek_v32_at_sequence_37(), directions_at_sequence(37),
                                     "model.layers.1.self_attn.indexer.wq_b.weight", 1.0001);
  // Every element, 2e-5 wrong (20× the tolerance): the kink test must not excuse smooth elements.
  GradientCheckOptions every_element;
  every_element.seq = 5;
  for (const char* wrong : {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.q_norm.weight"})
    expect_only_the_wrong_tensor_fails(testing::tiny_config_with(nullptr), every_element, wrong, 1.00002);
}

TEST(GradientCheck, AlongRandomDirections) {
  GradientCheckOptions options;
  options.max_full_elements = 0;  // force directions
  options.directions = 3;
  const GradientCheckReport report = check_with(ModelConfig::load(testing::model_config_path("tiny_qwen3_next.json")), options);
  EXPECT_FALSE(report.full);
  EXPECT_EQ(report.checked, 3 * static_cast<int64_t>(report.tensors.size()));
  EXPECT_LE(report.max_rel_err, 1e-6) << report.worst_tensor;
}

TEST(GradcheckCommand, PassesOnTinyAndPrintsJsonLast) {
  const std::string command = std::string("OMP_NUM_THREADS=1 ") + TRILLION_BINARY + " gradcheck --config " +
                              testing::model_config_path("tiny.json") + " --seq-len 5 2>&1";
  const auto [status, output] = test::run_shell(command);
  // Its last line (the JSON summary), from after the newline before the final one.
  const size_t last_begin = output.rfind('\n', output.size() < 2 ? 0 : output.size() - 2);
  const std::string last_line = last_begin == std::string::npos ? output : output.substr(last_begin + 1);
  EXPECT_EQ(status, 0) << output;
  const nlohmann::json summary = nlohmann::json::parse(last_line);
  EXPECT_LE(summary.at("max_rel_err").get<double>(), 1e-6);
  EXPECT_EQ(summary.at("tolerance").get<double>(), 1e-6);
  EXPECT_GT(summary.at("checked").get<int64_t>(), 5000);
  EXPECT_EQ(summary.at("refined_at_kinks").get<int64_t>(), 0);  // the dense model is smooth
  EXPECT_EQ(summary.at("skipped_at_kinks").get<int64_t>(), 0);
  EXPECT_NE(output.find("model.layers.1.mlp.down_proj.weight"), std::string::npos);
}

// With LoRA: only the adapters are checked (every element), and they pass.
TEST(GradcheckCommand, ChecksTheAdaptersOfALoraModel) {
  const std::string command = std::string("OMP_NUM_THREADS=1 ") + TRILLION_BINARY + " gradcheck --config " +
                              testing::model_config_path("tiny_deepseek_v32.json") +
                              " --seq-len 5 --lora-rank 2 --lora-targets kv_b_proj,wq_b,o_proj 2>&1";
  const auto [status, output] = test::run_shell(command);
  EXPECT_EQ(status, 0) << output;
  const nlohmann::json summary = nlohmann::json::parse(output.substr(output.rfind('{')));
  EXPECT_LE(summary.at("max_rel_err").get<double>(), 1e-6);
  EXPECT_NE(summary.at("worst_tensor").get<std::string>().find(".lora_"), std::string::npos);
  EXPECT_NE(output.find("model.layers.1.self_attn.indexer.wq_b.lora_A.weight"), std::string::npos) << output;
  EXPECT_EQ(output.find("model.layers.1.self_attn.o_proj.weight "), std::string::npos) << "the base is frozen";
}

TEST(GradientCheck, RejectsOptionsThatCheckNothing) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny.json"));
  const auto error = [&](const GradientCheckOptions& options) -> std::string {
    try {
      check_model_gradients(config, options);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  GradientCheckOptions options;
  options.directions = 0;
  EXPECT_EQ(error(options), "gradient check: --directions 0: expected at least 1");
  options = GradientCheckOptions{};
  options.max_full_elements = -1;
  EXPECT_EQ(error(options), "gradient check: --max-elements -1: expected a non-negative integer");
  for (const double step : {0.0, -1e-4, std::nan(""), double(INFINITY)}) {
    options = GradientCheckOptions{};
    options.step = step;
    EXPECT_NE(error(options).find("--step"), std::string::npos) << step;
  }
  options = GradientCheckOptions{};
  options.tolerance = 0.0;
  EXPECT_EQ(error(options), "gradient check: --tolerance 0: expected a positive finite number");
}

// With one token per sequence, attention's softmax is over a single key (weight exactly 1), so the
// loss does not depend on the query or key side (q_proj, q_norm, k_proj, k_norm): their numeric
// gradient is exactly zero, never above its noise floor, and the check fails them rather than passing
// with nothing compared.
TEST(GradientCheck, FailsATensorWithZeroNumericGradient) {
  GradientCheckOptions options;
  options.batch = 2;
  options.seq = 1;
  const GradientCheckReport report = check_with(ModelConfig::load(testing::model_config_path("tiny.json")), options);
  EXPECT_TRUE(std::isinf(report.max_rel_err));
  for (const TensorCheck& t : report.tensors) {
    bool scores_only = false;  // the tensor only feeds the attention scores
    for (const char* part : {"q_proj", "q_norm", "k_proj", "k_norm"})
      scores_only = scores_only || t.name.find(part) != std::string::npos;
    EXPECT_EQ(t.max_ref == 0.0, scores_only) << t.name;
    EXPECT_EQ(t.vacuous(), scores_only) << t.name;
  }
}

// The CLI's one-line error and non-zero exit for options under which nothing would be checked.
TEST(GradcheckCommand, RejectsZeroDirections) {
  for (const char* flags : {"--directions 0", "--max-elements -1", "--step 0", "--tolerance 0"}) {
    const std::string command = std::string("OMP_NUM_THREADS=1 ") + TRILLION_BINARY + " gradcheck --config " +
                                testing::model_config_path("tiny.json") + " " + flags + " 2>&1";
    const auto [status, output] = test::run_shell(command);
    EXPECT_NE(status, 0) << flags << ": " << output;
    EXPECT_EQ(output.rfind("error: ", 0), 0u) << flags << ": " << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << flags << ": " << output;
    const std::string flag_name = std::string(flags).substr(0, std::string(flags).find(' '));
    EXPECT_NE(output.find(flag_name), std::string::npos) << flags << ": " << output;
  }
}

// A step of 1e-2 leaves a truncation error (O(h⁴)) far above the rounding floor and beyond 1e-6.
TEST(GradcheckCommand, FailsOutsideTolerance) {
  const std::string command = std::string("OMP_NUM_THREADS=1 ") + TRILLION_BINARY + " gradcheck --config " +
                              testing::model_config_path("tiny.json") + " --seq-len 3 --batch 1 --step 1e-2 2>&1";
  const auto [status, output] = test::run_shell(command);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("exceeds tolerance 1e-06"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
