// ShardLayout without MPI: for any number of ranks every trainable element belongs to exactly one
// rank, in order and in near-equal pieces per unit (sizes differ by at most one), buffers belong to
// none, a rank's shard holds its pieces back to back, and one rank's shard is the flat layout; with
// expert parallelism each expert slice belongs to its ep index's ranks only; FSDP's gather runs
// follow the tensors' uses and rebuild each range from every rank's parts; a LoRA base's frozen
// groups split the same way into a frozen shard of their own.
#include "parallel/shard_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

namespace trillion {
namespace {

// Dense tensors in units 0–2, experts in units 1–2, a buffer in unit 1; padded to 8 elements.
ParamTable make_table() {
  ParamTable table;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, ParamGroup group, int unit,
                       ParamUse use) {
    ParamSpec spec{name, std::move(shape)};
    spec.group = group;
    spec.unit = unit;
    spec.use = use;
    table.add(spec);
  };
  add("model.embed_tokens.weight", {11, 3}, ParamGroup::dense, 0, ParamUse::values_and_products);
  add("model.layers.0.input_layernorm.weight", {3}, ParamGroup::dense, 1, ParamUse::values);
  add("model.layers.0.self_attn.q_proj.weight", {5, 3}, ParamGroup::dense, 1, ParamUse::products);
  add("model.layers.0.self_attn.k_proj.weight", {2, 3}, ParamGroup::dense, 1, ParamUse::products);
  add("model.layers.0.mlp.experts.gate_up_proj", {4, 6, 3}, ParamGroup::expert, 1, ParamUse::products);
  add("model.layers.0.mlp.gate.e_score_correction_bias", {4}, ParamGroup::buffer, 1, ParamUse::values);
  add("model.layers.1.input_layernorm.weight", {3}, ParamGroup::dense, 2, ParamUse::values);
  add("model.layers.1.mlp.experts.down_proj", {4, 3, 5}, ParamGroup::expert, 2, ParamUse::products);
  table.finalize(8);
  return table;
}

TEST(ShardLayout, EveryTrainableElementHasExactlyOneOwner) {
  const ParamTable table = make_table();
  for (const int ranks : {1, 2, 3, 4, 7, 64}) {
    std::vector<int> owners(table.trainable_size(), 0);
    int64_t total = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const ShardLayout layout(table, rank, ranks);
      int64_t local = 0, last_global = -1;
      for (const ShardLayout::Slice& s : layout.slices()) {
        EXPECT_EQ(s.local, local) << "pieces back to back, rank " << rank << " of " << ranks;
        EXPECT_GT(s.global, last_global) << "slices in flat order";
        for (int64_t i = s.global; i < s.global + s.count; ++i) ++owners[i];
        local += s.count;
        last_global = s.global;
      }
      EXPECT_EQ(local, layout.shard_size());
      total += layout.shard_size();
      for (const ShardLayout::Unit& unit : layout.units()) {
        const auto [low, high] = std::minmax_element(unit.counts.begin(), unit.counts.end());
        EXPECT_LE(*high - *low, 1) << "near-equal pieces";
        EXPECT_EQ(unit.displs[0], 0);
        for (int r = 1; r < ranks; ++r) EXPECT_EQ(unit.displs[r], unit.displs[r - 1] + unit.counts[r - 1]);
      }
    }
    EXPECT_EQ(total, table.trainable_size()) << ranks << " ranks";
    EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; })) << ranks << " ranks";
  }
  EXPECT_GT(table.total_size(), table.trainable_size()) << "the buffer lies past the trainable prefix, owned by none";
}

// With ep > 1 each expert tensor's slice of E / ep experts belongs to the ranks of one ep index:
// still every trainable element but the expert units' padding has exactly one owner, a rank holds
// only its own slices, and the world counts place every piece where its owner is.
TEST(ShardLayout, ExpertSlicesBelongToTheirEpGroup) {
  const ParamTable table = make_table();
  for (const auto& [ranks, ep] : {std::pair{2, 2}, {4, 2}, {4, 4}}) {
    std::vector<int> owners(table.trainable_size(), 0);
    for (int rank = 0; rank < ranks; ++rank) {
      const ShardLayout layout(table, rank, ranks, ep);
      for (const ShardLayout::Slice& s : layout.slices())
        for (int64_t i = s.global; i < s.global + s.count; ++i) ++owners[i];
      for (const ShardLayout::Unit& unit : layout.units()) {
        int64_t placed = 0;
        for (int r = 0; r < ranks; ++r) placed += unit.world_counts[r];
        EXPECT_EQ(placed, unit.count);
        if (unit.over_world) continue;
        int owner = -1;  // the ep index whose ranks hold the slice's pieces
        for (int r = 0; r < ranks; ++r) {
          if (unit.world_counts[r] == 0) continue;
          EXPECT_TRUE(owner < 0 || owner == r % ep) << "one ep index per slice";
          owner = r % ep;
        }
        EXPECT_EQ(unit.held, owner == rank % ep) << "held: its own ep index's slices only";
        EXPECT_EQ(unit.counts.size(), size_t(ranks / ep)) << "split over its edp group";
      }
    }
    for (const ParamSpec& spec : table.entries()) {
      if (!spec.trainable()) continue;
      for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) {
        ASSERT_EQ(owners[i], 1) << spec.name << " element " << i - spec.offset << ", " << ranks << " ranks, ep " << ep;
      }
    }
  }
}

