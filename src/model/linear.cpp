// The model's linear helper (see linear.h): the GEMMs through ops/gemm.h, the bias as a row add
// (forward) and a fixed-order column sum (backward).
#include "model/linear.h"

#include "core/parallel.h"
#include "ops/gemm.h"

namespace trillion {

template <class T>
void linear(T* y, const T* x, const LinearWeights<T>& w, int64_t rows, int64_t in, int64_t out, bool accumulate,
            Operands operands) {
  // y[rows, out] (beta 1 accumulates) x[rows, in] · weight[out, in]ᵀ
  gemm<T>(false, true, rows, out, in, T(1), x, in, w.weight, in, accumulate ? T(1) : T(0), y, out, operands);
  if (w.bias == nullptr) return;
  parallel_for(rows, out, [&](int64_t r) {
    T* row = y + r * out;  // [out]
    for (int64_t o = 0; o < out; ++o) row[o] += w.bias[o];
  });
}

template <class T>
void linear_grad(T* dx, const LinearWeights<T>& grads, const T* dy, const T* x, const LinearWeights<T>& w,
                 int64_t rows, int64_t in, int64_t out, bool accumulate_dx, Operands operands) {
  linear_backward(dx, grads.weight, dy, x, w.weight, rows, in, out, accumulate_dx, operands);
  if (grads.bias == nullptr || w.bias == nullptr) return;
  // db[out] += Σ_rows dy[rows, out], each column summed by one thread in row order.
  parallel_for(out, rows, [&](int64_t o) {
    T sum = T(0);
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * out + o];
    grads.bias[o] += sum;
  });
}

#define TRILLION_INSTANTIATE(T)                                                                              \
  template void linear<T>(T*, const T*, const LinearWeights<T>&, int64_t, int64_t, int64_t, bool, Operands); \
  template void linear_grad<T>(T*, const LinearWeights<T>&, const T*, const T*, const LinearWeights<T>&,    \
                               int64_t, int64_t, int64_t, bool, Operands);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
