// AdamW state, gradient norm and clipping over a parameter table (see optimizer.h).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/phase_clock.h"
#include "io/safetensors.h"

namespace trillion {
// Moments for the trainable groups only: they are the prefix [0, trainable_size()) of the layout.
template <class T>
Optimizer<T>::Optimizer(const ParamTable& table)
    : table_(table),
      layout_(table, 0, 1),
      exp_avg_(layout_.shard_size()),
      exp_avg_sq_(layout_.shard_size()) {
  spans_ = spans_of_updated();
}

template <class T>
Optimizer<T>::Optimizer(const ParamTable& table, const ProcessGroup& group, int ep)
    : table_(table),
      group_(&group),
      layout_(table, group.rank(), group.size(), ep),
      exp_avg_(layout_.shard_size()),
      exp_avg_sq_(layout_.shard_size()) {
  spans_ = spans_of_updated();
}

template <class T>
void Optimizer<T>::set_trainable(std::function<bool(const ParamSpec&)> filter) {
  filter_ = std::move(filter);
  spans_ = spans_of_updated();
}

template <class T>
bool Optimizer<T>::updates(const ParamSpec& spec) const {
  return spec.trainable() && (!filter_ || filter_(spec));
}

// The shard's pieces of the updated tensors as spans (shard offsets), neighbours with the same
// weight-decay flag merged. Tensors and slices are both in flat order, so one walk intersects them.
template <class T>
std::vector<AdamWSpan> Optimizer<T>::spans_of_updated() const {
  std::vector<AdamWSpan> spans;
  const std::vector<ShardLayout::Slice>& slices = layout_.slices();
  size_t first = 0;  // the first slice that may overlap the current tensor
  for (const ParamSpec& spec : table_.entries()) {
    if (!updates(spec) || spec.numel() == 0) continue;
    const int64_t begin = spec.offset, end = spec.offset + spec.numel();
    while (first < slices.size() && slices[first].global + slices[first].count <= begin) ++first;
    for (size_t i = first; i < slices.size() && slices[i].global < end; ++i) {
      const int64_t from = std::max(begin, slices[i].global);
      const int64_t to = std::min(end, slices[i].global + slices[i].count);
      const int64_t local = slices[i].local + (from - slices[i].global);
      AdamWSpan* last = spans.empty() ? nullptr : &spans.back();
      if (last != nullptr && last->offset + last->count == local && last->decay == spec.weight_decay) {
        last->count += to - from;
      } else {
        spans.push_back({local, to - from, spec.weight_decay});
      }
    }
  }
  return spans;
}

template <class T>
double Optimizer<T>::global_grad_norm(const T* grads) const {
  PhaseScope scope(Phase::optimizer);
  const double local = sum_of_squares(grads, spans_);
  return std::sqrt(group_ != nullptr ? group_->all_reduce_sum(local) : local);
}

template <class T>
void Optimizer<T>::step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper, double grad_scale) {
  PhaseScope scope(Phase::optimizer);
  adamw_step(params, exp_avg_.data(), exp_avg_sq_.data(), grads, spans_, step, hyper, grad_scale);
}

template <class T>
double Optimizer<T>::clip_and_step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper,
                                   double max_norm) {
  const double norm = global_grad_norm(grads);
  this->step(params, grads, step, hyper, clip_factor(norm, max_norm));
  return norm;
}

template <class T>
void Optimizer<T>::save(const std::string& path) const {
  const bool sharded = layout_.ranks() > 1;
  Buffer<T> gathered_avg(sharded ? table_.trainable_size() : 0);     // [trainable_size] when sharded
  Buffer<T> gathered_avg_sq(sharded ? table_.trainable_size() : 0);  // [trainable_size] when sharded
  if (sharded) {
    layout_.gather_everything(*group_, exp_avg_.data(), gathered_avg.data());
    layout_.gather_everything(*group_, exp_avg_sq_.data(), gathered_avg_sq.data());
    if (!group_->is_root()) return;
  }
  const T* avg = sharded ? gathered_avg.data() : exp_avg_.data();           // [trainable_size]
  const T* avg_sq = sharded ? gathered_avg_sq.data() : exp_avg_sq_.data();  // [trainable_size]
  SafetensorsWriter writer;
  for (const ParamSpec& spec : table_.entries()) {
    if (!spec.trainable()) continue;
    writer.add(spec.name + ".exp_avg", dtype_of<T>(), spec.shape, avg + spec.offset);
    writer.add(spec.name + ".exp_avg_sq", dtype_of<T>(), spec.shape, avg_sq + spec.offset);
  }
  writer.set_metadata("format", "trillion-adamw");
  writer.write(path);
}

template <class T>
void Optimizer<T>::load(const std::string& path) {
  const SafetensorsReader reader(path);
  const bool whole = layout_.ranks() == 1;  // the shard is the flat layout: read in place
  Buffer<T> avg(whole ? 0 : table_.trainable_size());     // [trainable_size] as saved, when sharded
  Buffer<T> avg_sq(whole ? 0 : table_.trainable_size());  // [trainable_size] as saved, when sharded
  T* into_avg = whole ? exp_avg_.data() : avg.data();
  T* into_avg_sq = whole ? exp_avg_sq_.data() : avg_sq.data();
  for (const ParamSpec& spec : table_.entries()) {
    if (!spec.trainable()) continue;
    reader.read(spec.name + ".exp_avg", spec.shape, into_avg + spec.offset);
    reader.read(spec.name + ".exp_avg_sq", spec.shape, into_avg_sq + spec.offset);
  }
  if (whole) return;
  layout_.copy_to_shard(avg.data(), exp_avg_.data());
  layout_.copy_to_shard(avg_sq.data(), exp_avg_sq_.data());
}

template <class T>
void Optimizer<T>::load_flat(const T* exp_avg, const T* exp_avg_sq) {
  layout_.copy_to_shard(exp_avg, exp_avg_.data());
  layout_.copy_to_shard(exp_avg_sq, exp_avg_sq_.data());
}

template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace trillion
