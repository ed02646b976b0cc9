// `trillion bench moe-parallel` at a tiny size under mpirun, so it cannot rot: both modes run the
// same weights and batch, so their losses agree (the pipelined exchange computes what the serial
// one does), their times and waits are measured, and the hidden fraction is at most 1. Its time is
// not checked.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

nlohmann::json bench(int ranks, const std::string& flags) {
  const CommandResult r = run_shell("OMP_NUM_THREADS=1 " + mpirun_launcher(ranks) + " " + TRILLION_BINARY +
                                    " bench moe-parallel --json " + flags +
                                    " 2>/dev/null");
  EXPECT_EQ(r.status, 0) << r.output;
  return r.status == 0 ? nlohmann::json::parse(r.output) : nlohmann::json();
}

TEST(MoeParallelBench, BothModesComputeTheSameStepAndReportTheirWaits) {
  for (const auto& [ranks, ep] : {std::pair{2, 2}, {4, 4}}) {
    const nlohmann::json s = bench(ranks, "--config " + std::string(TRILLION_SOURCE_DIR) +
                                              "/configs/models/tiny_glm4_moe.json --batch 4 --seq-len 16 --steps 2 " +
                                              "--rounds 1 --chunks 3 --ep " + std::to_string(ep));
    ASSERT_FALSE(s.is_null());
    EXPECT_EQ(s.at("ranks"), ranks);
    EXPECT_EQ(s.at("ep"), ep);
    const nlohmann::json &serial = s.at("serial"), &pipelined = s.at("pipelined");
    EXPECT_EQ(serial.at("chunks"), 1);
    EXPECT_EQ(pipelined.at("chunks"), 3);
    const double a = serial.at("loss"), b = pipelined.at("loss");
    EXPECT_NEAR(a, b, 1e-5 * std::abs(a)) << "the same step in both modes";
    EXPECT_GT(a, 0.0);
    for (const nlohmann::json* mode : {&serial, &pipelined}) {
      EXPECT_GT(mode->at("step_s").get<double>(), 0.0);
      EXPECT_GE(mode->at("wait_s").get<double>(), 0.0);
      EXPECT_LT(mode->at("wait_s").get<double>(), mode->at("step_s").get<double>());
    }
    EXPECT_LE(s.at("hidden_fraction").get<double>(), 1.0);
    EXPECT_GT(s.at("speedup").get<double>(), 0.0);
  }
}

TEST(MoeParallelBench, OneRankIsRefused) {
  const CommandResult r = run_cli("bench moe-parallel --config " + std::string(TRILLION_SOURCE_DIR) +
                                  "/configs/models/tiny_glm4_moe.json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("run it under mpirun"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trillion::train_test
