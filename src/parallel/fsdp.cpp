// Fully sharded parameters and gradients through the model's unit hooks. See fsdp.h.
#include "parallel/fsdp.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace trillion {
namespace {

// Returns the memory pages wholly inside base[begin, end) to the OS; with zero_ends, the range's
// elements on the partial pages at its ends are zeroed too, so the whole range reads as zeros.
template <class T>
void release_range(T* base, int64_t begin, int64_t end, bool zero_ends) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(base + begin), last = reinterpret_cast<uintptr_t>(base + end);
  const uintptr_t inner_first = (first + page - 1) / page * page, inner_last = last / page * page;
  if (inner_first >= inner_last) {
    if (zero_ends) std::memset(base + begin, 0, (end - begin) * sizeof(T));
    return;
  }
  if (zero_ends) {
    std::memset(reinterpret_cast<void*>(first), 0, inner_first - first);
    std::memset(reinterpret_cast<void*>(inner_last), 0, last - inner_last);
  }
  TRILLION_CHECK(madvise(reinterpret_cast<void*>(inner_first), inner_last - inner_first, MADV_DONTNEED) == 0,
                 "madvise(MADV_DONTNEED) of ", inner_last - inner_first, " bytes failed");
}

}  // namespace

template <class T>
const ProcessGroup& Fsdp<T>::group_of(const ShardLayout::Unit& piece) const {
  return piece.over_world ? group_ : edp_;
}

template <class T>
Fsdp<T>::Fsdp(Model<T>& model, const ProcessGroup& group, const ProcessGroup& edp, const ShardLayout& layout,
              Operands gathers)
    : model_(model),
      group_(group),
      edp_(edp),
      layout_(layout),
      shard_params_(layout.shard_size()),
      shard_grads_(layout.shard_size()),
      bf16_gathers_(std::is_same_v<T, float> && gathers == Operands::as_set &&
                    matmul_precision() == MatmulPrecision::bf16) {
  TRILLION_CHECK(group.size() == layout.ranks() && group.rank() == layout.rank(), "FSDP layout of ",
                 layout.ranks(), " ranks on ", group.describe());
  const UnitOrder order = unit_order(model.config());
  const int units = static_cast<int>(order.forward.size());
  pieces_of_unit_.resize(units);
  for (size_t i = 0; i < layout.units().size(); ++i) {
    const int unit = layout.units()[i].table_unit;
    TRILLION_CHECK(unit < units, "FSDP: table unit ", unit, " outside the model's ", units, " units");
    if (layout.units()[i].held) pieces_of_unit_[unit].push_back(static_cast<int>(i));
  }
  next_forward_.assign(units, -1);
  next_backward_.assign(units, -1);
  for (int i = 0; i + 1 < units; ++i) {
    next_forward_[order.forward[i]] = order.forward[i + 1];
    next_backward_[order.backward[i]] = order.backward[i + 1];
  }
  state_.assign(units, UnitState::released);
  in_flight_.resize(pieces_of_unit_.size());
  grads_resident_.assign(units, false);
  held_bytes_of_unit_.assign(units, 0);
  for (const ShardLayout::Unit& piece : layout.units()) {
    if (piece.held && !piece.frozen)  // its gradients
      held_bytes_of_unit_[piece.table_unit] += piece.count * static_cast<int64_t>(sizeof(T));
    runs_.push_back(layout.gather_runs(model.table(), piece, bf16_gathers_));
    gathered_bytes_.push_back(0);
    for (const ShardLayout::Run& run : runs_.back()) gathered_bytes_.back() += run.held_bytes(sizeof(T));
  }
  layout.copy_to_shard(model.params(), shard_params_.data());
  keep_frozen_parts();
  release_everything();
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_gathers_) {
      const int64_t sharded = model.table().sharded_size();
      params_bf16_ = Buffer<bf16>(sharded);  // counted as its runs are gathered
      release_range(params_bf16_.data(), 0, sharded, /*zero_ends=*/false);
      uncount(sharded * static_cast<int64_t>(sizeof(bf16)));
      registration_.emplace(model.params(), params_bf16_.data(), sharded);
    }
  }
  for (const ShardLayout::Unit& piece : layout.units()) {
    if (piece.frozen) continue;  // no gradients
    release_range(model.grads(), piece.begin, piece.begin + piece.count, /*zero_ends=*/true);
    uncount(piece.count * static_cast<int64_t>(sizeof(T)));
  }
}

