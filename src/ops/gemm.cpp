// Matrix products through oneDNN (dnnl_sgemm, row-major) or OpenBLAS (row-major cblas), and the
// Hugging Face linear layer built on them. Called inside an OpenMP region, both run single-threaded
// (oneDNN's OpenMP runtime runs nested work on the calling thread, OpenBLAS's OpenMP build too), so
// kernels that tile their work over the team may call gemm() from their items.
#include "ops/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <type_traits>

#include "core/error.h"
#include "core/phase_clock.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

std::atomic<GemmBackend> g_backend{GemmBackend::onednn};

// TRILLION_ISA=avx2 limits oneDNN's kernels to AVX2 as it does the engine's vector kernels
// (ops/vector_exp.h), so the AVX2 path runs on AVX-512 machines too; set once, before oneDNN's
// first product.
void limit_onednn_isa_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* forced = std::getenv("TRILLION_ISA");
    if (forced == nullptr || *forced == '\0' || vector_isa() != VectorIsa::avx2) return;
    const dnnl_status_t status = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    TRILLION_CHECK(status == dnnl_success, "oneDNN refused to limit its kernels to AVX2: status ", int(status));
  });
}

void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  limit_onednn_isa_once();
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TRILLION_CHECK(status == dnnl_success, "dnnl_sgemm m=", m, " n=", n, " k=", k, " failed: status ", int(status));
}

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

// ThreadSanitizer builds run the libraries on the calling thread: the threads of their own OpenMP
// regions synchronize in libgomp, which TSan cannot see (core/parallel.h announces only the engine's
// regions), so their writes to C would read as races. Both take their thread count from
// omp_get_max_threads() at each call. Other builds leave them their threads.
struct LibraryOnCallingThread {
#if defined(__SANITIZE_THREAD__)
  const int saved = omp_get_max_threads();
  LibraryOnCallingThread() { omp_set_num_threads(1); }
  ~LibraryOnCallingThread() { omp_set_num_threads(saved); }
#endif
};

}  // namespace

void set_gemm_backend(GemmBackend backend) { g_backend = backend; }
GemmBackend gemm_backend() { return g_backend; }

const char* gemm_backend_name(GemmBackend backend) {
  return backend == GemmBackend::onednn ? "onednn" : "openblas";
}

GemmBackend gemm_backend_from_name(const std::string& name, const char* option) {
  for (const GemmBackend backend : {GemmBackend::onednn, GemmBackend::openblas})
    if (name == gemm_backend_name(backend)) return backend;
  fail(option, " ", name, ": expected onednn or openblas");
}

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
  [[maybe_unused]] const LibraryOnCallingThread one_thread_under_tsan;
  if constexpr (std::is_same_v<T, float>) {
    if (g_backend == GemmBackend::onednn)
      return onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
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
