// PEFT's two layouts of routed experts' adapters (model/adapter_weights.cpp), and an adapter written
// in the other one (`train --expert-layout`):
//
//   fused → per-expert   exact: the pair on a stacked weight's rows becomes one pair per part with
//                        the same A and its part's rows of B (gate_up_proj's rank-r pair gives
//                        gate_proj's and up_proj's rank-r pairs)
//   per-expert → fused   PEFT's own conversion (peft/utils/transformers_weight_conversion.py): the
//                        parts' pairs of a stacked weight become one pair of the summed rank, A the
//                        parts' A stacked, B block-diagonal; the config gains rank_pattern and
//                        alpha_pattern ".*\.gate_up_proj": 2 r and 2 lora_alpha, so the scaling stays
//
// The converted config is checked by building its table: every pair of the written adapter must be
// the source's pairs with the same scaling, and every trainable tensor of the source must be written,
// or the conversion is refused naming the tensor (rsLoRA's scaling, for one, does not survive the
// doubled rank).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/lora_config.h"
#include "model/params.h"

namespace trillion {

enum class ExpertLayout {
  as_trained,  // the layout the pairs train in
  per_expert,  // one pair per expert module (transformers 4's expert lists)
  fused,       // PEFT's ParamWrapper on the stacked weights (target_parameters, transformers 5)
};

// "as-trained" | "per-expert" | "fused"; anything else fails naming `flag`.
ExpertLayout expert_layout_named(const std::string& name, const std::string& flag);
inline const std::vector<std::string>& expert_layout_names() {  // in ExpertLayout's order
  static const std::vector<std::string> names = {"as-trained", "per-expert", "fused"};
  return names;
}

// The config that declares the adapter of `table` (made from `lora`) in `layout`, or none when no
// routed experts' pair changes layout. A target_modules regex cannot be rewritten: refused.
std::optional<LoraConfig> lora_in_layout(const LoraConfig& lora, const ParamTable& table, ExpertLayout layout);

// out [to.numel()] = the values of `to`, a trainable tensor of the converted table `to_table` not
// stored as is, from the source table `from` and its parameters; `used` collects the source tensors
// read. Fails naming `to` when the source has no pairs that give it exactly.
template <class T>
void converted_tensor(const ParamTable& from, const T* params, const ParamTable& to_table, const ParamSpec& to, T* out,
                      std::set<std::string>& used);

// A pair tensor's module: "…mlp.experts.gate_proj.lora_A.weight" → "…mlp.experts.gate_proj".
std::string pair_module(const std::string& tensor);

// Whether `to` is stored in `from` as it is (the same name, shape and scaling): no conversion.
bool stored_as_is(const ParamTable& from, const ParamSpec& to);

}  // namespace trillion
