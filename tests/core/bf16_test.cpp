// bfloat16 conversions (core/bf16.h) against io/half_float.h's encoder, which rounds from double
// with integer arithmetic: every bit pattern's decoding, every class of float input's encoding
// (zeros, subnormals, ties both ways, the overflow threshold, infinities, NaNs) and a million
// random float bit patterns; the array conversions equal the scalar ones.
#include "core/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "io/half_float.h"

namespace trillion {
namespace {

bool is_nan_bits(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0; }

// to_bf16(x) is the encoder's result for x; NaN stays a quiet NaN of the same sign.
void expect_encodes_like_double(float x) {
  const uint16_t bits = to_bf16(x).bits;
  if (std::isnan(x)) {
    EXPECT_TRUE(is_nan_bits(bits)) << std::hex << std::bit_cast<uint32_t>(x);
    EXPECT_NE(bits & 0x0040u, 0u) << "quiet";
    EXPECT_EQ(bits >> 15, std::bit_cast<uint32_t>(x) >> 31) << "sign";
    return;
  }
  ASSERT_EQ(bits, bf16_from_double(double(x))) << std::hex << "float bits 0x" << std::bit_cast<uint32_t>(x);
}

TEST(Bf16, EveryBitPatternDecodesExactly) {
  for (uint32_t pattern = 0; pattern < 0x10000u; ++pattern) {
    const uint16_t bits = uint16_t(pattern);
    const float value = to_float(bf16{bits});
    if (is_nan_bits(bits)) {
      EXPECT_TRUE(std::isnan(value));
      continue;
    }
    ASSERT_EQ(double(value), bf16_to_double(bits)) << std::hex << pattern;
    ASSERT_EQ(to_bf16(value).bits, bits) << "a bf16 value encodes to itself";
  }
}

TEST(Bf16, EncodesEveryClassOfInputAsTheDoubleEncoderDoes) {
  const uint32_t patterns[] = {
      0x00000000u, 0x80000000u,              // ±0
      0x00000001u, 0x80000001u,              // smallest subnormal: rounds to ±0
      0x00008000u, 0x00018000u,              // subnormal ties: to even (0), to even (2)
      0x00008001u, 0x00007fffu,              // just above / below a subnormal half step
      0x007fffffu, 0x00800000u,              // largest subnormal (rounds to the smallest normal), smallest normal
      0x3f800000u, 0x3f808000u, 0x3f818000u,  // 1, ties to even down and up
      0x3f808001u, 0x3f807fffu,              // just above / below the tie
      0xbf818000u,                           // a negative tie
      0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u,  // largest bf16; below and at its overflow threshold
      0x7f7fffffu, 0xff7fffffu,              // ±largest float: ±infinity
      0x7f800000u, 0xff800000u,              // ±infinity
      0x7fc00000u, 0xffc00000u,              // quiet NaNs
      0x7f800001u, 0xff800001u, 0x7fbfffffu,  // signalling NaNs, payload only in the dropped half
  };
  for (const uint32_t pattern : patterns) expect_encodes_like_double(std::bit_cast<float>(pattern));
}

TEST(Bf16, MillionRandomFloatsEncodeAsTheDoubleEncoderDoes) {
  const CounterRng rng(5, "bf16_test");
  for (uint64_t i = 0; i < 1000000; ++i) expect_encodes_like_double(std::bit_cast<float>(uint32_t(rng.bits(i))));
}

TEST(Bf16, ArrayConversionsEqualTheScalarOnes) {
  const CounterRng rng(6, "bf16_test");
  const int64_t n = 1037;  // no vector width divides it
  std::vector<float> values(n), back(n);  // [n]
  for (int64_t i = 0; i < n; ++i) values[i] = float(rng.normal(i) * std::ldexp(1.0, int(i % 61) - 30));
  std::vector<bf16> encoded(n);  // [n]
  to_bf16(values.data(), encoded.data(), n);
  to_float(encoded.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(encoded[i].bits, to_bf16(values[i]).bits) << i;
    ASSERT_EQ(back[i], round_to_bf16(values[i])) << i;
    // Nearest: within half a bf16 step, 2^-8 of the value.
    ASSERT_LE(std::abs(double(back[i]) - double(values[i])), std::ldexp(std::abs(double(values[i])), -8)) << i;
  }
}

}  // namespace
}  // namespace trillion
