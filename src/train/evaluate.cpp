// Batched validation loss over evaluation windows (see evaluate.h).
#include "train/evaluate.h"

#include <algorithm>

#include "core/error.h"
#include "data/sampler.h"

namespace trillion {

template <class T>
EvalResult evaluate_loss(Model<T>& model, const TokenStreams& streams, int64_t seq_len, int64_t batch,
                         int64_t max_batches, ContextParallel* context) {
  TRILLION_CHECK(seq_len > 0 && batch > 0, "seq_len ", seq_len, " batch ", batch);
  EvalResult result;
  result.total_windows = eval_window_count(streams, seq_len);
  result.total_targets = eval_target_count(streams);
  const int64_t total_batches = (result.total_windows + batch - 1) / batch;
  const int64_t batches = max_batches > 0 ? std::min(max_batches, total_batches) : total_batches;
  std::vector<int32_t> inputs(batch * seq_len), targets(batch * seq_len);  // [batch, seq_len] each
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * batch;
    const int64_t rows = std::min(batch, result.total_windows - first);
    for (int64_t r = 0; r < rows; ++r) {
      eval_window(streams, seq_len, first + r, inputs.data() + r * seq_len, targets.data() + r * seq_len);
    }
    if (context != nullptr) {  // this rank's tokens of each window, in place
      context->split().take_local(inputs.data(), inputs.data(), rows, context->rank());
      context->split().take_local(targets.data(), targets.data(), rows, context->rank());
    }
    const int64_t held = context != nullptr ? context->split().local_len(context->rank()) : seq_len;
    const StepResult part = model.forward_loss(inputs.data(), targets.data(), rows, held);
    result.loss_sum += part.lm.loss_sum;
    result.target_count += part.lm.count;
    result.windows += rows;
    if (result.indexer.empty()) result.indexer.resize(part.indexer.size());
    for (size_t l = 0; l < part.indexer.size(); ++l) {  // weighted by the batch's windows
      result.indexer[l].layer = part.indexer[l].layer;
      result.indexer[l].loss += part.indexer[l].loss * double(rows);
      result.indexer[l].selected_mass += part.indexer[l].selected_mass * double(rows);
      result.indexer[l].best_mass += part.indexer[l].best_mass * double(rows);
    }
  }
  for (IndexerLayerStats& layer : result.indexer) {
    layer.loss /= double(result.windows);
    layer.selected_mass /= double(result.windows);
    layer.best_mass /= double(result.windows);
  }
  if (context != nullptr) {
    double sums[2] = {result.loss_sum, double(result.target_count)};
    context->sum_over_group(sums, 2);
    result.loss_sum = sums[0];
    result.target_count = static_cast<int64_t>(sums[1]);
  }
  return result;
}

template EvalResult evaluate_loss<float>(Model<float>&, const TokenStreams&, int64_t, int64_t, int64_t,
                                         ContextParallel*);
template EvalResult evaluate_loss<double>(Model<double>&, const TokenStreams&, int64_t, int64_t, int64_t,
                                          ContextParallel*);

}  // namespace trillion
