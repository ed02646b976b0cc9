// ShardLayout: which elements of the trainable parameters one rank owns under FSDP, and where they
// sit in its shard (DESIGN.md, "Parameters": the flat buffers are unit-major inside each group).
//
// Every (trainable group, unit) range of the parameter table is split over the ranks in order:
// rank r owns the r-th of `ranks` contiguous pieces (sizes differ by at most one element: the first
// count % ranks ranks take one more), so any number of ranks shards any table. A rank's shard
// stores its pieces back to back, unit after unit; its gradients and optimizer moments have the
// shard's layout. One rank owns everything, at the same offsets as the flat buffers.
//
//   flat [trainable_size]:  | unit 0: r0 r1 … | unit 1: r0 r1 … | …
//   shard of rank r:        | unit 0's piece r | unit 1's piece r | …
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"
#include "parallel/process_group.h"

namespace trillion {

class ShardLayout {
 public:
  ShardLayout(const ParamTable& table, int rank, int ranks);

  // One unit range of the flat buffers and how it is split.
  struct Unit {
    int table_unit = 0;               // the parameter table's unit (0: embeddings and head; 1 + layer)
    int64_t begin = 0;                // in the flat buffers
    std::vector<int64_t> counts;      // [ranks] elements of each rank's piece
    std::vector<int64_t> displs;      // [ranks] offset of each piece inside the unit
    int64_t shard_offset = 0;         // where this rank's piece starts in its shard
  };
  // A run of owned elements: flat [global, global + count) at shard [local, local + count).
  struct Slice {
    int64_t global = 0, local = 0, count = 0;
  };

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  const std::vector<Unit>& units() const { return units_; }
  const std::vector<Slice>& slices() const { return slices_; }  // in flat order; empty pieces left out
  int64_t shard_size() const { return shard_size_; }            // elements of this rank's shard

  // shard[shard_size] ← this rank's elements of flat[trainable_size].
  template <class T>
  void copy_to_shard(const T* flat, T* shard) const;
  // Collectives over `group` (its ranks are this layout's), unit by unit:
  // shard[shard_size] ← this rank's elements of Σ_ranks flat[trainable_size] (the gradients);
  template <class T>
  void reduce_scatter(const ProcessGroup& group, const T* flat, T* shard) const;
  // flat[trainable_size] ← every rank's shard, each at its elements (the updated parameters).
  template <class T>
  void all_gather(const ProcessGroup& group, const T* shard, T* flat) const;

 private:
  int rank_ = 0, ranks_ = 1;
  std::vector<Unit> units_;
  std::vector<Slice> slices_;
  int64_t shard_size_ = 0;
};

}  // namespace trillion
