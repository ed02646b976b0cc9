// The machine's available memory (core/machine_memory.h): a positive amount no larger than the
// machine's total, and the refusal message of a job that cannot fit it.
#include "core/machine_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"

namespace trillion {
namespace {

int64_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

TEST(MachineMemory, AvailableIsPositiveAndAtMostTheTotal) {
  const AvailableMemory available = available_memory();
  EXPECT_GT(available.bytes, 0);
  const int64_t total = mem_total_bytes();
  ASSERT_GT(total, 0);
  EXPECT_LE(available.bytes, total);
  EXPECT_FALSE(available.source.empty());
}

TEST(MachineMemory, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 bytes");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(3.0 * (int64_t(1) << 30)), "3.0 GiB");
  EXPECT_EQ(human_bytes(850.4 * double(int64_t(1) << 40)), "850.4 TiB");
}

TEST(MachineMemory, RequireMemoryRefusesWhatCannotFitWithBothCounts) {
  EXPECT_NO_THROW(require_memory(4096, "a small job"));
  const int64_t huge = int64_t(1) << 62;
  try {
    require_memory(huge, "a huge job", " (its parts)", "less of it");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("a huge job needs 4611686018427387904 bytes (4.0 EiB) of memory (its parts); this "
                            "machine has ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find(" available ("), std::string::npos) << message;
    EXPECT_EQ(message.substr(message.size() - 21), "; expected less of it") << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

}  // namespace
}  // namespace trillion
