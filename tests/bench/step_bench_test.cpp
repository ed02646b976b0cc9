// `trillion bench step` at a tiny size: whole training steps of the MoE and hybrid test configs,
// the summary's fields, the loss going down, and the phase breakdown adding up to the step time.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "bench/bench_run.h"

namespace trillion {
namespace {

nlohmann::json step_summary(const std::string& config, const std::string& sizes = "--batch 2 --seq-len 16 --steps 3") {
  const std::string command = std::string(TRILLION_BINARY) + " bench step --json --config " +
                              std::string(TRILLION_SOURCE_DIR) + "/configs/models/" + config + " " + sizes +
                              " --warmup 1 --gemm-size 64 2>/dev/null";
  const auto [status, output] = test::run_shell(command);
  EXPECT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = test::json_lines(output);
  EXPECT_EQ(lines.size(), 1u) << output;
  return lines.empty() ? nlohmann::json() : lines.back();
}

TEST(StepBench, TinyRunsReportStepsAndTheirPhases) {
  for (const char* config : {"tiny_qwen3_moe.json", "tiny_qwen3_next_hybrid.json"}) {
    const nlohmann::json s = step_summary(config);
    ASSERT_FALSE(s.is_null()) << config;
    EXPECT_EQ(s.at("bench"), "step");
    EXPECT_EQ(s.at("batch").get<int64_t>(), 2);
    EXPECT_EQ(s.at("seq_len").get<int64_t>(), 16);
    EXPECT_EQ(s.at("steps").get<int>(), 3);
    for (const char* field :
         {"tokens_per_s", "mfu", "sgemm_gflops", "flops_per_token", "step_s", "peak_fast_bytes", "mfu_peak", "peak_gflops"})
      EXPECT_GT(s.at(field).get<double>(), 0.0) << config << " " << field;
    EXPECT_NEAR(s.at("tokens_per_s").get<double>() * s.at("step_s").get<double>(), 32.0, 1e-6);
    // Four steps on the same random batch: the loss falls from about ln V.
    EXPECT_LT(s.at("last_loss").get<double>(), s.at("first_loss").get<double>()) << config;
    EXPECT_TRUE(std::isfinite(s.at("first_loss").get<double>()));
    const nlohmann::json& phases = s.at("phases_s");
    for (const char* phase : {"gemm", "attention", "moe", "elementwise", "loss", "optimizer", "other"})
      EXPECT_GE(phases.at(phase).get<double>(), 0.0) << config << " " << phase;
    EXPECT_GT(phases.at("gemm").get<double>(), 0.0) << config;
    EXPECT_GT(phases.at("attention").get<double>(), 0.0) << config;
    EXPECT_GT(phases.at("moe").get<double>(), 0.0) << config;
    EXPECT_GT(phases.at("optimizer").get<double>(), 0.0) << config;
    EXPECT_GE(s.at("idle_s").get<double>(), 0.0);
    // The phases and idle add up to the step time measured around it (issue 9 asks 5 %).
    EXPECT_NEAR(s.at("coverage").get<double>(), 1.0, 0.05) << config;
    EXPECT_LT(s.at("worst_step_coverage_error").get<double>(), 0.05) << config;
  }
}

// --precision bf16: the same steps with bf16 operands; the first loss within bf16's roundoff of fp32's.
TEST(StepBench, Bf16PrecisionStepsNearFloat32) {
  const nlohmann::json fp32 = step_summary("tiny_qwen3_moe.json");
  const nlohmann::json bf16 = step_summary("tiny_qwen3_moe.json", "--batch 2 --seq-len 16 --steps 3 --precision bf16");
  ASSERT_FALSE(fp32.is_null() || bf16.is_null());
  EXPECT_EQ(fp32.at("precision"), "fp32");
  EXPECT_EQ(bf16.at("precision"), "bf16");
  const double first_fp32 = fp32.at("first_loss").get<double>(), first_bf16 = bf16.at("first_loss").get<double>();
  EXPECT_NE(first_bf16, first_fp32);
  EXPECT_LE(std::abs(first_bf16 - first_fp32), 0x1.0p-8 * first_fp32);
  EXPECT_NE(bf16.at("peak_formula").get<std::string>().find("GFLOP/s"), std::string::npos);
}

// The demo configs scripts/step_vs_torch.sh compares with PyTorch, one short step each.
TEST(StepBench, EveryDemoConfigSteps) {
  for (const char* config : {"demo.json", "demo_moe.json", "demo_hybrid.json", "demo_kda.json", "demo_mla.json"}) {
    const nlohmann::json s = step_summary(config, "--batch 1 --seq-len 8 --steps 1");
    ASSERT_FALSE(s.is_null()) << config;
    EXPECT_TRUE(std::isfinite(s.at("last_loss").get<double>())) << config;
    EXPECT_NEAR(s.at("first_loss").get<double>(), std::log(8192.0), 0.5) << config;  // ≈ ln V at init
    EXPECT_NEAR(s.at("coverage").get<double>(), 1.0, 0.05) << config;
  }
}

TEST(StepBench, RejectsBadSizes) {
  const auto [status, output] = test::run_shell(std::string(TRILLION_BINARY) + " bench step --config " +
                                                std::string(TRILLION_SOURCE_DIR) +
                                                "/configs/models/tiny.json --batch 0 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("--batch and --seq-len must be ≥ 1"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
