// Matrix products, row-major, and the linear layer in Hugging Face layout (weight [out, in]).
// float products run on oneDNN's dnnl_sgemm (its AVX2 and AVX-512 kernels; the default) or on
// OpenBLAS's cblas_sgemm; double products always run on OpenBLAS's cblas_dgemm. Both libraries are
// callable from inside the kernels' OpenMP regions, where they run on the calling thread.
//
// linear_forward saves nothing: the backward reads the caller's x and w.
// Gradient rule: linear_backward writes (=) or accumulates (+=) dx as the caller says, and always
// accumulates (+=) dw. A null dx or dw skips that gradient (frozen weight, input that needs none).
#pragma once

#include <cstdint>
#include <string>

namespace trillion {

// The library float products run on: one setting for the process (`--gemm`, or TRILLION_GEMM),
// made before the first product. Results are bitwise reproducible per backend, machine and thread
// count; the two backends round differently.
enum class GemmBackend { onednn, openblas };
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_backend();
const char* gemm_backend_name(GemmBackend backend);
// The backend a name gemm_backend_name gives; fails naming `option` and the names otherwise.
GemmBackend gemm_backend_from_name(const std::string& name, const char* option);

// c[m, n] = alpha · op(a) · op(b) + beta · c; op(a) is [m, k], op(b) is [k, n]; lda/ldb/ldc are the
// row strides of a, b, c as stored.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// y[rows, out] = x[rows, in] · w[out, in]ᵀ
template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t rows, int64_t in, int64_t out);

// dx[rows, in] (= or +=) dy[rows, out] · w[out, in];  dw[out, in] += dyᵀ · x.
template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx);

}  // namespace trillion
