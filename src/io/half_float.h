// 16-bit floating-point formats used in checkpoints: bfloat16 (1 sign, 8 exponent, 7 fraction bits)
// and IEEE binary16 "half" (1 sign, 5 exponent, 10 fraction bits).
//
// Encoding rounds to nearest, ties to even, directly from double (one rounding, so a double and
// the float holding the same value encode identically); overflow gives ±infinity, values below
// half the smallest subnormal give ±0, NaN stays NaN (quiet, sign kept). Decoding is exact: every
// bf16 and f16 value is representable in float and in double.
#pragma once

#include <cstdint>

namespace trillion {

uint16_t bf16_from_double(double value);
uint16_t f16_from_double(double value);
double bf16_to_double(uint16_t bits);
double f16_to_double(uint16_t bits);

}  // namespace trillion
