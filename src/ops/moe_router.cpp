// The MoE router's kernels (see moe_router.h): scores, the routing decision, the routing weights and
// the load-balancing terms, forward and backward.
//
// Tokens are the work items. Every per-token reduction (softmax sums, renormalization, the aux
// loss's Σ_j scores) runs in double, in expert or slot order, inside one item. Sums across tokens
// (expert_load's prob_sums, the returned loss values) go through fixed-order partials: per-token
// or per-block values written to a buffer, then added in token or block order. Results therefore do
// not depend on the thread count. Selection arithmetic (bias add, group sums) is done in T, as
// transformers does it in the model's float type, so the decision matches theirs. Experts outside
// the kept groups are set to −∞ before the final top-k (the header says how this relates to
// transformers' 0.0 fill).
#include "ops/moe_router.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/topk.h"

namespace trillion {
namespace {

constexpr int64_t kTokenBlock = 64;      // rows per partial sum of expert_load
constexpr double kSigmoidNormEps = 1e-20;  // DeepSeek's denominator guard

void check_dims(const RouterDims& d) {
  TRILLION_CHECK(d.experts >= 1 && d.experts <= std::numeric_limits<int32_t>::max(), "router experts ", d.experts);
  TRILLION_CHECK(d.top_k >= 1 && d.top_k <= d.experts, "router top_k ", d.top_k, " not in [1, ", d.experts, "]");
  TRILLION_CHECK(d.n_group >= 1 && d.experts % d.n_group == 0, "router experts ", d.experts,
                 " not divisible by n_group ", d.n_group);
  TRILLION_CHECK(d.n_group == 1 || d.experts / d.n_group >= 2, "router groups of ", d.experts / d.n_group,
                 " expert(s); group-limited routing needs at least 2 per group");
  TRILLION_CHECK(d.topk_group >= 1 && d.topk_group <= d.n_group, "router topk_group ", d.topk_group,
                 " not in [1, ", d.n_group, "]");
  TRILLION_CHECK(d.topk_group * (d.experts / d.n_group) >= d.top_k, "router keeps ", d.topk_group, " groups of ",
                 d.experts / d.n_group, " experts, fewer than top_k ", d.top_k);
  TRILLION_CHECK(d.scoring == RouterScoring::sigmoid || d.n_group == 1,
                 "group-limited routing (n_group ", d.n_group, ") is defined for sigmoid scoring only");
}

// Every index[N, k] entry names an expert (checked serially, outside any parallel region).
void check_index(const int32_t* index, int64_t tokens, const RouterDims& d) {
  for (int64_t i = 0; i < tokens * d.top_k; ++i)
    TRILLION_CHECK(index[i] >= 0 && index[i] < d.experts, "router index ", index[i], " at token ", i / d.top_k,
                   " not in [0, ", d.experts, ")");
}

// The renormalizing denominator of one token's gathered scores (1 without norm_topk_prob).
template <class T>
double weight_denominator(const T* scores_row, const int32_t* index_row, const RouterDims& d) {
  if (!d.norm_topk_prob) return 1.0;
  double sum = 0.0;
  for (int64_t i = 0; i < d.top_k; ++i) sum += scores_row[index_row[i]];
  return d.scoring == RouterScoring::sigmoid ? sum + kSigmoidNormEps : sum;
}

// biased[N, E] (in place) ← −∞ outside each token's topk_group best groups; a group's score is the
// sum of its two largest entries. group_scores[N, G] and group_index[N, topk_group] are scratch.
template <class T>
void mask_to_best_groups(T* biased, T* group_scores, int32_t* group_index, int64_t tokens, const RouterDims& d) {
  const int64_t groups = d.n_group, size = d.experts / d.n_group, kept = d.topk_group;
  parallel_for(tokens, d.experts, [&](int64_t t) {
    const T* row = biased + t * d.experts;  // [E]
    for (int64_t g = 0; g < groups; ++g) {
      const T* group = row + g * size;  // [size], size ≥ 2
      T first = std::max(group[0], group[1]), second = std::min(group[0], group[1]);
      for (int64_t j = 2; j < size; ++j) {
        if (group[j] > first) {
          second = first;
          first = group[j];
        } else if (group[j] > second) {
          second = group[j];
        }
      }
      group_scores[t * groups + g] = first + second;
    }
  });
  topk_rows(group_index, group_scores, tokens, groups, kept);
  parallel_for(tokens, d.experts, [&](int64_t t) {
    T* row = biased + t * d.experts;                  // [E]
    const int32_t* chosen = group_index + t * kept;  // [topk_group]
    for (int64_t g = 0; g < groups; ++g) {
      if (std::find(chosen, chosen + kept, static_cast<int32_t>(g)) != chosen + kept) continue;
      std::fill(row + g * size, row + (g + 1) * size, -std::numeric_limits<T>::infinity());
    }
  });
}

}  // namespace

template <class T>
void router_scores_forward(T* scores, const T* logits, int64_t tokens, const RouterDims& dims) {
  check_dims(dims);
  const int64_t E = dims.experts;
  parallel_for(tokens, E, [&](int64_t t) {
    const T* l = logits + t * E;  // [E]
    T* s = scores + t * E;        // [E]
    if (dims.scoring == RouterScoring::sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
      return;
    }
    const double m = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - m);
    const double inv = 1.0 / sum;
    for (int64_t e = 0; e < E; ++e) s[e] = static_cast<T>(std::exp(static_cast<double>(l[e]) - m) * inv);
  });
}

