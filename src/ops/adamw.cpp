// AdamW step (torch.optim.AdamW semantics: decoupled decay, bias correction) and the pieces of
// global gradient-norm clipping. Element updates are independent; the sum of squares goes through
// deterministic_sum, whose order is fixed by the element count alone.
#include "ops/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace trillion {

template <class T>
void adamw_step(T* p, T* m, T* v, const T* g, int64_t n, int64_t step, const AdamWHyper& hyper, bool decay) {
  TRILLION_CHECK(step >= 1, "adamw step must be 1-based, got ", step);
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  const double decay_factor = decay ? 1.0 - hyper.lr * hyper.weight_decay : 1.0;
  const double step_size = hyper.lr / bias1;
  const double sqrt_bias2 = std::sqrt(bias2);
  // p, m, v, g: [n]
  parallel_for(n, [&](int64_t i) {
    const double grad = g[i];
    const double m_new = hyper.beta1 * m[i] + (1.0 - hyper.beta1) * grad;
    const double v_new = hyper.beta2 * v[i] + (1.0 - hyper.beta2) * grad * grad;
    m[i] = static_cast<T>(m_new);
    v[i] = static_cast<T>(v_new);
    const double denom = std::sqrt(static_cast<double>(v[i])) / sqrt_bias2 + hyper.eps;
    p[i] = static_cast<T>(p[i] * decay_factor - step_size * static_cast<double>(m[i]) / denom);
  });
}

template <class T>
double sum_of_squares(const T* g, int64_t n) {
  return deterministic_sum(n, [&](int64_t i) {
    const double x = g[i];
    return x * x;
  });
}

template <class T>
void scale_in_place(T* g, int64_t n, double factor) {
  const T f = static_cast<T>(factor);
  parallel_for(n, [&](int64_t i) { g[i] *= f; });
}

double clip_factor(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

#define TRILLION_INSTANTIATE_ADAMW(T)                                                               \
  template void adamw_step<T>(T*, T*, T*, const T*, int64_t, int64_t, const AdamWHyper&, bool);     \
  template double sum_of_squares<T>(const T*, int64_t);                                             \
  template void scale_in_place<T>(T*, int64_t, double);
TRILLION_INSTANTIATE_ADAMW(float)
TRILLION_INSTANTIATE_ADAMW(double)
#undef TRILLION_INSTANTIATE_ADAMW

}  // namespace trillion
