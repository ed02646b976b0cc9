// Matrix products through OpenBLAS (row-major cblas) and the Hugging Face linear layer built on them.
// Called inside an OpenMP region, OpenBLAS runs single-threaded, so kernels that tile their work over
// the team may call gemm() from their items.
#include "ops/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <limits>

#include "core/error.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

CBLAS_TRANSPOSE cblas_trans(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(trans_a), cblas_trans(trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, cblas_trans(trans_a), cblas_trans(trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// ThreadSanitizer builds run OpenBLAS on the calling thread: the threads of its own OpenMP regions
// synchronize in libgomp, which TSan cannot see (core/parallel.h announces only the engine's
// regions), so their writes to C would read as races. OpenBLAS takes its thread count from
// omp_get_max_threads() at each call. Other builds leave OpenBLAS its threads.
struct BlasOnCallingThread {
#if defined(__SANITIZE_THREAD__)
  const int saved = omp_get_max_threads();
  BlasOnCallingThread() { omp_set_num_threads(1); }
  ~BlasOnCallingThread() { omp_set_num_threads(saved); }
#endif
};

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  PhaseScope scope(Phase::gemm, /*team_scope=*/!omp_in_parallel());  // OpenBLAS runs on the team
  TRILLION_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm sizes m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  // Stored shapes: a is [m, k] (or [k, m] transposed), b is [k, n] (or [n, k]), c is [m, n].
  TRILLION_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, "gemm strides lda=", lda,
                 " ldb=", ldb, " ldc=", ldc, " for m=", m, " n=", n, " k=", k);
  // cblas takes blasint (32-bit in Debian's OpenBLAS): every size and stride must fit before the casts.
  constexpr int64_t blas_max = std::numeric_limits<blasint>::max();
  TRILLION_CHECK(m <= blas_max && n <= blas_max && k <= blas_max && lda <= blas_max && ldb <= blas_max &&
                     ldc <= blas_max,
                 "gemm m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc,
                 " exceed the BLAS integer limit ", blas_max);
  [[maybe_unused]] const BlasOnCallingThread one_thread_under_tsan;
  blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t rows, int64_t in, int64_t out) {
  // y[rows, out] = x[rows, in] · w[out, in]ᵀ
  gemm<T>(false, true, rows, out, in, T(1), x, in, w, in, T(0), y, out);
}

template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx) {
  // dx[rows, in] = dy[rows, out] · w[out, in]  (beta 1 accumulates)
  if (dx != nullptr) gemm<T>(false, false, rows, in, out, T(1), dy, out, w, in, accumulate_dx ? T(1) : T(0), dx, in);
  // dw[out, in] += dy[rows, out]ᵀ · x[rows, in]
  if (dw != nullptr) gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dw, in);
}

#define TRILLION_INSTANTIATE_GEMM(T)                                                                          \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
                        int64_t);                                                                              \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);                          \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool);
TRILLION_INSTANTIATE_GEMM(float)
TRILLION_INSTANTIATE_GEMM(double)
#undef TRILLION_INSTANTIATE_GEMM

}  // namespace trillion
