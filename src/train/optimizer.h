// AdamW optimizer state for a model's parameter table: first and second moments (exp_avg,
// exp_avg_sq) in flat buffers laid out like the parameters, weight decay per table entry (off for
// norms, biases, A_log, dt_bias), non-trainable buffers skipped. Also the global gradient norm
// and clipping over every trainable tensor (or the subset set_trainable keeps: frozen tensors are
// neither updated nor counted in the norm; their moments stay and are saved), and the optimizer checkpoint
// (optimizer.safetensors: "<name>.exp_avg" and "<name>.exp_avg_sq" per parameter, in T's dtype).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/memory.h"
#include "model/params.h"
#include "ops/adamw.h"

namespace trillion {

template <class T>
class Optimizer {
 public:
  explicit Optimizer(const ParamTable& table);
  // Only tensors for which filter(spec) holds are updated, clipped and counted (default: all).
  void set_trainable(std::function<bool(const ParamSpec&)> filter);

  // √(Σ g²) over all trainable tensors, in table order (independent of the thread count).
  double global_grad_norm(const T* grads) const;
  // Scales every trainable gradient by `factor`.
  void scale_grads(T* grads, double factor) const;
  // One AdamW update of every trainable tensor; step is 1-based (bias correction).
  void step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper);
  // A training step's update: the global norm, clipping to max_norm (≤ 0: none), step(); returns
  // the norm before clipping.
  double clip_and_step(T* params, T* grads, int64_t step, const AdamWHyper& hyper, double max_norm);

  void save(const std::string& path) const;
  // Restores the moments; every tensor must be present with its parameter's shape.
  void load(const std::string& path);

  const T* exp_avg() const { return exp_avg_.data(); }     // [table.trainable_size()]
  const T* exp_avg_sq() const { return exp_avg_sq_.data(); }  // [table.trainable_size()]

 private:
  bool updates(const ParamSpec& spec) const;
  const ParamTable& table_;
  std::function<bool(const ParamSpec&)> filter_;  // empty: every trainable tensor
  Buffer<T> exp_avg_;     // [table.trainable_size()]
  Buffer<T> exp_avg_sq_;  // [table.trainable_size()]
};

}  // namespace trillion
