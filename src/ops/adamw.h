// AdamW with decoupled weight decay and bias correction (Loshchilov & Hutter; torch.optim.AdamW):
//   m = β1 m + (1−β1) g;  v = β2 v + (1−β2) g²;  p ← p − lr·wd·p  (only where decay is on);
//   p ← p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
// and global gradient-norm clipping over many tensors. Moments are kept in the parameter type.
#pragma once

#include <cstdint>

namespace trillion {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// One step over n elements; step is 1-based (for bias correction); decay turns weight decay on.
template <class T>
void adamw_step(T* p, T* m, T* v, const T* g, int64_t n, int64_t step, const AdamWHyper& hyper, bool decay);

// Σ g² in double with a thread-count-independent order.
template <class T>
double sum_of_squares(const T* g, int64_t n);

// g *= factor.
template <class T>
void scale_in_place(T* g, int64_t n, double factor);

// Clip factor for global-norm clipping: min(1, max_norm / (norm + 1e-6)); max_norm ≤ 0 disables.
double clip_factor(double global_norm, double max_norm);

}  // namespace trillion
