// Configs that cannot fit: `trillion train` refuses a config whose head_dim needs terabytes and one
// with a hundred million layers with a one-line error and exit status 1 (no abort, no core dump),
// in well under a second; a small model with a batch too large for the machine names the peak.
#include <gtest/gtest.h>

#include <chrono>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

// Trains the demo config with `field` set to `value`; returns the result and the seconds it took.
std::pair<CommandResult, double> train_demo_with(const char* field, int64_t value, const std::string& flags = "") {
  const TestData& d = test_data();
  const fs::path path = config_with("demo", field != nullptr ? nlohmann::json{{field, value}} : nlohmann::json());
  const auto start = std::chrono::steady_clock::now();
  const CommandResult result = run_cli("train --config " + path.string() + " --data " + d.data_dir.string() + " --out " +
                                       (d.root / "resource_limits_out").string() + " --steps 1" + flags);
  return {result, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

void expect_one_line_refusal(const CommandResult& result, double seconds, const std::string& expected) {
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_LT(seconds, 5.0) << "refused in bounded time (a second on an idle machine)";
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find('\n'), result.output.size() - 1) << "one line: " << result.output;
}

TEST(ResourceLimitsCli, HugeHeadDimIsRefusedWithTheBytesNeededAndAvailable) {
  const auto [result, seconds] = train_demo_with("head_dim", 1000000000);
  expect_one_line_refusal(result, seconds, "needs ");
  EXPECT_NE(result.output.find(" of memory at its peak ("), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(") available ("), std::string::npos) << result.output;
}

TEST(ResourceLimitsCli, AbsurdLayerCountIsRefusedByField) {
  const auto [result, seconds] = train_demo_with("num_hidden_layers", 100000000);
  expect_one_line_refusal(result, seconds, "field \"num_hidden_layers\": got 100000000; expected at most 16384");
}

TEST(ResourceLimitsCli, BatchTooLargeForTheMachineNamesTheActivations) {
  const auto [result, seconds] = train_demo_with(nullptr, 0, " --batch 65536 --seq-len 1024");
  expect_one_line_refusal(result, seconds, "activations ");
  EXPECT_NE(result.output.find("expected a smaller model, --batch or --seq-len"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace trillion::train_test
