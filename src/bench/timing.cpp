// The sgemm ceiling problem of `trillion bench` (see timing.h).
#include "bench/timing.h"

#include <cblas.h>

#include "core/rng.h"

namespace trillion {

SgemmProblem::SgemmProblem(int64_t size) : size_(size), a_(size * size), b_(size * size), c_(size * size) {
  const CounterRng rng(1, "bench_gemm");
  for (int64_t i = 0; i < size * size; ++i) {
    a_[i] = float(rng.uniform(i) - 0.5);
    b_[i] = float(rng.uniform(size * size + i) - 0.5);
  }
}

void SgemmProblem::run() {
  const int n = static_cast<int>(size_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a_.data(), n, b_.data(), n, 0.0f, c_.data(),
              n);
}

}  // namespace trillion
