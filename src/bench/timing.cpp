// sgemm ceiling measurement for `trillion bench` (see timing.h).
#include "bench/timing.h"

#include <cblas.h>

#include "core/memory.h"
#include "core/rng.h"

namespace trillion {

GemmRate measure_sgemm_rate(int64_t size, int runs) {
  const int64_t n = size * size;
  Buffer<float> a(n), b(n), c(n);  // [size, size] each
  const CounterRng rng(1, "bench_gemm");
  for (int64_t i = 0; i < n; ++i) {
    a[i] = float(rng.uniform(i) - 0.5);
    b[i] = float(rng.uniform(n + i) - 0.5);
  }
  const int sz = static_cast<int>(size);
  const TimingResult timing = time_median(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sz, sz, sz, 1.0f, a.data(), sz, b.data(), sz, 0.0f,
                    c.data(), sz);
      },
      2, runs);
  const double flops = 2.0 * double(size) * double(size) * double(size);
  return {size, flops / timing.median_s * 1e-9, timing};
}

}  // namespace trillion
