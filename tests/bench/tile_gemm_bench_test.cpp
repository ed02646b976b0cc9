// `trillion bench tiles` at one run: a JSON line per shape and the summary; every path's product,
// libxsmm's wherever it has a kernel, agrees with the double product of its operands (float, or
// their bf16 roundings) to float's accumulation error; libxsmm has a kernel for every fp32 shape
// without a transposed right factor; not its times.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_run.h"

namespace trillion {
namespace {

using test::json_lines;
using test::run_shell;

TEST(TilesBench, EveryPathAgreesWithDoubleAndLibxsmmCoversTheUntransposedShapes) {
  const auto [status, output] = run_shell(std::string(TRILLION_BINARY) + " bench tiles --json --runs 1");
  ASSERT_EQ(status, 0) << output;
  const std::vector<nlohmann::json> lines = json_lines(output);
  ASSERT_GE(lines.size(), 2u) << output;
  const nlohmann::json& summary = lines.back();
  ASSERT_EQ(summary.at("shapes").get<size_t>(), lines.size() - 1) << output;
  int untransposed = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    const nlohmann::json& shape = lines[i];
    SCOPED_TRACE(shape.dump());
    const bool trans_b = shape.at("trans_b").get<bool>();
    untransposed += !trans_b;
    for (const char* path : {"onednn_fp32", "onednn_bf16", "libxsmm_fp32", "libxsmm_bf16"}) {
      if (shape.at(path).is_null()) continue;
      EXPECT_GT(shape.at(path).at("gflops").get<double>(), 0.0) << path;
      EXPECT_LT(shape.at(path).at("max_rel_err").get<double>(), 1e-5) << path;
    }
    EXPECT_FALSE(shape.at("onednn_fp32").is_null());
    EXPECT_FALSE(shape.at("onednn_bf16").is_null());
    if (!trans_b) {
      EXPECT_FALSE(shape.at("libxsmm_fp32").is_null());
    }
  }
  EXPECT_GT(untransposed, 0);
  EXPECT_LE(summary.at("libxsmm_faster_fp32").size(), lines.size() - 1);
  EXPECT_FALSE(summary.at("gemm_backend").get<std::string>().empty());
}

}  // namespace
}  // namespace trillion
