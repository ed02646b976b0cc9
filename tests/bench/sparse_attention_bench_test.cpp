// `trillion bench sparse-attention` at a tiny size: its accuracy (fused sparse path against the
// plain one), its FLOP formulas, its JSON lines and its option checks, not its times.
#include "bench/sparse_attention_bench.h"

#include <gtest/gtest.h>

#include "bench/bench_run.h"

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
    " --seq-len 96 --topk 16 --heads 4 --kv-heads 2 --head-dim 16 --index-heads 2 --index-head-dim 16"
    " --runs 2 --baseline-runs 1 --gemm-size 64";

TEST(SparseAttentionBench, FlopFormulas) {
  SparseAttentionBenchOptions o;
  o.seq_len = 96;
  o.topk = 16;
  o.index_heads = 2;
  o.index_head_dim = 16;
  // N = Σ_t min(16, t + 1) = 136 + 80 · 16; V = 96 · 97 / 2
  const double selected = 136.0 + 80.0 * 16.0, visible = 96.0 * 97.0 / 2.0;
  EXPECT_DOUBLE_EQ(sparse_attention_bench_sparse_flops(o, 16, 16, 4),
                   2.0 * visible * 32.0 + 6.0 * selected * 4.0 * 32.0);
  EXPECT_DOUBLE_EQ(sparse_attention_bench_dense_flops(o, 16, 16, 4), 6.0 * visible * 4.0 * 32.0);
}

TEST(SparseAttentionBench, TinyRunReportsAccurateJson) {
  const auto [status, output] =
      run_shell(std::string(TRILLION_BINARY) + " bench sparse-attention --json --mla-heads 2" + kTinyArgs);
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_EQ(lines.size(), 9u) << output;
  const char* measurements[] = {"sgemm_ceiling",      "sparse",      "dense",   "plain", "indexer_loss_dense",
                                "indexer_loss_sparse", "mla_sparse", "mla_dense"};
  for (int m = 0; m < 8; ++m) {
    EXPECT_EQ(lines[m].at("bench"), "sparse-attention");
    EXPECT_EQ(lines[m].at("measurement"), measurements[m]);
    EXPECT_GT(lines[m].at("median_s").get<double>(), 0.0) << measurements[m];
    EXPECT_GT(lines[m].at("min_s").get<double>(), 0.0) << measurements[m];
    EXPECT_EQ(lines[m].at("runs").get<int>(), m == 3 ? 1 : 2) << measurements[m];
  }
  for (int m = 1; m <= 3; ++m)
    for (const char* field : {"peak_bytes", "workspace_bytes", "gflops"})
      EXPECT_GT(lines[m].at(field).get<double>(), 0.0) << measurements[m] << " " << field;
  for (const char* field : {"workspace_bytes", "gflops", "indexer_topk_s", "forward_s", "backward_s"})
    EXPECT_GT(lines[6].at(field).get<double>(), 0.0) << "mla_sparse " << field;
  const nlohmann::json& s = lines.back();
  EXPECT_EQ(s.at("bench"), "sparse-attention");
  EXPECT_LT(s.at("max_rel_err").get<double>(), 1e-4);
  EXPECT_EQ(s.at("topk_mismatch_rows").get<int64_t>(), 0);
  for (const char* field :
       {"speedup", "ceiling_fraction", "ceiling_gflops", "fused_gflops", "fused_s", "baseline_s", "memory_ratio",
        "fused_peak_bytes", "baseline_peak_bytes", "flops", "dense_flops", "plain_s", "plain_peak_bytes",
        "ratio_plain", "indexer_loss_dense_s", "indexer_loss_sparse_s", "indexer_topk_s", "forward_s",
        "backward_s", "mla_speedup", "mla_sparse_s", "mla_dense_s"})
    EXPECT_GT(s.at(field).get<double>(), 0.0) << field;
  EXPECT_DOUBLE_EQ(s.at("speedup").get<double>(), s.at("baseline_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_DOUBLE_EQ(s.at("ratio_plain").get<double>(), s.at("plain_s").get<double>() / s.at("fused_s").get<double>());
  EXPECT_NEAR(s.at("ceiling_fraction").get<double>(),
              s.at("fused_gflops").get<double>() / s.at("ceiling_gflops").get<double>(), 1e-12);
  EXPECT_DOUBLE_EQ(s.at("flops").get<double>(), 2.0 * 96 * 97 / 2 * 32 + 6.0 * (136 + 80 * 16) * 4 * 32);
  EXPECT_EQ(s.at("seq_len").get<int64_t>(), 96);
  EXPECT_EQ(s.at("topk").get<int64_t>(), 16);
  EXPECT_EQ(s.at("heads").get<int64_t>(), 4);
  EXPECT_EQ(s.at("kv_heads").get<int64_t>(), 2);
  EXPECT_EQ(s.at("head_dim").get<int64_t>(), 16);
  EXPECT_EQ(s.at("v_dim").get<int64_t>(), 16);
  EXPECT_EQ(s.at("index_heads").get<int64_t>(), 2);
  EXPECT_EQ(s.at("index_head_dim").get<int64_t>(), 16);
  EXPECT_EQ(s.at("mla_heads").get<int64_t>(), 2);
  EXPECT_EQ(s.at("ceiling_gemm_size").get<int64_t>(), 64);
  EXPECT_EQ(s.at("precision"), "fp32");
  EXPECT_FALSE(s.contains("mla_bf16_gain"));
}

// Under --precision bf16 the timed paths read bf16 operands and the plain reference stays float:
// the error is bf16's, within 4u (u = 2⁻⁸), and far above float's. The MLA line also times its
// sparse path with float operands.
TEST(SparseAttentionBench, Bf16RunIsWithinBf16sTolerance) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) +
                                          " bench sparse-attention --json --mla-heads 2 --precision bf16" + kTinyArgs);
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_EQ(lines.size(), 10u) << output;
  EXPECT_EQ(lines[8].at("measurement"), "mla_sparse_fp32");
  EXPECT_GT(lines[8].at("backward_s").get<double>(), 0.0);
  const nlohmann::json& s = lines.back();
  EXPECT_EQ(s.at("precision"), "bf16");
  EXPECT_LT(s.at("max_rel_err").get<double>(), 4 * 0x1.0p-8);
  EXPECT_GT(s.at("max_rel_err").get<double>(), 1e-4);
  EXPECT_DOUBLE_EQ(s.at("mla_bf16_gain").get<double>(),
                   s.at("mla_sparse_fp32_s").get<double>() / s.at("mla_sparse_s").get<double>());
}

TEST(SparseAttentionBench, TextOutputAndMlaSkipped) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench sparse-attention" + kTinyArgs +
                                          " --mla-heads 0 --v-dim 8 2>&1");
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("speedup over dense"), std::string::npos) << output;
  EXPECT_NE(output.find("fewer than 10 runs"), std::string::npos) << output;
  EXPECT_NE(output.find("qk=16 v=8"), std::string::npos) << output;
  EXPECT_EQ(output.find("MLA"), std::string::npos) << output;
}

TEST(SparseAttentionBench, RejectsHeadsNotDivisibleByKvHeads) {
  const auto [status, output] =
      run_shell(std::string(TRILLION_BINARY) + " bench sparse-attention --seq-len 8 --heads 3 --kv-heads 2 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("--heads 3 must be a multiple of --kv-heads 2"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
