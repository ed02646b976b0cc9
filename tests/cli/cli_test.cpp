// The `trillion` command line as a whole: every subcommand answers --help, unknown input is
// rejected, and `bench gemm` runs at a tiny size with a checked result (its time is not checked).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(Cli, EverySubcommandHasHelp) {
  for (const char* name : {"tokenize", "train", "eval", "generate", "gradcheck", "bench", "bench gemm",
                           "bench attention"}) {
    const CommandResult r = run_cli(std::string(name) + " --help");
    EXPECT_EQ(r.status, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("Usage:"), std::string::npos) << name << ": " << r.output;
  }
  EXPECT_NE(run_cli("no-such-command").status, 0);
}

TEST(Cli, GradcheckOfAMissingConfigNamesTheFile) {
  const CommandResult r = run_cli("gradcheck --config /nonexistent/model.json");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model.json"), std::string::npos) << r.output;
}

TEST(BenchGemm, TinyRunReportsACorrectProduct) {
  const CommandResult r = run_cli("bench gemm --json --size 48", "OMP_NUM_THREADS=1", /*stdout_only=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json summary = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  EXPECT_EQ(summary.at("bench"), "gemm");
  EXPECT_EQ(summary.at("size"), 48);
  EXPECT_GT(summary.at("gflops").get<double>(), 0.0);
  EXPECT_GE(summary.at("runs").get<int>(), 10);
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-5);
}

}  // namespace
}  // namespace trillion::train_test
