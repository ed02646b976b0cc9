// Matrix products through OpenBLAS (cblas_sgemm / cblas_dgemm), row-major, and the linear layer in
// Hugging Face layout (weight [out, in]).
//
// linear_forward saves nothing: the backward reads the caller's x and w.
// Gradient rule: linear_backward writes (=) or accumulates (+=) dx as the caller says, and always
// accumulates (+=) dw. A null dx or dw skips that gradient (frozen weight, input that needs none).
#pragma once

#include <cstdint>

namespace trillion {

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
