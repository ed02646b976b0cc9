// Plain MoE router (see moe_router_ref.h): serial loops over tokens, std::vector scratch, and
// selection by stable-sorting all candidates, so every rule is visible in a few lines.
#include "ops/ref/moe_router_ref.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace trillion {
namespace {

// The first `count` positions of values[n] ranked by value descending, equal values by position
// ascending (std::stable_sort keeps the initial ascending order among equals).
template <class T>
std::vector<int32_t> ranked_positions(const std::vector<T>& values, int64_t count) {
  for (const T& v : values) TRILLION_CHECK(!std::isnan(v), "router ref: NaN score");
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  order.resize(count);
  return order;
}

// The chosen experts' unbiased scores of token t, [k].
template <class T>
std::vector<double> gathered(const T* scores, const int32_t* index, int64_t t, const RouterDims& dims) {
  std::vector<double> g(dims.top_k);
  for (int64_t i = 0; i < dims.top_k; ++i) g[i] = scores[t * dims.experts + index[t * dims.top_k + i]];
  return g;
}

// Σ g (+1e-20 for sigmoid) if norm_topk_prob, else 1.
double denominator(const std::vector<double>& g, const RouterDims& dims) {
  if (!dims.norm_topk_prob) return 1.0;
  double sum = 0.0;
  for (double v : g) sum += v;
  return dims.scoring == RouterScoring::sigmoid ? sum + 1e-20 : sum;
}

}  // namespace

template <class T>
void router_select_ref(int32_t* index, const T* scores, const T* bias, int64_t tokens, const RouterDims& dims) {
  const int64_t E = dims.experts, k = dims.top_k;
  TRILLION_CHECK(k >= 1 && k <= E, "router ref top_k ", k);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<T> choice(scores + t * E, scores + (t + 1) * E);  // [E]
    if (dims.scoring == RouterScoring::sigmoid) {
      if (bias != nullptr)
        for (int64_t e = 0; e < E; ++e) choice[e] = choice[e] + bias[e];
      const int64_t G = dims.n_group, size = E / G;
      if (G > 1) {
        // Group score: the sum of the two largest entries of the group (largest first).
        std::vector<T> group_score(G);  // [G]
        for (int64_t g = 0; g < G; ++g) {
          std::vector<T> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
          std::sort(members.begin(), members.end(), std::greater<T>());
          group_score[g] = members[0] + members[1];
        }
        const std::vector<int32_t> kept = ranked_positions(group_score, dims.topk_group);
        for (int64_t e = 0; e < E; ++e)
          if (std::find(kept.begin(), kept.end(), static_cast<int32_t>(e / size)) == kept.end())
            choice[e] = -std::numeric_limits<T>::infinity();
      }
    }
    const std::vector<int32_t> top = ranked_positions(choice, k);
    std::copy(top.begin(), top.end(), index + t * k);
  }
}

template <class T>
void router_weights_forward_ref(T* weight, const T* scores, const int32_t* index, int64_t tokens,
                                const RouterDims& dims) {
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> g = gathered(scores, index, t, dims);
    const double d = denominator(g, dims);
    for (int64_t i = 0; i < dims.top_k; ++i)
      weight[t * dims.top_k + i] = static_cast<T>(g[i] / d * dims.routed_scaling_factor);
  }
}

template <class T>
void router_weights_backward_ref(T* dscores, const T* dweight, const T* scores, const int32_t* index,
                                 int64_t tokens, const RouterDims& dims) {
  const int64_t k = dims.top_k;
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> g = gathered(scores, index, t, dims);
    const double d = denominator(g, dims), c = dims.routed_scaling_factor;
    for (int64_t m = 0; m < k; ++m) {
      double grad = 0.0;  // Σ_i J[i, m] · dweight_i
      for (int64_t i = 0; i < k; ++i) {
        // w_i = c · g_i / d(g): J[i, m] = c · (δ_im / d − g_i · ∂d/∂g_m / d²), ∂d/∂g_m = 1 when normalizing.
        const double jacobian = c * ((i == m ? 1.0 / d : 0.0) - (dims.norm_topk_prob ? g[i] / (d * d) : 0.0));
        grad += jacobian * dweight[t * k + i];
      }
      T& target = dscores[t * dims.experts + index[t * k + m]];
      target = static_cast<T>(target + grad);
    }
  }
}

#define TRILLION_INSTANTIATE_MOE_ROUTER_REF(T)                                                                \
  template void router_select_ref<T>(int32_t*, const T*, const T*, int64_t, const RouterDims&);              \
  template void router_weights_forward_ref<T>(T*, const T*, const int32_t*, int64_t, const RouterDims&);     \
  template void router_weights_backward_ref<T>(T*, const T*, const T*, const int32_t*, int64_t,              \
                                               const RouterDims&);
TRILLION_INSTANTIATE_MOE_ROUTER_REF(float)
TRILLION_INSTANTIATE_MOE_ROUTER_REF(double)
#undef TRILLION_INSTANTIATE_MOE_ROUTER_REF

}  // namespace trillion
