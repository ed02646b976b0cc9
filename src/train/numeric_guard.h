// Numeric guards of the training loop: a step whose loss or gradient norm is not finite is caught
// before its update, and named: the first gradient the backward made non-finite (of the tensors
// with a non-finite gradient, the one in the latest unit, which the backward visits first, and the
// latest of that unit; its last non-finite element) with the number of parameter tensors whose
// gradients are not finite, over all ranks; with
// --check-numerics also the first sublayer output of the forward that went non-finite
// (Model::set_check_numerics).
//
// What happens then (--on-nonfinite):
//   stop (default)  the run ends with an error naming the step, the parameter and the layer output;
//                   nothing of the step is saved, so the last checkpoint is intact;
//   skip            the step's update is dropped: parameters, AdamW moments and router biases stay
//                   as they were, the step's data is consumed, the step counter and the learning-rate
//                   schedule advance, metrics.jsonl counts the skip; more than --max-nonfinite-skips
//                   skipped steps in a row end the run as stop does.
// The decision is the same on every rank: the loss and the norm it rests on are reduced over them.
#pragma once

#include <cstdint>
#include <string>

#include "model/params.h"
#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace trillion {

enum class OnNonFinite { stop, skip };
// "stop" or "skip"; anything else fails naming --on-nonfinite.
OnNonFinite on_nonfinite_from_name(const std::string& name);

struct NonFiniteGradient {
  std::string parameter;  // empty: every gradient element is finite
  int64_t element = -1;   // row-major index inside the parameter
  double value = 0.0;     // the element (NaN or ±inf)
  int64_t tensors = 0, of_tensors = 0;  // parameter tensors with a non-finite gradient, of all
  // "model.layers.1.mlp.down_proj.weight[17] = nan (3 of 31 parameter tensors have non-finite gradients)"
  std::string describe() const;
};

// The first non-finite element of the gradients in backward order, over every rank's shard
// (collective: every rank calls it and gets the same answer). shard [layout.shard_size()]; a full
// scan, made only for a step that is not finite.
template <class T>
NonFiniteGradient first_nonfinite_gradient(const ParamTable& table, const ShardLayout& layout, const T* shard,
                                           const ProcessGroup& world);

// The numeric guards' test hook: TRILLION_TEST_NAN_AFTER_LAYER=L@S makes step S's forwards write a
// NaN into the residual stream after layer L (Model::inject_nan_after_layer). Unset: layer -1.
struct NanInjection {
  int layer = -1;
  int64_t step = -1;
};
NanInjection nan_injection_from_environment();

// The guard of one run: each step's loss and gradient norm checked before its update.
struct NumericGuard {
  OnNonFinite mode = OnNonFinite::stop;
  int64_t max_skips = 10;        // skip mode: more non-finite steps in a row end the run
  bool checking_outputs = false;  // --check-numerics is on (first_output is filled)
  int64_t in_a_row = 0;           // non-finite steps skipped in a row so far

  // Empty when `loss` and `grad_norm` are finite: the update goes ahead. Otherwise what went wrong
  // ("step 7: the loss is nan and the gradient norm nan; the first non-finite gradient is …; the
  // first non-finite layer output: …"), and the step is skipped; in stop mode, or past max_skips
  // in a row, it fails with that message instead. Collective (the gradient search).
  template <class T>
  std::string check(int64_t step, double loss, double grad_norm, const std::string& first_output,
                    const ParamTable& table, const ShardLayout& layout, const T* grads, const ProcessGroup& world);
};

}  // namespace trillion
