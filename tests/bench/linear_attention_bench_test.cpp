// `trillion bench linear-attention` at a tiny size: its accuracy (chunked against recurrent), its
// FLOP count and its JSON lines, not its times. T = 130 leaves a partial last chunk.
#include "bench/linear_attention_bench.h"

#include <gtest/gtest.h>

#include "bench/bench_run.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace trillion {
namespace {

using test::json_lines;
using test::run_shell;

constexpr const char* kTinyArgs =
    " --tokens 130 --heads 2 --key-dim 8 --value-dim 8 --runs 2 --baseline-runs 2 --gemm-size 64";

LinearAttentionBenchOptions tiny_options() {
  LinearAttentionBenchOptions o;
  o.tokens = 130;
  o.heads = 2;
  o.key_dim = 8;
  o.value_dim = 8;
  o.runs = 2;
  o.baseline_runs = 2;
  o.gemm_size = 64;
  o.seed = 3;
  return o;
}


void expect_kind_summary(const nlohmann::json& s, const std::string& decay) {
  SCOPED_TRACE(decay);
  EXPECT_EQ(s.at("bench"), "linear-attention");
  EXPECT_EQ(s.at("decay"), decay);
  EXPECT_LT(s.at("max_rel_err").get<double>(), 1e-4);
  for (const char* field : {"speedup", "ceiling_fraction", "ceiling_gflops", "fused_gflops", "fused_s",
                            "baseline_s", "memory_ratio", "fused_peak_bytes", "baseline_peak_bytes"})
    EXPECT_GT(s.at(field).get<double>(), 0.0) << field;
  EXPECT_DOUBLE_EQ(s.at("speedup").get<double>(), s.at("baseline_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_NEAR(s.at("ceiling_fraction").get<double>(),
              s.at("fused_gflops").get<double>() / s.at("ceiling_gflops").get<double>(), 1e-12);
  EXPECT_EQ(s.at("ceiling_gemm_size").get<int64_t>(), 64);
  EXPECT_EQ(s.at("tokens").get<int64_t>(), 130);
  EXPECT_EQ(s.at("heads").get<int64_t>(), 2);
  EXPECT_EQ(s.at("key_dim").get<int64_t>(), 8);
  EXPECT_EQ(s.at("value_dim").get<int64_t>(), 8);
  // For both kinds the plain unfused chunked form is timed too; its error against the fused kernel
  // is within max_rel_err (so bounded by it above).
  for (const char* field : {"unfused_s", "ratio_unfused", "unfused_peak_bytes"})
    EXPECT_GT(s.at(field).get<double>(), 0.0) << field;
  for (const char* field : {"unfused_forward_s", "unfused_backward_s"})
    EXPECT_GE(s.at(field).get<double>(), 0.0) << field;
  EXPECT_DOUBLE_EQ(s.at("ratio_unfused").get<double>(),
                   s.at("unfused_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_LE(s.at("unfused_max_rel_err").get<double>(), s.at("max_rel_err").get<double>());
  EXPECT_LT(s.at("unfused_max_rel_err").get<double>(), 1e-4);
}

TEST(LinearAttentionBench, FlopFormula) {
  // 3 · T · H · (2 · C · (3K + 2V) + 6 · K · V), C = 64
  EXPECT_DOUBLE_EQ(linear_attention_bench_flops(130, 2, 8, 8), 3.0 * 130 * 2 * (2.0 * 64 * (24 + 16) + 6.0 * 64));
  EXPECT_DOUBLE_EQ(linear_attention_bench_flops(130, 2, 8, 8), 4293120.0);
  EXPECT_DOUBLE_EQ(linear_attention_bench_flops(4096, 8, 128, 128),
                   3.0 * 4096 * 8 * (2.0 * 64 * (384 + 256) + 6.0 * 128 * 128));
}

TEST(LinearAttentionBench, TinyRunBothDecayKinds) {
  std::vector<nlohmann::json> lines;
  const nlohmann::json combined =
      run_linear_attention_bench(tiny_options(), [&](const nlohmann::json& j) { lines.push_back(j); });
  // Per kind: sgemm ceiling, chunked, recurrent; then the two kinds' summaries.
  ASSERT_EQ(lines.size(), 8u);
  const char* kinds[] = {"per_head", "per_key_channel"};
  for (int kind = 0; kind < 2; ++kind) {
    const char* measurements[] = {"sgemm_ceiling", "chunked", "recurrent"};
    for (int m = 0; m < 3; ++m) {
      const nlohmann::json& line = lines[3 * kind + m];
      EXPECT_EQ(line.at("bench"), "linear-attention");
      EXPECT_EQ(line.at("decay"), kinds[kind]);
      EXPECT_EQ(line.at("measurement"), measurements[m]);
      EXPECT_EQ(line.at("runs").get<int>(), 2);
      if (m > 0) {
        EXPECT_GT(line.at("peak_bytes").get<double>(), 0.0);
        EXPECT_GE(line.at("forward_s").get<double>(), 0.0);
        EXPECT_GE(line.at("backward_s").get<double>(), 0.0);
      }
    }
    const nlohmann::json& summary = lines[6 + kind];
    expect_kind_summary(summary, kinds[kind]);
    EXPECT_DOUBLE_EQ(summary.at("flops").get<double>(), 4293120.0);
    EXPECT_EQ(combined.at(kinds[kind]).at("max_rel_err"), summary.at("max_rel_err"));
  }
  // Peak bytes: inputs + outputs + workspace; per-key-channel g and dg are K times larger.
  const int64_t head_inputs = (130 * 2 * (8 + 8 + 8 + 8) + 130 * 2 * 2) * 4;
  const int64_t head_outputs = (130 * 2 * (8 + 8 + 8 + 8) + 130 * 2 * 2) * 4;
  EXPECT_EQ(lines[1].at("peak_bytes").get<int64_t>(), head_inputs + head_outputs + lines[1].at("workspace_bytes").get<int64_t>());
  EXPECT_GT(lines[1].at("workspace_bytes").get<int64_t>(), 0);
  EXPECT_GT(lines[2].at("workspace_bytes").get<int64_t>(), 0);
  const nlohmann::json& per_head = lines[6];
  const nlohmann::json& per_channel = lines[7];
  EXPECT_EQ(combined.at("bench"), "linear-attention");
  EXPECT_EQ(combined.at("decay"), "both");
  EXPECT_EQ(combined.at("speedup"), per_head.at("speedup"));
  EXPECT_EQ(combined.at("unfused_s"), per_head.at("unfused_s"));
  EXPECT_EQ(combined.at("ratio_unfused"), per_head.at("ratio_unfused"));
  EXPECT_EQ(combined.at("ratio_unfused_per_key_channel"), per_channel.at("ratio_unfused"));
  EXPECT_EQ(combined.at("per_key_channel").at("unfused_s"), per_channel.at("unfused_s"));
  EXPECT_DOUBLE_EQ(combined.at("max_rel_err").get<double>(),
                   std::max(per_head.at("max_rel_err").get<double>(), per_channel.at("max_rel_err").get<double>()));
  EXPECT_DOUBLE_EQ(combined.at("ceiling_fraction").get<double>(),
                   std::min(per_head.at("ceiling_fraction").get<double>(),
                            per_channel.at("ceiling_fraction").get<double>()));
  EXPECT_DOUBLE_EQ(combined.at("memory_ratio").get<double>(),
                   std::min(per_head.at("memory_ratio").get<double>(), per_channel.at("memory_ratio").get<double>()));
  EXPECT_LT(combined.at("max_rel_err").get<double>(), 1e-4);
  EXPECT_GT(combined.at("ceiling_gflops").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(combined.at("flops").get<double>(), 4293120.0);
}

TEST(LinearAttentionBench, CliSingleKindLastLineIsItsSummary) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench linear-attention --json" +
                                          kTinyArgs + " --decay per_key_channel --seed 5");
  ASSERT_EQ(status, 0) << output;
  const size_t last = output.rfind("\n{");
  ASSERT_NE(last, std::string::npos) << output;
  const nlohmann::json summary = nlohmann::json::parse(output.substr(last + 1));
  expect_kind_summary(summary, "per_key_channel");
  EXPECT_DOUBLE_EQ(summary.at("flops").get<double>(), 4293120.0);
  EXPECT_EQ(output.find("per_head"), std::string::npos) << output;
  for (const char* line :
       {"\"measurement\":\"sgemm_ceiling\"", "\"measurement\":\"chunked\"", "\"measurement\":\"recurrent\""})
    EXPECT_NE(output.find(line), std::string::npos) << line;
}

TEST(LinearAttentionBench, CliBothKindsLastLineIsCombinedSummary) {
  const auto [status, output] =
      run_shell(std::string(TRILLION_BINARY) + " bench linear-attention --json" + kTinyArgs);
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_EQ(lines.size(), 9u) << output;
  const nlohmann::json& summary = lines.back();
  EXPECT_EQ(summary.at("bench"), "linear-attention");
  EXPECT_EQ(summary.at("decay"), "both");
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-4);
  for (const char* field : {"speedup", "ceiling_fraction", "ceiling_gflops", "memory_ratio", "unfused_s",
                            "ratio_unfused", "ratio_unfused_per_key_channel"})
    EXPECT_GT(summary.at(field).get<double>(), 0.0) << field;
  expect_kind_summary(lines[6], "per_head");
  expect_kind_summary(lines[7], "per_key_channel");
  EXPECT_EQ(summary.at("ratio_unfused"), lines[6].at("ratio_unfused"));
  EXPECT_EQ(summary.at("ratio_unfused_per_key_channel"), lines[7].at("ratio_unfused"));
}

TEST(LinearAttentionBench, CliTextOutputAndBadDecay) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench linear-attention" + kTinyArgs +
                                          " --decay per_head 2>&1");
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("speedup over recurrent"), std::string::npos) << output;
  EXPECT_NE(output.find("fewer than 10 runs"), std::string::npos) << output;
  const auto [bad_status, bad_output] =
      run_shell(std::string(TRILLION_BINARY) + " bench linear-attention --decay per_token 2>&1");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad_output.find("--decay"), std::string::npos) << bad_output;
}

}  // namespace
}  // namespace trillion
