// ParallelPlan: a run's parallel layout applied to a model from outside, as TorchTitan's
// `parallelize` does (docs/architecture.md, "The parallel layout"). From the mesh it sets up, in
// one place for training, the distributed gradient check and the benches:
//   - the reduction of each forward's statistics (routing loads, balance and indexer losses) over
//     the world's ranks;
//   - FSDP (parallel/fsdp.h): the rank's shard of the parameters, gradients and (through the
//     layout) the optimizer's moments, the units gathered and released by the model's unit hooks;
//   - the expert exchange over the mesh's ep group (parallel/expert_parallel.h) when ep > 1;
//   - context parallelism over the mesh's cp group (parallel/context_parallel.h) when cp > 1;
//   - the parameters and gradients an optimizer step updates: the shard, or the whole buffers on
//     one rank.
// The model knows no rank count: it sees hooks, a reduction and an exchange. The plan and the
// layout must outlive the model's use of them.
#pragma once

#include <cstdint>
#include <optional>

#include "model/model.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/shard_layout.h"

namespace trillion {

template <class T>
class ParallelPlan {
 public:
  // One rank (a world of 1) leaves the model as it is. exchange_chunks: the expert exchange's
  // token chunks (parallel/expert_parallel.h, "Overlap"); seq_len: tokens per whole sequence, which
  // context parallelism splits (needed when cp > 1).
  ParallelPlan(Model<T>& model, const ParallelMesh& mesh, const ShardLayout& layout, int exchange_chunks = 1,
               int64_t seq_len = 0) {
    const ProcessGroup& world = mesh.world();
    if (mesh.cp() > 1) {
      TRILLION_CHECK(seq_len > 0, "context parallelism needs the sequence length to split");
      context_.emplace(mesh.cp_group(), seq_len);
      model.set_context_exchange(&*context_);
    }
    if (world.size() > 1) {
      // Every rank holds its rows' tokens, or under context parallelism its part of them.
      const int row_shares = world.size() / mesh.cp();
      const double token_share =
          context_ ? double(context_->split().local_len(mesh.cp_group().rank())) / double(seq_len * row_shares)
                   : 1.0 / row_shares;
      model.set_statistics_reduction(StatisticsReduction(
          row_shares, token_share, [&world](double* values, int64_t count) { world.all_reduce_sum(values, count); }));
      fsdp_.emplace(model, world, mesh.edp_group(), layout);
      model.set_unit_hooks(fsdp_->hooks());
    }
    if (mesh.ep() > 1) {
      experts_.emplace(mesh.ep_group(), exchange_chunks);
      model.set_expert_exchange(&*experts_);
    }
    step_params_ = fsdp_ ? fsdp_->shard_params() : model.params();
    step_grads_ = fsdp_ ? fsdp_->shard_grads() : model.grads();
  }
  ParallelPlan(const ParallelPlan&) = delete;
  ParallelPlan& operator=(const ParallelPlan&) = delete;

  Fsdp<T>* fsdp() { return fsdp_ ? &*fsdp_ : nullptr; }                // null on one rank
  ExpertParallel* experts() { return experts_ ? &*experts_ : nullptr; }  // null without ep
  ContextParallel* context() { return context_ ? &*context_ : nullptr; }  // null without cp
  T* step_params() const { return step_params_; }  // [shard size] or every parameter on one rank
  T* step_grads() const { return step_grads_; }

 private:
  std::optional<Fsdp<T>> fsdp_;
  std::optional<ExpertParallel> experts_;
  std::optional<ContextParallel> context_;
  T* step_params_ = nullptr;
  T* step_grads_ = nullptr;
};

}  // namespace trillion
