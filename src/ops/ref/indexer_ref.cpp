// Plain lightning indexer (see indexer_ref.h): whole matrices, plain loops, std::stable_sort.
// Rows of the score matrix are independent parallel items; everything else runs in a fixed order.
#include "ops/ref/indexer_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace trillion {
namespace {

void check_sizes(const IndexerSizes& s) {
  TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.heads > 0 && s.head_dim > 0 && s.topk > 0, "bad indexer sizes");
  TRILLION_CHECK(s.q_len <= s.kv_len, "indexer q_len ", s.q_len, " > kv_len ", s.kv_len);
}

// Whether key j is visible to query t of batch entry b (causal, and within its document).
bool visible(const IndexerSizes& s, int64_t b, int64_t t, int64_t j) {
  const int64_t first = s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0;
  return first <= j && j < t + s.kv_len - s.q_len + 1;
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Main attention probabilities averaged over heads for batch entry b:
// p[q_len, kv_len] = (1/heads) Σ_h exp(scale · q_h k_hᵀ − lse_h) on visible keys, 0 elsewhere.
template <class T>
void mean_probabilities(std::vector<T>& p, const IndexerTarget& target, const IndexerSizes& s, int64_t b) {
  const T* main_q = static_cast<const T*>(target.q);
  const T* main_k = static_cast<const T*>(target.k);
  const T* main_lse = static_cast<const T*>(target.lse);
  const int64_t group = target.heads / target.kv_heads, qk = target.qk_dim;
  std::vector<T> head_probs(s.q_len * s.kv_len);  // [q_len, kv_len]: P_h
  p.assign(s.q_len * s.kv_len, T(0));
  for (int64_t h = 0; h < target.heads; ++h) {
    for (int64_t t = 0; t < s.q_len; ++t) {
      const T* q_row = main_q + ((b * s.q_len + t) * target.heads + h) * qk;
      const T lse = main_lse[(b * target.heads + h) * s.q_len + t];
      for (int64_t j = 0; j < s.kv_len; ++j) {
        const T* k_row = main_k + ((b * s.kv_len + j) * target.kv_heads + h / group) * qk;
        head_probs[t * s.kv_len + j] = visible(s, b, t, j) ? std::exp(T(target.scale) * dot(q_row, k_row, qk) - lse) : T(0);
      }
    }
    for (int64_t i = 0; i < s.q_len * s.kv_len; ++i) p[i] += head_probs[i];
  }
  for (T& x : p) x /= T(target.heads);
}

}  // namespace

template <class T>
void indexer_ref_scores(T* scores, const T* q, const T* k, const T* w, const IndexerSizes& s) {
  check_sizes(s);
  const int64_t d = s.head_dim;
  parallel_for(s.batch * s.q_len, [&](int64_t bt) {
    const int64_t b = bt / s.q_len, t = bt % s.q_len;
    T* row = scores + bt * s.kv_len;  // [kv_len]
    for (int64_t j = 0; j < s.kv_len; ++j) {
      if (!visible(s, b, t, j)) {
        row[j] = -std::numeric_limits<T>::infinity();
        continue;
      }
      T sum = 0;
      for (int64_t h = 0; h < s.heads; ++h) {
        const T x = T(s.scale) * dot(q + (bt * s.heads + h) * d, k + (b * s.kv_len + j) * d, d);
        sum += w[bt * s.heads + h] * std::max(x, T(0));
      }
      row[j] = sum;
    }
  });
}

template <class T>
void indexer_ref_topk(int32_t* indices, const T* q, const T* k, const T* w, const IndexerSizes& s) {
  std::vector<T> scores(s.batch * s.q_len * s.kv_len);  // [batch, q_len, kv_len]
  indexer_ref_scores(scores.data(), q, k, w, s);
  parallel_for(s.batch * s.q_len, [&](int64_t bt) {
    const T* row = scores.data() + bt * s.kv_len;  // [kv_len]
    std::vector<int32_t> order;  // the visible keys, ascending
    for (int64_t j = 0; j < s.kv_len; ++j)
      if (visible(s, bt / s.q_len, bt % s.q_len, j)) order.push_back(static_cast<int32_t>(j));
    std::stable_sort(order.begin(), order.end(), [row](int32_t a, int32_t b) {
      return std::isnan(row[a]) ? !std::isnan(row[b]) : row[a] > row[b];  // NaN first, as ops/topk.h
    });
    const int64_t kept = std::min<int64_t>(s.topk, static_cast<int64_t>(order.size()));
    int32_t* out = indices + bt * s.topk;  // [topk]
    std::copy(order.begin(), order.begin() + kept, out);
    std::fill(out + kept, out + s.topk, -1);
  });
}

template <class T>
void indexer_ref_selected_lse(T* lse, const int32_t* indices, const IndexerTarget& target, const IndexerSizes& s) {
  const T* main_q = static_cast<const T*>(target.q);
  const T* main_k = static_cast<const T*>(target.k);
  const int64_t group = target.heads / target.kv_heads, qk = target.qk_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < target.heads; ++h)
      for (int64_t t = 0; t < s.q_len; ++t) {
        const int32_t* index_row = indices + (b * s.q_len + t) * s.topk;
        const T* q_row = main_q + ((b * s.q_len + t) * target.heads + h) * qk;
        std::vector<T> logits;  // [selected]
        for (int64_t c = 0; c < s.topk && index_row[c] >= 0; ++c)
          logits.push_back(T(target.scale) *
                           dot(q_row, main_k + ((b * s.kv_len + index_row[c]) * target.kv_heads + h / group) * qk, qk));
        const T top = *std::max_element(logits.begin(), logits.end());
        T sum = 0;
        for (T x : logits) sum += std::exp(x - top);
        lse[(b * target.heads + h) * s.q_len + t] = top + std::log(sum);
      }
}