// The frozen shard as held (ShardLayout::frozen_parts): each frozen run's own part copied from the
// whole parameters, or under bf16 gathers a products-only run's part rounded to bf16, which is all
// its gathers and the products read (the frozen base in bf16 alone).
template <class T>
void Fsdp<T>::keep_frozen_parts() {
  frozen_parts_ = layout_.frozen_parts(model_.table(), bf16_gathers_);
  frozen_float_ = Buffer<T>(frozen_parts_.float_elements);
  frozen_bf16_ = Buffer<bf16>(frozen_parts_.bf16_elements);
  for_each_frozen_part([&](const FrozenPart& part) {
    const T* own = model_.params() + part.flat;
    if (!part.in_bf16) {
      std::memcpy(frozen_float_.data() + part.at, own, part.count * sizeof(T));
    } else if constexpr (std::is_same_v<T, float>) {
      to_bf16_threaded(own, frozen_bf16_.data() + part.at, part.count);
    }
  });
}

// Each of this rank's parts of the frozen runs, in flat order.
template <class T>
template <class F>
void Fsdp<T>::for_each_frozen_part(F&& f) const {
  for (size_t i = 0; i < layout_.units().size(); ++i) {
    const ShardLayout::Unit& piece = layout_.units()[i];
    if (!piece.frozen || !piece.held) continue;
    const int me = layout_.group_rank(piece);
    for (size_t r = 0; r < runs_[i].size(); ++r) {
      const ShardLayout::Run& run = runs_[i][r];
      f(FrozenPart{piece.begin + run.begin + run.displs[me], piece.shard_offset + run.send_offset,
                   frozen_parts_.at[i][r], run.counts[me], in_bf16(run)});
    }
  }
}

template <class T>
Fsdp<T>::~Fsdp() {
  MemoryStats::add(Tier::fast, uncounted_bytes_);  // the model's buffers count whole again when freed
}

template <class T>
void Fsdp<T>::count(int64_t bytes) {
  MemoryStats::add(Tier::fast, bytes);
  uncounted_bytes_ -= bytes;
}

template <class T>
void Fsdp<T>::uncount(int64_t bytes) {
  MemoryStats::sub(Tier::fast, bytes);
  uncounted_bytes_ += bytes;
}

// Each before-hook completes its unit's gather and starts the next one's in the model's unit order.
template <class T>
UnitHooks Fsdp<T>::hooks() {
  UnitHooks h;
  h.before_forward = [this](int unit) {
    gather(unit);
    start_gather(next_forward_[unit]);
  };
  h.after_forward = [this](int unit) { release(unit); };
  h.before_backward = [this](int unit) {
    gather(unit);
    start_gather(next_backward_[unit]);
  };
  h.after_backward = [this](int unit) {
    release(unit);
    if (last_micro_batch_) reduce_scatter(unit);
  };
  h.before_gradients = [this](int unit) {
    if (grads_resident_[unit]) return;
    grads_resident_[unit] = true;
    count(held_bytes_of_unit_[unit]);
  };
  return h;
}

// Each run of each piece is one all-gather: float from the shard into the parameters, or bf16 in
// place in the copy, this rank's part rounded into it first (a frozen part held in bf16 is sent
// as it is).
template <class T>
ProcessGroup::Pending Fsdp<T>::start_run(int i, size_t r) {
  const ShardLayout::Unit& piece = layout_.units()[i];
  const ShardLayout::Run& run = runs_[i][r];
  const ProcessGroup& group = group_of(piece);
  const int64_t to = piece.begin + run.begin;
  counters_.gathered_bytes += run.moved_bytes(sizeof(T), layout_.group_rank(piece));
  if (piece.frozen && in_bf16(run))
    return group.start_all_gather(frozen_bf16_.data() + frozen_parts_.at[i][r], params_bf16_.data() + to, run.counts,
                                  run.displs);
  const T* own_part = piece.frozen ? frozen_float_.data() + frozen_parts_.at[i][r]
                                   : shard_params_.data() + piece.shard_offset + run.send_offset;
  if constexpr (std::is_same_v<T, float>) {
    if (run.use == ParamUse::products) {
      const int me = layout_.group_rank(piece);
      bf16* own = params_bf16_.data() + to + run.displs[me];
      to_bf16_threaded(own_part, own, run.counts[me]);
      return group.start_all_gather(own, params_bf16_.data() + to, run.counts, run.displs);
    }
  }
  return group.start_all_gather(own_part, model_.params() + to, run.counts, run.displs);
}

template <class T>
void Fsdp<T>::start_gather(int unit) {
  if (unit < 0 || state_[unit] != UnitState::released) return;  // none, in flight or gathered
  TRILLION_CHECK(!bf16_gathers_ || matmul_precision() == MatmulPrecision::bf16,
                 "FSDP gathers in bf16 for the bf16 precision, which has changed since: the products would read "
                 "float weights it never gathers");
  for (const int i : pieces_of_unit_[unit]) {
    const ShardLayout::Unit& piece = layout_.units()[i];
    for (size_t r = 0; r < runs_[i].size(); ++r) in_flight_[unit].push_back({&group_of(piece), start_run(i, r)});
    gathered_now_ += gathered_bytes_[i];
    count(gathered_bytes_[i]);
  }
  state_[unit] = UnitState::in_flight;
  counters_.peak_gathered_bytes = std::max(counters_.peak_gathered_bytes, gathered_now_);
}

