// The run's mesh and its checks. See mesh.h.
#include "parallel/mesh.h"

#include "core/error.h"

namespace trillion {

void ParallelMesh::validate(int ranks, int ep, const ModelConfig& config, int cp) {
  if (ep < 1 || ranks % ep != 0) fail("--ep ", ep, " must be ≥ 1 and divide the ", ranks, " ranks");
  if (ep > 1 && (config.num_experts == 0 || config.num_experts % ep != 0)) {
    fail("--ep ", ep, ": the model's ", config.num_experts, " routed experts must split evenly over ", ep, " ranks");
  }
  if (cp < 1 || (ranks / ep) % cp != 0)
    fail("--cp ", cp, " must be ≥ 1 and divide the ", ranks / ep, " ranks of each expert-data-parallel group (", ranks,
         " ranks / --ep ", ep, ")");
}

int64_t ParallelMesh::rows_per_rank(int64_t batch, int ranks, const std::string& flag) {
  if (batch < 1) fail(flag, " must be ≥ 1, got ", batch);
  if (batch % ranks != 0) {
    fail(flag, " ", batch, " must be divisible by the ", ranks, " ranks that split the batch (each trains batch / ",
         ranks, " rows of every micro-batch; the ranks of a --cp group share theirs)");
  }
  return batch / ranks;
}

ParallelMesh::ParallelMesh(const ProcessGroup& world, int ep, const ModelConfig& config, int cp)
    : world_(world),
      ep_((validate(world.size(), ep, config, cp), ep)),  // validated before any split
      cp_(cp),
      ep_group_(world.split(world.rank() / ep, world.rank() % ep)),
      edp_group_(world.split(world.rank() % ep, world.rank() / ep)),
      cp_group_(world.split(data_share(), cp_rank(world.rank(), ep, cp))) {}

}  // namespace trillion
