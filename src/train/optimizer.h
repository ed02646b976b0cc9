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
#include <vector>

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

  // √(Σ g²) over all trainable tensors (independent of the thread count).
  double global_grad_norm(const T* grads) const;
  // One AdamW update of every trainable tensor in one parallel pass, with the gradients multiplied
  // by grad_scale; step is 1-based (bias correction).
  void step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper, double grad_scale = 1.0);
  // A training step's update: the global norm, then step() with the gradients clipped to max_norm
  // (≤ 0: none) inside the update, leaving `grads` as they are; returns the norm before clipping.
  double clip_and_step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper, double max_norm);

  void save(const std::string& path) const;
  // Restores the moments; every tensor must be present with its parameter's shape.
  void load(const std::string& path);

  const T* exp_avg() const { return exp_avg_.data(); }     // [table.trainable_size()]
  const T* exp_avg_sq() const { return exp_avg_sq_.data(); }  // [table.trainable_size()]

 private:
  bool updates(const ParamSpec& spec) const;
  std::vector<AdamWSpan> spans_of_updated() const;
  const ParamTable& table_;
  std::function<bool(const ParamSpec&)> filter_;  // empty: every trainable tensor
  std::vector<AdamWSpan> spans_;                   // the tensors step() updates
  Buffer<T> exp_avg_;     // [table.trainable_size()]
  Buffer<T> exp_avg_sq_;  // [table.trainable_size()]
};

}  // namespace trillion
