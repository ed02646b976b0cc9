// StepResult, MoeLayerStats and DecisionLog (see step.h).
#include "model/step.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace trillion {

StatisticsReduction::StatisticsReduction(int row_shares, double token_share,
                                         std::function<void(double* values, int64_t count)> sum)
    : row_shares_(row_shares), token_share_(token_share), sum_(std::move(sum)) {
  TRILLION_CHECK(row_shares >= 1 && token_share > 0.0 && token_share <= 1.0 && sum_,
                 "statistics reduction over ", row_shares, " row shares, holding ", token_share,
                 " of the tokens, needs a sum");
}

const char* indexer_mode_name(IndexerMode mode) {
  switch (mode) {
    case IndexerMode::dense: return "dense";
    case IndexerMode::warmup: return "warmup";
    case IndexerMode::sparse: return "sparse";
  }
  return "?";
}

IndexerMode indexer_mode_from_name(const std::string& name) {
  for (IndexerMode mode : {IndexerMode::dense, IndexerMode::warmup, IndexerMode::sparse})
    if (name == indexer_mode_name(mode)) return mode;
  fail("indexer mode \"", name, "\": expected dense, warmup or sparse");
}

double MoeLayerStats::max_over_mean() const {
  if (tokens_per_expert.empty()) return 0.0;
  int64_t total = 0, most = 0;
  for (int64_t count : tokens_per_expert) total += count, most = std::max(most, count);
  const double mean = double(total) / double(tokens_per_expert.size());
  return mean > 0.0 ? double(most) / mean : 0.0;
}

double StepResult::objective(const LossScales& scales) const {
  double total = lm.loss_sum * scales.lm;
  for (const LossTerm& term : aux) total += term.coef * term.value * scales.aux;
  return total;
}

const std::vector<int32_t>& DecisionLog::recorded(DecisionKind kind, int layer) const {
  const auto it = decisions_.find({static_cast<int>(kind), layer});
  TRILLION_CHECK(it != decisions_.end(), "no decision of kind ", static_cast<int>(kind), " for layer ", layer);
  return it->second;
}

const int32_t* DecisionLog::decide(DecisionKind kind, int layer, int64_t count,
                                   const std::function<void(int32_t*)>& decide) {
  const std::pair<int, int> key{static_cast<int>(kind), layer};
  if (replaying_) {
    const auto it = decisions_.find(key);
    TRILLION_CHECK(it != decisions_.end(), "no recorded decision for layer ", layer, " to replay");
    TRILLION_CHECK(static_cast<int64_t>(it->second.size()) == count, "recorded decision of layer ", layer, " has ",
                   it->second.size(), " values, the pass asks for ", count);
    return it->second.data();
  }
  std::vector<int32_t>& values = decisions_[key];
  values.assign(count, 0);
  decide(values.data());
  return values.data();
}

}  // namespace trillion
