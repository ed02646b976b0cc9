// One process's gradient against the distributed step's. See distributed_gradient_check.h.
#include "parallel/distributed_gradient_check.h"

#include "core/error.h"
#include "core/memory.h"
#include "model/model.h"
#include "parallel/mesh.h"
#include "parallel/parallel_plan.h"
#include "parallel/shard_layout.h"

namespace trillion {

std::vector<TensorCheck> check_distributed_gradients(const ModelConfig& config, const GradientCheckOptions& options,
                                                     const ProcessGroup& world, int ep) {
  const ParallelMesh mesh(world, ep, config);
  const int64_t rows = mesh.rows_per_rank(options.batch, "gradient check: --batch");
  const GradientCheckBatch batch = gradient_check_batch(config, options);
  const int64_t at = world.rank() * rows * options.seq;  // this rank's first token
  const auto prepared = [&](Model<double>& model, int64_t first_token) {
    model.init_weights(options.seed);
    draw_lora_b(model, options.seed + 1);  // as the one-process check: A's gradient is 0 at B = 0
    model.set_lora_dropout(LoraDropoutPass{options.seed, 0, first_token});
    if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
    model.zero_grads();
  };

  Model<double> whole(config);  // this process, the whole batch
  prepared(whole, 0);
  whole.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch, options.seq, batch.scales);

  Model<double> parts(config);  // this rank's rows, as the trainer runs them
  prepared(parts, at);
  const ShardLayout layout(parts.table(), world.rank(), world.size(), ep);
  const ParallelPlan<double> plan(parts, mesh, layout);
  parts.forward_backward(batch.tokens.data() + at, batch.targets.data() + at, rows, options.seq, batch.scales);
  Buffer<double> gathered(parts.table().trainable_size());  // [trainable_size]
  layout.gather_everything(world, plan.step_grads(), gathered.data());
  return compare_gradients(parts.table(), gathered.data(), whole.grads());
}

}  // namespace trillion