// Completes the unit's gathers; a run both looked up and multiplied (tied embeddings) is rounded
// into the copy.
template <class T>
void Fsdp<T>::gather(int unit) {
  if (state_[unit] == UnitState::gathered) return;  // tied embeddings' unit 0, from the embedding to the head
  start_gather(unit);  // unless prefetched
  for (InFlight& f : in_flight_[unit]) f.group->finish(f.pending);
  in_flight_[unit].clear();
  state_[unit] = UnitState::gathered;
  if constexpr (std::is_same_v<T, float>) {
    for (const int i : pieces_of_unit_[unit]) {
      for (const ShardLayout::Run& run : runs_[i]) {
        const int64_t at = layout_.units()[i].begin + run.begin;
        if (run.use == ParamUse::values_and_products && bf16_gathers_)
          to_bf16_threaded(model_.params() + at, params_bf16_.data() + at, run.count);
      }
    }
  }
}

template <class T>
void Fsdp<T>::release(int unit) {
  TRILLION_CHECK(state_[unit] == UnitState::gathered, "FSDP unit ", unit, " released without being gathered");
  state_[unit] = UnitState::released;
  for (const int i : pieces_of_unit_[unit]) {
    const ShardLayout::Unit& piece = layout_.units()[i];
    release_range(model_.params(), piece.begin, piece.begin + piece.count, /*zero_ends=*/false);
    if (bf16_gathers_) release_range(params_bf16_.data(), piece.begin, piece.begin + piece.count, /*zero_ends=*/false);
    gathered_now_ -= gathered_bytes_[i];
    uncount(gathered_bytes_[i]);
  }
}

template <class T>
void Fsdp<T>::reduce_scatter(int unit) {
  for (const int i : pieces_of_unit_[unit]) {
    const ShardLayout::Unit& piece = layout_.units()[i];
    if (piece.frozen) continue;  // no gradients
    group_of(piece).reduce_scatter_sum(model_.grads() + piece.begin, shard_grads_.data() + piece.shard_offset,
                                       piece.counts);
    counters_.reduce_scattered_bytes += piece.moved_elements(layout_.group_rank(piece)) * static_cast<int64_t>(sizeof(T));
    release_range(model_.grads(), piece.begin, piece.begin + piece.count, /*zero_ends=*/true);  // zero for the next step
  }
  if (grads_resident_[unit]) uncount(held_bytes_of_unit_[unit]);
  grads_resident_[unit] = false;
}

template <class T>
int64_t Fsdp<T>::held_elements() const {
  int64_t held = 0;
  for (const ShardLayout::Unit& piece : layout_.units()) held += piece.held ? piece.count : 0;
  return held;
}

// The parameters count as resident from the start: the gathers write them while the frozen
// shard's widened copy, if any, is held.
template <class T>
void Fsdp<T>::gather_everything(bool frozen_too) {
  for (const UnitState state : state_)
    TRILLION_CHECK(state == UnitState::released, "FSDP gathers everything only between steps");
  frozen_gathered_ = frozen_too;
  for (const ShardLayout::Unit& piece : layout_.units())
    if (frozen_too || !piece.frozen) count(piece.count * static_cast<int64_t>(sizeof(T)));
  layout_.gather_everything(group_, shard_params_.data(), model_.params());
  if (!frozen_too) return;
  // Held in float alone, the frozen parts are the frozen shard (one run per range, in flat order).
  if (frozen_parts_.bf16_elements == 0)
    return layout_.gather_everything(group_, frozen_float_.data(), model_.params(), /*frozen=*/true);
  const Buffer<T> frozen = frozen_shard();
  layout_.gather_everything(group_, frozen.data(), model_.params(), /*frozen=*/true);
}

template <class T>
Buffer<T> Fsdp<T>::frozen_shard() const {
  Buffer<T> frozen(layout_.frozen_shard_size());  // [layout.frozen_shard_size()]
  for_each_frozen_part([&](const FrozenPart& part) {
    T* to = frozen.data() + part.local;
    if (!part.in_bf16) {
      std::memcpy(to, frozen_float_.data() + part.at, part.count * sizeof(T));
    } else if constexpr (std::is_same_v<T, float>) {
      to_float(frozen_bf16_.data() + part.at, to, part.count);
    }
  });
  return frozen;
}

template <class T>
void Fsdp<T>::release_everything() {
  for (const ShardLayout::Unit& piece : layout_.units()) {
    if (piece.frozen && !frozen_gathered_) continue;
    release_range(model_.params(), piece.begin, piece.begin + piece.count, /*zero_ends=*/false);
    uncount(piece.count * static_cast<int64_t>(sizeof(T)));
  }
  frozen_gathered_ = false;
}

template class Fsdp<float>;
template class Fsdp<double>;

}  // namespace trillion
