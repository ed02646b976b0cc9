// One process's gradient against the distributed step's. See distributed_gradient_check.h.
#include "parallel/distributed_gradient_check.h"

#include <optional>

#include "core/error.h"
#include "core/memory.h"
#include "model/model.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/shard_layout.h"

namespace trillion {

std::vector<TensorCheck> check_distributed_gradients(const ModelConfig& config, const GradientCheckOptions& options,
                                                     const ProcessGroup& world, int ep) {
  const int ranks = world.size();
  if (options.batch % ranks != 0)
    fail("gradient check: --batch ", options.batch, " must be divisible by the ", ranks, " ranks");
  const ParallelMesh mesh(world, ep, config);
  const GradientCheckBatch batch = gradient_check_batch(config, options);
  const auto prepared = [&](Model<double>& model) {
    model.init_weights(options.seed);
    if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
    model.zero_grads();
  };

  Model<double> whole(config);  // this process, the whole batch
  prepared(whole);
  whole.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch, options.seq, batch.scales);

  Model<double> parts(config);  // this rank's rows, as the trainer runs them
  prepared(parts);
  parts.set_statistics_reduction({ranks, [&world](double* values, int64_t count) { world.all_reduce_sum(values, count); }});
  const ShardLayout layout(parts.table(), world.rank(), ranks, ep);
  Fsdp<double> fsdp(parts, world, mesh.edp_group(), layout);
  parts.set_unit_hooks(fsdp.hooks());
  std::optional<ExpertParallel> experts;
  if (ep > 1) {
    experts.emplace(mesh.ep_group());
    parts.set_expert_exchange(&*experts);
  }
  const int64_t rows = options.batch / ranks, at = world.rank() * rows * options.seq;
  parts.forward_backward(batch.tokens.data() + at, batch.targets.data() + at, rows, options.seq, batch.scales);
  Buffer<double> gathered(parts.table().trainable_size());  // [trainable_size]
  layout.gather_everything(world, fsdp.shard_grads(), gathered.data());
  return compare_gradients(parts.table(), gathered.data(), whole.grads());
}

}  // namespace trillion