template <class T>
void router_scores_backward(T* dlogits, const T* dscores, const T* scores, int64_t tokens, const RouterDims& dims) {
  check_dims(dims);
  const int64_t E = dims.experts;
  parallel_for(tokens, E, [&](int64_t t) {
    const T* s = scores + t * E;    // [E]
    const T* ds = dscores + t * E;  // [E]
    T* dl = dlogits + t * E;        // [E]
    if (dims.scoring == RouterScoring::sigmoid) {
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(static_cast<double>(ds[e]) * s[e] * (1.0 - s[e]));
      return;
    }
    double dot = 0.0;  // Σ_e s · ds
    for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(s[e]) * ds[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(static_cast<double>(s[e]) * (ds[e] - dot));
  });
}

int64_t router_select_workspace_bytes(int64_t tokens, const RouterDims& dims, int64_t element_bytes, int threads) {
  const int64_t E = dims.experts, select = topk_rows_workspace_bytes(E, dims.top_k, threads);
  if (dims.scoring == RouterScoring::softmax) return select;
  int64_t groups = 0;  // group_scores, group_index and their top-k, freed before the final top-k
  if (dims.topk_group < dims.n_group)
    groups = tokens * dims.n_group * element_bytes + tokens * dims.topk_group * int64_t(sizeof(int32_t)) +
             topk_rows_workspace_bytes(dims.n_group, dims.topk_group, threads);
  return tokens * E * element_bytes + std::max(groups, select);  // biased
}

template <class T>
void router_select(int32_t* index, const T* scores, const T* bias, int64_t tokens, const RouterDims& dims) {
  check_dims(dims);
  TRILLION_CHECK(tokens >= 0, "router tokens ", tokens);
  const int64_t E = dims.experts;
  if (dims.scoring == RouterScoring::softmax) {
    topk_rows(index, scores, tokens, E, dims.top_k);
    return;
  }
  Buffer<T> biased(tokens * E);  // [N, E] scores + bias, then masked to the kept groups
  parallel_for(tokens, E, [&](int64_t t) {
    const T* s = scores + t * E;   // [E]
    T* b = biased.data() + t * E;  // [E]
    for (int64_t e = 0; e < E; ++e) b[e] = bias != nullptr ? s[e] + bias[e] : s[e];
  });
  if (dims.topk_group < dims.n_group) {
    Buffer<T> group_scores(tokens * dims.n_group);           // [N, n_group]
    Buffer<int32_t> group_index(tokens * dims.topk_group);  // [N, topk_group]
    mask_to_best_groups(biased.data(), group_scores.data(), group_index.data(), tokens, dims);
  }
  topk_rows(index, biased.data(), tokens, E, dims.top_k);
}

template <class T>
void router_weights_forward(T* weight, const T* scores, const int32_t* index, int64_t tokens, const RouterDims& dims) {
  check_dims(dims);
  check_index(index, tokens, dims);
  const int64_t E = dims.experts, k = dims.top_k;
  parallel_for(tokens, E, [&](int64_t t) {
    const T* s = scores + t * E;         // [E]
    const int32_t* idx = index + t * k;  // [k]
    T* w = weight + t * k;               // [k]
    const double factor = dims.routed_scaling_factor / weight_denominator(s, idx, dims);
    for (int64_t i = 0; i < k; ++i) w[i] = static_cast<T>(static_cast<double>(s[idx[i]]) * factor);
  });
}

template <class T>
void router_weights_backward(T* dscores, const T* dweight, const T* scores, const int32_t* index, int64_t tokens,
                             const RouterDims& dims) {
  check_dims(dims);
  check_index(index, tokens, dims);
  const int64_t E = dims.experts, k = dims.top_k;
  parallel_for(tokens, E, [&](int64_t t) {
    const T* s = scores + t * E;         // [E]
    const int32_t* idx = index + t * k;  // [k]
    const T* dw = dweight + t * k;       // [k]
    T* ds = dscores + t * E;             // [E]
    // w_i = c · s_i / D with D = Σ_m s_m (+ eps): ds_m += (c / D) · (dw_m − Σ_i dw_i · s_i / D);
    // without renormalization D = 1 and the sum term is absent.
    const double denom = weight_denominator(s, idx, dims);
    const double factor = dims.routed_scaling_factor / denom;
    double shared = 0.0;
    if (dims.norm_topk_prob) {
      for (int64_t i = 0; i < k; ++i) shared += static_cast<double>(dw[i]) * s[idx[i]];
      shared /= denom;
    }
    for (int64_t i = 0; i < k; ++i) ds[idx[i]] += static_cast<T>(factor * (static_cast<double>(dw[i]) - shared));
  });
}

int64_t expert_load_workspace_bytes(int64_t tokens, int64_t experts) {
  return (tokens + kTokenBlock - 1) / kTokenBlock * experts * int64_t(sizeof(double));  // partial
}

template <class T>
void expert_load(int64_t* counts, double* prob_sums, const T* scores, const int32_t* index, int64_t tokens,
                 const RouterDims& dims) {
  check_dims(dims);
  check_index(index, tokens, dims);
  const int64_t E = dims.experts;
  std::fill(counts, counts + E, int64_t{0});
  for (int64_t i = 0; i < tokens * dims.top_k; ++i) ++counts[index[i]];
  const int64_t blocks = (tokens + kTokenBlock - 1) / kTokenBlock;
  Buffer<double> partial(blocks * E);  // [blocks, E] per-block Σ_t scores[t, e]
  parallel_for(blocks, kTokenBlock * E, [&](int64_t b) {
    double* p = partial.data() + b * E;  // [E]
    const int64_t end = std::min(tokens, (b + 1) * kTokenBlock);
    for (int64_t t = b * kTokenBlock; t < end; ++t)
      for (int64_t e = 0; e < E; ++e) p[e] += scores[t * E + e];
  });
  std::fill(prob_sums, prob_sums + E, 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t e = 0; e < E; ++e) prob_sums[e] += partial[b * E + e];
}

int64_t router_z_loss_workspace_bytes(int64_t tokens) { return tokens * int64_t(sizeof(double)); }  // lse

template <class T>
double router_z_loss(T* dlogits, const T* logits, int64_t tokens, int64_t experts, double scale) {
  TRILLION_CHECK(tokens >= 0 && experts >= 1, "router_z_loss tokens=", tokens, " experts=", experts);
  if (tokens == 0) return 0.0;
  Buffer<double> lse(tokens);  // [N] logsumexp of each row
  // d/dl_e (mean_t lse_t²) = 2 · lse_t · softmax(l_t)_e / N.
  const double grad_factor = scale * 2.0 / static_cast<double>(tokens);
  parallel_for(tokens, experts, [&](int64_t t) {
    const T* l = logits + t * experts;  // [E]
    const double m = *std::max_element(l, l + experts);
    double sum = 0.0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(l[e]) - m);
    const double value = m + std::log(sum);
    lse[t] = value;
    if (dlogits == nullptr) return;
    T* dl = dlogits + t * experts;  // [E]
    const double row_factor = grad_factor * value / sum;
    for (int64_t e = 0; e < experts; ++e)
      dl[e] += static_cast<T>(row_factor * std::exp(static_cast<double>(l[e]) - m));
  });
  const double total = deterministic_sum(tokens, [&](int64_t t) { return lse[t] * lse[t]; });
  return total / static_cast<double>(tokens);
}

