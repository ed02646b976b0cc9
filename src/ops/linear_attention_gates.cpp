// L2 norm, decay gate and gated RMSNorm of the linear-attention layers. See linear_attention_gates.h.
#include "ops/linear_attention_gates.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/activation.h"

namespace trillion {
namespace {

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

constexpr int64_t kColumnBlock = 16;  // columns per thread task of the gated norm's dw sum

// act(z) and d act / dz, from z and s = σ(z).
template <class T>
void activation(T z, T s, GateActivation act, T& value, T& slope) {
  if (act == GateActivation::sigmoid) {
    value = s;
    slope = s * (T(1) - s);
  } else {
    value = z * s;
    slope = s * (T(1) + z * (T(1) - s));
  }
}

}  // namespace

template <class T>
void l2norm_forward(T* y, T* inv_norm, const T* x, int64_t rows, int64_t d, double eps) {
  parallel_for(rows, d, [&](int64_t r) {
    const T* in = x + r * d;  // [d]
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += double(in[i]) * double(in[i]);
    const T inv = static_cast<T>(1.0 / std::sqrt(sum + eps));
    inv_norm[r] = inv;
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = in[i] * inv;
  });
}

template <class T>
void l2norm_backward(T* dx, const T* dy, const T* y, const T* inv_norm, int64_t rows, int64_t d) {
  // dx = inv · (dy − y (y · dy))
  parallel_for(rows, d, [&](int64_t r) {
    const T* out = y + r * d;    // [d]
    const T* grad = dy + r * d;  // [d]
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) dot += double(out[i]) * double(grad[i]);
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = inv_norm[r] * (grad[i] - out[i] * static_cast<T>(dot));
  });
}

template <class T>
void decay_gate_forward(T* g, const T* a, const T* A_log, const T* dt_bias, int64_t rows, int64_t cols, int64_t group) {
  TRILLION_CHECK(group >= 1 && cols % group == 0, "decay gate: ", cols, " columns in groups of ", group);
  parallel_for(rows, cols, [&](int64_t r) {
    for (int64_t c = 0; c < cols; ++c)
      g[r * cols + c] = -std::exp(A_log[c / group]) * softplus(a[r * cols + c] + dt_bias[c]);
  });
}

template <class T>
void decay_gate_backward(T* da, T* dA_log, T* ddt_bias, const T* dg, const T* a, const T* A_log, const T* dt_bias,
                         int64_t rows, int64_t cols, int64_t group) {
  // dg/da = dg/d dt_bias = −exp(A_log) · σ(a + dt_bias) (softplus' = σ; 1 above the threshold);
  // dg/dA_log = g.
  parallel_for(rows, cols, [&](int64_t r) {
    for (int64_t c = 0; c < cols; ++c) {
      const T u = a[r * cols + c] + dt_bias[c];
      da[r * cols + c] = dg[r * cols + c] * -std::exp(A_log[c / group]) * (u > T(20) ? T(1) : sigmoid(u));
    }
  });
  if (ddt_bias != nullptr)
    parallel_for(cols, rows, [&](int64_t c) {
      T bias_sum = T(0);
      for (int64_t r = 0; r < rows; ++r) bias_sum += da[r * cols + c];
      ddt_bias[c] += bias_sum;
    });
  if (dA_log == nullptr) return;
  parallel_for(cols / group, rows * group, [&](int64_t h) {
    const T scale = -std::exp(A_log[h]);
    T sum = T(0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = h * group; c < (h + 1) * group; ++c)
        sum += dg[r * cols + c] * scale * softplus(a[r * cols + c] + dt_bias[c]);
    dA_log[h] += sum;
  });
}

template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* z, const T* w, int64_t rows, int64_t d, double eps,
                           GateActivation act) {
  parallel_for(rows, d, [&](int64_t r) {
    const T* in = x + r * d;    // [d]
    const T* gate = z + r * d;  // [d]
    T* out = y + r * d;         // [d] σ(z), then the output
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += double(in[i]) * double(in[i]);
    const T inv = static_cast<T>(1.0 / std::sqrt(sum / double(d) + eps));
    rstd[r] = inv;
    sigmoid_span(out, gate, d);
    for (int64_t i = 0; i < d; ++i) {
      T value, slope;
      activation(gate[i], out[i], act, value, slope);
      out[i] = w[i] * in[i] * inv * value;
    }
  });
}

template <class T>
void gated_rmsnorm_backward(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w, const T* rstd,
                            int64_t rows, int64_t d, GateActivation act) {
  // With n = x · rstd and h = w · n: y = h · act(z); dh = dy · act(z); dz = dy · h · act'(z);
  // dx = rstd · (w dh − n · mean(n · w dh)); dw += Σ_rows dh · n.
  parallel_for(rows, d, [&](int64_t r) {
    const T inv = rstd[r];
    const T* gate = z + r * d;  // [d]
    T* value_of = dx + r * d;   // [d] σ(z), then act(z), then dx
    sigmoid_span(value_of, gate, d);
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      T value, slope;
      activation(gate[i], value_of[i], act, value, slope);
      const T n = x[r * d + i] * inv;
      const T dh = dy[r * d + i] * value;
      dz[r * d + i] = dy[r * d + i] * w[i] * n * slope;
      dot += double(n) * double(w[i] * dh);
      value_of[i] = value;
    }
    const T mean = static_cast<T>(dot / double(d));
    for (int64_t i = 0; i < d; ++i) {
      const T n = x[r * d + i] * inv;
      dx[r * d + i] = inv * (w[i] * dy[r * d + i] * value_of[i] - n * mean);
    }
  });
  if (dw == nullptr) return;
  // Each column summed by one thread in row order; threads take blocks of columns and walk the rows
  // (contiguous in the column), recomputing act(z) on the block.
  parallel_for((d + kColumnBlock - 1) / kColumnBlock, rows * kColumnBlock, [&](int64_t block) {
    const int64_t i0 = block * kColumnBlock, width = std::min(kColumnBlock, d - i0);
    T sum[kColumnBlock] = {};  // [width]
    T sig[kColumnBlock];       // [width] σ(z) of the row's block
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * d + i0;
      sigmoid_span(sig, z + o, width);
      for (int64_t i = 0; i < width; ++i) {
        T value, slope;
        activation(z[o + i], sig[i], act, value, slope);
        sum[i] += dy[o + i] * value * x[o + i] * rstd[r];
      }
    }
    for (int64_t i = 0; i < width; ++i) dw[i0 + i] += sum[i];
  });
}

#define TRILLION_INSTANTIATE(T)                                                                                  \
  template void l2norm_forward<T>(T*, T*, const T*, int64_t, int64_t, double);                                   \
  template void l2norm_backward<T>(T*, const T*, const T*, const T*, int64_t, int64_t);                          \
  template void decay_gate_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);              \
  template void decay_gate_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t,    \
                                       int64_t);                                                                 \
  template void gated_rmsnorm_forward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, double,        \
                                         GateActivation);                                                        \
  template void gated_rmsnorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, \
                                          int64_t, GateActivation);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
