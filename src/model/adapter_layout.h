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
// The converted config is checked, before training starts, by building its table: every pair of the
// written adapter must be the source's pairs with the same scaling, every trainable tensor of the
// source must be written, and PEFT must read the written adapter alike (check_peft_reads_it_alike:
// a fused gate_up pair of rank other than r, for one, has no per-expert form PEFT reads back), or
// the conversion is refused naming the tensor or field.
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
// routed experts' pair changes layout. Module names are exact unless every MoE layer's experts are
// adapted alike (then one pattern of any layer). all-linear cannot be rewritten: refused. The
// written table is checked against `table` by the caller (model/adapter_weights.cpp).
std::optional<LoraConfig> lora_in_layout(const LoraConfig& lora, const ParamTable& table, ExpertLayout layout);

// Refuses, naming the field, an adapter of an MoE model (`table`, made from `lora`) that PEFT (>= 0.19,
// transformers 5) would read as another adapter:
//   - all-linear (PEFT extends it to the router), or gate_proj / up_proj / down_proj / gate named
//     as modules (PEFT reads them as the routed experts' target_parameters);
//   - routed experts adapted per expert (a) with gate and not up or the reverse, (b) by names that
//     miss the index-less module PEFT reads them as ("…mlp.experts.gate_proj"), (c) with another
//     rank or scaling there, or (d) gate and up at a rank other than r, alpha other than lora_alpha
//     or with rsLoRA (PEFT fuses them at rank 2 r, alpha 2 lora_alpha);
//   - per-expert pairs of a family whose checkpoint renames modules (kimi_linear: its per-expert
//     modules exist only in Moonshot's remote code, whose other names differ from the adapter's).
void check_peft_reads_it_alike(const LoraConfig& lora, const ParamTable& table, const std::string& model_type);

// out [to.numel()] = the values of `to`, a trainable tensor of the converted table `to_table` not
// stored as is, from the source table `from` and its parameters; `used` collects the source tensors
// read. Fails naming `to` when the source has no pairs that give it exactly. With `params` and `out`
// null it only checks that.
template <class T>
void converted_tensor(const ParamTable& from, const T* params, const ParamTable& to_table, const ParamSpec& to, T* out,
                      std::set<std::string>& used);

// A pair tensor's module: "…mlp.experts.gate_proj.lora_A.weight" → "…mlp.experts.gate_proj".
std::string pair_module(const std::string& tensor);

// Whether `to` is stored in `from` as it is (the same name, shape and scaling): no conversion.
bool stored_as_is(const ParamTable& from, const ParamSpec& to);

}  // namespace trillion
