// The split of the parameters over the ranks. See shard_layout.h.
#include "parallel/shard_layout.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace trillion {
namespace {

// A range of table unit `table_unit` before add splits it.
ShardLayout::Unit unit_of(int table_unit, int64_t begin, int64_t count, bool over_world, bool held, bool frozen) {
  ShardLayout::Unit unit;
  unit.table_unit = table_unit;
  unit.begin = begin;
  unit.count = count;
  unit.over_world = over_world;
  unit.held = held;
  unit.frozen = frozen;
  return unit;
}

}  // namespace

// Splits unit.count over a group of group_size ranks; owner_ep < 0: the world's ranks, else the
// edp group of that ep index (world rank = group rank · ep + owner_ep).
void ShardLayout::add(Unit unit, int group_rank, int group_size, int owner_ep) {
  int64_t displ = 0;
  for (int g = 0; g < group_size; ++g) {
    unit.displs.push_back(displ);
    unit.counts.push_back(unit.count / group_size + (g < unit.count % group_size ? 1 : 0));
    displ += unit.counts.back();
  }
  unit.world_counts.assign(ranks_, 0);
  unit.world_displs.assign(ranks_, 0);
  for (int g = 0; g < group_size; ++g) {
    const int world_rank = owner_ep < 0 ? g : g * ep_ + owner_ep;
    unit.world_counts[world_rank] = unit.counts[g];
    unit.world_displs[world_rank] = unit.displs[g];
  }
  if (unit.held) {
    int64_t& shard_size = shard_size_[unit.frozen ? 1 : 0];
    unit.shard_offset = shard_size;
    if (unit.counts[group_rank] > 0) {
      slices_[unit.frozen ? 1 : 0].push_back({unit.begin + unit.displs[group_rank], shard_size, unit.counts[group_rank]});
    }
    shard_size += unit.counts[group_rank];
  }
  units_.push_back(std::move(unit));
}

ShardLayout::ShardLayout(const ParamTable& table, int rank, int ranks, int ep) : rank_(rank), ranks_(ranks), ep_(ep) {
  TRILLION_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && ep >= 1 && ranks % ep == 0, "shard layout of rank ", rank,
                 " of ", ranks, " with ep ", ep);
  const int edp = ranks / ep, my_ep = rank % ep, my_edp = rank / ep;
  int64_t covered = 0;  // the ranges tile the sharded prefix [0, sharded_size) in order
  std::vector<std::pair<ParamGroup, bool>> groups;  // (group, frozen) in layout order
  for (const ParamGroup group : table.trainable_groups()) groups.emplace_back(group, false);
  for (const ParamGroup group : table.frozen_groups()) groups.emplace_back(group, true);
  for (const auto& [group, frozen] : groups) {
    const std::vector<ParamTable::UnitRange>& ranges = table.units(group);
    for (size_t u = 0; u < ranges.size(); ++u) {
      const ParamTable::UnitRange& range = ranges[u];
      if (range.end == range.begin) continue;
      TRILLION_CHECK(range.begin == covered, "unit ranges of the parameter table leave a gap at ", covered);
      covered = range.end;
      const bool sliced = group == ParamGroup::expert || group == ParamGroup::expert_lora;  // [E, …] tensors
      if (!sliced || ep == 1) {
        add(unit_of(static_cast<int>(u), range.begin, range.end - range.begin, true, true, frozen), rank, ranks, -1);
        continue;
      }
      // Expert slices, tensor by tensor; the unit's padding belongs to no one (it stays zero).
      for (const ParamSpec& spec : table.entries()) {
        if (spec.group != group || spec.unit != static_cast<int>(u)) continue;
        TRILLION_CHECK(!spec.shape.empty() && spec.shape[0] % ep == 0, spec.name, ": ", spec.shape.empty() ? 0 : spec.shape[0],
                       " experts do not split over ep ", ep);
        const int64_t slice = spec.numel() / ep;
        for (int p = 0; p < ep; ++p) {
          add(unit_of(static_cast<int>(u), spec.offset + p * slice, slice, false, p == my_ep, frozen), my_edp, edp, p);
        }
      }
    }
  }
  TRILLION_CHECK(covered == table.sharded_size(), "unit ranges cover ", covered, " of ", table.sharded_size(),
                 " trainable and frozen elements");
}

