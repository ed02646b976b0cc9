// The model's linear helper (see linear.h): the GEMMs through ops/gemm.h, the bias as a row add
// (forward) and a fixed-order column sum (backward), a LoRA pair as two thin GEMMs through its
// rank (never the [out, in] update itself).
#include "model/linear.h"

#include <cstring>

#include "core/memory.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

const LoraDropoutPass* g_dropout_pass = nullptr;  // set by LoraDropoutScope

bool dropping(double dropout) { return dropout > 0.0 && g_dropout_pass != nullptr; }

// out[rows, in] = values ⊙ m / (1 − p), m the pass's mask of the pair's input (see linear.h).
template <class T>
void apply_dropout(T* out, const T* values, const LoraPair<T>& pair, int64_t rows, int64_t in) {
  const LoraDropoutPass& pass = *g_dropout_pass;
  const CounterRng rng(pass.seed + 0x632be59bd9b4e019ull * static_cast<uint64_t>(pass.step + 1), pair.stream);
  const T keep_scale = T(1.0 / (1.0 - pair.dropout));
  parallel_for(rows, in, [&](int64_t r) {
    const uint64_t first = static_cast<uint64_t>(pass.token(r)) * static_cast<uint64_t>(in);
    for (int64_t c = 0; c < in; ++c)
      out[r * in + c] = rng.uniform(first + c) >= pair.dropout ? values[r * in + c] * keep_scale : T(0);
  });
}

// The pair's input as its products read it: x itself, or under dropout x ⊙ m / (1 − p) in `masked`.
template <class T>
const T* adapter_input(const T* x, const LoraPair<T>& pair, int64_t rows, int64_t in, Buffer<T>& masked) {
  if (!dropping(pair.dropout)) return x;
  masked = Buffer<T>(rows * in);  // [rows, in]
  apply_dropout(masked.data(), x, pair, rows, in);
  return masked.data();
}

}  // namespace

LoraDropoutScope::LoraDropoutScope(const LoraDropoutPass* pass) : previous_(g_dropout_pass) { g_dropout_pass = pass; }
LoraDropoutScope::~LoraDropoutScope() { g_dropout_pass = previous_; }

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
  Buffer<T> masked;  // [rows, in] under dropout
  const T* input = adapter_input(x, w.lora, rows, in, masked);
  Buffer<T> u(rows * rank);  // [rows, rank] input · Aᵀ
  gemm<T>(false, true, rows, rank, in, T(1), input, in, w.lora.a, in, T(0), u.data(), rank, operands);
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
    Buffer<T> masked;  // [rows, in] under dropout
    const T* input = adapter_input(x, w.lora, rows, in, masked);
    Buffer<T> u(rows * rank);  // [rows, rank] input · Aᵀ, recomputed
    gemm<T>(false, true, rows, rank, in, T(1), input, in, w.lora.a, in, T(0), u.data(), rank, operands);
    // dB[out, rank] += scaling · dyᵀ · u;  dA[rank, in] += gᵀ · input
    gemm<T>(true, false, out, rank, rows, scaling, dy, out, u.data(), rank, T(1), grads.lora.b, rank, operands);
    gemm<T>(true, false, rank, in, rows, T(1), g.data(), rank, input, in, T(1), grads.lora.a, in, operands);
  }
  if (dx == nullptr) return;
  if (!dropping(w.lora.dropout)) {
    // dx[rows, in] += g · A
    gemm<T>(false, false, rows, in, rank, T(1), g.data(), rank, w.lora.a, in, T(1), dx, in, operands);
    return;
  }
  // dx[rows, in] += (g · A) ⊙ m / (1 − p)
  Buffer<T> through(rows * in);  // [rows, in]
  gemm<T>(false, false, rows, in, rank, T(1), g.data(), rank, w.lora.a, in, T(0), through.data(), in, operands);
  apply_dropout(through.data(), through.data(), w.lora, rows, in);
  parallel_for(rows, in, [&](int64_t r) {
    for (int64_t c = 0; c < in; ++c) dx[r * in + c] += through[r * in + c];
  });
}

template <class T>
void lora_down(T* u, const T* x, const LoraPair<T>& pair, int64_t rows, int64_t in) {
  Buffer<T> masked;  // [rows, in] under dropout
  const T* input = adapter_input(x, pair, rows, in, masked);
  gemm<T>(false, true, rows, pair.rank, in, T(1), input, in, pair.a, in, T(0), u, pair.rank);
}

template <class T>
void lora_down_grad(T* dx, T* grad_a, const T* du, const T* x, const LoraPair<T>& pair, int64_t rows, int64_t in) {
  const int64_t rank = pair.rank;
  if (grad_a != nullptr) {
    Buffer<T> masked;  // [rows, in] under dropout
    const T* input = adapter_input(x, pair, rows, in, masked);
    gemm<T>(true, false, rank, in, rows, T(1), du, rank, input, in, T(1), grad_a, in);  // dA[rank, in] += duᵀ · x'
  }
  Buffer<T> through(rows * in);  // [rows, in] du · A
  gemm<T>(false, false, rows, in, rank, T(1), du, rank, pair.a, in, T(0), through.data(), in);
  if (dropping(pair.dropout)) apply_dropout(through.data(), through.data(), pair, rows, in);
  parallel_for(rows, in, [&](int64_t r) {
    for (int64_t c = 0; c < in; ++c) dx[r * in + c] += through[r * in + c];
  });
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

#define TRILLION_INSTANTIATE(T)                                                                                   \
  template void linear<T>(T*, const T*, const LinearWeights<T>&, int64_t, int64_t, int64_t, bool, Operands);      \
  template void linear_grad<T>(T*, const LinearWeights<T>&, const T*, const T*, const LinearWeights<T>&, int64_t, \
                               int64_t, int64_t, bool, Operands);                                                 \
  template void lora_down<T>(T*, const T*, const LoraPair<T>&, int64_t, int64_t);                                 \
  template void lora_down_grad<T>(T*, T*, const T*, const T*, const LoraPair<T>&, int64_t, int64_t);              \
  template const T* merged_weight<T>(const LinearWeights<T>&, int64_t, int64_t, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
