// ShardLayout: which elements of the parameters one rank owns under FSDP (with expert
// parallelism), and where they sit in its shard (docs/architecture.md, "Parameters and the flat
// buffers": the flat buffers are group-major, then unit-major). The trainable groups' pieces form
// the shard that gradients and optimizer moments share; a LoRA base's frozen groups are split the
// same way into a second, frozen shard of parameters alone (gathered to use, never reduced).
//
// Mesh: world = ep × edp, rank = edp index · ep + ep index. A range is split over a group in order:
// the group's rank g owns the g-th of its contiguous pieces (sizes differ by at most one element),
// so any number of ranks shards any table.
//   - dense (and LoRA) units, and with ep = 1 the expert units too: each (group, unit) range split
//     over the world;
//   - with ep > 1, each expert tensor [E, …] of a unit (the expert group's, and the routed experts'
//     LoRA pairs of expert_lora) is cut into ep slices of E / ep experts; the
//     slice of ep index p belongs to the ranks of ep index p (its edp group) and is split over them.
//     A rank never holds the other slices (their experts run elsewhere).
// A rank's shard stores its pieces back to back in flat order; its gradients and optimizer moments
// have the shard's layout. One rank owns everything, at the same offsets as the flat buffers.
//
//   flat [sharded_size]:    | trainable: unit 0: r0 r1 … | unit 1: … | frozen: unit 0: r0 r1 … | …
//   shard of rank r:        | unit 0's piece r | unit 1's piece r | …  (trainable)
//   frozen shard of rank r: | unit 0's piece r | unit 1's piece r | …
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"
#include "parallel/process_group.h"

namespace trillion {

class ShardLayout {
 public:
  ShardLayout(const ParamTable& table, int rank, int ranks, int ep = 1);

  // One range of the flat buffers and how it is split.
  struct Unit {
    int table_unit = 0;             // the parameter table's unit (model.h's unit_order)
    int64_t begin = 0;              // in the flat buffers
    int64_t count = 0;              // elements of the range
    bool over_world = true;         // split over the world; else over its ep slice's edp group
    bool held = false;              // this rank holds a piece (and gathers the range to use it)
    bool frozen = false;            // a frozen group's range: its piece in the frozen shard
    std::vector<int64_t> counts;    // [group ranks] elements of each piece, in the group's order
    std::vector<int64_t> displs;    // [group ranks] offset of each piece inside the range
    std::vector<int64_t> world_counts, world_displs;  // [ranks] the same by world rank (0: holds none)
    int64_t shard_offset = 0;       // where this rank's piece starts in its (frozen) shard, when held
    // Elements a collective over the range moves for the group's rank `group_rank`: the range but
    // its own piece, in or out (the volume of a ring algorithm).
    int64_t moved_elements(int group_rank) const { return count - counts[group_rank]; }
  };
  // A run of owned elements: flat [global, global + count) at shard [local, local + count).
  struct Slice {
    int64_t global = 0, local = 0, count = 0;
  };

  // A run of a range's elements that FSDP gathers alike (parallel/fsdp.h): under the bf16
  // precision a range is gathered in runs of its tensors' uses (model/params.h, ParamUse; padding
  // joins the run before it), products-only runs as bf16 and the others as float; otherwise the
  // whole range is one run of values.
  struct Run {
    int64_t begin = 0, count = 0;          // inside the range
    ParamUse use = ParamUse::values;
    std::vector<int64_t> counts, displs;   // [group ranks] each rank's part of the run, inside it
    int64_t send_offset = 0;               // where this rank's part starts inside its piece
    // Bytes a rank holds of the run gathered (float parameters: 2 per element as bf16, 4 as float,
    // 6 both) and bytes it receives (the run but its own part).
    int64_t held_bytes(int64_t element_bytes) const;
    int64_t moved_bytes(int64_t element_bytes, int group_rank) const;
  };
  // The runs of `range` (one of units()) as this rank gathers them, bf16 or not.
  std::vector<Run> gather_runs(const ParamTable& table, const Unit& range, bool bf16) const;
  // Where this rank keeps its part of each gather run of its frozen ranges (FSDP's frozen shard as
  // held): with `bf16` (bf16 gathers), products-only runs' parts in bf16 alone, packed in flat
  // order, the other parts in float; without, every part in float (the frozen shard's layout).
  struct FrozenParts {
    std::vector<std::vector<int64_t>> at;  // [units()][runs] offset of the part in its buffer (frozen held ranges)
    int64_t float_elements = 0, bf16_elements = 0;
    int64_t bytes(int64_t element_bytes) const { return float_elements * element_bytes + bf16_elements * 2; }
  };
  FrozenParts frozen_parts(const ParamTable& table, bool bf16) const;
  // What FSDP's collectives move for this rank (parallel/fsdp.h's counters, metrics' "fsdp"): bytes
  // of one all-gather of every range it holds (runs as gather_runs gives them, bf16 or not), and of
  // one reduce-scatter of every trainable range's gradients. A step gathers each unit twice per
  // micro-batch (forward, backward) and reduce-scatters once.
  int64_t gather_bytes(const ParamTable& table, bool bf16, int64_t element_bytes) const;
  int64_t reduce_scatter_bytes(int64_t element_bytes) const;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int ep() const { return ep_; }
  int group_rank(const Unit& unit) const { return unit.over_world ? rank_ : rank_ / ep_; }
  const std::vector<Unit>& units() const { return units_; }  // trainable, then frozen ranges
  // The trainable shard: its slices in flat order (empty pieces left out) and its elements.
  const std::vector<Slice>& slices() const { return slices_[0]; }
  int64_t shard_size() const { return shard_size_[0]; }
  // The frozen shard (LoRA's base; empty without one).
  const std::vector<Slice>& frozen_slices() const { return slices_[1]; }
  int64_t frozen_shard_size() const { return shard_size_[1]; }

  // shard[shard_size] ← this rank's elements of flat[trainable_size]; with `frozen`, the frozen
  // shard's of flat[trainable_size, sharded_size).
  template <class T>
  void copy_to_shard(const T* flat, T* shard, bool frozen = false) const;
  // flat ← every piece of every trainable (or frozen) range, over the world (a checkpoint's full
  // parameters or moments).
  template <class T>
  void gather_everything(const ProcessGroup& world, const T* shard, T* flat, bool frozen = false) const;

 private:
  void add(Unit unit, int group_rank, int group_size, int owner_ep);
  int rank_ = 0, ranks_ = 1, ep_ = 1;
  std::vector<Unit> units_;
  std::vector<Slice> slices_[2];   // [trainable, frozen]
  int64_t shard_size_[2] = {0, 0};  // [trainable, frozen]
};

}  // namespace trillion
