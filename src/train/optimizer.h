// AdamW optimizer state for a model's parameter table: first and second moments (exp_avg,
// exp_avg_sq) laid out like the parameters, weight decay per table entry (off for norms, biases,
// A_log, dt_bias), non-trainable buffers skipped. Also the global gradient norm and clipping over
// every trainable tensor (or the subset set_trainable keeps: frozen tensors are neither updated nor
// counted in the norm; their moments stay and are saved), and the optimizer checkpoint
// (optimizer.safetensors: "<name>.exp_avg" and "<name>.exp_avg_sq" per parameter, in T's dtype).
//
// Sharded (FSDP, a group of several ranks): the moments, and the parameters and gradients that
// step() takes, are this rank's shard (parallel/shard_layout.h); the norm sums every rank's shard;
// save gathers the moments for rank 0 to write, load keeps this rank's elements. On one rank the
// shard is the whole trainable prefix of the flat buffers, at the same offsets.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/params.h"
#include "ops/adamw.h"
#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace trillion {

template <class T>
class Optimizer {
 public:
  explicit Optimizer(const ParamTable& table);
  // Sharded over the world `group` (which must outlive the optimizer), experts over ep groups.
  Optimizer(const ParamTable& table, const ProcessGroup& group, int ep = 1);
  // Only tensors for which filter(spec) holds are updated, clipped and counted (default: all).
  void set_trainable(std::function<bool(const ParamSpec&)> filter);

  // √(Σ g²) over all trainable tensors (independent of the thread count); grads[shard_size].
  double global_grad_norm(const T* grads) const;
  // One AdamW update of every trainable tensor in one parallel pass, with the gradients multiplied
  // by grad_scale; step is 1-based (bias correction). params, grads [layout().shard_size()].
  void step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper, double grad_scale = 1.0);
  // A training step's update: the global norm, then step() with the gradients clipped to max_norm
  // (≤ 0: none) inside the update, leaving `grads` as they are; returns the norm before clipping.
  double clip_and_step(T* params, const T* grads, int64_t step, const AdamWHyper& hyper, double max_norm);

  // Sharded: a collective every rank calls; rank 0 writes `path` (the others ignore it).
  void save(const std::string& path) const;
  // Restores the moments; every tensor must be present with its parameter's shape.
  void load(const std::string& path);
  // Restores the moments from flat [trainable_size] arrays (a sharded checkpoint's).
  void load_flat(const T* exp_avg, const T* exp_avg_sq);

  const ShardLayout& layout() const { return layout_; }
  const T* exp_avg() const { return exp_avg_.data(); }        // [layout().shard_size()]
  const T* exp_avg_sq() const { return exp_avg_sq_.data(); }  // [layout().shard_size()]

 private:
  bool updates(const ParamSpec& spec) const;
  std::vector<AdamWSpan> spans_of_updated() const;
  const ParamTable& table_;
  const ProcessGroup* group_ = nullptr;  // null: one rank
  ShardLayout layout_;
  std::function<bool(const ParamSpec&)> filter_;  // empty: every trainable tensor
  std::vector<AdamWSpan> spans_;                   // the tensors step() updates
  Buffer<T> exp_avg_;     // [layout_.shard_size()]
  Buffer<T> exp_avg_sq_;  // [layout_.shard_size()]
};

}  // namespace trillion
