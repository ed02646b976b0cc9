// The policies `--recompute` and `--swap` name: a preset or a comma-separated list of activation
// tags (memory/activation_tags.h), applied to an activation store.
//
//   --recompute none       keep everything (the default)
//               selective  the FFN sublayer's tensors except its input: the dense MLP or the MoE
//                          (router, grouped GEMMs, shared expert) is re-run from ffn_input before
//                          its backward (Megatron's `mlp` / `moe` recompute modules)
//               full       every decoder-layer tensor except attn_input: the whole layer is re-run
//               Neither drops the rows of the expert exchange (kind exchanged) but the owners'
//               activations (ep_gate_up, ep_act), which their fused backward forms again: a re-run
//               MoE layer does not exchange again, so every rank may re-run what it dropped alone.
//               A list naming only expert_gate_up / expert_act (or ep_gate_up / ep_act) re-runs
//               nothing: the experts' backward forms them again in its row tiles.
//   --swap      none       (the default)
//               selective  the outputs of GEMMs, grouped GEMMs and attention kernels, and the
//                          exchanged rows (kinds gemm, attention, exchanged): the tensors most
//                          expensive to recompute
//               full       every decoder-layer tensor
// The head's tensors (final norm, loss) are used as soon as the backward starts and are always
// kept. A tag may not be both recomputed and swapped.
#pragma once

#include <string>
#include <vector>

#include "memory/activation_store.h"

namespace trillion {

std::vector<ActivationTag> recompute_tags(const std::string& spec);
std::vector<ActivationTag> swap_tags(const std::string& spec);
// Fails if a tag is named by both (the same message apply_save_policies gives).
void check_disjoint_policies(const std::string& recompute, const std::string& swap);
// Sets every tag's policy from the two specs (tags named by neither are kept); fails naming the
// option and the tag on an unknown name or a tag in both.
void apply_save_policies(ActivationStore& store, const std::string& recompute, const std::string& swap);

}  // namespace trillion