// make_table's tensors as a LoRA base (dense and expert groups frozen) with a pair on q_proj and
// one per expert on gate_up_proj.
ParamTable make_lora_table() {
  ParamTable table;
  const ParamTable base = make_table();
  for (ParamSpec spec : base.entries()) {
    spec.offset = 0;
    table.add(spec);
  }
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, ParamGroup group, int unit) {
    ParamSpec spec;
    spec.name = name;
    spec.shape = std::move(shape);
    spec.group = group;
    spec.unit = unit;
    spec.use = ParamUse::products;
    table.add(spec);
  };
  add("model.layers.0.self_attn.q_proj.lora_A.weight", {2, 3}, ParamGroup::lora, 1);
  add("model.layers.0.self_attn.q_proj.lora_B.weight", {5, 2}, ParamGroup::lora, 1);
  add("model.layers.0.mlp.experts.lora_A", {4, 2, 3}, ParamGroup::expert_lora, 1);
  table.freeze(ParamGroup::dense);
  table.freeze(ParamGroup::expert);
  table.finalize(8);
  return table;
}

// The frozen base's elements each have one owner among the ranks' frozen shards (its expert slices
// only among their ep index's ranks), packed back to back; the trainable shard is the adapters'
// alone; one rank's frozen shard is the flat frozen range, and the ranks' frozen shards rebuild it.
TEST(ShardLayout, AFrozenBaseSplitsIntoItsOwnShard) {
  const ParamTable table = make_lora_table();
  ASSERT_GT(table.sharded_size(), table.trainable_size());
  std::vector<double> flat(table.sharded_size());
  std::iota(flat.begin(), flat.end(), 0.0);
  for (const auto& [ranks, ep] : {std::pair{1, 1}, {2, 1}, {3, 1}, {4, 2}}) {
    std::vector<int> trainable_owners(table.sharded_size(), 0), frozen_owners(table.sharded_size(), 0);
    std::vector<double> rebuilt(flat.size(), -1.0);
    for (int rank = 0; rank < ranks; ++rank) {
      const ShardLayout layout(table, rank, ranks, ep);
      for (const ShardLayout::Slice& s : layout.slices())
        for (int64_t i = s.global; i < s.global + s.count; ++i) ++trainable_owners[i];
      int64_t local = 0;
      for (const ShardLayout::Slice& s : layout.frozen_slices()) {
        EXPECT_EQ(s.local, local) << "frozen pieces back to back";
        for (int64_t i = s.global; i < s.global + s.count; ++i) ++frozen_owners[i];
        local += s.count;
      }
      EXPECT_EQ(local, layout.frozen_shard_size());
      std::vector<double> frozen(layout.frozen_shard_size());
      layout.copy_to_shard(flat.data(), frozen.data(), /*frozen=*/true);
      for (const ShardLayout::Unit& unit : layout.units()) {
        EXPECT_EQ(unit.frozen, unit.begin >= table.trainable_size()) << unit.begin;
        if (!unit.frozen || !unit.held) continue;
        const int me = layout.group_rank(unit);
        for (int64_t i = 0; i < unit.counts[me]; ++i)
          rebuilt[unit.begin + unit.displs[me] + i] = frozen[unit.shard_offset + i];
      }
      if (ranks == 1) {
        EXPECT_EQ(frozen, std::vector<double>(flat.begin() + table.trainable_size(), flat.end()));
      }
    }
    for (const ParamSpec& spec : table.entries()) {
      if (spec.group == ParamGroup::buffer) continue;
      for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) {
        ASSERT_EQ(trainable_owners[i], spec.trainable() ? 1 : 0) << spec.name << ", " << ranks << " ranks";
        ASSERT_EQ(frozen_owners[i], spec.frozen ? 1 : 0) << spec.name << ", " << ranks << " ranks";
        if (spec.frozen) {
          ASSERT_EQ(rebuilt[i], flat[i]) << spec.name << ", " << ranks << " ranks";
        }
      }
    }
  }
}

