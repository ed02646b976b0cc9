// `trillion bench loss` at a tiny size: its accuracy (fused against the plain 3-gemm path, and the
// recompute pair against plain), its JSON lines and fields, the z-loss option, bf16's extra path
// and the option checks, not its times.
#include "bench/loss_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_run.h"

namespace trillion {
namespace {

using test::json_lines;
using test::run_shell;

constexpr const char* kTinyArgs = " --tokens 70 --hidden 24 --vocab 300 --runs 2 --baseline-runs 1 --gemm-size 64";

TEST(LossBench, TinyRunReportsAccurateJson) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench loss --json" + kTinyArgs);
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_EQ(lines.size(), 5u) << output;
  const char* measurements[] = {"sgemm_ceiling", "fused", "recompute", "plain"};
  for (int m = 0; m < 4; ++m) {
    EXPECT_EQ(lines[m].at("bench"), "loss");
    EXPECT_EQ(lines[m].at("measurement"), measurements[m]);
    EXPECT_GT(lines[m].at("median_s").get<double>(), 0.0) << measurements[m];
    EXPECT_EQ(lines[m].at("runs").get<int>(), m < 2 ? 2 : 1) << measurements[m];
  }
  for (int m = 1; m < 4; ++m)
    for (const char* field : {"peak_bytes", "gflops"})
      EXPECT_GT(lines[m].at(field).get<double>(), 0.0) << measurements[m] << " " << field;
  const nlohmann::json& s = lines.back();
  EXPECT_EQ(s.at("bench"), "loss");
  EXPECT_LT(s.at("max_rel_err").get<double>(), 1e-5);
  EXPECT_LT(s.at("recompute_rel_err").get<double>(), 1e-5);
  for (const char* field : {"speedup", "ceiling_fraction", "ceiling_gflops", "fused_gflops", "fused_s", "baseline_s",
                            "memory_ratio", "fused_peak_bytes", "baseline_peak_bytes", "flops", "ratio_recompute",
                            "recompute_s", "recompute_peak_bytes", "plain_s"})
    EXPECT_GT(s.at(field).get<double>(), 0.0) << field;
  EXPECT_DOUBLE_EQ(s.at("speedup").get<double>(), s.at("plain_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_DOUBLE_EQ(s.at("ratio_recompute").get<double>(),
                   s.at("recompute_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_DOUBLE_EQ(s.at("flops").get<double>(), 6.0 * 70 * 24 * 300);
  // plain keeps [70, 300] float logits; fused keeps one chunk of them (here all 70 rows, the same size).
  EXPECT_GE(s.at("baseline_peak_bytes").get<int64_t>(), 70 * 300 * 4);
  EXPECT_EQ(s.at("fused_row_chunk").get<int64_t>(), 70);
  EXPECT_EQ(s.at("tokens").get<int64_t>(), 70);
  EXPECT_EQ(s.at("hidden").get<int64_t>(), 24);
  EXPECT_EQ(s.at("vocab").get<int64_t>(), 300);
  EXPECT_EQ(s.at("ceiling_gemm_size").get<int64_t>(), 64);
}

// Under bf16 the fused path is also timed without its dlogits copy: a sixth line, and the copy's
// speedup with the same bits; the paths agree with plain (rounding its operands alike) to bf16's
// products' accumulation differences.
TEST(LossBench, Bf16TimesTheFusedPathWithoutItsDlogitsCopy) {
  const auto [status, output] =
      run_shell(std::string(TRILLION_BINARY) + " bench loss --json --precision bf16" + kTinyArgs);
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_EQ(lines.size(), 6u) << output;
  EXPECT_EQ(lines[2].at("measurement"), "fused_rounding");
  EXPECT_EQ(lines[2].at("runs").get<int>(), 2);
  EXPECT_GT(lines[2].at("median_s").get<double>(), 0.0);
  const nlohmann::json& s = lines.back();
  EXPECT_EQ(s.at("precision"), "bf16");
  EXPECT_TRUE(s.at("dlogits_copy_same_bits").get<bool>());
  EXPECT_GT(s.at("dlogits_copy_speedup").get<double>(), 0.0);
  EXPECT_LT(s.at("max_rel_err").get<double>(), 1e-5);
  const auto [fp32_status, fp32_output] = run_shell(std::string(TRILLION_BINARY) + " bench loss --json" + kTinyArgs);
  ASSERT_EQ(fp32_status, 0) << fp32_output;
  EXPECT_FALSE(json_lines(fp32_output).back().contains("dlogits_copy_speedup"));
}

TEST(LossBench, TextOutputWithZLoss) {
  const auto [status, output] =
      run_shell(std::string(TRILLION_BINARY) + " bench loss --z-loss 1e-4" + kTinyArgs + " 2>&1");
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("speedup over plain"), std::string::npos) << output;
  EXPECT_NE(output.find("z-loss=0.0001"), std::string::npos) << output;
  EXPECT_NE(output.find("fewer than 10 runs"), std::string::npos) << output;
}

TEST(LossBench, RejectsBadOptions) {
  for (const char* args : {" --tokens 0", " --z-loss -1", " --runs 0"}) {
    const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench loss" + args + " 2>&1");
    EXPECT_NE(status, 0) << args;
    EXPECT_NE(output.find("bench loss:"), std::string::npos) << args << ": " << output;
  }
}

}  // namespace
}  // namespace trillion
