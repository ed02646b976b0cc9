// Array conversions between float and bfloat16 (see bf16.h): plain loops over the inline scalar
// conversions, which the compiler vectorizes (integer adds, shifts and a NaN select at AVX2's width).
#include "core/bf16.h"

namespace trillion {

void to_bf16(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

void to_float(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace trillion