TEST(ShardLayout, OneRankIsTheFlatLayoutAndCopiesGatherTheRanksPieces) {
  const ParamTable table = make_table();
  std::vector<double> flat(table.trainable_size());
  std::iota(flat.begin(), flat.end(), 0.0);
  const ShardLayout whole(table, 0, 1);
  ASSERT_EQ(whole.shard_size(), table.trainable_size());
  std::vector<double> copy(whole.shard_size());
  whole.copy_to_shard(flat.data(), copy.data());
  EXPECT_EQ(copy, flat);

  // Three ranks' shards, put back per unit at each piece's place, rebuild the flat buffer.
  std::vector<double> rebuilt(flat.size(), -1.0);
  for (int rank = 0; rank < 3; ++rank) {
    const ShardLayout layout(table, rank, 3);
    std::vector<double> shard(layout.shard_size());
    layout.copy_to_shard(flat.data(), shard.data());
    for (const ShardLayout::Unit& unit : layout.units()) {
      for (int64_t i = 0; i < unit.counts[rank]; ++i) {
        rebuilt[unit.begin + unit.displs[rank] + i] = shard[unit.shard_offset + i];
      }
    }
  }
  EXPECT_EQ(rebuilt, flat);
}

// FSDP's gather runs (parallel/fsdp.h): a range is one run of values, or under bf16 runs of its
// tensors' uses (padding joining the run before it) that tile it; every rank's parts of the runs,
// sent from its shard at their offsets, put together rebuild the flat buffer.
TEST(ShardLayout, GatherRunsFollowTheTensorsUsesAndEveryRanksPartsRebuildTheRange) {
  const ParamTable table = make_table();
  std::vector<ParamUse> use_at(table.total_size(), ParamUse::values);  // [total] of each tensor element
  for (const ParamSpec& spec : table.entries()) std::fill_n(use_at.begin() + spec.offset, spec.numel(), spec.use);
  std::vector<bool> padding(table.total_size(), true);
  for (const ParamSpec& spec : table.entries()) std::fill_n(padding.begin() + spec.offset, spec.numel(), false);
  std::vector<double> flat(table.trainable_size());
  std::iota(flat.begin(), flat.end(), 1.0);
  for (const auto& [ranks, ep] : {std::pair{1, 1}, {2, 1}, {3, 1}, {7, 1}, {2, 2}, {4, 2}, {4, 4}}) {
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, ep " + std::to_string(ep) + (bf16 ? ", bf16" : ""));
      std::vector<double> rebuilt(flat.size(), 0.0);
      int64_t runs_seen = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        const ShardLayout layout(table, rank, ranks, ep);
        std::vector<double> shard(layout.shard_size());
        layout.copy_to_shard(flat.data(), shard.data());
        for (const ShardLayout::Unit& unit : layout.units()) {
          const std::vector<ShardLayout::Run> runs = layout.gather_runs(table, unit, bf16);
          runs_seen += static_cast<int64_t>(runs.size());
          int64_t at = 0;
          for (const ShardLayout::Run& run : runs) {
            EXPECT_EQ(run.begin, at) << "runs tile the range in order";
            at += run.count;
            EXPECT_EQ(std::accumulate(run.counts.begin(), run.counts.end(), int64_t(0)), run.count);
            for (int64_t i = run.begin; i < run.begin + run.count; ++i) {
              const int64_t element = unit.begin + i;
              if (!padding[element]) {
                EXPECT_EQ(run.use, bf16 ? use_at[element] : ParamUse::values) << element;
              }
            }
            const int me = layout.group_rank(unit);
            for (int64_t i = 0; unit.held && i < run.counts[me]; ++i)
              rebuilt[unit.begin + run.begin + run.displs[me] + i] = shard[unit.shard_offset + run.send_offset + i];
          }
          EXPECT_EQ(at, unit.count);
        }
      }
      // The flat buffer where a range covers it (with ep > 1 the experts' padding belongs to none).
      const ShardLayout first(table, 0, ranks, ep);
      std::vector<double> ranges(flat.size(), 0.0);
      for (const ShardLayout::Unit& unit : first.units())
        std::copy_n(flat.begin() + unit.begin, unit.count, ranges.begin() + unit.begin);
      EXPECT_EQ(rebuilt, ranges);
      const int64_t one_run_each = ranks * static_cast<int64_t>(first.units().size());
      EXPECT_EQ(runs_seen > one_run_each, bf16) << "under bf16 the layers' ranges split into runs";
    }
  }
}

}  // namespace
}  // namespace trillion
