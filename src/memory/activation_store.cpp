// ActivationStore: per-step storage of saved activations under static tags (kept resident until clear()).
#include "memory/activation_store.h"

namespace trillion {

const char* activation_tag_name(ActivationTag tag) {
  switch (tag) {
    case ActivationTag::attn_input: return "attn_input";
    case ActivationTag::attn_norm_rstd: return "attn_norm_rstd";
    case ActivationTag::attn_norm_out: return "attn_norm_out";
    case ActivationTag::q_raw: return "q_raw";
    case ActivationTag::q_rstd: return "q_rstd";
    case ActivationTag::q: return "q";
    case ActivationTag::gate: return "gate";
    case ActivationTag::k_raw: return "k_raw";
    case ActivationTag::k_rstd: return "k_rstd";
    case ActivationTag::k: return "k";
    case ActivationTag::v: return "v";
    case ActivationTag::attn_out: return "attn_out";
    case ActivationTag::attn_lse: return "attn_lse";
    case ActivationTag::o_proj_in: return "o_proj_in";
    case ActivationTag::la_conv_in: return "la_conv_in";
    case ActivationTag::la_q_hat: return "la_q_hat";
    case ActivationTag::la_q_inv: return "la_q_inv";
    case ActivationTag::la_k_hat: return "la_k_hat";
    case ActivationTag::la_k_inv: return "la_k_inv";
    case ActivationTag::la_v: return "la_v";
    case ActivationTag::la_z: return "la_z";
    case ActivationTag::la_a: return "la_a";
    case ActivationTag::la_g: return "la_g";
    case ActivationTag::la_beta: return "la_beta";
    case ActivationTag::la_core: return "la_core";
    case ActivationTag::la_norm_rstd: return "la_norm_rstd";
    case ActivationTag::la_normed: return "la_normed";
    case ActivationTag::la_f_low: return "la_f_low";
    case ActivationTag::la_g_low: return "la_g_low";
    case ActivationTag::mla_q_a: return "mla_q_a";
    case ActivationTag::mla_q_a_rstd: return "mla_q_a_rstd";
    case ActivationTag::mla_q_latent: return "mla_q_latent";
    case ActivationTag::mla_kv_a: return "mla_kv_a";
    case ActivationTag::mla_kv_rstd: return "mla_kv_rstd";
    case ActivationTag::mla_latent: return "mla_latent";
    case ActivationTag::attn_indices: return "attn_indices";
    case ActivationTag::idx_k_raw: return "idx_k_raw";
    case ActivationTag::idx_k_mean: return "idx_k_mean";
    case ActivationTag::idx_k_rstd: return "idx_k_rstd";
    case ActivationTag::idx_dq: return "idx_dq";
    case ActivationTag::idx_dk: return "idx_dk";
    case ActivationTag::idx_dw: return "idx_dw";
    case ActivationTag::ffn_input: return "ffn_input";
    case ActivationTag::ffn_norm_rstd: return "ffn_norm_rstd";
    case ActivationTag::ffn_norm_out: return "ffn_norm_out";
    case ActivationTag::mlp_gate: return "mlp_gate";
    case ActivationTag::mlp_up: return "mlp_up";
    case ActivationTag::mlp_act: return "mlp_act";
    case ActivationTag::router_logits: return "router_logits";
    case ActivationTag::router_scores: return "router_scores";
    case ActivationTag::router_index: return "router_index";
    case ActivationTag::router_weight: return "router_weight";
    case ActivationTag::expert_gate_up: return "expert_gate_up";
    case ActivationTag::expert_act: return "expert_act";
    case ActivationTag::expert_out: return "expert_out";
    case ActivationTag::shared_gate: return "shared_gate";
    case ActivationTag::shared_up: return "shared_up";
    case ActivationTag::shared_act: return "shared_act";
    case ActivationTag::shared_out: return "shared_out";
    case ActivationTag::shared_gate_logit: return "shared_gate_logit";
    case ActivationTag::final_input: return "final_input";
    case ActivationTag::final_norm_rstd: return "final_norm_rstd";
    case ActivationTag::final_norm_out: return "final_norm_out";
    case ActivationTag::loss_lse: return "loss_lse";
    case ActivationTag::loss_dh: return "loss_dh";
    case ActivationTag::count_: break;
  }
  return "?";
}

ActivationStore::ActivationStore(Tier tier) : arena_(tier) {}

void* ActivationStore::save_bytes(ActivationTag tag, int layer, int64_t bytes) {
  TRILLION_CHECK(tag != ActivationTag::count_, "count_ is not a tag");
  const std::pair<int, int> key{static_cast<int>(tag), layer};
  TRILLION_CHECK(entries_.count(key) == 0, "activation ", activation_tag_name(tag), " of layer ", layer,
                 " saved twice in one step");
  // The bytes stay in the arena until clear().
  void* data = arena_.alloc_bytes(bytes);
  entries_.emplace(key, Entry{data, bytes});
  return data;
}

const void* ActivationStore::get_bytes(ActivationTag tag, int layer, int64_t bytes) const {
  const auto it = entries_.find({static_cast<int>(tag), layer});
  TRILLION_CHECK(it != entries_.end(), "activation ", activation_tag_name(tag), " of layer ", layer,
                 " was not saved");
  TRILLION_CHECK(it->second.bytes == bytes, "activation ", activation_tag_name(tag), " of layer ", layer, " has ",
                 it->second.bytes, " bytes, expected ", bytes);
  return it->second.data;
}

void ActivationStore::clear() {
  entries_.clear();
  arena_.reset();
}

}  // namespace trillion
