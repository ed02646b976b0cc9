// The build's instruction sets against the CPU: the machine that built and runs the tests has all
// of them, and `trillion` starts (a build for a CPU it lacks would refuse with their names).
#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support/command.h"

namespace trillion {
namespace {

TEST(CpuFeatures, TheBuildMachineHasWhatTheBuildUses) {
  const std::vector<std::string> missing = missing_cpu_features();
  EXPECT_TRUE(missing.empty()) << missing.front();
  const auto [status, output] = test::run_shell(std::string(TRILLION_BINARY) + " --help 2>&1");
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output.find("which this CPU lacks"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
