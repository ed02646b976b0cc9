// ParallelMesh: the layout of a parallel run (docs/architecture.md, "The parallel layout"): world = ep × edp,
// rank = edp index · ep + ep index. Dense parameters are sharded over the world; the routed
// experts are split over the expert-parallel group (the ep ranks of one edp index) and each ep
// slice sharded over its edp group (the edp ranks of one ep index). One object validates the
// degrees against the world and the model, and the batch against the ranks, with errors naming the
// flag and the values.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "parallel/process_group.h"

namespace trillion {

class ParallelMesh {
 public:
  // Every rank of `world` builds it (the groups are split collectively); `world` must outlive it.
  ParallelMesh(const ProcessGroup& world, int ep, const ModelConfig& config);

  const ProcessGroup& world() const { return world_; }
  const ProcessGroup& ep_group() const { return ep_group_; }    // the ranks of this rank's edp index
  const ProcessGroup& edp_group() const { return edp_group_; }  // the ranks of this rank's ep index
  int ep() const { return ep_; }
  int edp() const { return world_.size() / ep_; }

  // Fails naming --ep unless `ep` divides `ranks` and the model's routed experts (a mesh of that
  // shape, checked without building one: the constructor's check, and `trillion plan`'s).
  static void validate(int ranks, int ep, const ModelConfig& config);

  // The rows of a global batch each of `ranks` ranks trains (every rank its own share of every
  // micro-batch); fails naming `flag` unless the ranks split it evenly.
  static int64_t rows_per_rank(int64_t batch, int ranks, const std::string& flag);
  int64_t rows_per_rank(int64_t batch, const std::string& flag) const {
    return rows_per_rank(batch, world_.size(), flag);
  }

 private:
  const ProcessGroup& world_;
  int ep_ = 1;
  ProcessGroup ep_group_, edp_group_;
};

}  // namespace trillion
