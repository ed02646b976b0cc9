// AdamW with decoupled weight decay and bias correction (Loshchilov & Hutter; torch.optim.AdamW):
//   m = β1 m + (1−β1) g;  v = β2 v + (1−β2) g²;  p ← p − lr·wd·p  (only where decay is on);
//   p ← p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
// and global gradient-norm clipping over many tensors. Moments are kept in the parameter type.
#pragma once

#include <cstdint>
#include <vector>

namespace trillion {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// A run of elements of flat parameter, moment and gradient buffers sharing a weight-decay flag (one
// tensor, or neighbouring tensors merged).
struct AdamWSpan {
  int64_t offset = 0;
  int64_t count = 0;
  bool decay = false;
};

// One step over every span at once (one parallel pass over fixed blocks of the spans); each
// gradient is multiplied by grad_scale first (global-norm clipping fused into the update); step is
// 1-based (for bias correction).
template <class T>
void adamw_step(T* p, T* m, T* v, const T* g, const std::vector<AdamWSpan>& spans, int64_t step,
                const AdamWHyper& hyper, double grad_scale = 1.0);

// Σ g² over the spans in double, in an order fixed by the spans alone (not the thread count).
template <class T>
double sum_of_squares(const T* g, const std::vector<AdamWSpan>& spans);

// Clip factor for global-norm clipping: min(1, max_norm / (norm + 1e-6)); max_norm ≤ 0 disables.
double clip_factor(double global_norm, double max_norm);

}  // namespace trillion
