// The MoE router, split at the routing decision so the decision can be recorded and replayed
// (gradcheck's perturbed passes and recomputation never re-route):
//
//   logits[N, E] = x · W_routerᵀ            (the caller's linear; no bias)
//   scores       = softmax(logits) per row   (qwen3_moe, qwen3_next)
//                | sigmoid(logits)           (glm4_moe, deepseek_v3, kimi_linear)
//   index[N, k]  = router_select(scores, bias)          ← the decision (no gradient)
//   weight[N, k] = router_weights_forward(scores, index)
//
// Selection. softmax: top-k of the scores. sigmoid: top-k of (scores + correction bias) inside the
// `topk_group` best of `n_group` expert groups (E / n_group consecutive experts each); a group's
// score is the sum of its two largest biased scores; experts of the other groups are masked (−∞, as
// DeepSeek's reference code and Megatron do; transformers' DeepseekV3/Glm4Moe routers fill 0.0
// instead, which picks the same experts whenever the k-th largest kept biased score is > 0, i.e.
// unless the correction bias pushes scores below zero). n_group = 1 (or topk_group = n_group) is
// plain top-k of the biased scores.
// Ties everywhere: score descending, then index ascending (ops/topk.h). The order of a row of
// index is the top-k order.
// Weights. The chosen experts' unbiased scores; if norm_topk_prob they are divided by their sum
// (softmax: Σ, as transformers' Qwen routers; sigmoid: Σ + 1e-20, as DeepSeek's), then multiplied
// by routed_scaling_factor (1 for the softmax families).
//
// Load balancing terms on the same scores (each returns its value and adds its gradient):
//   router_z_loss:        mean_t logsumexp(logits_t)²                       (ST-MoE)
//   sequence_aux_loss:    DeepSeek-V3's sequence-wise loss, per sequence of `seq` tokens
//                         Σ_i f_i P_i, f_i = E / (k·seq) · #{t : i ∈ index_t},
//                         P_i = mean_t scores[t, i] / Σ_j scores[t, j]; averaged over sequences.
//   expert_load:          counts[E] of top-k assignments and prob_sums[E] = Σ_t scores[t, e], the
//                         statistics of the Switch/GShard losses (pooled over layers as transformers
//                         does for Qwen, or per layer as Megatron does) whose gradient w.r.t.
//                         scores[t, e] is one constant per expert (the caller adds it).
//
// Gradient rule: router_scores_backward writes (=) dlogits; router_weights_backward and the loss
// backwards accumulate (+=) into dscores. Forward saves nothing beyond scores and index (callers
// keep those). Float models compute all of this in float (transformers computes its routers in
// float32, which is what a float model gives).
#pragma once

#include <cstdint>
#include <functional>

namespace trillion {

enum class RouterScoring { softmax, sigmoid };

struct RouterDims {
  int64_t experts = 0;  // E
  int64_t top_k = 0;    // k, 1 ≤ k ≤ E
  RouterScoring scoring = RouterScoring::softmax;
  bool norm_topk_prob = false;
  int64_t n_group = 1;     // sigmoid only (softmax needs 1): E divisible by it, E / n_group ≥ 2 if > 1
  int64_t topk_group = 1;  // sigmoid only: groups kept, 1 ≤ topk_group ≤ n_group
  double routed_scaling_factor = 1.0;
};

// scores[N, E] ← softmax or sigmoid of logits[N, E].
template <class T>
void router_scores_forward(T* scores, const T* logits, int64_t tokens, const RouterDims& dims);
// dlogits[N, E] (=) from dscores[N, E] and the saved scores.
template <class T>
void router_scores_backward(T* dlogits, const T* dscores, const T* scores, int64_t tokens, const RouterDims& dims);

// index[N, k] ← the routing decision; bias[E] (sigmoid's e_score_correction_bias) may be null.
template <class T>
void router_select(int32_t* index, const T* scores, const T* bias, int64_t tokens, const RouterDims& dims);
// The bytes of router_select's temporaries at `threads` threads, for the memory plan (sigmoid: the
// biased scores [N, E] of T, with the group scores and choices while groups are kept; every
// top-k's own, ops/topk.h).
int64_t router_select_workspace_bytes(int64_t tokens, const RouterDims& dims, int64_t element_bytes, int threads);

// weight[N, k] ← gathered, optionally renormalized and scaled scores.
template <class T>
void router_weights_forward(T* weight, const T* scores, const int32_t* index, int64_t tokens, const RouterDims& dims);
// dscores[N, E] += d(weight)/d(scores)ᵀ · dweight[N, k].
template <class T>
void router_weights_backward(T* dscores, const T* dweight, const T* scores, const int32_t* index, int64_t tokens,
                             const RouterDims& dims);

// counts[E] (=) top-k assignments per expert; prob_sums[E] (=) Σ_t scores[t, e] (fixed order).
template <class T>
void expert_load(int64_t* counts, double* prob_sums, const T* scores, const int32_t* index, int64_t tokens,
                 const RouterDims& dims);
// The bytes of expert_load's temporaries (its per-block partials [⌈N / 64⌉, E] in double).
int64_t expert_load_workspace_bytes(int64_t tokens, int64_t experts);

// Returns mean_t logsumexp(logits_t)² (0 for no tokens); if dlogits is non-null,
// dlogits[N, E] += scale · its gradient.
template <class T>
double router_z_loss(T* dlogits, const T* logits, int64_t tokens, int64_t experts, double scale);
// The bytes of router_z_loss's temporaries (lse [N] in double).
int64_t router_z_loss_workspace_bytes(int64_t tokens);

// Sequences split over ranks (context parallelism): each rank holds `seq` of every sequence's
// whole_seq tokens, and `sum` adds values [count] in place over the ranks that hold them.
struct SplitSequences {
  int64_t whole_seq = 0;
  std::function<void(double* values, int64_t count)> sum;
};

// Returns the sequence-wise loss (above) of tokens = batch · seq rows; if dscores is non-null,
// dscores[N, E] += scale · its gradient (index is a constant). The count behind f_i is of (t, slot)
// assignments, as DeepSeek's scatter_add does; it equals #{t : i ∈ index_t} for distinct indices.
// With `split`, the rows are this rank's parts of longer sequences: f_i counts every part's
// assignments (summed over the ranks), and the value is this rank's part of the loss, (1 / batch)
// Σ_rows (1 / whole_seq) Σ_{its t} Σ_i f_i p_{t,i}, whose sum over the ranks is the loss.
template <class T>
double sequence_aux_loss(T* dscores, const T* scores, const int32_t* index, int64_t batch, int64_t seq,
                         const RouterDims& dims, double scale, const SplitSequences* split = nullptr);
// The bytes of sequence_aux_loss's temporaries (f [B, E] and term [N] in double).
int64_t sequence_aux_loss_workspace_bytes(int64_t batch, int64_t seq, int64_t experts);

}  // namespace trillion
