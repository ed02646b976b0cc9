// AdamW state, gradient norm and clipping over a parameter table (see optimizer.h).
#include "train/optimizer.h"

#include <cmath>
#include <utility>

#include "core/phase_clock.h"
#include "io/safetensors.h"

namespace trillion {
// Moments for the trainable groups only: they are the prefix [0, trainable_size()) of the layout.
template <class T>
Optimizer<T>::Optimizer(const ParamTable& table)
    : table_(table), exp_avg_(table.trainable_size()), exp_avg_sq_(table.trainable_size()) {
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

// The updated tensors as spans, neighbours with the same weight-decay flag merged.
template <class T>
std::vector<AdamWSpan> Optimizer<T>::spans_of_updated() const {
  std::vector<AdamWSpan> spans;
  for (const ParamSpec& spec : table_.entries()) {
    if (!updates(spec) || spec.numel() == 0) continue;
    AdamWSpan* last = spans.empty() ? nullptr : &spans.back();
    if (last != nullptr && last->offset + last->count == spec.offset && last->decay == spec.weight_decay) {
      last->count += spec.numel();
    } else {
      spans.push_back({spec.offset, spec.numel(), spec.weight_decay});
    }
  }
  return spans;
}

template <class T>
double Optimizer<T>::global_grad_norm(const T* grads) const {
  PhaseScope scope(Phase::optimizer);
  return std::sqrt(sum_of_squares(grads, spans_));
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
  SafetensorsWriter writer;
  for (const ParamSpec& spec : table_.entries()) {
    if (!spec.trainable()) continue;
    writer.add(spec.name + ".exp_avg", dtype_of<T>(), spec.shape, exp_avg_.data() + spec.offset);
    writer.add(spec.name + ".exp_avg_sq", dtype_of<T>(), spec.shape, exp_avg_sq_.data() + spec.offset);
  }
  writer.set_metadata("format", "trillion-adamw");
  writer.write(path);
}

template <class T>
void Optimizer<T>::load(const std::string& path) {
  const SafetensorsReader reader(path);
  for (const ParamSpec& spec : table_.entries()) {
    if (!spec.trainable()) continue;
    reader.read(spec.name + ".exp_avg", spec.shape, exp_avg_.data() + spec.offset);
    reader.read(spec.name + ".exp_avg_sq", spec.shape, exp_avg_sq_.data() + spec.offset);
  }
}

template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace trillion
