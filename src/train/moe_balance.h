// The MoE side of a training step: routing statistics of the step's micro-batches aggregated per
// MoE layer (what metrics.jsonl reports), and the aux-loss-free balancing update that runs after
// each optimizer step (DeepSeek-V3: b_e += rate · sign(mean load − load_e), loads over the step).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/step.h"

namespace trillion {

// Sums of the per-layer statistics over the micro-batches of one optimizer step, and the mean of
// each auxiliary loss term.
class StepStats {
 public:
  void add(const StepResult& micro_batch);
  const std::vector<MoeLayerStats>& layers() const { return layers_; }
  // metrics.jsonl fields: each aux term's mean ("aux_loss", "indexer_loss", …); with sparse layers
  // "indexer_selected_mass" (mean over layers) and "sparse_layers": [{layer, indexer_loss,
  // selected_mass, best_mass}]; with MoE layers "expert_load_max_over_mean" (the worst layer),
  // "dropped_tokens", and "moe_layers": [{layer, tokens_per_expert, max_over_mean, dropped}].
  void write_metrics(nlohmann::json& record) const;
  // Mean over the micro-batches of Σ coef · value.
  double aux_objective() const;

 private:
  int64_t micro_batches_ = 0;
  std::vector<LossTerm> aux_;  // sums of the values
  std::vector<MoeLayerStats> layers_;
  std::vector<IndexerLayerStats> indexer_;  // sums over the micro-batches
};

// bias[E] += rate · sign(mean(load) − load[e]) (sign 0 → 0).
template <class T>
void aux_free_bias_update(T* bias, const std::vector<int64_t>& load, double rate);

}  // namespace trillion