int64_t ShardLayout::Run::held_bytes(int64_t element_bytes) const {
  const int64_t bf16_bytes = use == ParamUse::values ? 0 : 2;
  const int64_t float_bytes = use == ParamUse::products ? 0 : element_bytes;
  return count * (bf16_bytes + float_bytes);
}

int64_t ShardLayout::Run::moved_bytes(int64_t element_bytes, int group_rank) const {
  return (count - counts[group_rank]) * (use == ParamUse::products ? 2 : element_bytes);
}

int64_t ShardLayout::gather_bytes(const ParamTable& table, bool bf16, int64_t element_bytes) const {
  int64_t bytes = 0;
  for (const Unit& range : units_) {
    if (!range.held) continue;
    for (const Run& run : gather_runs(table, range, bf16)) bytes += run.moved_bytes(element_bytes, group_rank(range));
  }
  return bytes;
}

int64_t ShardLayout::reduce_scatter_bytes(int64_t element_bytes) const {
  int64_t bytes = 0;
  for (const Unit& range : units_)
    if (range.held && !range.frozen) bytes += range.moved_elements(group_rank(range)) * element_bytes;
  return bytes;
}

std::vector<ShardLayout::Run> ShardLayout::gather_runs(const ParamTable& table, const Unit& range, bool bf16) const {
  std::vector<Run> runs(1);  // a run of values from 0 unless the range's first tensor says otherwise
  for (const ParamSpec& spec : table.entries()) {
    if (!bf16) break;
    if (spec.offset + spec.numel() <= range.begin || spec.offset >= range.begin + range.count) continue;
    const int64_t at = std::max<int64_t>(0, spec.offset - range.begin);
    if (at == 0) runs.back().use = spec.use;
    if (runs.back().use == spec.use) continue;
    runs.back().count = at - runs.back().begin;
    runs.emplace_back();
    runs.back().begin = at;
    runs.back().use = spec.use;
  }
  runs.back().count = range.count - runs.back().begin;
  const int me = group_rank(range);
  for (Run& run : runs) {  // each group rank's part: its piece of the range within the run
    for (size_t g = 0; g < range.counts.size(); ++g) {
      const int64_t first = std::max(run.begin, range.displs[g]);
      const int64_t last = std::min(run.begin + run.count, range.displs[g] + range.counts[g]);
      run.counts.push_back(std::max<int64_t>(0, last - first));
      run.displs.push_back(last > first ? first - run.begin : 0);
    }
    run.send_offset = std::clamp(run.begin - range.displs[me], int64_t(0), range.counts[me]);
  }
  return runs;
}

ShardLayout::FrozenParts ShardLayout::frozen_parts(const ParamTable& table, bool bf16) const {
  FrozenParts parts;
  parts.at.resize(units_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].frozen || !units_[i].held) continue;
    const int me = group_rank(units_[i]);
    for (const Run& run : gather_runs(table, units_[i], bf16)) {
      int64_t& elements = run.use == ParamUse::products && bf16 ? parts.bf16_elements : parts.float_elements;
      parts.at[i].push_back(elements);
      elements += run.counts[me];
    }
  }
  return parts;
}

template <class T>
void ShardLayout::copy_to_shard(const T* flat, T* shard, bool frozen) const {
  for (const Slice& s : slices_[frozen ? 1 : 0]) std::memcpy(shard + s.local, flat + s.global, s.count * sizeof(T));
}

template <class T>
void ShardLayout::gather_everything(const ProcessGroup& world, const T* shard, T* flat, bool frozen) const {
  TRILLION_CHECK(world.size() == ranks_ && world.rank() == rank_, "shard layout of ", ranks_, " ranks used on ",
                 world.describe());
  for (const Unit& unit : units_) {
    if (unit.frozen != frozen) continue;
    world.all_gather(unit.held ? shard + unit.shard_offset : shard, flat + unit.begin, unit.world_counts,
                     unit.world_displs);
  }
}

#define TRILLION_INSTANTIATE(T)                                                                                    \
  template void ShardLayout::copy_to_shard<T>(const T*, T*, bool) const;                                           \
  template void ShardLayout::gather_everything<T>(const ProcessGroup&, const T*, T*, bool) const;
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
