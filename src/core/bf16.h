// bfloat16 in memory and its conversions from and to float: the operand type of the mixed-precision
// matrix products (ops/gemm.h). A bf16 keeps float's 8 exponent bits and the top 7 of its 23
// fraction bits, so float → bf16 is float's bit pattern rounded to its upper half, and bf16 → float
// is exact.
//
// Rounding is to nearest, ties to even, on the bits (subnormals included, as float and bf16 share
// their exponent range); a value beyond the largest bf16 by half a step or more becomes ±infinity;
// NaN stays NaN, quiet, its sign kept. The result equals io/half_float.h's bf16_from_double of the
// same value (tests/core/bf16_test.cpp checks every class of input).
#pragma once

#include <bit>
#include <cstdint>

namespace trillion {

struct bf16 {
  uint16_t bits;
};

inline bf16 to_bf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // NaN: quiet
  // Adding 0x7fff, plus the kept part's lowest bit, carries into the kept half exactly when the
  // dropped half is above one half, or equal to it with the kept part odd.
  return bf16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline float to_float(bf16 value) { return std::bit_cast<float>(uint32_t(value.bits) << 16); }

// The float nearest `value` that a bf16 holds: to_float(to_bf16(value)).
inline float round_to_bf16(float value) { return to_float(to_bf16(value)); }

// dst[i] = to_bf16(src[i]) / to_float(src[i]) for i < n.
void to_bf16(const float* src, bf16* dst, int64_t n);
void to_float(const bf16* src, float* dst, int64_t n);
// The same over the threads, in blocks of 64 Ki elements (whole buffers: weights, saved activations;
// called outside parallel regions).
void to_bf16_threaded(const float* src, bf16* dst, int64_t n);
void to_float_threaded(const bf16* src, float* dst, int64_t n);

}  // namespace trillion
