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
    : table_(table), exp_avg_(table.trainable_size()), exp_avg_sq_(table.trainable_size()) {}

template <class T>
void Optimizer<T>::set_trainable(std::function<bool(const ParamSpec&)> filter) {
  filter_ = std::move(filter);
}

template <class T>
bool Optimizer<T>::updates(const ParamSpec& spec) const {
  return spec.trainable() && (!filter_ || filter_(spec));
}

template <class T>
double Optimizer<T>::global_grad_norm(const T* grads) const {
  PhaseScope scope(Phase::optimizer);
  double total = 0.0;
  for (const ParamSpec& spec : table_.entries()) {
    if (updates(spec)) total += sum_of_squares(grads + spec.offset, spec.numel());
  }
  return std::sqrt(total);
}

template <class T>
void Optimizer<T>::scale_grads(T* grads, double factor) const {
  PhaseScope scope(Phase::optimizer);
  for (const ParamSpec& spec : table_.entries()) {
    if (updates(spec)) scale_in_place(grads + spec.offset, spec.numel(), factor);
  }
}

template <class T>
void Optimizer<T>::step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper) {
  PhaseScope scope(Phase::optimizer);
  for (const ParamSpec& spec : table_.entries()) {
    if (!updates(spec)) continue;
    const int64_t at = spec.offset;
    adamw_step(params + at, exp_avg_.data() + at, exp_avg_sq_.data() + at, grads + at, spec.numel(), step, hyper,
               spec.weight_decay);
  }
}

template <class T>
double Optimizer<T>::clip_and_step(T* params, T* grads, int64_t step, const AdamWHyper& hyper, double max_norm) {
  const double norm = global_grad_norm(grads);
  const double factor = clip_factor(norm, max_norm);
  if (factor < 1.0) scale_grads(grads, factor);
  this->step(params, grads, step, hyper);
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
