// Validation loss of a model over the evaluation windows of a token stream (data/sampler.h:
// every non-overlapping window in order, so each token after the first is a target exactly once),
// batched, optionally truncated to the first max_batches batches. Under context parallelism (the
// model's exchange, `context`) each rank of a group evaluates its tokens of the same windows and the
// loss sums over the group. With the indexers' loss on (Model::set_indexer_training), each sparse
// layer's indexer statistics are averaged over the evaluated tokens: in the dense mode, the main
// attention's mass on the indexer's selection (its recall of dense attention) and the most any
// selection of as many keys holds; under context parallelism, over this rank's tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "data/shards.h"
#include "model/model.h"
#include "parallel/context_parallel.h"

namespace trillion {

struct EvalResult {
  double loss_sum = 0.0;        // nats, over counted targets
  int64_t target_count = 0;     // counted targets (non-ignored)
  int64_t total_targets = 0;    // targets of the whole split (eval_target_count)
  int64_t windows = 0;          // windows evaluated
  int64_t total_windows = 0;    // windows of the whole stream
  std::vector<IndexerLayerStats> indexer;  // one per sparse layer when its loss is on: means over the tokens
  double loss() const { return target_count > 0 ? loss_sum / static_cast<double>(target_count) : 0.0; }
};

// max_batches ≤ 0 evaluates every window.
template <class T>
EvalResult evaluate_loss(Model<T>& model, const TokenStreams& streams, int64_t seq_len, int64_t batch,
                         int64_t max_batches, ContextParallel* context = nullptr);

}  // namespace trillion
