// Norms over the last dimension.
// RMSNorm, plain (y = x̂ · w, w initialized to 1) and zero-centred as Qwen3-Next does it
// (y = x̂ · (1 + w), w initialized to 0); x̂ = x · rstd, rstd = 1/sqrt(mean(x²)+eps). Used per token
// (hidden norms) and per head (q_norm / k_norm: rows = tokens · heads, d = head_dim). Saves rstd[rows].
// LayerNorm with bias (torch.nn.LayerNorm; the sparse-attention indexer's k_norm, eps 1e-6):
// y = x̂ · w + b, x̂ = (x − mean) · rstd, rstd = 1/sqrt(var + eps) with the biased variance.
// Saves mean[rows] and rstd[rows].
// Gradient rule: dx written (=) or accumulated (+=) as the caller says; dw (and db) accumulate (+=).
#pragma once

#include <cstdint>

namespace trillion {

// y[rows, d], rstd[rows] (saved) from x[rows, d], w[d].
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t d, double eps, bool zero_centred);

// dx[rows, d] (= or +=), dw[d] (+=; may be null) from dy[rows, d], x, w, rstd.
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                      bool zero_centred, bool accumulate_dx);

// The bytes of rmsnorm_backward's and layer_norm_backward's temporaries (per-block partials of the
// weight and bias gradients in double), for the memory plan; forwards have none.
int64_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t d, bool has_dw);
int64_t layer_norm_backward_workspace_bytes(int64_t rows, int64_t d, bool has_dw, bool has_db);

// y[rows, d], mean[rows], rstd[rows] (saved) from x[rows, d], w[d], b[d].
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows, int64_t d,
                        double eps);

// dx[rows, d] (= or +=), dw[d] and db[d] (+=; either may be null) from dy[rows, d], x, w, mean, rstd.
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         int64_t rows, int64_t d, bool accumulate_dx);

}  // namespace trillion
