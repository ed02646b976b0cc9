// The model's linear helper (see linear.h): the GEMMs through ops/gemm.h, the bias as a row add
// (forward) and a fixed-order column sum (backward), a LoRA pair as two thin GEMMs through its
// rank (never the [out, in] update itself).
#include "model/linear.h"

#include <cstring>

#include "core/memory.h"
#include "core/parallel.h"
#include "ops/gemm.h"

namespace trillion {

template <class T>
void linear(T* y, const T* x, const LinearWeights<T>& w, int64_t rows, int64_t in, int64_t out, bool accumulate,
            Operands operands) {
  // y[rows, out] (beta 1 accumulates) x[rows, in] · weight[out, in]ᵀ
  gemm<T>(false, true, rows, out, in, T(1), x, in, w.weight, in, accumulate ? T(1) : T(0), y, out, operands);
  if (w.bias != nullptr)
    parallel_for(rows, out, [&](int64_t r) {
      T* row = y + r * out;  // [out]
      for (int64_t o = 0; o < out; ++o) row[o] += w.bias[o];
    });
  if (w.lora.a == nullptr) return;
  const int64_t rank = w.lora.rank;
  Buffer<T> u(rows * rank);  // [rows, rank] x · Aᵀ
  gemm<T>(false, true, rows, rank, in, T(1), x, in, w.lora.a, in, T(0), u.data(), rank, operands);
  // y[rows, out] += scaling · u · Bᵀ
  gemm<T>(false, true, rows, out, rank, T(w.lora.scaling), u.data(), rank, w.lora.b, rank, T(1), y, out, operands);
}

template <class T>
void linear_grad(T* dx, const LinearWeights<T>& grads, const T* dy, const T* x, const LinearWeights<T>& w,
                 int64_t rows, int64_t in, int64_t out, bool accumulate_dx, Operands operands) {
  linear_backward(dx, grads.weight, dy, x, w.weight, rows, in, out, accumulate_dx, operands);
  if (grads.bias != nullptr && w.bias != nullptr)
    // db[out] += Σ_rows dy[rows, out], each column summed by one thread in row order.
    parallel_for(out, rows, [&](int64_t o) {
      T sum = T(0);
      for (int64_t r = 0; r < rows; ++r) sum += dy[r * out + o];
      grads.bias[o] += sum;
    });
  if (w.lora.a == nullptr) return;
  const bool adapter_trains = grads.lora.a != nullptr;  // both or neither: a pair is frozen whole
  if (!adapter_trains && dx == nullptr) return;
  const int64_t rank = w.lora.rank;
  const T scaling = T(w.lora.scaling);
  Buffer<T> g(rows * rank);  // [rows, rank] scaling · dy · B
  gemm<T>(false, false, rows, rank, out, scaling, dy, out, w.lora.b, rank, T(0), g.data(), rank, operands);
  if (adapter_trains) {
    Buffer<T> u(rows * rank);  // [rows, rank] x · Aᵀ, recomputed
    gemm<T>(false, true, rows, rank, in, T(1), x, in, w.lora.a, in, T(0), u.data(), rank, operands);
    // dB[out, rank] += scaling · dyᵀ · u;  dA[rank, in] += gᵀ · x
    gemm<T>(true, false, out, rank, rows, scaling, dy, out, u.data(), rank, T(1), grads.lora.b, rank, operands);
    gemm<T>(true, false, rank, in, rows, T(1), g.data(), rank, x, in, T(1), grads.lora.a, in, operands);
  }
  // dx[rows, in] += g · A
  if (dx != nullptr) gemm<T>(false, false, rows, in, rank, T(1), g.data(), rank, w.lora.a, in, T(1), dx, in, operands);
}

template <class T>
const T* merged_weight(const LinearWeights<T>& w, int64_t in, int64_t out, Arena& scratch) {
  if (w.lora.a == nullptr) return w.weight;
  T* merged = scratch.alloc<T>(out * in);  // [out, in]
  std::memcpy(merged, w.weight, out * in * sizeof(T));
  gemm<T>(false, false, out, in, w.lora.rank, T(w.lora.scaling), w.lora.b, w.lora.rank, w.lora.a, in, T(1), merged, in,
          Operands::fp32);
  return merged;
}

#define TRILLION_INSTANTIATE(T)                                                                              \
  template void linear<T>(T*, const T*, const LinearWeights<T>&, int64_t, int64_t, int64_t, bool, Operands); \
  template void linear_grad<T>(T*, const LinearWeights<T>&, const T*, const T*, const LinearWeights<T>&,    \
                               int64_t, int64_t, int64_t, bool, Operands);                                  \
  template const T* merged_weight<T>(const LinearWeights<T>&, int64_t, int64_t, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
