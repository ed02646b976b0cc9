// bfloat16 and binary16 encode/decode (see half_float.h). Both formats share one routine
// parameterised by their exponent and fraction widths; rounding is done on the 53-bit double
// significand with integer arithmetic, so it is exact round-to-nearest-even.
#include "io/half_float.h"

#include <bit>
#include <cmath>

namespace trillion {
namespace {

struct Format16 {
  int exponent_bits;
  int fraction_bits;
};
constexpr Format16 kBf16{8, 7};
constexpr Format16 kF16{5, 10};

uint16_t encode(double value, Format16 format) {
  const uint64_t bits = std::bit_cast<uint64_t>(value);
  const uint64_t sign = (bits >> 63) << 15;
  const int double_exponent_field = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t double_fraction = bits & ((uint64_t{1} << 52) - 1);
  const uint64_t exponent_all_ones = (uint64_t{1} << format.exponent_bits) - 1;
  const uint64_t infinity = exponent_all_ones << format.fraction_bits;

  if (double_exponent_field == 0x7ff) {  // infinity or NaN
    if (double_fraction == 0) return static_cast<uint16_t>(sign | infinity);
    return static_cast<uint16_t>(sign | infinity | (uint64_t{1} << (format.fraction_bits - 1)));
  }
  // Double subnormals (and zero) are far below the smallest 16-bit subnormal: they round to ±0.
  if (double_exponent_field == 0) return static_cast<uint16_t>(sign);

  const int bias = (1 << (format.exponent_bits - 1)) - 1;
  const int min_exponent = 1 - bias;                       // exponent of the smallest normal
  const int exponent = double_exponent_field - 1023;       // value = significand · 2^(exponent − 52)
  const uint64_t significand = (uint64_t{1} << 52) | double_fraction;  // 53 bits
  // The result is a multiple of 2^(max(exponent, min_exponent) − fraction_bits); shift the
  // significand so that one unit is that quantum. Shifts of 54 or more leave less than half a unit.
  int shift = (exponent > min_exponent ? exponent : min_exponent) - exponent + 52 - format.fraction_bits;
  if (shift > 54) shift = 54;
  uint64_t rounded = significand >> shift;
  const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (remainder > half || (remainder == half && (rounded & 1) != 0)) ++rounded;

  uint64_t magnitude;
  if (exponent < min_exponent) {
    // Subnormal: the field holds the multiple of the smallest subnormal; a carry into bit
    // `fraction_bits` yields exactly the encoding of the smallest normal.
    magnitude = rounded;
  } else {
    // Normal: rounded is in [2^f, 2^(f+1)]; adding the biased exponent above the implicit bit
    // lets a carry out of the fraction bump the exponent, as it should.
    magnitude = (static_cast<uint64_t>(exponent + bias - 1) << format.fraction_bits) + rounded;
  }
  if (magnitude >= infinity) magnitude = infinity;
  return static_cast<uint16_t>(sign | magnitude);
}

double decode(uint16_t bits, Format16 format) {
  const int bias = (1 << (format.exponent_bits - 1)) - 1;
  const int exponent_all_ones = (1 << format.exponent_bits) - 1;
  const bool negative = (bits >> 15) != 0;
  const int exponent_field = (bits >> format.fraction_bits) & exponent_all_ones;
  const int fraction = bits & ((1 << format.fraction_bits) - 1);
  double magnitude;
  if (exponent_field == exponent_all_ones) {
    magnitude = fraction == 0 ? INFINITY : NAN;
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction), 1 - bias - format.fraction_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>((1 << format.fraction_bits) | fraction),
                           exponent_field - bias - format.fraction_bits);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace

uint16_t bf16_from_double(double value) { return encode(value, kBf16); }
uint16_t f16_from_double(double value) { return encode(value, kF16); }
double bf16_to_double(uint16_t bits) { return decode(bits, kBf16); }
double f16_to_double(uint16_t bits) { return decode(bits, kF16); }

}  // namespace trillion