int64_t sequence_aux_loss_workspace_bytes(int64_t batch, int64_t seq, int64_t experts) {
  return (batch * experts + batch * seq) * int64_t(sizeof(double));  // f, term
}

template <class T>
double sequence_aux_loss(T* dscores, const T* scores, const int32_t* index, int64_t batch, int64_t seq,
                         const RouterDims& dims, double scale, const SplitSequences* split) {
  check_dims(dims);
  TRILLION_CHECK(batch >= 1 && seq >= 1, "sequence_aux_loss batch=", batch, " seq=", seq);
  const int64_t E = dims.experts, k = dims.top_k, tokens = batch * seq;
  const int64_t whole_seq = split != nullptr ? split->whole_seq : seq;
  TRILLION_CHECK(whole_seq >= seq, "sequence_aux_loss: ", seq, " tokens of ", whole_seq, "-token sequences");
  check_index(index, tokens, dims);
  // f[B, E]: f_i = E / (k · whole_seq) · (assignments of expert i in the sequence).
  Buffer<double> f(batch * E);
  const double f_unit = static_cast<double>(E) / static_cast<double>(k * whole_seq);
  parallel_for(batch, seq * k, [&](int64_t b) {
    double* fb = f.data() + b * E;                  // [E]
    const int32_t* idx = index + b * seq * k;       // [seq, k]
    for (int64_t i = 0; i < seq * k; ++i) fb[idx[i]] += f_unit;
  });
  if (split != nullptr) split->sum(f.data(), f.size());  // every part's assignments
  // term[N]: Σ_i f_i · p_{t,i} with p_t = s_t / Σ_j s_{t,j}; loss_b = mean over the sequence's t.
  Buffer<double> term(tokens);
  const double grad_factor = scale / static_cast<double>(batch * whole_seq);
  parallel_for(tokens, E, [&](int64_t t) {
    const T* s = scores + t * E;                 // [E]
    const double* fb = f.data() + (t / seq) * E;  // [E]
    double sum = 0.0, dot = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      sum += s[e];
      dot += fb[e] * s[e];
    }
    const double value = dot / sum;
    term[t] = value;
    if (dscores == nullptr) return;
    // d value_t / d s_{t,j} = (f_j − value_t) / sum; the loss is (1 / (B · seq)) Σ_t value_t.
    T* ds = dscores + t * E;  // [E]
    const double row_factor = grad_factor / sum;
    for (int64_t e = 0; e < E; ++e) ds[e] += static_cast<T>(row_factor * (fb[e] - value));
  });
  double total = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    double loss_b = 0.0;
    for (int64_t t = b * seq; t < (b + 1) * seq; ++t) loss_b += term[t];
    total += loss_b / static_cast<double>(whole_seq);
  }
  return total / static_cast<double>(batch);
}

#define TRILLION_INSTANTIATE_MOE_ROUTER(T)                                                                    \
  template void router_scores_forward<T>(T*, const T*, int64_t, const RouterDims&);                          \
  template void router_scores_backward<T>(T*, const T*, const T*, int64_t, const RouterDims&);               \
  template void router_select<T>(int32_t*, const T*, const T*, int64_t, const RouterDims&);                  \
  template void router_weights_forward<T>(T*, const T*, const int32_t*, int64_t, const RouterDims&);         \
  template void router_weights_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, const RouterDims&); \
  template void expert_load<T>(int64_t*, double*, const T*, const int32_t*, int64_t, const RouterDims&);     \
  template double router_z_loss<T>(T*, const T*, int64_t, int64_t, double);                                  \
  template double sequence_aux_loss<T>(T*, const T*, const int32_t*, int64_t, int64_t, const RouterDims&, double, \
                                       const SplitSequences*);
TRILLION_INSTANTIATE_MOE_ROUTER(float)
TRILLION_INSTANTIATE_MOE_ROUTER(double)
#undef TRILLION_INSTANTIATE_MOE_ROUTER

}  // namespace trillion
