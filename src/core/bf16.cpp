// Array conversions between float and bfloat16 (see bf16.h): plain loops over the inline scalar
// conversions, which the compiler vectorizes (integer adds, shifts and a NaN select at AVX2's width).
#include "core/bf16.h"

#include <algorithm>

#include "core/parallel.h"

namespace trillion {

void to_bf16(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

void to_float(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

namespace {

// f(start, count) over [0, n) in blocks, one block per item.
template <class F>
void in_blocks(int64_t n, F&& f) {
  constexpr int64_t kBlock = int64_t(1) << 16;  // elements per item
  parallel_for((n + kBlock - 1) / kBlock, kBlock, [&](int64_t block) {
    const int64_t start = block * kBlock;
    f(start, std::min(kBlock, n - start));
  });
}

}  // namespace

void to_bf16_threaded(const float* src, bf16* dst, int64_t n) {
  in_blocks(n, [&](int64_t start, int64_t count) { to_bf16(src + start, dst + start, count); });
}

void to_float_threaded(const bf16* src, float* dst, int64_t n) {
  in_blocks(n, [&](int64_t start, int64_t count) { to_float(src + start, dst + start, count); });
}

}  // namespace trillion
