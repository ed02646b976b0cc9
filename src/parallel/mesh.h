// ParallelMesh: the layout of a parallel run (docs/architecture.md, "The parallel layout"): world = ep × edp,
// rank = edp index · ep + ep index. Dense parameters are sharded over the world; the routed
// experts are split over the expert-parallel group (the ep ranks of one edp index) and each ep
// slice sharded over its edp group (the edp ranks of one ep index). Context parallelism divides
// the edp ranks further: cp consecutive edp indices (at one ep index) form a context-parallel group,
// which shares its rows of the batch and splits each sequence (parallel/context_parallel.h); FSDP
// still shards over every rank, cp included, as Megatron-Core does. One object validates the degrees
// against the world and the model, and the batch against the ranks, with errors naming the flag and
// the values.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "parallel/process_group.h"

namespace trillion {

class ParallelMesh {
 public:
  // Every rank of `world` builds it (the groups are split collectively); `world` must outlive it.
  ParallelMesh(const ProcessGroup& world, int ep, const ModelConfig& config, int cp = 1);

  const ProcessGroup& world() const { return world_; }
  const ProcessGroup& ep_group() const { return ep_group_; }    // the ranks of this rank's edp index
  const ProcessGroup& edp_group() const { return edp_group_; }  // the ranks of this rank's ep index
  const ProcessGroup& cp_group() const { return cp_group_; }    // the ranks sharing this rank's rows
  int ep() const { return ep_; }
  int edp() const { return world_.size() / ep_; }
  int cp() const { return cp_; }
  // The batch's shares (one per context-parallel group) and this rank's.
  int data_shares() const { return world_.size() / cp_; }
  int data_share() const { return world_.rank() / ep_ / cp_ * ep_ + world_.rank() % ep_; }
  // A rank's place in its context-parallel group (which of the split's parts it holds).
  static int cp_rank(int rank, int ep, int cp) { return rank / ep % cp; }

  // Fails naming --ep unless `ep` divides `ranks` and the model's routed experts, and naming --cp
  // unless `cp` divides the edp ranks (a mesh of that shape, checked without building one: the
  // constructor's check, and `trillion plan`'s).
  static void validate(int ranks, int ep, const ModelConfig& config, int cp = 1);

  // The rows of a global batch each of `ranks` ranks trains (every rank its own share of every
  // micro-batch); fails naming `flag` unless the ranks split it evenly.
  static int64_t rows_per_rank(int64_t batch, int ranks, const std::string& flag);
  int64_t rows_per_rank(int64_t batch, const std::string& flag) const {
    return rows_per_rank(batch, data_shares(), flag);
  }

 private:
  const ProcessGroup& world_;
  int ep_ = 1, cp_ = 1;
  ProcessGroup ep_group_, edp_group_, cp_group_;
};

}  // namespace trillion
