// A training forward's statistics over the batch's shares (StatisticsReduction), the router losses
// they give and their gradients, and the indexer loss term: Model<T>::Impl's, see model_impl.h.
#include <cmath>
#include <variant>

#include "core/error.h"
#include "model/model.h"
#include "model/model_impl.h"

namespace trillion {

template <class T>
const MoeDims* Model<T>::Impl::first_moe() const {
  for (const DecoderLayerDims& dims : layer_dims)
    if (const auto* moe = std::get_if<MoeDims>(&dims.ffn)) return moe;
  return nullptr;
}

template <class T>
void Model<T>::Impl::reduce_statistics(StepResult& result) const {
  std::vector<double> packed;  // every layer's counts, score sums, dropped slots and means, in order
  const double per_token = reduction.token_weight(), per_row = reduction.row_weight();
  for (const MoeLayerStats& s : result.moe) {
    for (const int64_t count : s.tokens_per_expert) packed.push_back(double(count));
    packed.insert(packed.end(), s.prob_sums.begin(), s.prob_sums.end());
    packed.insert(packed.end(), {double(s.dropped), s.sequence_aux * per_row, s.z_loss * per_token});
  }
  for (const IndexerLayerStats& s : result.indexer)
    packed.insert(packed.end(), {s.loss * per_token, s.selected_mass * per_token, s.best_mass * per_token});
  if (packed.empty()) return;
  reduction.sum(packed.data(), static_cast<int64_t>(packed.size()));
  const double* next = packed.data();
  const auto take_count = [&] { return static_cast<int64_t>(std::llround(*next++)); };  // sums of integers, exact
  for (MoeLayerStats& s : result.moe) {
    for (int64_t& count : s.tokens_per_expert) count = take_count();
    for (double& sum : s.prob_sums) sum = *next++;
    s.dropped = take_count();
    s.sequence_aux = *next++;
    s.z_loss = *next++;
  }
  for (IndexerLayerStats& s : result.indexer) {
    s.loss = *next++;
    s.selected_mass = *next++;
    s.best_mass = *next++;
  }
}

// Pooled (transformers' Qwen): f_e = Σ_l count_le / (L·N), P_e = Σ_l Σ_t p_lte / (L·N), E Σ f_e P_e.
// Per layer (Megatron): Σ_l E Σ_e count_le / (N·k) · Σ_t p_lte / N. Sequence-wise: Σ_l of each
// layer's value. Router z-loss: Σ_l of each layer's mean_t lse².
template <class T>
void Model<T>::Impl::add_router_losses(StepResult& result, int64_t tokens) const {
  const MoeDims* moe = first_moe();
  if (moe == nullptr || result.moe.empty()) return;
  const int64_t E = moe->experts(), k = moe->top_k();
  const double L = double(result.moe.size()), N = double(tokens);
  if (moe->aux_coef != 0.0) {
    LossTerm term{"aux_loss", 0.0, moe->aux_coef, ""};
    switch (moe->aux_type) {
      case AuxLossType::pooled: {
        for (int64_t e = 0; e < E; ++e) {
          double count = 0.0, prob = 0.0;
          for (const MoeLayerStats& s : result.moe) count += double(s.tokens_per_expert[e]), prob += s.prob_sums[e];
          term.value += double(E) * (count / (L * N)) * (prob / (L * N));
        }
        term.normalization = "pooled over the MoE layers and tokens of the micro-batch (transformers' Qwen)";
        break;
      }
      case AuxLossType::per_layer:
        for (const MoeLayerStats& s : result.moe)
          for (int64_t e = 0; e < E; ++e)
            term.value += double(E) * (double(s.tokens_per_expert[e]) / (N * double(k))) * (s.prob_sums[e] / N);
        term.normalization = "per MoE layer over the micro-batch's tokens, summed over layers (Megatron)";
        break;
      case AuxLossType::sequence:
        for (const MoeLayerStats& s : result.moe) term.value += s.sequence_aux;
        term.normalization = "per sequence, averaged over sequences, summed over layers (DeepSeek-V3)";
        break;
    }
    result.aux.push_back(term);
  }
  if (moe->z_coef != 0.0) {
    LossTerm term{"router_z_loss", 0.0, moe->z_coef, "mean over the micro-batch's tokens, summed over MoE layers"};
    for (const MoeLayerStats& s : result.moe) term.value += s.z_loss;
    result.aux.push_back(term);
  }
}

template <class T>
MoeBalanceGrad Model<T>::Impl::balance_grad(const StepResult& result, int layer, int64_t tokens,
                                            double aux_scale) const {
  const MoeDims& moe = std::get<MoeDims>(layer_dims[layer].ffn);
  const int64_t E = moe.experts(), k = moe.top_k();
  const double L = double(result.moe.size()), N = double(tokens), coef = moe.aux_coef * aux_scale;
  MoeBalanceGrad grad;
  grad.z_scale = moe.z_coef * aux_scale * reduction.token_weight();  // a mean over this rank's tokens
  if (coef == 0.0) return grad;
  const MoeLayerStats* own = nullptr;
  for (const MoeLayerStats& s : result.moe) own = s.layer == layer ? &s : own;
  TRILLION_CHECK(own != nullptr, "no routing statistics of layer ", layer);
  switch (moe.aux_type) {
    case AuxLossType::pooled:
      grad.per_expert.assign(E, 0.0);
      for (int64_t e = 0; e < E; ++e) {
        double count = 0.0;
        for (const MoeLayerStats& s : result.moe) count += double(s.tokens_per_expert[e]);
        grad.per_expert[e] = coef * double(E) * (count / (L * N)) / (L * N);  // ∂/∂p_lte of E Σ f P
      }
      break;
    case AuxLossType::per_layer:
      grad.per_expert.assign(E, 0.0);
      for (int64_t e = 0; e < E; ++e)
        grad.per_expert[e] = coef * double(E) * (double(own->tokens_per_expert[e]) / (N * double(k))) / N;
      break;
    case AuxLossType::sequence:
      grad.sequence_scale = coef * reduction.row_weight();  // a mean over this rank's rows
      break;
  }
  return grad;
}

template <class T>
void Model<T>::Impl::add_indexer_loss(StepResult& result) const {
  if (result.indexer.empty()) return;
  LossTerm term{"indexer_loss", 0.0, indexer.coef,
                "KL(main attention summed over heads ‖ softmax(indexer scores)), mean over tokens and sparse layers"};
  for (const IndexerLayerStats& s : result.indexer) term.value += s.loss / double(result.indexer.size());
  result.aux.push_back(term);
}

#define TRILLION_INSTANTIATE(T)                                                                            \
  template const MoeDims* Model<T>::Impl::first_moe() const;                                               \
  template void Model<T>::Impl::reduce_statistics(StepResult&) const;                                      \
  template void Model<T>::Impl::add_router_losses(StepResult&, int64_t) const;                             \
  template MoeBalanceGrad Model<T>::Impl::balance_grad(const StepResult&, int, int64_t, double) const;     \
  template void Model<T>::Impl::add_indexer_loss(StepResult&) const;
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
