// The split of the trainable units over the ranks. See shard_layout.h.
#include "parallel/shard_layout.h"

#include <cstring>

#include "core/error.h"

namespace trillion {

ShardLayout::ShardLayout(const ParamTable& table, int rank, int ranks) : rank_(rank), ranks_(ranks) {
  TRILLION_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "shard layout of rank ", rank, " of ", ranks);
  int64_t covered = 0;  // the units tile the trainable prefix [0, trainable_size) in order
  for (const ParamGroup group : {ParamGroup::dense, ParamGroup::expert, ParamGroup::lora}) {
    const std::vector<ParamTable::UnitRange>& ranges = table.units(group);
    for (size_t u = 0; u < ranges.size(); ++u) {
      const ParamTable::UnitRange& range = ranges[u];
      if (range.end == range.begin) continue;
      TRILLION_CHECK(range.begin == covered, "unit ranges of the parameter table leave a gap at ", covered);
      Unit unit;
      unit.table_unit = static_cast<int>(u);
      unit.begin = range.begin;
      const int64_t count = range.end - range.begin;
      int64_t displ = 0;
      for (int r = 0; r < ranks; ++r) {
        unit.displs.push_back(displ);
        unit.counts.push_back(count / ranks + (r < count % ranks ? 1 : 0));
        displ += unit.counts.back();
      }
      unit.shard_offset = shard_size_;
      if (unit.counts[rank] > 0) slices_.push_back({unit.begin + unit.displs[rank], shard_size_, unit.counts[rank]});
      shard_size_ += unit.counts[rank];
      covered = range.end;
      units_.push_back(std::move(unit));
    }
  }
  TRILLION_CHECK(covered == table.trainable_size(), "unit ranges cover ", covered, " of ", table.trainable_size(),
                 " trainable elements");
}

template <class T>
void ShardLayout::copy_to_shard(const T* flat, T* shard) const {
  for (const Slice& s : slices_) std::memcpy(shard + s.local, flat + s.global, s.count * sizeof(T));
}

template <class T>
void ShardLayout::reduce_scatter(const ProcessGroup& group, const T* flat, T* shard) const {
  TRILLION_CHECK(group.size() == ranks_ && group.rank() == rank_, "shard layout of ", ranks_, " ranks used on ",
                 group.describe());
  for (const Unit& unit : units_) group.reduce_scatter_sum(flat + unit.begin, shard + unit.shard_offset, unit.counts);
}

template <class T>
void ShardLayout::all_gather(const ProcessGroup& group, const T* shard, T* flat) const {
  TRILLION_CHECK(group.size() == ranks_ && group.rank() == rank_, "shard layout of ", ranks_, " ranks used on ",
                 group.describe());
  for (const Unit& unit : units_) group.all_gather(shard + unit.shard_offset, flat + unit.begin, unit.counts, unit.displs);
}

#define TRILLION_INSTANTIATE(T)                                                                \
  template void ShardLayout::copy_to_shard<T>(const T*, T*) const;                             \
  template void ShardLayout::reduce_scatter<T>(const ProcessGroup&, const T*, T*) const;       \
  template void ShardLayout::all_gather<T>(const ProcessGroup&, const T*, T*) const;
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
