// LR schedule values: linear warmup, cosine decay to min_lr_ratio · peak at the run's last step.
#include "train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trillion {
namespace {

TEST(LrSchedule, WarmupIsLinearFromZeroToPeak) {
  const LrSchedule s{1e-2, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(1), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-2);
}

TEST(LrSchedule, CosineDecaysToMinimumAtLastStep) {
  const LrSchedule s{1e-2, 0.1, 10, 110};
  // Halfway through the decay the rate is the mean of peak and minimum.
  EXPECT_NEAR(s.at(60), 0.5 * (1e-2 + 1e-3), 1e-15);
  // A quarter of the way: min + (peak − min) · (1 + cos(π/4)) / 2.
  EXPECT_NEAR(s.at(35), 1e-3 + 0.5 * 9e-3 * (1.0 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-3);  // beyond the run: stays at the minimum
  for (int64_t step = 11; step < 110; ++step) EXPECT_GT(s.at(step), s.at(step + 1)) << step;
}

TEST(LrSchedule, NoWarmupStartsNearPeak) {
  const LrSchedule s{2e-3, 0.0, 0, 4};
  EXPECT_NEAR(s.at(1), 1e-3 * (1.0 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_NEAR(s.at(2), 1e-3, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(4), 0.0);
}

TEST(LrSchedule, WarmupAsLongAsTheRunEndsAtPeak) {
  const LrSchedule s{1e-3, 0.1, 8, 8};
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(8), 1e-3);
}

}  // namespace
}  // namespace trillion
