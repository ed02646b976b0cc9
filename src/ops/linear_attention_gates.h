// The element-wise pieces around the delta rule in linear-attention layers (Gated DeltaNet,
// Kimi Delta Attention), forward and backward side by side:
//
//   l2norm:        y = x · (Σ x² + eps)^−½ per row (q and k per head; transformers: eps 1e-6)
//   decay gate:    g = −exp(A_log[col / group]) · softplus(a + dt_bias[col])
//                  GDN: a [N, H] (one column per value head, group 1); KDA: a [N, H·K], group K
//                  (A_log per head, dt_bias per key channel). softplus(x) = x above 20, as
//                  torch's F.softplus (threshold 20) and Kimi's where(x > 20, x, log(1 + exp x)).
//   gated rmsnorm: y = w · x · rstd · act(z),  rstd = (mean x² + eps)^−½ per row of d (per head),
//                  act = silu (GDN's norm(core, z)) or sigmoid (KDA's output gate); w initialized to
//                  1, not zero-centred.
//
// Saves: l2norm its inverse norms [rows]; gated rmsnorm its rstd [rows]; the decay gate nothing.
// Gradient rule: input gradients are written (=); parameter gradients (w, A_log, dt_bias)
// accumulate (+=), each summed over rows by one thread in row order (thread-count independent).
#pragma once

#include <cstdint>

namespace trillion {

// transformers' eps of the q / k L2 norm in both families' linear attention.
inline constexpr double kLinearAttentionL2Eps = 1e-6;

// out[n, out_stride] ← columns [0, width) of in[n, in_stride] (splitting [q | k | v] rows and
// assembling their gradients).
template <class T>
void copy_column_block(T* out, const T* in, int64_t n, int64_t in_stride, int64_t out_stride, int64_t width) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < width; ++c) out[t * out_stride + c] = in[t * in_stride + c];
}

// y[rows, d], inv_norm[rows] (saved) from x[rows, d].
template <class T>
void l2norm_forward(T* y, T* inv_norm, const T* x, int64_t rows, int64_t d, double eps);
// dx[rows, d] (=) from dy, y and inv_norm.
template <class T>
void l2norm_backward(T* dx, const T* dy, const T* y, const T* inv_norm, int64_t rows, int64_t d);

// g[rows, cols] from a[rows, cols], A_log[cols / group], dt_bias[cols].
template <class T>
void decay_gate_forward(T* g, const T* a, const T* A_log, const T* dt_bias, int64_t rows, int64_t cols, int64_t group);
// da[rows, cols] (=), dA_log[cols / group] (+=), ddt_bias[cols] (+=) from dg and the forward's inputs;
// a null dA_log or ddt_bias (frozen) is skipped.
template <class T>
void decay_gate_backward(T* da, T* dA_log, T* ddt_bias, const T* dg, const T* a, const T* A_log, const T* dt_bias,
                         int64_t rows, int64_t cols, int64_t group);

enum class GateActivation { silu, sigmoid };

// y[rows, d], rstd[rows] (saved) from x[rows, d], z[rows, d], w[d].
template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* z, const T* w, int64_t rows, int64_t d, double eps,
                           GateActivation act);
// dx, dz [rows, d] (=), dw[d] (+=; null: frozen) from dy and the forward's inputs and rstd.
template <class T>
void gated_rmsnorm_backward(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w, const T* rstd,
                            int64_t rows, int64_t d, GateActivation act);

}  // namespace trillion
