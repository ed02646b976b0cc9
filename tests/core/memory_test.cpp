// Tier accounting, arenas and the OS view of resident memory.
#include "core/memory.h"

#include <gtest/gtest.h>

#include <vector>

namespace trillion {
namespace {

TEST(Memory, BufferCountsCurrentAndPeakBytes) {
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  {
    Buffer<float> a(1000);
    EXPECT_EQ(MemoryStats::current(Tier::fast), before + 4000);
    Buffer<double> b(10, Tier::slow);
    EXPECT_EQ(b[3], 0.0);
  }
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);
  EXPECT_EQ(MemoryStats::peak(Tier::fast), before + 4000);
}

TEST(Memory, ArenaResetsAndReusesBlocks) {
  Arena arena(Tier::fast, 1 << 12);
  const int64_t before = MemoryStats::current(Tier::fast);
  float* a = arena.alloc<float>(100);
  float* b = arena.alloc<float>(2000);  // larger than a block
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before + 448 + 8000);
  arena.reset();
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);
  Tensor<float> t = arena.tensor<float>({3, 5});
  EXPECT_EQ(t.dim(1), 5);
  EXPECT_EQ(t.slice(2).numel(), 5);
}

TEST(Memory, PeakResidentSetIsReported) {
  EXPECT_GT(peak_rss_bytes(), 0);
  EXPECT_GE(peak_rss_bytes(), current_rss_bytes());
}

// A 256 MB touch raises the peak; after it is freed, the reset brings the peak back near the
// current resident size, so the next step's peak is its own.
TEST(Memory, PeakResidentSetResetsToCurrent) {
  {
    std::vector<char> big(256 << 20);
    for (size_t i = 0; i < big.size(); i += 4096) big[i] = char(i);
    EXPECT_GE(peak_rss_bytes(), current_rss_bytes());
    EXPECT_GT(peak_rss_bytes(), int64_t(256) << 20);
  }
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  EXPECT_LT(peak_rss_bytes(), current_rss_bytes() + (int64_t(64) << 20));
}

}  // namespace
}  // namespace trillion
