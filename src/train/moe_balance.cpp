// Step-level MoE statistics and the aux-loss-free bias update (see moe_balance.h).
#include "train/moe_balance.h"

#include <algorithm>

#include "core/error.h"

namespace trillion {

void StepStats::add(const StepResult& micro_batch) {
  if (micro_batches_ == 0) {
    aux_ = micro_batch.aux;
    layers_ = micro_batch.moe;
    indexer_ = micro_batch.indexer;
  } else {
    TRILLION_CHECK(aux_.size() == micro_batch.aux.size() && layers_.size() == micro_batch.moe.size() &&
                       indexer_.size() == micro_batch.indexer.size(),
                   "micro-batches report different loss terms, MoE layers or sparse layers");
    for (size_t l = 0; l < indexer_.size(); ++l) {
      indexer_[l].loss += micro_batch.indexer[l].loss;
      indexer_[l].selected_mass += micro_batch.indexer[l].selected_mass;
      indexer_[l].best_mass += micro_batch.indexer[l].best_mass;
    }
    for (size_t i = 0; i < aux_.size(); ++i) aux_[i].value += micro_batch.aux[i].value;
    for (size_t l = 0; l < layers_.size(); ++l) {
      MoeLayerStats& sum = layers_[l];
      const MoeLayerStats& part = micro_batch.moe[l];
      for (size_t e = 0; e < sum.tokens_per_expert.size(); ++e) {
        sum.tokens_per_expert[e] += part.tokens_per_expert[e];
        sum.rank_tokens_per_expert[e] += part.rank_tokens_per_expert[e];
        sum.prob_sums[e] += part.prob_sums[e];
      }
      sum.dropped += part.dropped;
      sum.sequence_aux += part.sequence_aux;
      sum.z_loss += part.z_loss;
    }
  }
  ++micro_batches_;
}

double StepStats::aux_objective() const {
  double total = 0.0;
  for (const LossTerm& term : aux_) total += term.coef * term.value;
  return micro_batches_ > 0 ? total / double(micro_batches_) : 0.0;
}

void StepStats::write_metrics(nlohmann::json& record) const {
  for (const LossTerm& term : aux_) record[term.name] = term.value / double(micro_batches_);
  if (!indexer_.empty()) {
    double mass = 0.0;
    nlohmann::json layers = nlohmann::json::array();
    for (const IndexerLayerStats& s : indexer_) {
      mass += s.selected_mass / double(micro_batches_ * int64_t(indexer_.size()));
      layers.push_back({{"layer", s.layer},
                        {"indexer_loss", s.loss / double(micro_batches_)},
                        {"selected_mass", s.selected_mass / double(micro_batches_)},
                        {"best_mass", s.best_mass / double(micro_batches_)}});
    }
    record["indexer_selected_mass"] = mass;
    record["sparse_layers"] = layers;
  }
  if (layers_.empty()) return;
  double worst = 0.0;
  int64_t dropped = 0;
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeLayerStats& s : layers_) {
    worst = std::max(worst, s.max_over_mean());
    dropped += s.dropped;
    nlohmann::json layer = {{"layer", s.layer},
                            {"tokens_per_expert", s.tokens_per_expert},
                            {"max_over_mean", s.max_over_mean()},
                            {"dropped", s.dropped}};
    for (const LossTerm& term : aux_) {  // the per-layer values of the terms formed per layer
      if (term.name == "router_z_loss") layer["router_z_loss"] = s.z_loss / double(micro_batches_);
      if (term.name == "aux_loss" && s.sequence_aux != 0.0) layer["aux_loss"] = s.sequence_aux / double(micro_batches_);
    }
    layers.push_back(layer);
  }
  record["expert_load_max_over_mean"] = worst;
  record["dropped_tokens"] = dropped;
  record["moe_layers"] = layers;
}

template <class T>
void aux_free_bias_update(T* bias, const std::vector<int64_t>& load, double rate) {
  int64_t total = 0;
  for (int64_t count : load) total += count;
  const double mean = double(total) / double(load.size());
  for (size_t e = 0; e < load.size(); ++e) {
    const double gap = mean - double(load[e]);
    bias[e] += static_cast<T>(rate * double((gap > 0.0) - (gap < 0.0)));
  }
}

template void aux_free_bias_update<float>(float*, const std::vector<int64_t>&, double);
template void aux_free_bias_update<double>(double*, const std::vector<int64_t>&, double);

}  // namespace trillion
