// One process's gradient against the distributed step's. See distributed_gradient_check.h.
#include "parallel/distributed_gradient_check.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/memory.h"
#include "model/model.h"
#include "parallel/mesh.h"
#include "parallel/parallel_plan.h"
#include "parallel/shard_layout.h"

namespace trillion {

std::vector<TensorCheck> check_distributed_gradients(const ModelConfig& config, const GradientCheckOptions& options,
                                                     const ProcessGroup& world, int ep, int cp) {
  const ParallelMesh mesh(world, ep, config, cp);
  const int64_t rows = mesh.rows_per_rank(options.batch, "gradient check: --batch");
  const GradientCheckBatch batch = gradient_check_batch(config, options);
  const int64_t at = mesh.data_share() * rows * options.seq;  // this rank's first row's first token
  const auto prepared = [&](Model<double>& model, const LoraDropoutPass& dropout) {
    model.init_weights(options.seed);
    draw_lora_b(model, options.seed + 1);  // as the one-process check: A's gradient is 0 at B = 0
    model.set_lora_dropout(dropout);
    if (model.sparse_layers() > 0) model.set_indexer_training(options.indexer_mode, options.indexer_loss_coef);
    if (options.document_eos >= 0) model.set_document_mask(options.document_eos);
    model.zero_grads();
  };

  Model<double> whole(config);  // this process, the whole batch
  prepared(whole, LoraDropoutPass{.seed = options.seed});
  const StepResult whole_result =
      whole.forward_backward(batch.tokens.data(), batch.targets.data(), options.batch, options.seq, batch.scales);

  Model<double> parts(config);  // this rank's rows (and with cp its tokens of them), as the trainer runs them
  LoraDropoutPass dropout{.seed = options.seed, .first_token = at};
  if (cp > 1) {
    dropout.positions = ContextSplit(options.seq, cp).positions(mesh.cp_group().rank());
    dropout.seq = options.seq;
  }
  prepared(parts, dropout);
  const ShardLayout layout(parts.table(), world.rank(), world.size(), ep);
  ParallelPlan<double> plan(parts, mesh, layout, 1, options.seq);
  const int64_t local = cp > 1 ? static_cast<int64_t>(dropout.positions.size()) : options.seq;
  std::vector<int32_t> tokens(batch.tokens.begin() + at, batch.tokens.begin() + at + rows * local);  // [rows, local]
  std::vector<int32_t> targets(batch.targets.begin() + at, batch.targets.begin() + at + rows * local);
  if (const ContextParallel* context = plan.context()) {
    context->split().take_local(tokens.data(), batch.tokens.data() + at, rows, mesh.cp_group().rank());
    context->split().take_local(targets.data(), batch.targets.data() + at, rows, mesh.cp_group().rank());
  }
  const StepResult part_result = parts.forward_backward(tokens.data(), targets.data(), rows, local, batch.scales);
  Buffer<double> gathered(parts.table().trainable_size());
  layout.gather_everything(world, plan.step_grads(), gathered.data());
  std::vector<TensorCheck> checks = compare_gradients(parts.table(), gathered.data(), whole.grads());
  // The loss terms too: the LM loss summed over the ranks, the reduced auxiliary terms as they are.
  const auto compare = [&](const std::string& name, double value, double reference) {
    TensorCheck check{.name = name, .checked = 1};
    check.max_abs_err = std::abs(value - reference);
    check.max_ref = std::abs(reference);
    check.rel_err = check.max_ref > 0.0 ? check.max_abs_err / check.max_ref : check.max_abs_err;
    checks.push_back(check);
  };
  compare("loss.lm_loss_sum", world.all_reduce_sum(part_result.lm.loss_sum), whole_result.lm.loss_sum);
  // An evaluation pass (forward_loss) too, after the step: the same rows, the same weights.
  const double part_eval = parts.forward_loss(tokens.data(), targets.data(), rows, local).lm.loss_sum;
  const double whole_eval =
      whole.forward_loss(batch.tokens.data(), batch.targets.data(), options.batch, options.seq).lm.loss_sum;
  compare("eval.lm_loss_sum", world.all_reduce_sum(part_eval), whole_eval);
  if (part_result.aux.size() != whole_result.aux.size())
    fail("distributed gradient check: ", part_result.aux.size(), " auxiliary loss terms, one process has ",
         whole_result.aux.size());
  for (size_t i = 0; i < whole_result.aux.size(); ++i) {
    if (part_result.aux[i].name != whole_result.aux[i].name)
      fail("distributed gradient check: auxiliary loss term ", i, " is ", part_result.aux[i].name,
           ", one process's is ", whole_result.aux[i].name);
    compare("loss." + whole_result.aux[i].name, part_result.aux[i].value, whole_result.aux[i].value);
  }
  if (part_result.indexer.size() != whole_result.indexer.size())
    fail("distributed gradient check: ", part_result.indexer.size(), " indexer layers reported, one process has ",
         whole_result.indexer.size());
  for (size_t i = 0; i < whole_result.indexer.size(); ++i) {
    const std::string layer = std::to_string(whole_result.indexer[i].layer);
    compare("indexer.selected_mass." + layer, part_result.indexer[i].selected_mass,
            whole_result.indexer[i].selected_mass);
    compare("indexer.best_mass." + layer, part_result.indexer[i].best_mass, whole_result.indexer[i].best_mass);
  }
  return checks;
}

}  // namespace trillion
