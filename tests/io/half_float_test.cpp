// bfloat16 / binary16 conversion: exact decoding, round-to-nearest-even encoding at every edge
// (ties, subnormals, overflow, NaN), checked against known bit patterns, an independent float-bit
// reference for bf16, and an exhaustive decode→encode round trip over all 65536 patterns.
#include "io/half_float.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace trillion {
namespace {

// bf16 reference from float bits: add 0x7FFF plus the lowest kept bit, then truncate (RNE).
uint16_t bf16_reference(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

TEST(HalfFloat, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_double(1.0), 0x3F80);
  EXPECT_EQ(bf16_from_double(-2.0), 0xC000);
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8)), 0x3F80);      // tie, even is 1.0
  EXPECT_EQ(bf16_from_double(1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);  // tie, even is above
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)), 0x3F81);  // just above tie
  // Rounded once from double: via float this value would become an exact tie and round down.
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)), 0x3F81);
  EXPECT_EQ(bf16_from_double(-1.0 - std::ldexp(1.0, -8) - std::ldexp(1.0, -30)), 0xBF81);
}

TEST(HalfFloat, Bf16SpecialValues) {
  EXPECT_EQ(bf16_from_double(0.0), 0x0000);
  EXPECT_EQ(bf16_from_double(-0.0), 0x8000);
  EXPECT_EQ(bf16_from_double(INFINITY), 0x7F80);
  EXPECT_EQ(bf16_from_double(-INFINITY), 0xFF80);
  EXPECT_EQ(bf16_from_double(NAN), 0x7FC0);
  EXPECT_TRUE(std::isnan(bf16_to_double(0x7FC1)));
  EXPECT_EQ(bf16_from_double(3.3895313892515355e38), 0x7F7F);            // largest finite
  EXPECT_EQ(bf16_from_double(std::numeric_limits<float>::max()), 0x7F80);  // beyond the last tie: inf
  EXPECT_EQ(bf16_from_double(1e300), 0x7F80);
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -133)), 0x0001);      // smallest subnormal
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -134)), 0x0000);      // half of it: tie to even 0
  EXPECT_EQ(bf16_from_double(3 * std::ldexp(1.0, -135)), 0x0001);  // 0.75 of it
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -1030)), 0x0000);     // double subnormal
  EXPECT_EQ(bf16_to_double(0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(bf16_to_double(0x7F7F), 3.3895313892515355e38);
}

TEST(HalfFloat, Bf16MatchesFloatBitReference) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<uint32_t> any_bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float value = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(value)) continue;
    ASSERT_EQ(bf16_from_double(value), bf16_reference(value)) << "value " << value;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
}

TEST(HalfFloat, F16RoundsToNearestEven) {
  EXPECT_EQ(f16_from_double(1.0), 0x3C00);
  EXPECT_EQ(f16_from_double(-0.5), 0xB800);
  EXPECT_EQ(f16_from_double(1.0 + std::ldexp(1.0, -11)), 0x3C00);      // tie, even below
  EXPECT_EQ(f16_from_double(1.0 + 3 * std::ldexp(1.0, -11)), 0x3C02);  // tie, even above
  EXPECT_EQ(f16_from_double(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3C01);
  EXPECT_EQ(f16_from_double(0.1), 0x2E66);  // 0.0999755859375
}

TEST(HalfFloat, F16SpecialValues) {
  EXPECT_EQ(f16_from_double(65504.0), 0x7BFF);  // largest finite
  EXPECT_EQ(f16_from_double(65519.0), 0x7BFF);  // below the tie
  EXPECT_EQ(f16_from_double(65520.0), 0x7C00);  // tie rounds to even: infinity
  EXPECT_EQ(f16_from_double(-1e10), 0xFC00);
  EXPECT_EQ(f16_from_double(NAN), 0x7E00);
  EXPECT_EQ(f16_from_double(-0.0), 0x8000);
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -25) + std::ldexp(1.0, -40)), 0x0001);
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -14)), 0x0400);  // smallest normal
  // Halfway between the largest subnormal 0x03FF and 2^-14: the carry gives the smallest normal.
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -14) - std::ldexp(1.0, -25)), 0x0400);
  EXPECT_EQ(f16_to_double(0x03FF), std::ldexp(1.0, -14) - std::ldexp(1.0, -24));
  EXPECT_EQ(f16_to_double(0x7BFF), 65504.0);
  EXPECT_EQ(f16_to_double(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_double(0x7C01)));
}

TEST(HalfFloat, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const uint16_t pattern = static_cast<uint16_t>(bits);
    const double bf16 = bf16_to_double(pattern);
    const double f16 = f16_to_double(pattern);
    // bf16 is the upper half of a float.
    const float as_float = std::bit_cast<float>(bits << 16);
    if (std::isnan(as_float)) {
      ASSERT_TRUE(std::isnan(bf16));
    } else {
      ASSERT_EQ(bf16, static_cast<double>(as_float)) << std::hex << bits;
      ASSERT_EQ(bf16_from_double(bf16), pattern) << std::hex << bits;
    }
    if (!std::isnan(f16)) {
      ASSERT_EQ(f16_from_double(f16), pattern) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace trillion