template <class T>
IndexerLossResult indexer_ref_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                                   const IndexerTarget& target, IndexerLossMode mode, double coef,
                                   const IndexerSizes& s) {
  check_sizes(s);
  const int64_t d = s.head_dim, n_keys = s.kv_len;
  std::vector<T> scores(s.batch * s.q_len * n_keys);  // [batch, q_len, kv_len]: I
  indexer_ref_scores(scores.data(), q, k, w, s);
  std::fill(dq, dq + s.batch * s.q_len * s.heads * d, T(0));
  std::fill(dk, dk + s.batch * n_keys * d, T(0));
  std::fill(dw, dw + s.batch * s.q_len * s.heads, T(0));
  const T grad_scale = T(coef / double(s.batch * s.q_len));
  double kl_total = 0.0, mass_total = 0.0, best_total = 0.0;
  std::vector<T> p;                   // [q_len, kv_len]
  std::vector<char> in_domain(n_keys), selected(n_keys);  // [kv_len] masks of one query
  std::vector<T> dI(n_keys);          // [kv_len] of one query
  std::vector<T> domain_p;            // [≤ kv_len] p on one query's domain
  for (int64_t b = 0; b < s.batch; ++b) {
    mean_probabilities(p, target, s, b);
    for (int64_t t = 0; t < s.q_len; ++t) {
      const T* row = scores.data() + (b * s.q_len + t) * n_keys;
      const T* p_row = p.data() + t * n_keys;
      const int32_t* index_row = indices + (b * s.q_len + t) * s.topk;
      std::fill(selected.begin(), selected.end(), 0);
      for (int64_t c = 0; c < s.topk && index_row[c] >= 0; ++c) selected[index_row[c]] = 1;
      for (int64_t j = 0; j < n_keys; ++j)
        in_domain[j] = mode == IndexerLossMode::kDense ? visible(s, b, t, j) : selected[j];
      // p on the domain (renormalized there: in sparse mode the caller's lse already is over S_t).
      T top = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n_keys; ++j)
        if (in_domain[j]) top = std::max(top, row[j]);
      T sum = 0;
      for (int64_t j = 0; j < n_keys; ++j)
        if (in_domain[j]) sum += std::exp(row[j] - top);
      const T lse_index = top + std::log(sum);
      domain_p.clear();
      for (int64_t j = 0; j < n_keys; ++j)
        if (in_domain[j]) domain_p.push_back(p_row[j]);
      std::sort(domain_p.begin(), domain_p.end(),
                [](T a, T b) { return std::isnan(a) ? !std::isnan(b) : a > b; });  // NaN first, as the top-k
      for (int64_t c = 0; c < std::min<int64_t>(s.topk, int64_t(domain_p.size())); ++c) best_total += domain_p[c];
      for (int64_t j = 0; j < n_keys; ++j) {
        dI[j] = 0;
        if (selected[j]) mass_total += p_row[j];
        if (!in_domain[j]) continue;
        const T log_soft = row[j] - lse_index;
        if (p_row[j] > 0) kl_total += double(p_row[j]) * (std::log(double(p_row[j])) - log_soft);
        dI[j] = grad_scale * (std::exp(log_soft) - p_row[j]);
      }
      // I = Σ_h w_h ReLU(scale · q_h · k): dw_h = Σ dI ReLU(·), dS_h = dI w_h scale 1[q_h·k > 0].
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t qh = (b * s.q_len + t) * s.heads + h;
        for (int64_t j = 0; j < n_keys; ++j) {
          if (dI[j] == T(0)) continue;
          const T* k_row = k + (b * n_keys + j) * d;
          const T x = T(s.scale) * dot(q + qh * d, k_row, d);
          dw[qh] += dI[j] * std::max(x, T(0));
          if (!(x > 0)) continue;
          const T dS = dI[j] * w[qh] * T(s.scale);
          for (int64_t i = 0; i < d; ++i) {
            dq[qh * d + i] += dS * k_row[i];
            dk[(b * n_keys + j) * d + i] += dS * q[qh * d + i];
          }
        }
      }
    }
  }
  const double queries = double(s.batch * s.q_len);
  return {kl_total / queries, mass_total / queries, best_total / queries};
}

#define TRILLION_INSTANTIATE_INDEXER_REF(T)                                                                     \
  template void indexer_ref_scores<T>(T*, const T*, const T*, const T*, const IndexerSizes&);                  \
  template void indexer_ref_topk<T>(int32_t*, const T*, const T*, const T*, const IndexerSizes&);              \
  template void indexer_ref_selected_lse<T>(T*, const int32_t*, const IndexerTarget&, const IndexerSizes&);    \
  template IndexerLossResult indexer_ref_loss<T>(T*, T*, T*, const T*, const T*, const T*, const int32_t*,      \
                                                 const IndexerTarget&, IndexerLossMode, double, const IndexerSizes&);
TRILLION_INSTANTIATE_INDEXER_REF(float)
TRILLION_INSTANTIATE_INDEXER_REF(double)
#undef TRILLION_INSTANTIATE_INDEXER_REF

}  // namespace trillion
